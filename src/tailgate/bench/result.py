"""The merged result of a bench run: JSON, terminal summary, warnings, HdrHistogram and
per-request logs.

The JSON (``tailgate_bench: 1``) is the contract other tools and the SLO gate
read::

    {"target", "protocol", "config": {...}, "interrupted", "duration_s",
     "rate": {"target", "achieved", "ok"},
     "requests": {"scheduled", "sent", "ok", "errors": {"connect", "timeout", "reset",
                  "status_4xx", "status_5xx", "protocol", "truncated", "too_large",
                  "upgrade", "stale_connection", "tls", "grpc_status"},
                  "error_examples": {kind: [{"reason", "count"}, ...]},
                  "abandoned", "retried", "queued", "warmup"},
     "connections": {"opened", "connect_failures", "max_open", "cap",
                     "errors": {kind: count}, "error_examples": {kind: [...]},
                     "connect_ms", "handshake_ms" (TLS targets): {"p50", ..., "count"}},
     "accounting": {"consistent", "problems"},
     "latency_ms" | "service_time_ms" | "lateness_ms":
         {"p50", "p90", "p95", "p99", "p999", "p9999", "max", "mean", "count",
          "samples_above": {"p99", "p999", "p9999"}, "clamped",
          "ci_level", "ci": {"p50": {"lo", "hi", "measurable"[, "reason"]}, ...}},
     "arrivals": {"distribution", "resolution_us", "samples", "gaps": {...},
                  "counts": {...}, "verdict": "match"|"deviate"|"unknown", "statement"},
     "stationarity": {"interval_s", "intervals", "shift": {...}, "trend": {...},
                      "verdict": "stationary"|"drifted"|"unknown", "statement"},
     "offered": {"interval_s", "ramp", "t_s": [...], "target_rps": [...],
                 "sent_rps": [...], "p99_ms": [...]},  # the offered rate over time
     "over_time": {"interval_s", "by": "intended start",
                   "latency": {"t_s", "count", "p50_ms", "p99_ms", "max_ms"},
                   # openai+: the same for "ttft" and "itl", and by end of request
                   "completed": {"by": "end", "t_s", "ok_per_s", "good_per_s",
                                 "output_tokens_per_s"}},
     "confidence": {"targets": [{"expr", "width_ms", "limit_ms", "reached", ...}],
                    "reached", "after_s", "schedule_ended", "ceiling_s"},  # --confidence
     "warnings": [...], "slo": [{"expr", "observed", "pass", ...}]}

Every printed percentile carries its order-statistic confidence interval
(:mod:`.confidence`); one that cannot be formed is ``measurable: false`` and the
terminal prints ``n/m`` instead of a figure. ``arrivals`` (:mod:`.arrivals`) tests
the achieved send times against the requested distribution, ``stationarity``
(:mod:`.stationarity`) the per-interval tails for a shift or trend.

Accounting, each figure from its own counter (see :mod:`.engine`), checked here
and reported under ``accounting`` (a warning when it does not add up):
``scheduled == sent + abandoned (+ lost)``, ``sent == ok + sum(errors)``,
``latency_ms.count == sent`` (every request has a latency: time-outs at the
time-out). ``lost`` (``--ray`` only) counts the requests owed by a generator node
that never reported (see :mod:`.distributed`). ``abandoned`` is non-zero only for an interrupted run (measured
requests without an outcome when it stopped). ``error_examples`` keeps up to
five reasons per kind with their counts, summed over workers.
``connections.errors`` are protocol errors with no request in flight (bytes
after a complete response): charged to the connection, which was dropped, and
not part of ``sent``. ``connections.connect_ms`` is the TCP connect time of every
connection opened and ``handshake_ms`` (https://, grpcs://) its TLS handshake,
apart: neither is in any request's service time, and both are in the latency of a
request that waited for that connection. ``retried`` counts requests resent after a stale
keep-alive connection (``--retry-stale``).
``queued`` counts requests that found no idle connection when due and waited for
one (a new one opening, or a busy one freeing up); ``lateness`` is how late the
generator itself got to each request; ``generator.read_lag_ms`` how long after the
kernel's receive stamp it read each reply (compiled engine; a latency ends at that stamp,
so this delay is in none; null for the python engine, whose latencies end at its read, and
for streams, whose every chunk is timed at its own stamp).
``generator.cpu_us_per_request`` is the
generator processes' CPU time per request handled.
``samples_above`` says how many samples lie above each tail percentile: a P999
with fewer than ``min_tail_samples`` above it is reported with a warning.

An ``openai+`` run is the same document (``protocol: "openai"``; its error kinds
add ``malformed_sse``, ``server_error``, ``no_token``) plus the LLM figures of
:mod:`tailgate.llm.accounting`: ``model``, ``api``, ``workload``, ``mode``,
``ttft_ms``/``itl_ms`` (per chunk)/``itl_per_token_ms``/``tpot_ms``/``e2e_ms``/
``first_chunk_ms`` (p50..p999, max, count), ``tokens``, ``token_check`` (the client's
count against usage), ``prefix_cache`` (usage's cached prompt tokens), ``throughput``
(output tokens/s, goodput), ``metrics`` (what LLM SLOs read), ``requests.good`` and
``requests.warmup_ok``, and their histograms beside ``latency`` (which is the request
from intended start to the end of its response, every outcome counted).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from ..hist import (
    Histogram,
    HistogramSpec,
    Interval,
    encode,
    merged,
    write_log,
)
from .arrivals import arrival_test
from .confidence import ConfidenceTarget, judge_targets, quantile_ci
from .engine_types import LLM_LOG_HEADER, LLM_LOG_HEADER_V2, LOG_HEADER, WorkerResult
from .http1 import Limits
from .outcome import KINDS
from .protocols import kinds_for
from .recording import MAX_REASONS, OTHER_REASONS
from .schedule import Ramp
from .stationarity import over_time, stationarity_test

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9,
               "p9999": 99.99}
TAIL = ("p99", "p999", "p9999")
CI_LEVEL = 0.95  # of the interval printed beside every percentile
NS_PER_MS = 1e6


@dataclass(frozen=True)
class RunInfo:
    """What was asked for (echoed in the JSON as ``config``)."""

    target: str
    protocol: str
    rate: float
    duration_s: float
    arrival: str = "constant"
    warmup_s: float = 0.0
    workers: int = 1
    connections: int = 1
    max_connections: int = 1024
    timeout_s: float = 2.0
    seed: int | None = 0
    min_tail_samples: int = 10
    hdr_interval_s: float | None = None
    spec: HistogramSpec = field(default_factory=HistogramSpec)
    limits: Limits = field(default_factory=Limits)
    retry_stale: bool = False
    confidence: tuple[ConfidenceTarget, ...] = ()  # --confidence: run until these are met
    requests: int | None = None  # --requests: the schedule's first N
    llm: dict[str, Any] | None = None  # openai+: model, api, workload, mode (echoed)
    engine: str = "auto"  # asked for: auto, fast or python (bench.fastpath.choose)
    burstiness: float = 1.0  # --arrival gamma: the gaps' shape (1: Poisson)
    ramp: Ramp | None = None  # --rate LO..HI: the offered rate over time (rate: its mean)
    coalesce_s: float = 0.0  # --coalesce: how long a due request may wait for others

    def config_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.arrival == "gamma":
            extra["burstiness"] = self.burstiness
        if self.ramp is not None:
            extra["ramp"] = self.ramp.json()
        return {"rate": self.rate, "duration_s": self.duration_s, "arrival": self.arrival,
                **extra,
                "requests": self.requests,
                "warmup_s": self.warmup_s, "workers": self.workers,
                "connections": self.connections, "max_connections": self.max_connections,
                "timeout_s": self.timeout_s, "seed": self.seed,
                "retry_stale": self.retry_stale, "coalesce_s": self.coalesce_s,
                "confidence": [t.expr for t in self.confidence],
                "limits": {"max_header_bytes": self.limits.max_header_bytes,
                           "max_body_bytes": self.limits.max_body_bytes}}


@dataclass
class BenchResult:
    """The JSON plus the merged histograms it was computed from."""

    json: dict[str, Any]
    latency: Histogram
    service: Histogram
    lateness: Histogram
    intervals: dict[int, Histogram]
    info: RunInfo
    tokens: Any = None  # openai+: the merged tailgate.llm.accounting.TokenBook
    stopped: bool = False  # Ctrl-C (or a stop) ended the run early
    start_epoch_s: float | None = None  # wall-clock time of the schedule's time 0

    @property
    def exit_ok(self) -> bool:
        conf = self.json.get("confidence")
        return all(s["pass"] for s in self.json.get("slo", [])) and (
            conf is None or conf["reached"]) and not self.json["requests"].get("lost")

    @property
    def passed(self) -> bool:
        """Every SLO held, the confidence asked for was reached, nothing was lost, and at
        least one request succeeded: what exit status 0 means."""
        return self.exit_ok and bool(self.json["requests"].get("ok"))


def add_percentiles(result: BenchResult, chosen: list[tuple[str, float]]) -> None:
    """Put the chosen percentiles bench does not write by default into the JSON blocks,
    each with its confidence interval, from the merged histograms (nothing re-run)."""
    hists = {"latency_ms": result.latency, "service_time_ms": result.service,
             "lateness_ms": result.lateness}
    if result.tokens is not None:
        hists.update({f"{k}_ms": h for k, h in result.tokens.hists.items()
                      if f"{k}_ms" in result.json})
    for key, h in hists.items():
        block = result.json[key]
        for name, p in chosen:
            if name in block:
                continue
            block[name] = round(min(h.value_at_percentile(p), h.max) / NS_PER_MS, 6) \
                if h.total else None
            ci = quantile_ci(h, p, CI_LEVEL)
            block.setdefault("ci", {})[name] = (
                {"lo": round(ci.lo / NS_PER_MS, 6), "hi": round(ci.hi / NS_PER_MS, 6),
                 "measurable": True} if ci.measurable else
                {"lo": None, "hi": None, "measurable": False, "reason": ci.reason})


def summarize(h: Histogram, scale: float = NS_PER_MS) -> dict[str, Any]:
    """Percentiles (in ``1/scale`` units of the recorded values), count and tail support,
    and each percentile's confidence interval (``ci``, see :func:`intervals`)."""
    vals = h.values_at_percentiles(PERCENTILES.values())
    out: dict[str, Any] = {k: round(v / scale, 6) for k, v in zip(PERCENTILES, vals, strict=True)}
    out["max"] = round(h.max / scale, 6)
    out["mean"] = round(h.mean() / scale, 6)
    out["count"] = h.total
    out["samples_above"] = {k: h.samples_above_percentile(PERCENTILES[k]) for k in TAIL}
    out["clamped"] = h.clamped
    out["ci_level"] = CI_LEVEL
    out["ci"] = intervals(h, scale)
    return out


