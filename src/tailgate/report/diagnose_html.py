"""The diagnose page: causes, the timeline (each request's latency against each layer's
evidence, zoomable) and the latency spectrum."""

from __future__ import annotations

import html
from typing import Any

from ..hist import decode

MAX_POINTS = 20_000  # per trace: the timeline is downsampled, the percentiles never are


def timeline_figure(tl: dict[str, Any]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    evidence = {k: v for k, v in tl.get("evidence_ms", {}).items() if any(v)}
    instants = {k: v for k, v in tl.get("instants", {}).items() if any(v)}
    rows = 1 + len(evidence) + len(instants)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        subplot_titles=["request latency (P99 and max per bin)"]
                        + [f"{k}: ms per bin" for k in evidence]
                        + [f"{k}: count per bin" for k in instants])
    t = tl["t_ms"]
    step = max(1, len(t) // MAX_POINTS)
    if "latency_p99_ms" in tl:
        fig.add_trace(go.Scatter(x=t[::step], y=tl["latency_p99_ms"][::step], name="P99",
                                   mode="lines"), row=1, col=1)
        fig.add_trace(go.Scatter(x=t[::step], y=tl["latency_max_ms"][::step], name="max",
                                   mode="lines"), row=1, col=1)
    for i, (k, v) in enumerate({**evidence, **instants}.items(), 2):
        fig.add_trace(go.Bar(x=t[::step], y=v[::step], name=k), row=i, col=1)
    fig.update_layout(height=220 * rows, title="timeline (ms from the window's start)",
                      margin={"l": 60, "r": 20, "t": 60, "b": 40})
    return fig


def diagnose_page(doc: dict[str, Any]) -> str:
    from .plots import figure_div, page, spectrum_figure

    e = html.escape
    v = doc["verdict"]
    parts = [f"<h1>tailgate diagnose: {e(str(doc.get('target') or 'passive'))}</h1>"]
    parts.append("<p><b>verdict:</b> " + (e(f"{v['first']} ({v['layer']}) explains the tail "
                                              "first") if v["first"] else
                                            e(f"nothing claimed: {v['unexplained']}")) + "</p>")
    rows = "".join(
        f"<tr class='{'worse' if c['claimed'] else ''}'><td>{e(c['layer'])}</td>"
        f"<td>{e(c['cause'])}</td><td>{'claimed' if c['claimed'] else ''}</td>"
        f"<td>{e(c['sentence'])}</td><td>{e(c['remedy'] if c['claimed'] else '')}</td></tr>"
        for c in doc["causes"])
    parts.append("<table id='causes'><tr><th>layer</th><th>cause</th><th></th><th>evidence</th>"
                 f"<th>remedy</th></tr>{rows}</table>")
    parts.append(figure_div(timeline_figure(doc["timeline"]), "timeline"))
    hists = (doc.get("bench") or {}).get("histograms") or {}
    series = [(k, decode(t)) for k, t in hists.items() if k != "lateness"]
    if series:
        parts.append(figure_div(spectrum_figure(series, "latency by percentile"), "spectrum"))
    o = doc["overhead"]
    parts.append(f"<p class='noise'>probe: attached in {o['startup_s']} s; bpftrace used "
                 f"{o['probe_cpu_s']} s CPU over {o['context_switches']} context switches in "
                 f"{o['window_s']} s</p>")
    return page("tailgate diagnose", "".join(parts), True)
