"""The collective result document: JSON, SLOs per size, exit status, HdrHistogram log (its
terminal table and HTML page are :mod:`tailgate.report.collective_render`'s).

The document (``tailgate_collective: 1``) is the same whether tailgate
measured it or it was read from nccl-tests output (:mod:`.nccl_tests`)::

    {"tailgate_collective": 1, "source": "tailgate" | "nccl-tests", "collective",
     "backend", "library", "ranks", "hosts", "config": {...}, "clock": {...},
     "sizes": [{"bytes", "count", "dtype", "op", "placement", "iterations",
                "time_us", "algbw_gbps", "busbw_gbps", "wrong",
                "latency_ms": {"p50", "p90", "p99", "p999", "p9999", "max", "mean",
                               "count", "samples_above", "clamped"},
                "histogram_ns": "HISTFAAA..." (HdrHistogram V2, ns; measured runs only),
                "straggler": {"rank", "host", "tail_iterations", "tail_ms", "share",
                              "delay_ms", "last_arrivals"},
                "per_rank": [...]}],
     "warnings": [...], "slo": [{"expr", "pass", "observed", "per_size": [...]}]}

``time_us`` is the mean per-iteration time and the bandwidths are computed
from it with nccl-tests' formulas; ``wrong`` is the number of wrong result
elements (``null``: not checked). A block from nccl-tests has no
distribution: its ``latency_ms`` holds only what nccl-tests printed (the mean,
and with ``-I 1`` the per-iteration max and P99), never zero-filled.
"""

from __future__ import annotations

from typing import IO, Any

from ...hist import Histogram, encode
from ...slo import Slo, evaluate
from ...slo import parse_slo as _parse_slo
from .spec import format_size

SCHEMA = 1
CUSTOM_METRICS = {"busbw": "count", "algbw": "count", "wrong": "count"}
SLO_EXAMPLES = "p999<200ms, p99<5ms, max<1s, busbw>=10 (GB/s), algbw>=5, wrong<=0"


def parse_slo(expr: str) -> Slo:
    """A bench SLO (``p999<200ms``) or a collective one (``busbw>=10``: GB/s), per size."""
    try:
        return _parse_slo(expr, CUSTOM_METRICS)
    except ValueError as exc:
        raise ValueError(f"{exc} (collectives: {SLO_EXAMPLES})") from None


def _per_size_view(block: dict[str, Any]) -> dict[str, Any]:
    """One size seen as a bench result, so tailgate.slo evaluates it unchanged."""
    return {"latency_ms": block.get("latency_ms") or {},
            "metrics": {"busbw": block.get("busbw_gbps"), "algbw": block.get("algbw_gbps"),
                        "wrong": block.get("wrong")}}


def evaluate_slos(slos: list[Slo], sizes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each SLO holds only if it holds at every size (and a size without the figure fails)."""
    out = []
    for slo in slos:
        rows = []
        for block in sizes:
            rec = evaluate([slo], _per_size_view(block))[0]
            row = {"bytes": block["bytes"], "placement": block.get("placement"),
                   "observed": rec["observed"], "pass": rec["pass"]}
            if "reason" in rec:
                row["reason"] = rec["reason"]
            rows.append(row)
        observed = [r["observed"] for r in rows if r["observed"] is not None]
        worst = None
        if observed:
            worst = max(observed) if slo.op in ("<", "<=") else min(observed)
        rec = {"expr": slo.expr, "metric": slo.metric, "op": slo.op, "limit": slo.limit,
               "unit": slo.unit, "observed": worst,
               "pass": bool(rows) and all(r["pass"] for r in rows), "per_size": rows}
        if not rows:
            rec["reason"] = "no sizes"
        out.append(rec)
    return out


def warnings(sizes: list[dict[str, Any]], min_tail_samples: int) -> list[str]:
    """What a reader must know before trusting the figures."""
    out = []
    wrong = [b for b in sizes if b.get("wrong")]
    if wrong:
        total = sum(b["wrong"] for b in wrong)
        out.append(f"{total} wrong result element(s) at "
                   + ", ".join(format_size(b["bytes"]) for b in wrong)
                   + ": the results are corrupt, the timings are not to be trusted")
    thin = [b for b in sizes if (b.get("latency_ms") or {}).get("samples_above") is not None
            and b["latency_ms"]["count"]
            and b["latency_ms"]["samples_above"]["p999"] < min_tail_samples]
    if thin:
        n = thin[0]["latency_ms"]["count"]
        out.append(f"p999 rests on fewer than {min_tail_samples} samples above it at "
                   f"{len(thin)} size(s) ({n} iterations): use --iters "
                   f"{min_tail_samples * 1000} or more for a reliable p999")
    clamped = sum((b.get("latency_ms") or {}).get("clamped", 0) for b in sizes)
    if clamped:
        out.append(f"{clamped} iteration time(s) outside the histogram range were clamped")
    return out


def exit_status(doc: dict[str, Any]) -> int:
    """1 when a result was wrong (or nccl-tests counted out-of-bounds values), an SLO
    failed, else 0."""
    if any(b.get("wrong") for b in doc["sizes"]):
        return 1
    if (doc.get("nccl_tests") or {}).get("out_of_bounds"):
        return 1
    return 0 if all(s["pass"] for s in doc.get("slo", [])) else 1


def write_hdr(out: IO[str], doc: dict[str, Any], hists: list[tuple[float, float, Histogram]],
              start_epoch_s: float) -> None:
    """One HdrHistogram log line per size, tagged ``Tag=<bytes>B`` (values in ns).

    ``hists`` holds (start s, length s, histogram) per size, in the order of
    ``doc["sizes"]``. The log format is HdrHistogram's 1.3 (tags as its Java
    HistogramLogWriter writes them), so its readers split the sizes apart.
    """
    import datetime as _dt

    when = _dt.datetime.fromtimestamp(start_epoch_s, _dt.UTC).isoformat(" ")
    out.write(f"#tailgate bench {doc['collective']} ({doc.get('backend')}, {doc.get('ranks')} "
              "ranks): per-iteration time of the slowest rank, ns; one tag per message size\n")
    out.write("#[Histogram log format version 1.3]\n")
    out.write(f"#[StartTime: {start_epoch_s:.3f} (seconds since epoch), {when}]\n")
    out.write('"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"\n')
    for block, (t0, length, h) in zip(doc["sizes"], hists, strict=True):
        out.write(f"Tag={block['bytes']}B,{t0:.3f},{length:.3f},{h.max / 1e6:.3f},{encode(h)}\n")
