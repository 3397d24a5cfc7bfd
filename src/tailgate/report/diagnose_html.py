"""The diagnose page: causes, the timeline (each request's latency against each layer's
evidence, zoomable; a panel whose series stayed at zero is one line under it, not drawn)
and the latency spectrum."""

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


Panel = tuple[str, str, list[tuple[str, str, list]]]  # (layer, kind, [(name, unit, values)])


def timeline_panels(tl: dict[str, Any]) -> list[Panel]:
    """The panels drawn: those with something in them (see :func:`quiet_panels`)."""
    return [p for p in _panels(tl) if not _quiet(p)]


def quiet_panels(tl: dict[str, Any]) -> list[Panel]:
    """The panels whose every series stayed at zero over the window (a bin no poll reached
    is neither): watched and quiet, said in one line each rather than drawn flat."""
    return [p for p in _panels(tl) if _quiet(p)]


def _quiet(panel: Panel) -> bool:
    values = [v for _, _, vs in panel[2] for v in vs if v is not None]
    return bool(values) and not any(values)


def _panels(tl: dict[str, Any]) -> list[Panel]:
    """Each layer's row cut by evidence kind: ``(layer, kind, series)``, the causes' own
    evidence (``evidence``: intervals and instants) first, then the counters by source (the
    series name up to its first dot: ``psi``, ``softirq``, ``switches``...), so no row holds
    more than a handful of lines."""
    cause_keys = set(tl.get("evidence_ms", {})) | set(tl.get("instants", {}))
    out = []
    for layer, series in timeline_rows(tl):
        kinds: dict[str, list[tuple[str, str, list]]] = {}
        for name, unit, values in series:
            kind = "evidence" if name in cause_keys else name.split(".", 1)[0]
            kinds.setdefault(kind, []).append((name, unit, values))
        out += [(layer, kind, kinds[kind]) for kind in kinds]
    return out


def acted(values: list, t: list[float], bin_ms: float, limit: int = 200) -> list[tuple[float, float]]:
    """The time ranges (ms) of the bins where ``values`` is non-zero, contiguous bins merged;
    past ``limit`` ranges the shortest gaps are closed too (a page draws a few hundred shapes,
    not one per bin)."""
    runs: list[list[float]] = []
    for x, v in zip(t, values, strict=False):
        if v:
            if runs and abs(runs[-1][1] - x) < 1e-9:
                runs[-1][1] = x + bin_ms
            else:
                runs.append([x, x + bin_ms])
    while len(runs) > limit:
        gaps = sorted(runs[i + 1][0] - runs[i][1] for i in range(len(runs) - 1))
        close = gaps[len(runs) - limit - 1]
        merged = [runs[0]]
        for r in runs[1:]:
            if r[0] - merged[-1][1] <= close:
                merged[-1][1] = r[1]
            else:
                merged.append(r)
        runs = merged
    return [(a, b) for a, b in runs]


def palette(n: int) -> list[str]:
    """``n`` colours, none repeated for n <= 48 (plotly's Dark24 then Light24)."""
    from plotly.colors import qualitative

    colours = list(qualitative.Dark24) + list(qualitative.Light24)
    return [colours[i % len(colours)] for i in range(n)]


def _units(series: list[tuple[str, str, list]]) -> str:
    ms = {unit == "ms" for _, unit, _ in series}
    if ms == {True, False}:
        return "ms per bin (left), counts and levels (right)"
    return "ms per bin" if ms == {True} else "counts and levels per bin"


BAND_KEYS = ("row", "start_ms", "end_ms", "kind", "label", "source", "request")


def band_rows(bands: list[dict[str, Any]]) -> list[str]:
    """The band layer's rows, in the order they first appear (a source lists its own rows
    together: a request above the threads its chain went through)."""
    return list(dict.fromkeys(b["row"] for b in bands))


