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


def latency_figure(doc: dict[str, Any]):
    """Latency over time (P50, P99, max per interval, by intended start); the halves' P99
    of the stationarity test as dashed steps, and the heavier half shaded when the result
    says the tail drifted."""
    import plotly.graph_objects as go

    from .plots import tails_over_time

    ot = doc["over_time"]
    fig = go.Figure()
    tails_over_time(fig, ot["latency"], "latency")
    st = doc.get("stationarity") or {}
    shift = st.get("shift") or {}
    t = ot["latency"]["t_s"]
    step = float(ot.get("interval_s") or 0.0)
    title = f"latency over time ({step * 1e3:.0f} ms intervals)"
    if shift.get("split_s") is not None and t:
        cut, end = shift["split_s"], t[-1] + step
        halves = ((t[0], cut, shift["first_half_p99"]), (cut, end, shift["second_half_p99"]))
        drifted = st.get("verdict") == "drifted"
        for i, (x0, x1, p99) in enumerate(halves):
            fig.add_trace(go.Scatter(x=[x0, x1], y=[p99, p99], mode="lines",
                                     name=f"{'first' if i == 0 else 'second'} half P99",
                                     line={"dash": "dash", "width": 2,
                                           "color": "#cf222e" if drifted else "#6e7781"}))
        if drifted:
            x0, x1, _ = max(halves, key=lambda h: h[2])
            fig.add_vrect(x0=x0, x1=x1, fillcolor="#cf222e", opacity=0.08, line_width=0,
                          annotation_text="drifted", annotation_position="top left")
        title += f": {st.get('verdict')}"
    fig.update_xaxes(title="seconds from the end of the warm-up (intended start)")
    fig.update_yaxes(title="latency (ms)", rangemode="tozero")
    fig.update_layout(title=title, height=380, margin={"l": 60, "r": 20, "t": 50, "b": 50})
    return fig


def llm_figures(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    """An openai+ result: throughput and goodput over time (by end of request) against the
    run's figures, and TTFT/ITL over time."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from .plots import tails_over_time

    ot = doc["over_time"]
    done = ot.get("completed") or {}
    tp = doc.get("throughput") or {}
    out = []
    if done.get("t_s"):
        fig = go.Figure(go.Scatter(x=done["t_s"], y=done["output_tokens_per_s"], mode="lines",
                                   line={"shape": "hv"}, name="output tokens/s"))
        if tp.get("output_tokens_per_s") is not None:
            fig.add_hline(y=tp["output_tokens_per_s"], line={"dash": "dash", "color": "#6e7781"},
                          annotation_text=f"run: {tp['output_tokens_per_s']:g} tokens/s")
        fig.update_layout(title="throughput: output tokens per second (by end of request)",
                          height=320, margin={"l": 60, "r": 20, "t": 50, "b": 50},
                          xaxis_title="seconds from the end of the warm-up",
                          yaxis_title="tokens/s", showlegend=False)
        out.append(("throughput", fig))
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=done["t_s"], y=done["ok_per_s"], mode="lines",
                                 line={"shape": "hv"}, name="ok requests/s"))
        fig.add_trace(go.Scatter(x=done["t_s"], y=done["good_per_s"], mode="lines",
                                 line={"shape": "hv"}, name="good requests/s (goodput)"))
        if tp.get("goodput_rps") is not None:
            fig.add_hline(y=tp["goodput_rps"], line={"dash": "dash", "color": "#6e7781"},
                          annotation_text=f"run goodput: {tp['goodput_rps']:g}/s")
        fig.update_layout(title="goodput: requests per second that met every SLO (by end of "
                          "request)", height=320, margin={"l": 60, "r": 20, "t": 50, "b": 50},
                          xaxis_title="seconds from the end of the warm-up",
                          yaxis_title="requests/s")
        out.append(("goodput", fig))
    names = [k for k in ("ttft", "itl") if (ot.get(k) or {}).get("t_s")]
    if names:
        fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                            subplot_titles=[f"{k.upper()} per interval (ms)" for k in names])
        for i, k in enumerate(names, 1):
            tails_over_time(fig, ot[k], k.upper(), row=i)
            fig.update_yaxes(title_text="ms", rangemode="tozero", row=i, col=1)
        fig.update_xaxes(title_text="seconds from the end of the warm-up (intended start)",
                         row=len(names), col=1)
        fig.update_layout(title="TTFT and ITL over time", height=260 * len(names) + 80,
                          margin={"l": 60, "r": 20, "t": 60, "b": 50})
        out.append(("llm-over-time", fig))
    return out


def _throughput_table(tp: dict[str, Any]) -> str:
    e = html.escape
    names = {"output_tokens_per_s": "output tokens/s", "total_tokens_per_s": "total tokens/s",
             "requests_per_s": "requests/s", "goodput_rps": "goodput (good requests/s)",
             "span_s": "span (s)"}
    return ("<table id='throughput-table' style='width:auto'>" + "".join(
        f"<tr><td>{e(label)}</td><td class='num'>{e(str(tp[k]))}</td></tr>"
        for k, label in names.items() if k in tp) + "</table>")


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
        from .bench_text import token_lines

        head += [f"<p class='tokens'>{e(line)}</p>" for line in token_lines(doc)]
    for s in doc.get("slo") or []:
        head.append(f"<p>SLO {e(str(s.get('expr')))}: "
                    f"{'pass' if s.get('pass') else '<b class=worse>fail</b>'}</p>")
    for w in doc.get("warnings") or []:
        head.append(f"<p class='noise'>warning: {e(str(w))}</p>")
    if isinstance(doc.get("throughput"), dict):
        head.append(_throughput_table(doc["throughput"]))
    plots = []
    if (doc.get("over_time") or {}).get("latency", {}).get("t_s"):
        plots.append(figure_div(latency_figure(doc), "over-time"))
    if doc.get("over_time") and doc.get("protocol") == "openai":
        plots += [figure_div(fig, div) for div, fig in llm_figures(doc)]
    hists = {k: decode(v) for k, v in (doc.get("histograms") or {}).items()}
    for i, (name, h) in enumerate(hists.items()):
        if h.total:
            plots.append(figure_div(spectrum_figure([(name, h)], f"{name}: latency by "
                                                    "percentile"), f"spectrum-{i}"))
    return page(f"tailgate bench {doc.get('target', '')}", "".join(head + plots), bool(plots))
