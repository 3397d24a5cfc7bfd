"""A rate sweep (`tailgate bench --sweep`, :mod:`tailgate.plan.sweep`) on a terminal and as
an HTML page of its latency-throughput curve."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..outputs import write_output
from ..plan.sweep import Point, Sweep
from .plan_plot import line_chart_html


def _ms(v: float | None) -> str:
    return f"{v:>10.3f}" if v is not None else f"{'-':>10}"


def summary(points: Sequence[Point], top: Point | None, k: Point | None, has_slo: bool,
            knee_why: str = "") -> str:
    llm = any(p.output_tokens_per_s is not None for p in points)
    head = (f"{'offered/s':>12}{'achieved/s':>12}{'p50 ms':>10}{'p99 ms':>10}{'p999 ms':>10}"
            + (f"{'out tok/s':>11}{'goodput/s':>11}" if llm else "") + "  result")
    lines = [head]
    for p in points:
        verdict = ("holds" if p.holds else "SLO failed" if not p.slo_pass
                   else "not sustained") if has_slo else ("" if p.sustained else "not sustained")
        lines.append(f"{p.rate:>12,.1f}{p.achieved:>12,.1f}{_ms(p.p50_ms)}{_ms(p.p99_ms)}"
                     f"{_ms(p.p999_ms)}"
                     + (f"{p.output_tokens_per_s or 0:>11,.1f}{p.goodput_rps or 0:>11,.2f}"
                        if llm else "") + f"  {verdict}")
    if has_slo:
        lines.append(f"highest rate meeting every SLO: {top.rate:,.1f}/s (achieved "
                     f"{top.achieved:,.1f}/s, p99 {_ms(top.p99_ms).strip()} ms)" if top else
                     "no rate tried met every SLO: lower the sweep's LO")
        if top and top.output_tokens_per_s is not None:
            lines.append(f"decode throughput at the SLO: {top.output_tokens_per_s:,.1f} output "
                         f"tokens/s, goodput {top.goodput_rps:,.2f} requests/s")
    if k:
        lines.append(f"knee: {k.achieved:,.1f}/s achieved (p99 {_ms(k.p99_ms).strip()} ms): "
                     "beyond it latency rises faster than throughput"
                     + (f" ({knee_why})" if knee_why else ""))
    elif knee_why:
        lines.append(knee_why)
    return "\n".join(lines)


def html(target: str, points: Sequence[Point], top: Point | None, k: Point | None) -> str:
    pts = [p for p in points if p.p99_ms is not None]
    xs = [p.achieved for p in pts]
    series = [(name, xs, [getattr(p, attr) or 0.0 for p in pts])
              for name, attr in (("p50", "p50_ms"), ("p99", "p99_ms"), ("p999", "p999_ms"))]
    notes = [f"target {target}"]
    if top:
        notes.append(f"highest rate meeting every SLO: {top.rate:,.1f}/s")
    if k:
        notes.append(f"knee: {k.achieved:,.1f}/s (p99 {_ms(k.p99_ms).strip()} ms)")
    return line_chart_html(f"latency vs throughput: {target}", "achieved rate (requests/s)",
                           "latency (ms)", series, notes)


def progress_line(rate: float, p: Point) -> str:
    """One rate measured, as the sweep goes (standard error)."""
    return (f"  rate {rate:>12,.1f}/s  achieved {p.achieved:>12,.1f}/s  p99 "
            f"{_ms(p.p99_ms)}  {'holds' if p.holds else 'fails'}")


def text(sweep: Sweep) -> str:
    """The finished sweep's table and verdict lines."""
    return summary(list(sweep.points), sweep.top, sweep.knee, sweep.has_slo, sweep.knee_reason)


def save(sweep: Sweep, json_path: str | None = None, html_path: str | None = None) -> None:
    """Write the sweep's JSON document and its HTML curve where asked (``-``: stdout)."""
    if json_path:
        write_output(json_path, json.dumps(sweep.to_json(), indent=2) + "\n")
    if html_path:
        write_output(html_path, html(sweep.target, list(sweep.points), sweep.top, sweep.knee))
