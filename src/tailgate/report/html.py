"""A self-contained HTML report (no scripts, no external assets)."""

from __future__ import annotations

import html
import json

from ..model import LAYERS, Report
from .safe import clean_report

_COLORS = {"pass": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e", "skip": "#6e7781",
           "unknown": "#8250df", "incomplete": "#8250df", "error": "#a40e26"}
_NAMES = {"L1": "physical interconnect and clocks", "L2": "kernel scheduling and I/O",
          "L3": "user-space data plane", "L4": "inference engine"}


def _cell(value) -> str:
    return html.escape("" if value is None else str(value))


def render_html(report: Report) -> str:
    report = clean_report(report)  # control characters escaped; html.escape does the markup
    v = report.verdict
    head = (f"<h1>tailgate inspect: {_cell(report.host.get('hostname'))}</h1>"
            f"<p class='verdict' style='color:{_COLORS[v.status]}'>verdict: {v.status.upper()}"
            + (f" &mdash; fix {v.first_failing_layer} first" if v.first_failing_layer else "")
            + f"</p><p>{_cell(json.dumps(v.counts))} &middot; tailgate {_cell(report.version)}"
            f" &middot; interval {report.interval_s:.2f} s</p>")
    if report.platform:
        from .terminal import platform_line

        head += f"<p class='platform'>platform: {_cell(platform_line(report.platform))}</p>"
    missing = [*(f"{u['id']} (required): {u['reason']}" for u in v.unmet_required),
               *(f"{u['id']} [{u['subject']}]: {u['reason']}"
                 + (f" -- needs {u['needs']}" if u["needs"] else "") for u in v.unmeasured)]
    if missing:  # what stayed unmeasured, and what would measure it
        head += "<p>not measured:</p><ul>" + "".join(
            f"<li>{_cell(m)}</li>" for m in missing) + "</ul>"
    rows = []
    for layer in LAYERS:
        rows.append(f"<tr class='layer'><th colspan='6'>{layer} &mdash; {_NAMES[layer]}</th></tr>")
        for f in (f for f in report.findings if f.layer == layer):
            evidence = html.escape(json.dumps(f.evidence, default=str, sort_keys=True))
            rows.append(
                f"<tr><td style='color:{_COLORS[f.status]};font-weight:bold'>{f.status}</td>"
                f"<td><code>{_cell(f.id)}</code></td><td>{_cell(f.subject)}</td>"
                f"<td>{_cell(f.observed)} {_cell(f.unit)}</td><td>{_cell(f.limit)}</td>"
                f"<td>{_cell(f.reason)}<details><summary>remedy &amp; evidence</summary>"
                f"<p>{_cell(f.remedy)}</p><pre>{evidence}</pre></details></td></tr>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;width:100%}"
             "td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}"
             "tr.layer th{background:#f6f8fa}.verdict{font-size:1.4em;font-weight:bold}"
             "pre{white-space:pre-wrap;font-size:.8em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>tailgate report</title>"
            f"<style>{style}</style></head><body>{head}<table><tr><th>status</th><th>id</th>"
            f"<th>subject</th><th>observed</th><th>limit</th><th>reason</th></tr>"
            + "".join(rows) + "</table></body></html>\n")
