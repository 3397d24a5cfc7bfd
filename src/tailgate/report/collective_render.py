"""A collective's document (``tailgate bench allreduce``, :mod:`tailgate.bench.collective`)
on a terminal and as a self-contained HTML page, and its files written where the user asked
(rank 0 alone calls :func:`save`)."""

from __future__ import annotations

import json
import sys
from typing import Any

from ..bench.collective.result import write_hdr
from ..bench.collective.spec import format_size
from ..hist import Histogram
from ..outputs import write_output


def save(doc: dict[str, Any], json_path: str | None = None, html_path: str | None = None,
         hdr_path: str | None = None, hists: list[tuple[float, float, Histogram]] | None = None,
         start_epoch_s: float = 0.0) -> None:
    """Write the document's JSON, HTML page and HdrHistogram log where asked (``-``:
    stdout), then print its terminal report (on stderr when the JSON went to stdout)."""
    if json_path:
        write_output(json_path, json.dumps(doc, indent=2) + "\n")
    if html_path:
        write_output(html_path, render_html(doc))
    if hdr_path:
        with open(hdr_path, "w", encoding="ascii") as f:
            write_hdr(f, doc, hists or [], start_epoch_s)
    stream = sys.stderr if json_path == "-" else sys.stdout
    print(summary_text(doc), file=stream, flush=True)


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
