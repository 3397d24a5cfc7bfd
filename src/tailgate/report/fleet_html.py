"""The fleet view of `inspect --ray` as one self-contained HTML page: the layers and hosts
tables, then each host's own report (as `inspect --html` renders it)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ..model import LAYERS
from .html import _COLORS, _NAMES, render_html


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def render_fleet_html(view: dict[str, Any], hosts: Sequence[Any]) -> str:
    """``view`` from :func:`tailgate.fleet.inspect.fleet_view`, ``hosts`` its HostReports."""
    status = view["status"]
    first = view["first_failing_layer"]
    n = view["hosts_total"]
    parts = [f"<h1>tailgate inspect --ray: {n} host(s)</h1>"
             f"<p class='verdict' style='color:{_COLORS.get(status, '#000')}'>fleet: "
             f"{_e(status.upper())}" + (f" &mdash; fix {_e(first)} first" if first else "")
             + "</p><table><tr><th>layer</th><th>hosts failing</th><th>which</th>"
             "<th>warn</th><th>unknown</th></tr>"]
    for layer in LAYERS:
        row = view["layers"][layer]
        parts.append(f"<tr><td>{layer} &mdash; {_NAMES[layer]}</td><td>{len(row['failing'])}/{n}"
                     f"</td><td>{_e(', '.join(row['failing']))}</td><td>{len(row['warn'])}</td>"
                     f"<td>{len(row['unknown'])}</td></tr>")
    parts.append("</table><h2>hosts</h2><table><tr><th>address</th><th>host</th><th>status</th>"
                 "<th>first failing</th><th>reason</th></tr>")
    for r in view["hosts"]:
        parts.append(f"<tr><td><a href='#h-{_e(r['address'])}'>{_e(r['address'])}</a></td>"
                     f"<td>{_e(r['hostname'])}</td><td style='color:"
                     f"{_COLORS.get(r['status'], '#000')};font-weight:bold'>{_e(r['status'])}"
                     f"</td><td>{_e(r['first_failing_layer'])}</td><td>{_e(r['reason'])}</td>"
                     "</tr>")
    parts.append("</table>")
    style = ""
    for h in hosts:
        if h.report is None:
            continue
        page = render_html(h.report, with_plots=False)
        style = style or page.split("<style>", 1)[1].split("</style>", 1)[0]
        body = page.split("<body>", 1)[1].rsplit("</body>", 1)[0]
        parts.append(f"<section id='h-{_e(h.node.address)}'><hr><h2>{_e(h.node.address)}</h2>"
                     f"{body}</section>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>tailgate fleet</title>"
            f"<style>{style}</style></head><body>" + "".join(parts) + "</body></html>\n")
