"""A self-contained HTML page with an inline SVG line chart (no scripts, no assets).

Small on purpose: the plan curves are a handful of points, and the project has no
plotting library among its dependencies. Renders only; computes nothing.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

_COLORS = ("#0969da", "#cf222e", "#1a7f37", "#8250df")


def line_chart_html(title: str, x_label: str, y_label: str,
                    series: Sequence[tuple[str, Sequence[float], Sequence[float]]],
                    notes: Sequence[str] = (), hline: tuple[str, float] | None = None,
                    log_x: bool = False) -> str:
    """``series``: (name, xs, ys). y is drawn from 0; x from 0 to its maximum, or on a
    log scale between its extremes with ``log_x`` (ticks at the data's x values)."""
    w, h, left, bottom, top, right = 720, 400, 70, 50, 20, 20
    xs_all = [x for _, xs, _ in series for x in xs] or [1.0]
    ys_all = [y for _, _, ys in series for y in ys] + ([hline[1]] if hline else []) or [1.0]
    x_max = max(xs_all) or 1.0
    y_max = max(ys_all) * 1.05 or 1.0
    x_min = min(x for x in xs_all if x > 0) if log_x and any(x > 0 for x in xs_all) else 0.0
    log_x = log_x and 0 < x_min < x_max

    def px(x: float) -> float:
        if log_x:
            return left + (w - left - right) * (math.log(max(x, x_min) / x_min)
                                                / math.log(x_max / x_min))
        return left + (w - left - right) * x / x_max

    def label(v: float) -> str:
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

    def py(y: float) -> float:
        return h - bottom - (h - bottom - top) * y / y_max

    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' "
             "font-family='sans-serif' font-size='12'>",
             f"<line x1='{left}' y1='{h - bottom}' x2='{w - right}' y2='{h - bottom}' "
             "stroke='#333'/>",
             f"<line x1='{left}' y1='{top}' x2='{left}' y2='{h - bottom}' stroke='#333'/>"]
    x_ticks = sorted(set(series[0][1])) if log_x and series else [x_max * i / 5
                                                                   for i in range(6)]
    for xv in x_ticks:
        parts.append(f"<text x='{px(xv):.1f}' y='{h - bottom + 16}' text-anchor='middle'>"
                     f"{label(xv)}</text>")
    for i in range(6):
        yv = y_max * i / 5
        parts.append(f"<text x='{left - 6}' y='{py(yv) + 4:.1f}' text-anchor='end'>"
                     f"{yv:.3g}</text>")
    parts.append(f"<text x='{(w + left) / 2}' y='{h - 10}' text-anchor='middle'>"
                 f"{html.escape(x_label)}</text>")
    parts.append(f"<text x='14' y='{(h - bottom) / 2}' transform='rotate(-90 14 "
                 f"{(h - bottom) / 2})' text-anchor='middle'>{html.escape(y_label)}</text>")
    if hline:
        parts.append(f"<line x1='{left}' x2='{w - right}' y1='{py(hline[1]):.1f}' "
                     f"y2='{py(hline[1]):.1f}' stroke='#999' stroke-dasharray='4 3'/>"
                     f"<text x='{w - right}' y='{py(hline[1]) - 4:.1f}' text-anchor='end' "
                     f"fill='#666'>{html.escape(hline[0])}</text>")
    for k, (name, xs, ys) in enumerate(series):
        color = _COLORS[k % len(_COLORS)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
        parts.append(f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{pts}'/>")
        parts += [f"<circle cx='{px(x):.1f}' cy='{py(y):.1f}' r='3' fill='{color}'>"
                  f"<title>{html.escape(name)}: {x:,.6g}, {y:.4g}</title></circle>"
                  for x, y in zip(xs, ys, strict=True)]
        parts.append(f"<text x='{left + 10}' y='{top + 14 + 16 * k}' fill='{color}'>"
                     f"{html.escape(name)}</text>")
    parts.append("</svg>")
    body = "".join(f"<p>{html.escape(n)}</p>" for n in notes)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title></head><body style='font-family:sans-serif;margin:2em'>"
            f"<h1>{html.escape(title)}</h1>{''.join(parts)}{body}</body></html>\n")