def intervals(h: Histogram, scale: float = NS_PER_MS,
              level: float = CI_LEVEL) -> dict[str, dict[str, Any]]:
    """``{"p99": {"lo", "hi", "measurable"}}`` per percentile: the order-statistic
    interval (:func:`.confidence.quantile_ci`); one that cannot be formed from the
    samples at hand has ``lo``/``hi`` null, ``measurable`` false and a ``reason``."""
    out: dict[str, dict[str, Any]] = {}
    for name, p in PERCENTILES.items():
        ci = quantile_ci(h, p, level)
        if ci.measurable:
            out[name] = {"lo": round(ci.lo / scale, 6), "hi": round(ci.hi / scale, 6),
                         "measurable": True}
        else:
            out[name] = {"lo": None, "hi": None, "measurable": False, "reason": ci.reason}
    return out


def owed_by_worker(cfgs: Iterable[Any]) -> dict[int, int]:
    """Each worker's measured requests (its schedule after the warm-up), by worker."""
    return {c.worker: int(np.count_nonzero(np.asarray(c.times) >= c.warmup_s)) for c in cfgs}


def build_result(info: RunInfo, parts: Sequence[WorkerResult],
                 interrupted: bool = False, missing_workers: Iterable[int] = (),
                 confidence_after_s: float | None = None,
                 owed: Mapping[int, int] | None = None) -> BenchResult:
    """Merge the workers' results exactly (histograms add) and derive the JSON.

    ``owed``: each worker's measured requests (:func:`owed_by_worker`); a missing
    worker's share is counted in ``requests.lost`` and ``scheduled`` (the schedule never
    shrinks because a worker died), and the run does not pass (:attr:`exit_ok`).

    ``confidence_after_s``: the measured time after which the run saw every
    ``info.confidence`` target met (None: it never did)."""
    spec = info.spec
    latency = merged((p.latency for p in parts), spec)
    service = merged((p.service for p in parts), spec)
    lateness = merged((p.lateness for p in parts), spec)
    intervals: dict[int, Histogram] = {}
    for p in parts:
        for k, h in p.intervals.items():
            intervals.setdefault(k, Histogram(spec)).add(h)
    counts = np.sum([p.counts for p in parts], axis=0) if parts else np.zeros(len(KINDS))
    by_kind = {k: int(c) for k, c in zip(KINDS, counts, strict=True)}
    sent = sum(p.sent for p in parts)
    interrupted = interrupted or any(p.interrupted for p in parts)
    dispatched = sum(p.dispatched for p in parts)
    last = max((p.last_dispatch_s for p in parts), default=0.0) - info.warmup_s
    ended = any(p.schedule_ended for p in parts)  # --confidence cut the schedule short
    window = max(last, 0.0) if interrupted or ended else max(last, info.duration_s)
    achieved = dispatched / window if window > 0 else 0.0
    conns = {k: sum(p.connections.get(k, 0) for p in parts)
             for k in ("opened", "connect_failures", "max_open", "cap")}
    conn_book = _sum_books(p.conn_errors for p in parts)
    data: dict[str, Any] = {
        "tailgate_bench": 1,
        "target": info.target,
        "protocol": info.protocol,
        "config": info.config_json(),
        "interrupted": interrupted,
        "duration_s": round(window, 6),
        "rate": {"target": info.rate, "achieved": round(achieved, 3),
                 "ok": round(by_kind["ok"] / window, 3) if window > 0 else 0.0},
        "requests": {
            "scheduled": sum(p.scheduled for p in parts),
            "sent": sent,
            "ok": by_kind["ok"],
            "errors": {k: by_kind[k] for k in kinds_for(info.protocol)},
            "error_examples": merge_reasons(p.error_examples for p in parts),
            "abandoned": sum(p.abandoned for p in parts),
            "retried": sum(p.retried for p in parts),
            "queued": sum(p.queued for p in parts),
            "warmup": sum(p.warmup_requests for p in parts),
        },
        "connections": {**conns,
                        "errors": {k: sum(r.values()) for k, r in conn_book.items()},
                        "error_examples": merge_reasons(p.conn_errors for p in parts),
                        **_dial_times(parts, spec)},
        "latency_ms": summarize(latency),
        "service_time_ms": summarize(service),
        "lateness_ms": summarize(lateness),
        # The recorded histograms (HdrHistogram V2, values in ns): `tailgate compare` merges
        # runs exactly and tests differences against them.
        "histogram_unit": "ns",
        "histograms": {"latency": encode(latency), "service": encode(service),
                       "lateness": encode(lateness)},
        "generator": {"workers": len(parts),
                      # which engine measured: "fast" (compiled hot path) or "python"
                      "engine": "fast" if parts and all(p.engine == "fast" for p in parts)
                      else "python",
                      "precise_timer": all(p.precise_timer for p in parts),
                      "cpu_s": round(sum(p.cpu_s for p in parts), 6),
                      # openai+ (compiled): the loop stopped reading while the chunks'
                      # JSON was behind; chunks read together then share one time
                      "read_pauses": sum(p.read_pauses for p in parts),
                      "read_paused_s": round(sum(p.read_paused_s for p in parts), 6),
                      # compiled: each reply's kernel receive stamp (where its latency
                      # ends) to the loop's read of it; null: none (the python engine's
                      # latencies end at its read; a stream's chunks are timed at theirs)
                      "read_lag_ms": _read_lag(parts, spec),
                      # compiled: the most a loop polled before a due time instead of
                      # sleeping, learnt from how late its timed wake-ups came
                      "spin_us": round(1e6 * max((p.spin_s for p in parts), default=0.0), 1),
                      # all requests handled, warm-up included: what the CPU time paid for
                      "cpu_us_per_request": round(
                          1e6 * sum(p.cpu_s for p in parts)
                          / max(sum(sum(p.counts) + p.warmup_requests for p in parts), 1), 3),
                      "connect_errors": _top(_sum_books(
                          {"connect": p.connect_errors} for p in parts).get("connect", {}))},
    }
    data["arrivals"] = arrival_test(info.arrival, info.rate, info.workers, info.warmup_s,
                                    [p.arrivals_s for p in parts],
                                    max((p.tick_s for p in parts), default=0.0),
                                    burstiness=info.burstiness, ramp=info.ramp)
    data["stationarity"] = stationarity_test(intervals, info.hdr_interval_s)
    data["offered"] = offered_series(info, intervals, window)
    data["over_time"] = {"interval_s": info.hdr_interval_s, "by": "intended start",
                         "latency": over_time(intervals, info.hdr_interval_s)}
    if info.confidence:
        data["confidence"] = {**judge_targets(list(info.confidence), latency,
                                              confidence_after_s, info.duration_s),
                              "schedule_ended": ended, "ceiling_s": info.duration_s}
    book = None
    if info.llm is not None:
        from ..llm.accounting import TokenBook, llm_block

        book = TokenBook(spec)
        for p in parts:
            if p.tokens is not None:
                book.add(p.tokens)
        from ..llm.accounting import ENGINE

        block = llm_block(book, info.warmup_s)
        data["requests"]["good"] = block.pop("good")
        data["requests"]["warmup_ok"] = book.warmup_ok
        data.update(info.llm)
        data.update(block)
        data["histograms"].update({k: encode(book.hists[k])
                                   for k in ("ttft", "itl", "itl_per_token", "tpot", "e2e",
                                             "first_chunk", *ENGINE) if book.hists[k].total})
        if info.hdr_interval_s:
            from ..llm.accounting import completed_over_time

            for k in ("ttft", "itl"):  # ITL: by its request's intended start
                data["over_time"][k] = over_time(book.over_intervals(k), info.hdr_interval_s)
            data["over_time"]["completed"] = completed_over_time(book, info.hdr_interval_s)
    from .fastpath import fallback_note
    from .protocols import scheme_of

    note = fallback_note(info.engine, scheme_of(info.target) or info.protocol)
    if note and data["generator"]["engine"] == "python":
        data["generator"]["engine_note"] = note
    missing_workers = sorted(missing_workers)
    if missing_workers and owed is not None:
        lost = sum(owed.get(w, 0) for w in missing_workers)
        data["requests"]["lost"] = lost
        data["requests"]["scheduled"] += lost
    data["accounting"] = accounting(data)
    data["warnings"] = warnings(data, info, parts, missing_workers)
    return BenchResult(data, latency, service, lateness, intervals, info, book)


