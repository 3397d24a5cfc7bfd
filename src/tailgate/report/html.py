"""The inspect page: the pyramid, then per layer its findings drawn against their red lines
and listed in a table; the run-queue latency histogram when a probe window measured it.

Self-contained: the pyramid is inline SVG, the figures plotly (its library inlined, see
:mod:`.plots`). ``with_plots=False`` leaves the figures out and the page script-free (the
fleet page embeds one such page per host).
"""

from __future__ import annotations

import html
import json
import math
from collections import Counter
from typing import Any

from ..model import LAYERS, SEVERITY, Finding, Report
from ..safe import clean_report

_COLORS = {"pass": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e", "skip": "#6e7781",
           "unknown": "#8250df", "incomplete": "#8250df", "error": "#a40e26"}
_FILL = {"pass": "#dafbe1", "warn": "#fff8c5", "fail": "#ffebe9", "skip": "#f6f8fa",
         "unknown": "#fbefff", "error": "#ffd8d3"}
_NAMES = {"L1": "physical interconnect and clocks", "L2": "kernel scheduling and I/O",
          "L3": "user-space data plane", "L4": "inference engine"}
_ORDER = ("error", "fail", "warn", "unknown", "pass", "skip")


def _cell(value) -> str:
    return html.escape("" if value is None else str(value))


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def pyramid_svg(report: Report) -> str:
    """L1 the base, L4 the top, each tier in its layer's status colour with its counts; the
    layer to fix first outlined and named."""
    from .terminal import _layer_status

    first = report.verdict.first_failing_layer
    w, tier, inset, pad = 640, 54, 60, 170
    rows = []
    for i, layer in enumerate(reversed(LAYERS)):  # L4 at the top
        fs = [f for f in report.findings if f.layer == layer]
        status = _layer_status(fs)
        counts = Counter(f.status for f in fs)
        summary = ", ".join(f"{counts[s]} {s}" for s in _ORDER if counts[s]) or "no checks"
        y0, y1 = i * tier, (i + 1) * tier
        top, bottom = (len(LAYERS) - i) * inset, (len(LAYERS) - 1 - i) * inset
        pts = f"{top},{y0} {w - top},{y0} {w - bottom},{y1} {bottom},{y1}"
        mark = layer == first
        rows.append(
            f"<polygon points='{pts}' fill='{_FILL[status]}' stroke='{_COLORS[status]}' "
            f"stroke-width='{4 if mark else 1.5}' data-layer='{layer}' data-status='{status}'/>"
            f"<text x='{w / 2}' y='{y0 + 22}' text-anchor='middle' font-weight='bold' "
            f"fill='{_COLORS[status]}'>{layer} {status.upper()}</text>"
            f"<text x='{w / 2}' y='{y0 + 40}' text-anchor='middle' font-size='12'>"
            f"{_cell(_NAMES[layer])}: {_cell(summary)}</text>")
        if mark:
            rows.append(f"<text x='{w + 12}' y='{y0 + 32}' font-weight='bold' fill='#cf222e' "
                        f"class='fix-first' data-layer='{layer}'>&#9664; fix {layer} first</text>")
    return (f"<svg id='pyramid' xmlns='http://www.w3.org/2000/svg' width='{w + pad}' "
            f"height='{tier * len(LAYERS) + 2}' role='img' aria-label='the pyramid, L1 at the "
            f"base'>" + "".join(rows) + "</svg>")


def drawable(f: Finding) -> bool:
    """A finding whose observed value and red line are both numbers (drawn as a bar)."""
    return f.status != "skip" and _number(f.observed) is not None and _number(f.limit) is not None


