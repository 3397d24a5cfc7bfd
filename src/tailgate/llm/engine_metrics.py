"""Pure arithmetic over engine ``/metrics`` samples (``[[name, labels, value], ...]``).

Counters are summed over every label set (several engines or data-parallel
ranks behind one endpoint), and a window is the difference of two scrapes.
Histograms are read the way Prometheus' ``histogram_quantile`` reads them:
linear inside a bucket, so a percentile is only known to lie inside its bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

Samples = list[list[Any]]


def total(samples: Samples, name: str) -> float | None:
    """Sum of every series named ``name``; None when the engine does not export it."""
    values = [s[2] for s in samples if s[0] == name]
    return sum(values) if values else None


def labels_of(samples: Samples, name: str) -> list[dict[str, str]]:
    return [s[1] for s in samples if s[0] == name]


@dataclass(frozen=True)
class Window:
    """A counter's value over the inspection window, or since the engine started."""

    value: float
    windowed: bool  # False: totals since start (no earlier scrape, or nothing happened)
    note: str = ""


def window(before: Samples | None, after: Samples, name: str) -> tuple[float | None, float | None]:
    """(t1 total, t1 - t0 delta or None when there is no usable earlier scrape)."""
    t1 = total(after, name)
    if t1 is None:
        return None, None
    if before is None:
        return t1, None
    # A series absent from the earlier scrape was created since: it started at 0.
    t0 = total(before, name) or 0.0
    if t1 < t0:  # the engine restarted (counter reset): no usable window
        return t1, None
    return t1, t1 - t0


def went_backwards(before: Samples | None, after: Samples, *names: str) -> str | None:
    """The first of ``names`` whose total fell between the scrapes (an engine restart, a
    counter reset), as a reason; None when every one grew or stayed."""
    if before is None:
        return None
    for name in names:
        t0, t1 = total(before, name), total(after, name)
        if t0 is not None and t1 is not None and t1 < t0:
            return (f"counter reset: {name} went backwards between the two scrapes "
                    f"({t0:g} -> {t1:g}; the engine restarted?): no rate across a reset")
    return None


def ratio_over_window(before: Samples | None, after: Samples, num: str, den: str,
                      interval_s: float) -> tuple[float, float, bool, str] | None:
    """num/den over the window when the window saw any ``den``, else since start.

    Returns (numerator, denominator, windowed, note) or None when a series is absent.
    """
    n1, dn = window(before, after, num)
    d1, dd = window(before, after, den)
    if n1 is None or d1 is None:
        return None
    if dn is not None and dd is not None and dd > 0:
        return dn, dd, True, f"over the {interval_s:.1f} s window"
    why = ("no earlier scrape" if before is None or dd is None
           else f"no traffic during the {interval_s:.1f} s window")
    return n1, d1, False, f"{why}: totals since the engine started"


# A part never exceeds its whole: (part, whole) counter pairs of one engine.
PARTS = (
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
    ("sglang:cached_tokens_total", "sglang:prompt_tokens_total"),
    ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
    ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total"),
)
# Gauges that are fractions.
RATIOS = ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate", "sglang:spec_accept_rate",
          "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")


def impossible(samples: Samples) -> str | None:
    """Why one scrape cannot be a real engine's (a part above its whole, a negative counter,
    a ratio outside [0, 1]); None when nothing is impossible. Such a body is broken, and a
    rate read from it (a hit rate of 10,000 %) would judge a number no engine produced."""
    for s in samples:
        if s[0].endswith("_total") and s[2] < 0:
            return f"impossible counter: {s[0]} is negative ({s[2]:g})"
    for name in RATIOS:
        for s in samples:
            if s[0] == name and not 0.0 <= s[2] <= 1.0:
                return f"impossible ratio: {name} is {s[2]:g}, outside [0, 1]"
    for part, whole in PARTS:
        p, w = total(samples, part), total(samples, whole)
        if p is not None and w is not None and p > w:
            return f"impossible counters: {part} ({p:g}) > {whole} ({w:g})"
    return None


