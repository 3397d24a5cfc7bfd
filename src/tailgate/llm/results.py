"""From per-request records to the figures: percentiles, tokens, throughput, goodput, SLOs.

Definitions (every time from the request's *intended* start):

* TTFT: to the first chunk that carries non-empty content. A role-only or empty
  first chunk (chat's ``{"role": "assistant"}``, llama.cpp's empty first text)
  does not count: the user has seen nothing yet. Engines that time the first
  *chunk* report a smaller TTFT; ``first_chunk_ms`` gives that figure too.
* ITL: every gap between consecutive content chunks (a chunk carrying several
  tokens, as with speculative decoding, is one gap).
* TPOT: ``(E2E - TTFT) / (output tokens - 1)``, per request with >= 2 tokens.
* E2E: to the end of the stream (``[DONE]``, or the end of the response).
* Output tokens: the server's ``usage.completion_tokens`` when it sent one for
  every successful request (``counted_by: "usage"``), else one per content chunk
  (``counted_by: "chunks"``). Input tokens likewise, else the workload's word
  count (``input_counted_by: "workload"``).

A request that timed out counts in TTFT and E2E at its time-out (if no token had
come) so the tail keeps it; other failures are counted by kind only.
Goodput: successful requests per second whose own TTFT, TPOT, E2E and ITLs meet
every latency SLO given (for ``itl_pXX`` the request's own XX-th percentile gap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..bench.engine import note_reason
from ..bench.result import merge_reasons
from ..bench.slo import Slo, SloError, evaluate
from ..bench.slo import parse_slo as _bench_parse_slo
from ..hist import Histogram, encode
from .client import ERROR_KINDS, Record
from .run import RunResult

PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9))
METRICS = ("ttft", "itl", "tpot", "e2e")

# SLOs are parsed and evaluated by tailgate.bench.slo (one grammar for every bench); the
# LLM figures are its "custom" metrics, looked up in the result's "metrics" block.
_STATS = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9, "p9999": 99.99, "max": 100.0}
CUSTOM_METRICS: dict[str, str] = {
    **{f"{m}_{stat}": "ms" for m in METRICS for stat in _STATS},
    "goodput_rps": "rate", "requests_per_s": "rate", "output_tokens_per_s": "rate",
}
SLO_EXAMPLES = ("ttft_p999<2s, itl_p99<50ms, tpot_p50<20ms, e2e_max<30s, error_rate<1%, "
                "goodput_rps>=5")


def parse_slo(expr: str) -> Slo:
    """``ttft_p999<2s``, ``itl_p99<=50ms``, ``e2e_max<30s``, ``error_rate<1%``,
    ``goodput_rps>=5`` (also bench's ``p99<...``, which here means E2E)."""
    try:
        return _bench_parse_slo(expr, CUSTOM_METRICS)
    except SloError as exc:
        raise ValueError(f"{exc} (LLM targets: {SLO_EXAMPLES})") from None


def _latency_slo(slo: Slo) -> tuple[str, float] | None:
    """(metric, percentile) of a per-request latency SLO, else None."""
    metric, _, stat = slo.metric.replace(".", "_").partition("_")
    if metric == "latency":  # bench's plain p99<...: E2E
        metric = "e2e"
    if metric in METRICS and stat in _STATS:
        return metric, _STATS[stat]
    return None


@dataclass
class Derived:
    """Per-request figures in nanoseconds (None where not defined)."""

    ttft: int | None
    e2e: int | None
    tpot: float | None
    itl: np.ndarray
    output_tokens: int
    input_tokens: int


def derive(rec: Record) -> Derived:
    itl = np.diff(np.asarray(rec.token_ns, dtype=np.int64)) if len(rec.token_ns) > 1 \
        else np.zeros(0, dtype=np.int64)
    out = rec.completion_tokens if rec.completion_tokens is not None else len(rec.token_ns)
    inp = rec.prompt_tokens if rec.prompt_tokens is not None else rec.nominal_input
    ttft = rec.token_ns[0] - rec.intended_ns if rec.token_ns else None
    e2e = rec.end_ns - rec.intended_ns if rec.end_ns is not None else None
    if rec.error == "timeout" and ttft is None:
        ttft = e2e  # no token by the time-out: TTFT is at least that; keep it in the tail
    tpot = None
    if rec.ok and ttft is not None and e2e is not None and out >= 2:
        tpot = (e2e - ttft) / (out - 1)
    return Derived(ttft, e2e, tpot, itl, out, inp)


def _hist(values: np.ndarray | list) -> Histogram:
    h = Histogram()
    arr = np.asarray(values, dtype=np.float64)
    if arr.size:
        h.record(np.maximum(arr, 0.0))
    return h


def summary(h: Histogram) -> dict[str, Any]:
    """Percentiles in ms with the sample counts behind the tail."""
    out: dict[str, Any] = {}
    vals = h.values_at_percentiles([p for _, p in PERCENTILES])
    for (name, _), v in zip(PERCENTILES, vals, strict=True):
        # HdrHistogram's value may pass the exact max by part of a bucket: show at most max.
        out[name] = round(min(v, h.max) / 1e6, 3) if h.total else None
    out["max"] = round(h.max / 1e6, 3) if h.total else None
    out["count"] = h.total
    out["samples_above"] = {"p99": h.samples_above_percentile(99.0),
                            "p999": h.samples_above_percentile(99.9)}
    return out


def _value_at(h: Histogram, pct: float) -> float:
    return (h.max if pct >= 100.0 else h.value_at_percentile(pct)) / 1e9


def analyse(result: RunResult, slos: list[Slo], *, target: str, model: str, api: str,
            rate: float | None, timeout_s: float, workload: dict[str, Any],
            warmup_s: float = 0.0) -> dict[str, Any]:
    # Requests due in the warm-up are sent and accounted, but kept out of the figures.
    cut = result.start_ns + int(warmup_s * 1e9)
    warm = [r for r in result.records if r.intended_ns < cut] if warmup_s > 0 else []
    records = result.records[len(warm):] if warm else result.records
    derived = [derive(r) for r in records]
    counted = [(r, d) for r, d in zip(records, derived, strict=True)
               if r.ok or r.error == "timeout"]
    ok = [(r, d) for r, d in zip(records, derived, strict=True) if r.ok]
    hists = {
        "ttft": _hist([d.ttft for _, d in counted if d.ttft is not None]),
        "e2e": _hist([d.e2e for _, d in counted if d.e2e is not None]),
        "tpot": _hist([d.tpot for _, d in ok if d.tpot is not None]),
        "itl": _hist(np.concatenate([d.itl for _, d in counted]) if counted else []),
        "lateness": _hist([r.sent_ns - r.intended_ns for r in records if r.sent_ns]),
        # What an engine that counts the first chunk, empty or not, would call TTFT.
        "first_chunk": _hist([r.first_chunk_ns - r.intended_ns for r, _ in ok
                              if r.first_chunk_ns is not None]),
    }
    errors = {k: 0 for k in ERROR_KINDS}
    book: dict[str, dict[str, int]] = {}
    for r in records:
        if r.error:
            errors[r.error] += 1
            note_reason(book, r.error, r.detail or r.error)
    sent = len(records)
    first = cut if warm else result.start_ns
    last_end = max((r.end_ns for r in records if r.end_ns), default=first)
    span_s = max((last_end - first) / 1e9, 1e-9)
    out_tokens = sum(d.output_tokens for _, d in ok)
    in_tokens = sum(d.input_tokens for _, d in ok)
    by_usage = bool(ok) and all(r.completion_tokens is not None for r, _ in ok)
    in_by_usage = bool(ok) and all(r.prompt_tokens is not None for r, _ in ok)

    latency_slos = [(s, ls) for s in slos if (ls := _latency_slo(s)) is not None]
    good = sum(1 for _, d in ok if _request_meets(d, latency_slos))
    out: dict[str, Any] = {
        "target": target, "model": model, "api": api, "mode": result.mode,
        "workload": workload,
        "rate": {"target": rate, "achieved": round(sent / span_s, 3)},
        "duration_s": round(span_s, 3),
        "timeout_s": timeout_s,
        "interrupted": result.interrupted,
        "ttft_ms": summary(hists["ttft"]), "itl_ms": summary(hists["itl"]),
        "tpot_ms": summary(hists["tpot"]), "e2e_ms": summary(hists["e2e"]),
        "lateness_ms": summary(hists["lateness"]),
        "first_chunk_ms": summary(hists["first_chunk"]),
        "tokens": {"input": in_tokens, "output": out_tokens,
                   "counted_by": "usage" if by_usage else "chunks",
                   "input_counted_by": "usage" if in_by_usage else "workload"},
        "throughput": {"output_tokens_per_s": round(out_tokens / span_s, 3),
                       "total_tokens_per_s": round((in_tokens + out_tokens) / span_s, 3),
                       "requests_per_s": round(len(ok) / span_s, 3),
                       "goodput_rps": round(good / span_s, 3)},
        "requests": {"sent": sent, "ok": len(ok), "good": good,
                     "errors": {k: v for k, v in errors.items() if v},
                     "error_examples": merge_reasons([book]),
                     **({"warmup": {"sent": len(warm), "ok": sum(r.ok for r in warm)}}
                        if warm else {})},
    }
    metrics: dict[str, float | None] = {}
    for m in METRICS:
        for stat in _STATS:
            metrics[f"{m}_{stat}"] = out[f"{m}_ms"][stat] if stat != "p9999" else (
                _p9999(hists[m]))
    metrics.update({k: out["throughput"][k] for k in ("goodput_rps", "requests_per_s",
                                                      "output_tokens_per_s")})
    out["metrics"] = metrics
    out["latency_ms"] = out["e2e_ms"]  # bench's plain p99<... reads this: E2E here
    # The recorded histograms (HdrHistogram V2, ns), for `tailgate compare`.
    out["clock"] = {"start_monotonic_s": result.start_ns / 1e9}  # perf_counter: CLOCK_MONOTONIC
    out["histogram_unit"] = "ns"
    out["histograms"] = {k: encode(hists[k]) for k in ("ttft", "itl", "tpot", "e2e")}
    out["slo"] = evaluate(slos, out)
    return out


def _p9999(h: Histogram) -> float | None:
    return round(min(h.value_at_percentile(99.99), h.max) / 1e6, 3) if h.total else None


def _request_meets(d: Derived, slos: list[tuple[Slo, tuple[str, float]]]) -> bool:
    """Whether one request's own figures meet every latency SLO (for goodput)."""
    for slo, (metric, pct) in slos:
        if metric == "itl":
            if d.itl.size == 0:
                continue
            own = (float(d.itl.max()) if pct >= 100.0 else
                   float(np.percentile(d.itl, pct, method="inverted_cdf")))
        else:
            raw = {"ttft": d.ttft, "tpot": d.tpot, "e2e": d.e2e}[metric]
            if raw is None:
                continue
            own = float(raw)
        if not slo.holds(own / 1e6):  # ns -> ms, the SLO's unit
            return False
    return True


def slo_failed(report: dict[str, Any]) -> list[str]:
    return [s["expr"] for s in report["slo"] if not s["pass"]]


def format_report(report: dict[str, Any]) -> str:
    """The terminal summary."""
    lines = [f"tailgate bench {report['target']}  model {report['model']}  api {report['api']}  "
             f"{report['mode']} loop  {report['duration_s']:.2f} s"]
    req = report["requests"]
    errs = ", ".join(f"{k} {v}" for k, v in req["errors"].items()) or "none"
    lines.append(f"requests: sent {req['sent']}, ok {req['ok']}, errors: {errs}")
    for kind, examples in req["error_examples"].items():
        lines.append(f"  {kind}: " + "; ".join(f"{e['reason']} (x{e['count']})"
                                              for e in examples))
    lines.append(f"{'':13}{'p50':>10}{'p90':>10}{'p99':>10}{'p999':>10}{'max':>10}{'count':>9}")
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"),
                      ("e2e_ms", "E2E"), ("first_chunk_ms", "1st chunk"),
                      ("lateness_ms", "late")):
        s = report[key]
        cells = "".join(f"{'-' if s[p] is None else format(s[p], '.2f'):>10}"
                        for p in ("p50", "p90", "p99", "p999", "max"))
        lines.append(f"{name + ' ms':13}{cells}{s['count']:>9}")
    thin = [k for k in ("ttft_ms", "itl_ms", "e2e_ms") if 0 < report[k]["count"] < 1000]
    if thin:
        lines.append("note: a P999 needs >= 1000 samples; "
                     + ", ".join(f"{k[:-3]} has {report[k]['count']}" for k in thin)
                     + " (its P999 is the maximum of too few samples)")
    t, tp = report["tokens"], report["throughput"]
    lines.append(f"tokens: input {t['input']} ({t['input_counted_by']}), output {t['output']} "
                 f"({t['counted_by']})")
    lines.append(f"throughput: {tp['output_tokens_per_s']:.1f} output tok/s, "
                 f"{tp['total_tokens_per_s']:.1f} total tok/s, {tp['requests_per_s']:.2f} req/s, "
                 f"goodput {tp['goodput_rps']:.2f} req/s")
    for s in report["slo"]:
        mark = "pass" if s["pass"] else "FAIL"
        seen = ("no samples" if s["observed"] is None else
                f"{s['observed']:.6g}{'' if s['unit'] in ('fraction', 'count') else s['unit']}")
        lines.append(f"SLO {s['expr']}: {mark} (observed {seen})")
    if report["interrupted"]:
        lines.append("interrupted: figures cover the requests completed before the stop")
    return "\n".join(lines)


def records_json(result: RunResult) -> list[dict[str, Any]]:
    """One record per request (for --log): times in ms from the run's start."""
    def ms(ns: int | None) -> float | None:
        return None if ns is None else round((ns - result.start_ns) / 1e6, 3)

    out = []
    for r in result.records:
        out.append({"index": r.index, "intended_ms": ms(r.intended_ns), "sent_ms": ms(r.sent_ns),
                    "first_token_ms": ms(r.token_ns[0]) if r.token_ns else None,
                    "end_ms": ms(r.end_ns), "chunks": len(r.token_ns), "status": r.status,
                    "error": r.error, "detail": r.detail, "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens, "conversation": r.conversation,
                    "turn": r.turn})
    return out
