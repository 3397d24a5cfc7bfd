"""The HTML page of one bench result (HTTP, TCP or LLM): the figures and the percentile
spectra of every recorded histogram, from the result document alone."""

from __future__ import annotations

import html
from typing import Any

from ..hist import decode

_TABLES = {  # histogram name -> the summary key that holds its percentiles
    "latency": "latency_ms", "service": "service_time_ms", "lateness": "lateness_ms",
    "ttft": "ttft_ms", "itl": "itl_ms", "itl_per_token": "itl_per_token_ms", "tpot": "tpot_ms",
    "e2e": "e2e_ms",
}
_COLS = ("p50", "p90", "p95", "p99", "p999", "p9999", "max", "count")


def _cell(s: dict[str, Any], c: str) -> str:
    """One percentile: its value with its confidence interval, or n/m (not measurable)."""
    e = html.escape
    ci = (s.get("ci") or {}).get(c)
    if isinstance(ci, dict) and not ci.get("measurable", True):
        return f"<td class='num' title='{e(str(ci.get('reason', '')))}'>n/m</td>"
    text = e("" if s.get(c) is None else str(s.get(c)))
    if isinstance(ci, dict):
        level = f"{float(s.get('ci_level', 0.95)) * 100:g}%"
        text += f"<br><small>{e(level)} CI {e(str(ci['lo']))}..{e(str(ci['hi']))}</small>"
    return f"<td class='num'>{text}</td>"


def bench_page(doc: dict[str, Any]) -> str:
    from .plots import figure_div, page, spectrum_figure

    e = html.escape
    req = doc.get("requests") or {}
    errors = req.get("errors") or {}
    head = [f"<h1>tailgate bench: {e(str(doc.get('target', '')))}</h1>",
            f"<p>requests: sent {e(str(req.get('sent')))}, ok {e(str(req.get('ok')))}, errors: "
            + e(", ".join(f"{k} {v}" for k, v in errors.items() if v) or "none") + "<br>"
            f"rate: target {e(str((doc.get('rate') or {}).get('target')))}/s, achieved "
            f"{e(str((doc.get('rate') or {}).get('achieved')))}/s</p>"]
    rows = []
    for name, key in _TABLES.items():
        s = doc.get(key)
        if not isinstance(s, dict):
            continue
        cells = "".join(_cell(s, c) for c in _COLS)
        rows.append(f"<tr><td>{e(name)} ms</td>{cells}</tr>")
    head.append("<table id='percentiles'><tr><th></th>" + "".join(f"<th>{c}</th>" for c in _COLS)
                + "</tr>" + "".join(rows) + "</table>")
    for key in ("arrivals", "stationarity"):
        block = doc.get(key)
        if isinstance(block, dict) and block.get("statement"):
            head.append(f"<p>{e(str(block['statement']))}</p>")
    if isinstance(doc.get("token_check"), dict):
        from ..llm.accounting import token_lines

        head += [f"<p class='tokens'>{e(line)}</p>" for line in token_lines(doc)]
    for s in doc.get("slo") or []:
        head.append(f"<p>SLO {e(str(s.get('expr')))}: "
                    f"{'pass' if s.get('pass') else '<b class=worse>fail</b>'}</p>")
    for w in doc.get("warnings") or []:
        head.append(f"<p class='noise'>warning: {e(str(w))}</p>")
    hists = {k: decode(v) for k, v in (doc.get("histograms") or {}).items()}
    plots = []
    for i, (name, h) in enumerate(hists.items()):
        if h.total:
            plots.append(figure_div(spectrum_figure([(name, h)], f"{name}: latency by "
                                                    "percentile"), f"spectrum-{i}"))
    return page(f"tailgate bench {doc.get('target', '')}", "".join(head + plots), bool(plots))