def findings_figure(layer: str, findings: list[Finding]):
    """One row per finding: its observed value as a bar on its own axis (the limit's unit),
    the red line at the limit."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    height = 100 + 100 * len(findings)
    gap = 50 / (height - 100)  # 50 px between rows: each row's title clears the axis above it
    fig = make_subplots(rows=len(findings), cols=1, vertical_spacing=min(gap, 0.9 / len(findings)),
                        subplot_titles=[f"{f.id} [{f.subject}]: {f.status}, {float(f.observed):.4g}"
                                        f" {f.unit} (red line {float(f.limit):g})".replace("  ", " ")
                                        for f in findings])
    # Axes and red lines in one layout update: per-row update_xaxes/add_vline calls each
    # walk the whole subplot grid (quadratic in rows, most of a page's render time).
    axes: dict[str, Any] = {}
    shapes = []
    for i, f in enumerate(findings, 1):
        obs, limit = float(f.observed), float(f.limit)
        fig.add_trace(go.Bar(x=[obs], y=[f.subject], orientation="h", name=f.id,
                             marker_color=_COLORS[f.status], showlegend=False,
                             hovertemplate=f"{html.escape(f.id)}: %{{x:.4g}} {html.escape(f.unit)}"
                             f" (limit {limit:g})<extra></extra>"), row=i, col=1)
        n = "" if i == 1 else str(i)
        shapes.append({"type": "line", "x0": limit, "x1": limit, "xref": f"x{n}",
                       "y0": 0, "y1": 1, "yref": f"y{n} domain",
                       "line": {"color": "#cf222e", "width": 2, "dash": "dash"}})
        lo, hi = min(obs, limit, 0.0), max(obs, limit, 0.0)
        span = (hi - lo) or 1.0
        axes[f"xaxis{n}"] = {"range": [lo - 0.05 * span, hi + 0.15 * span]}
        axes[f"yaxis{n}"] = {"showticklabels": False}
    fig.update_layout(shapes=shapes, **axes)
    fig.update_layout(title=f"{layer}: observed value against the red line (dashed)",
                      height=height, bargap=0.3,
                      margin={"l": 30, "r": 30, "t": 70, "b": 30})
    return fig


def runqlat_series(report: Report) -> list[tuple[str, dict[str, Any], float | None]]:
    """Each measured run-queue histogram in the report: ``(subject, evidence, limit)``."""
    return [(f.subject, f.evidence, _number(f.limit)) for f in report.findings
            if f.id == "l2.sched.runqlat" and isinstance(f.evidence.get("buckets"), list)
            and f.evidence["buckets"]]


def _vline(fig, x: float, text: str, line: dict[str, Any], side: str) -> None:
    """A labelled vertical line on a log x axis: a shape takes the value, an annotation its
    log10 (plotly's rule for log axes, which add_vline's own label does not follow)."""
    fig.add_vline(x=x, line=line)
    fig.add_annotation(x=math.log10(x), xref="x", y=1.0, yref="paper", text=text,
                       showarrow=False, xanchor=side, yanchor="bottom",
                       font={"color": line.get("color", "#000"), "size": 11})


def runqlat_figure(series: list[tuple[str, dict[str, Any], float | None]]):
    """Run-queue waits per log-linear bucket (log axes: the tail stays visible), the red line
    and each subject's P999."""
    import plotly.graph_objects as go

    fig = go.Figure()
    limit = None
    for subject, ev, lim in series:
        xs: list[float | None] = []
        ys: list[float | None] = []
        for b in ev["buckets"]:
            lo, hi = max(float(b["min"]), 0.001), max(float(b["max"]), 0.001)
            if xs and xs[-1] is not None and xs[-1] < lo:
                xs.append(None)
                ys.append(None)  # an empty bucket between: a gap, not a plateau
            xs += [lo, hi]
            ys += [b["count"], b["count"]]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", fill="tozeroy", name=subject,
                                 hovertemplate="%{x:.3g} us: %{y} waits<extra>"
                                 + html.escape(subject) + "</extra>"))
        if ev.get("p999") is not None:
            _vline(fig, max(float(ev["p999"]), 0.001), f"{subject} P999 {ev['p999']:g} us",
                   {"dash": "dot", "width": 1, "color": "#57606a"}, "right")
        limit = lim if lim is not None else limit
    if limit:
        _vline(fig, limit, f"red line {limit:g} us",
               {"color": "#cf222e", "width": 2, "dash": "dash"}, "left")
    fig.update_xaxes(type="log", title="run-queue wait (us)")
    fig.update_yaxes(type="log", title="waits")
    fig.update_layout(title="l2.sched.runqlat: run-queue latency histogram", height=380,
                      margin={"l": 60, "r": 20, "t": 60, "b": 50}, legend={"orientation": "h"})
    return fig