def offered_series(info: RunInfo, intervals: Mapping[int, Histogram],
                   measured_s: float) -> dict[str, Any]:
    """The offered rate over time, per interval of the measured part (by intended start):
    what the schedule asked for (``target_rps``: the ramp's mean over the interval, else
    ``--rate``), the requests intended in it that were sent (``sent_rps``), and their
    latency P99 (ms; None without samples)."""
    step = info.hdr_interval_s
    out: dict[str, Any] = {"interval_s": step, "ramp": info.ramp.json() if info.ramp else None}
    if not step or measured_s <= 0:
        return {**out, "t_s": [], "target_rps": [], "sent_rps": [], "p99_ms": []}
    n = max(int(math.ceil(measured_s / step - 1e-9)), 1)
    t0 = np.arange(n, dtype=np.float64) * step
    width = np.minimum(t0 + step, measured_s) - t0
    if info.ramp is not None:
        w = info.warmup_s
        target = (info.ramp.cumulative(w + t0 + width) - info.ramp.cumulative(w + t0)) / width
    else:
        target = np.full(n, float(info.rate))
    hs = [intervals.get(k) for k in range(n)]
    sent = np.array([h.total if h is not None else 0 for h in hs], dtype=np.float64) / width
    p99 = [round(min(h.value_at_percentile(99.0), h.max) / NS_PER_MS, 3)
           if h is not None and h.total else None for h in hs]
    return {**out, "t_s": [round(float(t), 6) for t in t0],
            "target_rps": [round(float(v), 3) for v in target],
            "sent_rps": [round(float(v), 3) for v in sent], "p99_ms": p99}