def add_bands(fig, bands: list[dict[str, Any]], row: int) -> None:
    """The generic band layer (``timeline.bands``): each band a bar from ``start_ms`` to
    ``end_ms`` on its ``row``, one colour per ``source``/``kind`` (one trace each, so a few
    thousand bands stay light), its ``label`` on hover; the bands of one request from one
    source linked by a dotted line through their ends (a chain: each link ends where the
    wake-up ending the link before it came from)."""
    import plotly.graph_objects as go

    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for b in bands:
        by.setdefault((b["source"], b["kind"]), []).append(b)
    colours = palette(len(by))
    for ((source, kind), group), colour in zip(sorted(by.items()), colours, strict=True):
        fig.add_trace(go.Bar(
            orientation="h", y=[b["row"] for b in group],
            x=[max(b["end_ms"] - b["start_ms"], 0.0) for b in group],
            base=[b["start_ms"] for b in group], name=f"{source}: {kind}", legend="legend2",
            marker={"color": colour}, hovertext=[
                f"{b['label']}" + (f" (request {b['request']})" if b["request"] is not None
                                   else "") for b in group],
            hoverinfo="text"), row=row, col=1)
    chains: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for b in bands:
        if b["request"] is not None and b["kind"] != "request":
            chains.setdefault((b["source"], b["request"]), []).append(b)
    xs: list[float | None] = []
    ys: list[str | None] = []
    for links in chains.values():
        if len(links) > 1:
            xs += [b["end_ms"] for b in reversed(links)] + [None]
            ys += [b["row"] for b in reversed(links)] + [None]
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="chain (who woke whom)",
                                 legend="legend2", line={"dash": "dot", "color": "#555",
                                                         "width": 1}), row=row, col=1)
    fig.update_yaxes(type="category", categoryorder="array",
                     categoryarray=list(reversed(band_rows(bands))), row=row, col=1)


