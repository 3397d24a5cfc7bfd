"""The diagnose page: causes, the timeline (each request's latency against each layer's
evidence, zoomable) and the latency spectrum."""

from __future__ import annotations

import html
from typing import Any

from ..hist import decode

MAX_POINTS = 20_000  # per trace: the timeline is downsampled, the percentiles never are


LAYERS = ("L1", "L2", "L3", "L4")


def timeline_rows(tl: dict[str, Any]) -> list[tuple[str, list[tuple[str, str, list]]]]:
    """One row per layer that has evidence: ``(layer, [(name, unit, values), ...])``. The
    evidence intervals (ms per bin) that never occurred are left out; every polled or probed
    series is drawn, a flat line being a fact too."""
    from ..diagnose.causes import CAUSES

    rows: dict[str, list[tuple[str, str, list]]] = {}
    for k, v in tl.get("evidence_ms", {}).items():
        if any(v):
            rows.setdefault(CAUSES[k].layer if k in CAUSES else "L2", []).append((k, "ms", v))
    for k, v in tl.get("instants", {}).items():
        if any(v):
            rows.setdefault(CAUSES[k].layer if k in CAUSES else "L2", []).append((k, "count", v))
    for k, s in tl.get("series", {}).items():
        rows.setdefault(s["layer"], []).append((k, s["unit"], s["values"]))
    return [(layer, rows[layer]) for layer in LAYERS if layer in rows]


def timeline_figure(tl: dict[str, Any]):
    """Request latency on top, then one zoomable row per layer (time per bin on the left axis,
    counts and levels on the right), all on the window's shared time axis."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    layers = timeline_rows(tl)
    rows = 1 + len(layers)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        specs=[[{"secondary_y": True}]] * rows,
                        subplot_titles=["request latency (P99 and max per bin, ms)"]
                        + [f"{layer}: ms per bin (left), counts and levels (right)"
                           for layer, _ in layers])
    t = tl["t_ms"]
    step = max(1, len(t) // MAX_POINTS)
    if "latency_p99_ms" in tl:
        fig.add_trace(go.Scatter(x=t[::step], y=tl["latency_p99_ms"][::step], name="P99",
                                 mode="lines"), row=1, col=1)
        fig.add_trace(go.Scatter(x=t[::step], y=tl["latency_max_ms"][::step], name="max",
                                 mode="lines"), row=1, col=1)
    for i, (layer, series) in enumerate(layers, 2):
        for name, unit, values in series:
            fig.add_trace(go.Scatter(x=t[::step], y=values[::step], mode="lines",
                                     name=f"{layer} {name} ({unit})",
                                     line={"dash": "solid" if unit == "ms" else "dot"}),
                          row=i, col=1, secondary_y=unit != "ms")
    fig.update_layout(height=260 * rows, title="timeline (ms from the window's start)",
                      margin={"l": 60, "r": 60, "t": 60, "b": 40})
    return fig


def accounting_section(acc: dict[str, Any] | None) -> str:
    """The slow requests' time by part against all requests' (diagnose.accounting), ranked by
    the part's share of the tail, and the slowest requests' own splits."""
    if not acc or not acc.get("sets"):
        return ""
    e = html.escape
    tail, every = acc["sets"]["p99"], acc["sets"]["all"]
    ranked = sorted(acc["parts"], key=lambda p: -(tail["parts"][p]["share"] or 0))
    rows = "".join(
        f"<tr class='{'worse' if p == acc.get('grows_most') else ''}'><td>{e(p)}</td>"
        f"<td class='num'>{tail['parts'][p]['median_ms']:.3f}</td>"
        f"<td class='num'>{tail['parts'][p]['p90_ms']:.3f}</td>"
        f"<td class='num'>{tail['parts'][p]['max_ms']:.3f}</td>"
        f"<td class='num'>{100 * tail['parts'][p]['share']:.1f}</td>"
        f"<td class='num'>{100 * every['parts'][p]['share']:.1f}</td></tr>"
        for p in ranked if tail["parts"][p]["share"] or every["parts"][p]["share"])
    def split(parts: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.3f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))

    slow = "".join(
        f"<tr><td class='num'>{r['latency_ms']:.3f}</td><td class='num'>{r['candidates']}</td>"
        f"<td>{e(split(r['parts_ms']))}</td></tr>" for r in acc.get("slowest", []))
    return (f"<h2>each slow request's time, accounted</h2><p id='accounting'>"
            f"{e(acc['sentence'])}</p><table id='accounting-parts'><tr><th>part</th>"
            "<th>median ms</th><th>P90 ms</th><th>max ms</th><th>tail %</th><th>all %</th>"
            f"</tr>{rows}</table><p>the slowest requests, by part (ms):</p>"
            "<table id='accounting-slowest'><tr><th>latency ms</th><th>threads</th>"
            f"<th>parts</th></tr>{slow}</table>")


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
    from .flame import flame_section

    parts.append(accounting_section(doc.get("accounting")))
    parts.append(flame_section(doc.get("profile")))
    unknown = (doc.get("timeline") or {}).get("unknown") or {}
    if unknown:
        parts.append("<p><b>not measured:</b></p><ul id='unknown'>" + "".join(
            f"<li>{e(k)}: {e(v)}</li>" for k, v in unknown.items()) + "</ul>")
    o = doc["overhead"]
    parts.append(f"<p class='noise'>probe: attached in {o['startup_s']} s; bpftrace used "
                 f"{o['probe_cpu_s']} s CPU over {o['context_switches']} context switches in "
                 f"{o['window_s']} s</p>")
    return page("tailgate diagnose", "".join(parts), True)
