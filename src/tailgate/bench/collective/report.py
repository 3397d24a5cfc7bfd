"""The collective result document: JSON, SLOs per size, terminal table, HdrHistogram log.

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

import json
from typing import IO, Any

from ...hist import Histogram, encode
from ...slo import Slo, evaluate
from ...slo import parse_slo as _parse_slo
from .spec import format_size

SCHEMA = 1
CUSTOM_METRICS = {"busbw": "count", "algbw": "count", "wrong": "count"}
SLO_EXAMPLES = "p999<200ms, p99<5ms, max<1s, busbw>=10 (GB/s), algbw>=5, wrong<=0"
_TAIL = ("p99", "p999", "p9999")


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


def _us(block: dict[str, Any], key: str) -> str:
    v = (block.get("latency_ms") or {}).get(key)
    return f"{v * 1e3:>10.1f}" if v is not None else f"{'-':>10}"


def summary_text(doc: dict[str, Any]) -> str:
    """The terminal report: one row per size (and placement), then warnings and SLOs."""
    cfg = doc.get("config") or {}
    head = (f"{doc['collective']} over {doc.get('ranks') or '?'} rank(s)"
            + (f" on {len(set(doc['hosts']))} host(s)"
               if doc.get("hosts") and len(doc["hosts"]) == doc.get("ranks") else "")
            + f", {doc.get('backend') or doc['source']}"
            + (f" ({doc['library']})" if doc.get("library") else ""))
    lines = [head]
    if doc["source"] == "tailgate":
        place = str(cfg.get("placement", "")).replace("_", "-")
        lines.append(f"{cfg.get('dtype')} {cfg.get('op')}, {place}, {cfg.get('iters')} iterations "
                     f"(+{cfg.get('warmup')} warm-up) per size, gap {cfg.get('gap_s', 0) * 1e3:g} "
                     "ms; latency: each iteration as the slowest rank saw it")
    else:
        lines.append(f"read from nccl-tests output ({doc.get('file') or 'stdin'}): "
                     "means only, no distribution")
    lines.append("")
    cols = ("p50 us", "p90 us", "p99 us", "p999 us", "max us", "mean us", "algbw GB/s",
            "busbw GB/s", "wrong")
    lines.append(f"{'size':>10}{'place':>6}" + "".join(f"{c:>11}" for c in cols)
                 + "  straggler")
    for b in doc["sizes"]:
        wrong = "n/a" if b.get("wrong") is None else str(b["wrong"])
        st = b.get("straggler")
        who = (f"rank {st['rank']} ({st['share'] * 100:.0f}% of the tail, "
               f"{st['tail_iterations']} it.)") if st else "-"
        place = {"out_of_place": "out", "in_place": "in"}.get(b.get("placement"), "-")
        lines.append(
            f"{format_size(b['bytes']):>10}{place:>6} "
            + "".join(f"{_us(b, k)} " for k in ("p50", "p90", "p99", "p999", "max"))
            + f"{b['time_us']:>10.1f} {b['algbw_gbps']:>10.3f} {b['busbw_gbps']:>10.3f} "
            + f"{wrong:>10}  {who}")
    counts = [b["latency_ms"]["count"] for b in doc["sizes"]
              if (b.get("latency_ms") or {}).get("samples_above")]
    if counts:
        lines.append(f"samples per size: {min(counts)}" + (
            f"..{max(counts)}" if max(counts) != min(counts) else "")
            + "; samples above p999: " + ", ".join(
                str(b["latency_ms"]["samples_above"]["p999"]) for b in doc["sizes"]))
    for w in doc.get("warnings", []):
        lines.append(f"warning: {w}")
    for s in doc.get("slo", []):
        verdict = "pass" if s["pass"] else "FAIL"
        if s["observed"] is None:
            shown = "no value at any size"
        else:
            shown = f"worst {s['observed']:.6g} {s['unit'] if s['unit'] == 'ms' else ''}".rstrip()
        bad = list(dict.fromkeys(format_size(r["bytes"]) for r in s["per_size"] if not r["pass"]))
        lines.append(f"SLO {s['expr']}: {verdict} ({shown})"
                     + (f" at {', '.join(bad)}" if bad else ""))
    return "\n".join(lines)


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


def render_html(doc: dict[str, Any]) -> str:
    """A self-contained page (no scripts, no external assets): the table, warnings, SLOs."""
    import html

    def cell(v: Any) -> str:
        return html.escape("" if v is None else str(v))

    cols = ("size", "placement", "p50 us", "p90 us", "p99 us", "p999 us", "max us", "mean us",
            "algbw GB/s", "busbw GB/s", "wrong", "straggler")
    rows = []
    for b in doc["sizes"]:
        lat = b.get("latency_ms") or {}
        us = [f"{lat[k] * 1e3:.1f}" if lat.get(k) is not None else "-"
              for k in ("p50", "p90", "p99", "p999", "max")]
        st = b.get("straggler")
        who = f"rank {st['rank']} ({st['share'] * 100:.0f}% of the tail)" if st else "-"
        wrong = "n/a" if b.get("wrong") is None else b["wrong"]
        bad = " class='bad'" if b.get("wrong") else ""
        vals = (format_size(b["bytes"]), b.get("placement"), *us, f"{b['time_us']:.1f}",
                f"{b['algbw_gbps']:.3f}", f"{b['busbw_gbps']:.3f}", wrong, who)
        rows.append(f"<tr{bad}>" + "".join(f"<td>{cell(v)}</td>" for v in vals) + "</tr>")
    notes = "".join(f"<li>warning: {cell(w)}</li>" for w in doc.get("warnings", []))
    notes += "".join(
        f"<li class='{'ok' if s['pass'] else 'bad'}'>SLO {cell(s['expr'])}: "
        f"{'pass' if s['pass'] else 'FAIL'} (worst {cell(s['observed'])})</li>"
        for s in doc.get("slo", []))
    title = (f"tailgate bench {cell(doc['collective'])}: {cell(doc.get('ranks'))} ranks, "
             f"{cell(doc.get('backend'))} ({cell(doc.get('library'))}), source "
             f"{cell(doc['source'])}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>" + title + "</title>"
            "<style>body{font-family:sans-serif}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
            ".bad{color:#cf222e}.ok{color:#1a7f37}</style></head><body>"
            f"<h1>{title}</h1><p>{cell(json.dumps(doc.get('config')))}</p><table><tr>"
            + "".join(f"<th>{c}</th>" for c in cols) + "</tr>" + "".join(rows)
            + f"</table><ul>{notes}</ul></body></html>\n")