def timeline_figure(tl: dict[str, Any], claimed: str | None = None):
    """Request latency on top, then the band layer (``timeline.bands``: the chains of the
    slowest requests across the threads involved, and any other source's bands), then one
    zoomable row per layer and evidence kind (time per bin on the left axis, counts and
    levels on the right), all on the window's shared time axis, each row with its own legend
    beside it and no colour twice in it; the bins where the claimed cause acted shaded
    across every row."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = timeline_panels(tl)
    bands = tl.get("bands") or []
    first = 2 + bool(bands)  # the first evidence panel's row
    rows = first - 1 + len(panels)
    heights = [1.0] + ([max(1.0, 0.25 * len(band_rows(bands)))] if bands else []) \
        + [1.0] * len(panels)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.3 / rows,
                        specs=[[{"secondary_y": True}]] * rows, row_heights=heights,
                        subplot_titles=["request latency (P99 and max per bin, ms)"]
                        + (["bands: the slowest requests' chains (hover for each link)"]
                           if bands else [])
                        + [f"{layer} {kind}: {_units(series)}" for layer, kind, series in panels])
    t = tl["t_ms"]
    step = max(1, len(t) // MAX_POINTS)
    if "latency_p99_ms" in tl:
        top = palette(2)
        fig.add_trace(go.Scatter(x=t[::step], y=tl["latency_p99_ms"][::step], name="P99",
                                 mode="lines", line={"color": top[0]}), row=1, col=1)
        fig.add_trace(go.Scatter(x=t[::step], y=tl["latency_max_ms"][::step], name="max",
                                 mode="lines", line={"color": top[1]}), row=1, col=1)
    legends: dict[str, Any] = {}
    if bands:
        add_bands(fig, bands, 2)
        domain = fig.get_subplot(2, 1).yaxis.domain
        legends["legend2"] = {"y": domain[1], "yanchor": "top", "x": 1.06, "xanchor": "left",
                              "font": {"size": 10}}
    for i, (_, _, series) in enumerate(panels, first):
        legend = f"legend{i}"
        # the right axis only beside a left one: plotly cannot lay out an overlaying axis
        # whose base axis has no trace (the whole figure then draws nothing)
        both = len({unit == "ms" for _, unit, _ in series}) == 2
        for (name, unit, values), colour in zip(series, palette(len(series)), strict=True):
            mark = name == claimed
            fig.add_trace(go.Scatter(x=t[::step], y=values[::step], mode="lines",
                                     name=f"{name} ({unit})" + (" (claimed)" if mark else ""),
                                     legend=legend,
                                     line={"dash": "solid" if unit == "ms" else "dot",
                                           "color": colour, "width": 3 if mark else 1.5}),
                          row=i, col=1, secondary_y=both and unit != "ms")
        domain = fig.get_subplot(i, 1).yaxis.domain
        legends[legend] = {"y": domain[1], "yanchor": "top", "x": 1.06, "xanchor": "left",
                           "font": {"size": 10}}
    title = "timeline (ms from the window's start)"
    if claimed is not None:
        where = tl.get("evidence_ms", {}).get(claimed) or tl.get("instants", {}).get(claimed) or []
        ranges = acted(where, t, float(tl.get("bin_ms") or 0.0))
        for a, b in ranges:  # one shape per range over the whole height (the x axes are shared)
            fig.add_shape(type="rect", xref="x", yref="paper", x0=a, x1=b, y0=0, y1=1,
                          fillcolor="#cf222e", opacity=0.12, line_width=0, layer="below",
                          name=f"claimed: {claimed}")
        title += f"; shaded: where {claimed} (claimed) acted"
    for m in tl.get("marks", ()):  # a target that exited, an engine's counters reset
        fig.add_shape(type="rect", xref="x", yref="paper", x0=m["start_ms"], x1=m["end_ms"],
                      y0=0, y1=1, fillcolor="#6e7781", opacity=0.3, line_width=0,
                      layer="below", name=m["label"])
        fig.add_annotation(x=m["end_ms"], xref="x", y=1, yref="paper", text=m["label"],
                           showarrow=False, xanchor="left", yanchor="bottom",
                           font={"size": 10})
    top_domain = fig.get_subplot(1, 1).yaxis.domain
    fig.update_layout(height=120 + 200 * rows + (20 * len(band_rows(bands)) if bands else 0),
                      title=title, barmode="overlay",
                      margin={"l": 60, "r": 260, "t": 70, "b": 40},
                      legend={"y": top_domain[1], "yanchor": "top", "x": 1.06, "xanchor": "left",
                              "font": {"size": 10}}, **legends)
    return fig


def accounting_section(acc: dict[str, Any] | None) -> str:
    """The slow requests' time by part against all requests' (diagnose.accounting), ranked by
    the part's share of the tail, and the slowest requests' own splits."""
    if not acc or not acc.get("sets"):
        return ""
    e = html.escape
    tail, every = acc["sets"]["p99"], acc["sets"]["all"]
    ranked = sorted(acc["parts"], key=lambda p: -(tail["parts"][p]["share"] or 0))
    labels = acc.get("labels") or {}  # (engine_wait: "waits on the engine (futex)")
    rows = "".join(
        f"<tr class='{'worse' if p == acc.get('grows_most') else ''}'>"
        f"<td>{e(labels.get(p, p))}</td>"
        f"<td class='num'>{tail['parts'][p]['median_ms']:.3f}</td>"
        f"<td class='num'>{tail['parts'][p]['p90_ms']:.3f}</td>"
        f"<td class='num'>{tail['parts'][p]['max_ms']:.3f}</td>"
        f"<td class='num'>{100 * tail['parts'][p]['share']:.1f}</td>"
        f"<td class='num'>{100 * every['parts'][p]['share']:.1f}</td></tr>"
        for p in ranked if tail["parts"][p]["share"] or every["parts"][p]["share"])
    def split(parts: dict[str, float]) -> str:
        return ", ".join(f"{labels.get(k, k)} {v:.3f}"
                         for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))

    slow = "".join(
        f"<tr><td class='num'>{r['latency_ms']:.3f}</td><td class='num'>{r['candidates']}</td>"
        f"<td>{e(split(r['parts_ms']))}</td></tr>" for r in acc.get("slowest", []))
    return (f"<h2>each slow request's time, accounted</h2><p id='accounting'>"
            f"{e(acc['sentence'])}</p><table id='accounting-parts'><tr><th>part</th>"
            "<th>median ms</th><th>P90 ms</th><th>max ms</th><th>tail %</th><th>all %</th>"
            f"</tr>{rows}</table><p>the slowest requests, by part (ms):</p>"
            "<table id='accounting-slowest'><tr><th>latency ms</th><th>threads</th>"
            f"<th>parts</th></tr>{slow}</table>")


def engine_join_section(eng: dict[str, Any] | None) -> str:
    """How the engine's records were placed on tailgate's clock, and how far they may be off
    (diagnose.engine's join); "" where the run had none."""
    from .diagnose_render import join_bound_line

    join = (eng or {}).get("join")
    if not join:
        return ""
    e = html.escape
    line = join_bound_line(join)
    return (f"<h2>the engine's records on tailgate's clock</h2><p id='engine-join'>"
            f"{join['placed']} placed, {join['refused']} refused"
            + (f"; {e(line)}" if line else "") + "</p>")


def diagnose_page(doc: dict[str, Any]) -> str:
    from .plots import figure_div, page, spectrum_figure

    e = html.escape
    v = doc["verdict"]
    parts = [f"<h1>tailgate diagnose: {e(str(doc.get('target') or 'passive'))}</h1>"]
    parts.append("<p><b>verdict:</b> " + (e(f"{v['first']} ({v['layer']}) explains the tail "
                                              "first") if v["first"] else
                                            e(f"nothing claimed: {v['unexplained']}")) + "</p>")
    if v.get("unknown") and v["first"]:
        parts.append(f"<p><b>unknown:</b> {e(v['unknown'])}</p>")
    chain = v.get("chain")
    if chain:
        parts.append(f"<p id='chain'><b>chain of blame ({chain['tail']} tail):</b> "
                     f"{e(chain['sentence'])}<br><b>remedy (its last link):</b> "
                     f"{e(chain['remedy'])}</p>")
    rows = "".join(
        f"<tr class='{'worse' if c['claimed'] else ''}'><td>{e(c['layer'])}</td>"
        f"<td>{e(c['cause'])}</td><td>{'claimed' if c['claimed'] else ''}</td>"
        f"<td>{e(c['sentence'])}</td><td>{e(c['remedy'] if c['claimed'] else '')}</td></tr>"
        for c in doc["causes"])
    parts.append("<table id='causes'><tr><th>layer</th><th>cause</th><th></th><th>evidence</th>"
                 f"<th>remedy</th></tr>{rows}</table>")
    parts.append(figure_div(timeline_figure(doc["timeline"], v.get("first")), "timeline"))
    quiet = quiet_panels(doc["timeline"])
    if quiet:
        parts.append("<p><b>watched and quiet</b> (zero in every bin of the window, not "
                     "drawn):</p><ul id='quiet'>" + "".join(
                         f"<li>{e(layer)} {e(kind)}: "
                         f"{e(', '.join(name for name, _, _ in series))}</li>"
                         for layer, kind, series in quiet) + "</ul>")
    hists = (doc.get("bench") or {}).get("histograms") or {}
    series = [(k, decode(t)) for k, t in hists.items() if k != "lateness"]
    if series:
        parts.append(figure_div(spectrum_figure(series, "latency by percentile"), "spectrum"))
    from .flame import flame_section

    parts.append(accounting_section(doc.get("accounting")))
    parts.append(engine_join_section(doc.get("engine")))
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