def _counts_table(counts: dict[str, int]) -> str:
    keys = [s for s in _ORDER if s in counts] + [s for s in counts if s not in _ORDER]
    return ("<table id='counts' style='width:auto'><tr>"
            + "".join(f"<th style='color:{_COLORS.get(s, '#000')}'>{_cell(s)}</th>" for s in keys)
            + "</tr><tr>" + "".join(f"<td class='num'>{_cell(counts[s])}</td>" for s in keys)
            + "</tr></table>")


def render_html(report: Report, with_plots: bool = True) -> str:
    from .plots import figure_div, page

    report = clean_report(report)  # control characters escaped; html.escape does the markup
    v = report.verdict
    head = (f"<h1>tailgate inspect: {_cell(report.host.get('hostname'))}</h1>"
            f"<p class='verdict' style='color:{_COLORS[v.status]}'>verdict: {v.status.upper()}"
            + (f" &mdash; fix {v.first_failing_layer} first" if v.first_failing_layer else "")
            + f"</p>{_counts_table(v.counts)}<p>tailgate {_cell(report.version)}"
            f" &middot; interval {report.interval_s:.2f} s</p>")
    if report.platform:
        from .terminal import platform_line

        head += f"<p class='platform'>platform: {_cell(platform_line(report.platform))}</p>"
    head += pyramid_svg(report)
    missing = [*(f"{u['id']} (required): {u['reason']}" for u in v.unmet_required),
               *(f"{u['id']} [{u['subject']}]: {u['reason']}"
                 + (f" -- needs {u['needs']}" if u["needs"] else "") for u in v.unmeasured)]
    if missing:  # what stayed unmeasured, and what would measure it
        head += "<p>not measured:</p><ul>" + "".join(
            f"<li>{_cell(m)}</li>" for m in missing) + "</ul>"
    parts = [head]
    figures = 0
    rq = runqlat_series(report)
    for layer in LAYERS:
        fs = sorted((f for f in report.findings if f.layer == layer),
                    key=lambda f: -SEVERITY.get(f.status, 0))
        parts.append(f"<h2 id='layer-{layer}'>{layer} &mdash; {_NAMES[layer]}</h2>")
        bars = [f for f in fs if drawable(f)]
        if with_plots and bars:
            parts.append(figure_div(findings_figure(layer, bars), f"bars-{layer}"))
            figures += 1
        if with_plots and layer == "L2" and rq:
            parts.append(figure_div(runqlat_figure(rq), "runqlat"))
            figures += 1
        rows = []
        for f in fs:
            evidence = html.escape(json.dumps(f.evidence, default=str, sort_keys=True))
            rows.append(
                f"<tr><td style='color:{_COLORS[f.status]};font-weight:bold'>{f.status}</td>"
                f"<td><code>{_cell(f.id)}</code></td><td>{_cell(f.subject)}</td>"
                f"<td>{_cell(f.observed)} {_cell(f.unit)}</td><td>{_cell(f.limit)}</td>"
                f"<td>{_cell(f.reason)}<details><summary>remedy &amp; evidence</summary>"
                f"<p>{_cell(f.remedy)}</p><pre>{evidence}</pre></details></td></tr>")
        parts.append(f"<table class='findings' data-layer='{layer}'><tr><th>status</th>"
                     "<th>id</th><th>subject</th><th>observed</th><th>limit</th><th>reason</th>"
                     "</tr>" + "".join(rows) + "</table>")
    return page("tailgate report", "".join(parts), figures > 0,
                extra_style=".verdict{font-size:1.4em;font-weight:bold}")