def impossible_window(before: Samples | None, after: Samples) -> str | None:
    """As :func:`impossible`, for the growth between two scrapes (each may be possible alone)."""
    if before is None:
        return None
    for part, whole in PARTS:
        p0, p1 = total(before, part), total(after, part)
        w0, w1 = total(before, whole), total(after, whole)
        if p0 is None or p1 is None or w0 is None or w1 is None or p1 < p0 or w1 < w0:
            continue  # absent, or a reset (the checks judge a reset as one)
        if p1 - p0 > w1 - w0:
            return (f"impossible counters: {part} grew by {p1 - p0:g} but {whole} by only "
                    f"{w1 - w0:g} between the two scrapes")
    return None


def histogram(samples: Samples, name: str) -> list[tuple[float, float]]:
    """Cumulative buckets ``[(le, count), ...]`` of ``name`` summed over label sets, sorted."""
    by_le: dict[float, float] = {}
    for s in samples:
        if s[0] == name + "_bucket" and "le" in s[1]:
            le = float(s[1]["le"])
            by_le[le] = by_le.get(le, 0.0) + s[2]
    return sorted(by_le.items())


def histogram_delta(before: Samples | None, after: Samples,
                    name: str) -> tuple[list[tuple[float, float]], bool]:
    """Buckets over the window (t1 - t0) when it holds samples, else since start."""
    h1 = histogram(after, name)
    if before is None:
        return h1, False
    h0 = dict(histogram(before, name))
    delta = [(le, c - h0.get(le, 0.0)) for le, c in h1]
    if delta and delta[-1][1] > 0 and all(c >= 0 for _, c in delta):
        return delta, True
    return h1, False


def quantile(buckets: list[tuple[float, float]], q: float) -> tuple[float, float, float] | None:
    """(estimate, bucket low, bucket high) of quantile q from cumulative buckets.

    Like Prometheus' ``histogram_quantile``: linear interpolation inside the
    bucket. The true value is anywhere in [low, high]; high is +Inf when the
    quantile falls in the overflow bucket (then the estimate is low).
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lo_le, lo_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lo_le, lo_le, le
            if count == lo_count:
                return le, lo_le, le
            frac = (rank - lo_count) / (count - lo_count)
            return lo_le + (le - lo_le) * frac, lo_le, le
        lo_le, lo_count = le, count
    return None


# The engines' request-latency histograms, per figure, newest name first.
LATENCY_HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "itl": ("vllm:inter_token_latency_seconds", "sglang:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",
             "sglang:request_time_per_output_token_seconds",
             "sglang:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
}

COARSE_WARNING = (
    "engine histograms have a few fixed buckets: a percentile is only known to lie inside its "
    "bucket (bounds given), and no P999 can be read from them; measure the tail client-side "
    "with `tailgate bench openai+http://HOST:PORT/v1 ...`"
)


def latency_evidence(before: Samples | None, after: Samples) -> dict[str, Any]:
    """The engine's TTFT/ITL/TPOT/E2E histograms as evidence, in milliseconds."""
    out: dict[str, Any] = {}
    for figure, names in LATENCY_HISTOGRAMS.items():
        for name in names:
            buckets, windowed = histogram_delta(before, after, name)
            if not buckets:
                continue
            entry: dict[str, Any] = {"metric": name, "count": int(buckets[-1][1]),
                                     "windowed": windowed}
            for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
                est = quantile(buckets, q)
                if est is None:
                    entry[f"{label}_ms"] = None
                    continue
                value, lo, hi = est
                # In the overflow bucket only a lower bound is known: no estimate.
                entry[f"{label}_ms"] = None if math.isinf(hi) else round(value * 1000, 3)
                entry[f"{label}_bucket_ms"] = [round(lo * 1000, 3),
                                               None if math.isinf(hi) else round(hi * 1000, 3)]
            entry["p999_ms"] = None
            out[figure] = entry
            break
    if out:
        out["warning"] = COARSE_WARNING
    return out
