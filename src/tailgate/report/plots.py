"""Plots for the HTML reports, drawn with plotly and embedded offline.

plotly's own JavaScript is inlined once per page (no network when the page is opened);
each figure is a ``<div>`` plotly fills in. Chosen over hand-drawn SVG because the percentile
spectrum and the timeline need zoom, hover values and log axes, which plotly gives for free,
and over matplotlib SVG because a static image of a million-point timeline is unreadable.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from ..hist import Histogram

SPECTRUM_TICKS = (50.0, 90.0, 99.0, 99.9, 99.99, 99.999)


def spectrum_points(hist: Histogram, scale: float = 1e6, per_half: int = 5,
                    limit: int = 400) -> tuple[list[float], list[float], list[float]]:
    """``(x = 1/(1-p), value / scale, percentile)`` along HdrHistogram's percentile ladder
    (finer as p approaches 100 %), ending at the largest rank the samples support."""
    xs: list[float] = []
    ys: list[float] = []
    ps: list[float] = []
    if not hist.total:
        return xs, ys, ps
    top = 100.0 * (1.0 - 1.0 / hist.total)
    level = 0.0
    while level <= top and len(xs) < limit:
        xs.append(1.0 / (1.0 - level / 100.0))
        ys.append(min(hist.value_at_percentile(level), hist.max) / scale)
        ps.append(level)
        ticks = per_half * 2 ** (int(math.log2(100.0 / (100.0 - level))) + 1)
        level += 100.0 / ticks
    xs.append(1.0 / (1.0 - top / 100.0) if top < 100.0 else xs[-1] * 2)
    ys.append(hist.max / scale)
    ps.append(100.0)
    return xs, ys, ps


def spectrum_figure(series: Sequence[tuple[str, Histogram]], title: str, unit: str = "ms",
                    scale: float = 1e6):
    """Latency by percentile on HdrHistogram's log ``1/(1-p)`` axis, one trace per series."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, hist in series:
        xs, ys, ps = spectrum_points(hist, scale)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name,
                                 customdata=ps,
                                 hovertemplate="p%{customdata:.4f}: %{y:.3f} " + unit
                                 + "<extra>" + html.escape(name) + "</extra>"))
    fig.update_xaxes(type="log", title="percentile",
                     tickvals=[1 / (1 - p / 100) for p in SPECTRUM_TICKS],
                     ticktext=[f"{p:g}%" for p in SPECTRUM_TICKS])
    fig.update_yaxes(title=f"latency ({unit})", rangemode="tozero")
    fig.update_layout(title=title, height=420, margin={"l": 60, "r": 20, "t": 50, "b": 50},
                      legend={"orientation": "h"})
    return fig


def tails_over_time(fig, series: dict[str, Any], what: str, row: int | None = None,
                    unit: str = "ms") -> None:
    """P50, P99 and max per interval (an ``over_time`` series of a bench result) as three
    lines, on ``fig`` or on its subplot ``row``."""
    import plotly.graph_objects as go

    at = {} if row is None else {"row": row, "col": 1}
    for key, name, dash in (("p50_ms", "P50", "solid"), ("p99_ms", "P99", "solid"),
                            ("max_ms", "max", "dot")):
        fig.add_trace(go.Scatter(x=series.get("t_s", []), y=series.get(key, []), mode="lines",
                                 name=f"{what} {name}", line={"dash": dash},
                                 hovertemplate=f"%{{x:.3f}} s: %{{y:.3f}} {unit}"
                                 f"<extra>{html.escape(what)} {name}</extra>"), **at)


def figure_div(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}"
         "table{border-collapse:collapse;width:100%}"
         "td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}"
         "td.num{text-align:right;font-variant-numeric:tabular-nums}"
         "tr.layer th{background:#f6f8fa}.worse{color:#cf222e}.better{color:#1a7f37}"
         ".noise{color:#6e7781}pre{white-space:pre-wrap;font-size:.8em}")


def page(title: str, body: str, with_plots: bool, extra_style: str = "") -> str:
    """A complete, self-contained page: the plotly library inlined when the page has plots."""
    script = ""
    if with_plots:
        from plotly.offline import get_plotlyjs

        script = f"<script type='text/javascript'>{get_plotlyjs()}</script>"
    return (f"<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{STYLE}{extra_style}</style>{script}</head>"
            f"<body>{body}</body></html>\n")
