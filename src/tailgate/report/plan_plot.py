"""The plan commands' curves as a self-contained HTML page (plotly, embedded offline, like
every other report: see tailgate.report.plots). Renders only; computes nothing."""

from __future__ import annotations

import html
from collections.abc import Sequence

from .plots import figure_div, page


def line_chart(title: str, x_label: str, y_label: str,
               series: Sequence[tuple[str, Sequence[float], Sequence[float]]],
               hline: tuple[str, float] | None = None, log_x: bool = False):
    """A plotly figure: ``series`` as (name, xs, ys), y from 0, an optional dashed level."""
    import plotly.graph_objects as go  # here: plotly is the optional html extra, and heavy

    fig = go.Figure()
    for name, xs, ys in series:
        fig.add_trace(go.Scatter(x=list(xs), y=list(ys), mode="lines+markers", name=name))
    if hline:
        fig.add_hline(y=hline[1], line_dash="dash", line_color="#999",
                      annotation_text=hline[0], annotation_position="top right")
    fig.update_xaxes(title=x_label, type="log" if log_x else "linear")
    fig.update_yaxes(title=y_label, rangemode="tozero")
    fig.update_layout(title=title, height=450, margin={"l": 60, "r": 20, "t": 50, "b": 50})
    return fig


def line_chart_html(title: str, x_label: str, y_label: str,
                    series: Sequence[tuple[str, Sequence[float], Sequence[float]]],
                    notes: Sequence[str] = (), hline: tuple[str, float] | None = None,
                    log_x: bool = False) -> str:
    fig = line_chart(title, x_label, y_label, series, hline, log_x)
    body = (f"<h1>{html.escape(title)}</h1>" + figure_div(fig, "curve")
            + "".join(f"<p>{html.escape(n)}</p>" for n in notes))
    return page(title, body, True)