def _dial_times(parts: Sequence[WorkerResult], spec: HistogramSpec) -> dict[str, Any]:
    """Connect and TLS handshake times of the connections opened (handshake: TLS only)."""
    out = {"connect_ms": summarize(merged((p.connect_time for p in parts
                                           if p.connect_time is not None), spec))}
    shakes = [p.handshake_time for p in parts if p.handshake_time is not None]
    if shakes:
        out["handshake_ms"] = summarize(merged(shakes, spec))
    return out


def _sum_books(books: Iterable[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for book in books:
        for kind, reasons in book.items():
            mine = out.setdefault(kind, {})
            for reason, n in reasons.items():
                mine[reason] = mine.get(reason, 0) + n
    return out


def _top(reasons: dict[str, int]) -> list[dict[str, Any]]:
    """The most frequent reasons first; past MAX_REASONS they add up under 'other'."""
    ranked = sorted(((n, r) for r, n in reasons.items() if r != OTHER_REASONS),
                    key=lambda x: (-x[0], x[1]))
    rest = reasons.get(OTHER_REASONS, 0) + sum(n for n, _ in ranked[MAX_REASONS:])
    out = [{"reason": r, "count": n} for n, r in ranked[:MAX_REASONS]]
    if rest:
        out.append({"reason": OTHER_REASONS, "count": rest})
    return out


def merge_reasons(books: Iterable[dict[str, dict[str, int]]]) -> dict[str, list[dict[str, Any]]]:
    """Per-worker ``{kind: {reason: count}}`` merged by kind and reason, counts summed."""
    return {k: _top(r) for k, r in sorted(_sum_books(books).items())}


def accounting(data: dict[str, Any]) -> dict[str, Any]:
    """Check the independent counters against each other (a bookkeeping bug shows)."""
    req = data["requests"]
    problems = []
    lost = req.get("lost", 0)  # owed by a generator node that never reported (--ray)
    if req["scheduled"] != req["sent"] + req["abandoned"] + lost:
        problems.append(f"scheduled {req['scheduled']} != sent {req['sent']} + abandoned "
                        f"{req['abandoned']}" + (f" + lost {lost}" if lost else ""))
    if req["sent"] != req["ok"] + sum(req["errors"].values()):
        problems.append(f"sent {req['sent']} != ok {req['ok']} + errors "
                        f"{sum(req['errors'].values())}")
    if data["latency_ms"]["count"] != req["sent"]:
        problems.append(f"latency count {data['latency_ms']['count']} != sent {req['sent']}")
    return {"consistent": not problems, "problems": problems}


def warnings(data: dict[str, Any], info: RunInfo, parts: Sequence[WorkerResult],
             missing: list[int]) -> list[str]:
    """What a reader must know before trusting the figures."""
    out = []
    for p in data["accounting"]["problems"]:
        out.append(f"accounting does not add up ({p}): a tailgate bug, please report it")
    conn_errs = data["connections"]["errors"]
    if conn_errs:
        out.append("the server broke the protocol with no request in flight ("
                   + ", ".join(f"{k} {v}" for k, v in conn_errs.items())
                   + "): those connections were dropped; no request was charged")
    if missing:
        lost = data["requests"].get("lost")
        out.append(f"workers {missing} sent no result: "
                   + (f"the {lost} request(s) they owed are counted as lost"
                      if lost is not None else "their requests are missing"))
    if data["interrupted"]:
        out.append(f"interrupted: results cover the {data['requests']['sent']} requests "
                   f"completed; {data['requests']['abandoned']} in flight were abandoned")
    lat = data["latency_ms"]
    for name in TAIL:
        n = lat["samples_above"][name]
        if lat["count"] and n < info.min_tail_samples:
            out.append(f"latency {name} rests on {n} sample(s) above it (fewer than "
                       f"{info.min_tail_samples}): not a reliable {name}; run longer or faster")
    for key in ("latency_ms", "service_time_ms", "lateness_ms"):
        if data[key]["clamped"]:
            out.append(f"{data[key]['clamped']} {key[:-3]} value(s) outside the histogram "
                       f"range were clamped to its ends")
    late99, lat99 = data["lateness_ms"]["p99"], lat["p99"]
    held = info.coalesce_s * 1e3  # waits asked for with --coalesce are not falling behind
    if data["lateness_ms"]["count"] and late99 - held > max(1.0, 0.1 * lat99):
        beyond = f", {held:g} ms of it asked for with --coalesce" if held else ""
        out.append(f"the generator fell behind its schedule (lateness p99 {late99:.3f} ms"
                   f"{beyond}): the latency figures include it; add --workers or lower --rate")
    capped = [p for p in parts if p.connections.get("cap") and
              p.connections.get("max_open", 0) >= p.connections["cap"]]
    if capped and data["requests"]["queued"]:
        out.append(f"--max-connections reached: {data['requests']['queued']} request(s) "
                   f"waited for a free connection; latency counts their wait, service time "
                   f"does not")
    if data["arrivals"]["verdict"] == "deviate":
        out.append(data["arrivals"]["statement"])
    tc = data.get("token_check")
    if tc and tc["usage_mismatch"]:
        ex = ", ".join(f"{e['client']} streamed vs {e['usage']}" for e in tc["mismatch_examples"])
        out.append(f"{tc['usage_mismatch']} of {tc['usage_compared']} request(s): the tokens "
                   f"streamed do not add up to usage.completion_tokens (e.g. {ex}): "
                   + ("itl_per_token_ms assumed one token per chunk where the server did not "
                      "say (--continuous-usage asks vLLM to)" if tc["chunk_tokens_assumed_one"]
                      else "the server's own per-chunk counts disagree with its usage")
                   + "; see docs/llm-tokens.md")
    if data["stationarity"]["verdict"] == "drifted":
        out.append(data["stationarity"]["statement"])
    conf = data.get("confidence")
    if conf is not None and not conf["reached"]:
        out.append("--confidence not reached within --duration "
                   f"{info.duration_s:g} s: " + "; ".join(
                       f"{t['expr']} is {fmt_width(t['width_ms'])} wide" if t["width_ms"]
                       is not None else f"{t['expr']}: {t.get('reason', 'not measurable')}"
                       for t in conf["targets"] if not t["reached"]))
    stale = data["requests"]["errors"].get("stale_connection", 0)
    if stale and not info.retry_stale:
        # (llama-server closes every streamed response's connection although it answers
        # "Keep-Alive: timeout=5, max=100"; a loop that reuses it at once, with requests
        # waiting, races that close: 442 of 1,000 requests at 200 req/s on 64 slots)
        out.append(f"{stale} request(s) went out on kept-alive connections the server had "
                   "already closed (stale_connection): the server closes connections it "
                   "offered to keep; --retry-stale sends each such request again on a new "
                   "connection")
    if not data["generator"]["precise_timer"]:
        out.append("no timerfd: wake-ups have millisecond resolution (see lateness)")
    gen = data["generator"]
    if gen.get("read_pauses"):
        out.append(f"the generator stopped reading {gen['read_pauses']} times for "
                   f"{1e3 * gen['read_paused_s']:.0f} ms in all: the chunks' JSON fell behind "
                   "(4 MiB of events waiting), so chunks read together after a pause share "
                   "the last one's arrival time; a lower --rate or more --workers")
    return out


def _read_lag(parts: Sequence[WorkerResult], spec: Any) -> dict[str, Any] | None:
    lags = [p.read_lag for p in parts if p.read_lag is not None]
    return summarize(merged(lags, spec)) if lags else None


def fmt_width(ms: float) -> str:
    """A confidence interval's width, in ms from 1 ms up, else in µs."""
    return f"{ms:.3g} ms" if ms >= 1 else f"{ms * 1e3:.3g} µs"


def write_hdr(out: IO[str], result: BenchResult, start_epoch_s: float) -> None:
    """The latency histogram as an HdrHistogram interval log (values in ns, max column ms).

    With per-interval histograms (``hdr_interval_s``) one line per interval,
    by intended start time; otherwise one line for the whole run. Adding all
    lines gives exactly ``result.latency``.
    """
    step = result.info.hdr_interval_s
    whole = max(result.json["duration_s"], 0.0)
    if result.tokens is not None:
        # openai+: one tagged series per metric (HdrHistogram's Tag=), the same intervals.
        ivs = []
        for tag, name in (("TTFT", "ttft"), ("ITL", "itl"), ("E2E", "e2e")):
            per = result.tokens.over_intervals(name)
            if per and step:
                ivs += [Interval(k * step, step, per[k], tag) for k in sorted(per)]
            else:
                ivs.append(Interval(0.0, whole, result.tokens.hists[name], tag))
        order = {"TTFT": 0, "ITL": 1, "E2E": 2}
        ivs.sort(key=lambda iv: (iv.start_s, order[iv.tag or ""]))  # in time, as Java writes
        write_log(out, ivs, start_epoch_s,
                  comment=f"tailgate bench {result.info.target}: TTFT, ITL and E2E "
                          f"(from intended start), ns")
        return
    if result.intervals and step:
        ivs = [Interval(k * step, step, result.intervals[k]) for k in sorted(result.intervals)]
    else:
        ivs = [Interval(0.0, whole, result.latency)]
    write_log(out, ivs, start_epoch_s,
              comment=f"tailgate bench {result.info.target}: latency from intended start, ns")


def merge_logs(out: IO[str], part_paths: Iterable[str], llm: bool = False) -> int:
    """Concatenate the workers' per-request CSV parts under one header; returns rows."""
    out.write(LLM_LOG_HEADER if llm else LOG_HEADER)
    rows = 0
    for path in part_paths:
        try:
            with open(path, encoding="ascii") as f:
                for line in f:
                    out.write(line)
                    rows += 1
        except FileNotFoundError:
            continue
    return rows


def _headers() -> list[list[str]]:
    old = LOG_HEADER.replace(",arrive_s", "")  # (before arrive_s; still read)
    llm_tail = LLM_LOG_HEADER[len(LOG_HEADER) - 1:]
    # (before the longest gap and the engine's columns; still read)
    llm_old = llm_tail[:llm_tail.index(",gap_from_s")] + "\n"
    v2_tail = LLM_LOG_HEADER_V2[len(LOG_HEADER) - 1:]  # (before the per-token columns)
    return [h.strip().split(",") for h in (LOG_HEADER, LLM_LOG_HEADER, old,
                                           old[:-1] + llm_tail, LOG_HEADER[:-1] + llm_old,
                                           old[:-1] + llm_old, LLM_LOG_HEADER_V2,
                                           old[:-1] + v2_tail)]


_LOG_HEADERS = _headers()


def read_log(text: str) -> dict[str, np.ndarray]:
    """Parse a per-request log (pure) into columns; empty ``send_s`` -> NaN.

    Times are seconds from the run's start: ``intended_s``, ``dispatch_s``,
    ``send_s``, ``end_s``, ``arrive_s`` (when the kernel received the reply's last bytes;
    NaN where not known: the Python engine, or a log from before the column).
    ``outcome`` is the kind name; ``engine_state`` "ok", "bad" or "", ``engine_tokens_state``
    "ok", "" or "bad: " and the reason, and the other ``engine_*`` counts, times and
    durations floats (NaN where the engine sent none).
    """
    f = io.StringIO(text)
    header = f.readline().strip().split(",")
    if header not in _LOG_HEADERS:
        raise ValueError(f"not a tailgate request log (header {header!r})")
    cols: dict[str, list[Any]] = {h: [] for h in header}
    for n, line in enumerate(f, 2):
        parts = line.rstrip("\n").split(",")
        if len(parts) != len(header):
            raise ValueError(f"line {n}: {len(parts)} fields, expected {len(header)}")
        for h, v in zip(header, parts, strict=True):
            cols[h].append(v)
    if "arrive_s" not in cols:  # a log written before replies' arrival times were kept
        cols["arrive_s"] = [""] * len(cols["id"])
    out: dict[str, np.ndarray] = {}
    for h, vals in cols.items():
        if h in ("outcome", "engine_state", "engine_tokens_state"):
            out[h] = np.array(vals, dtype=object)
        elif h.endswith("_s") or h.startswith("engine_"):
            out[h] = np.array([float(v) if v else math.nan for v in vals], dtype=np.float64)
        else:
            out[h] = np.array([int(v) for v in vals], dtype=np.int64)
    return out
