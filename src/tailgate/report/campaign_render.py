"""Render campaigns: the before/after table of two (terminal, Markdown, HTML; JSON is the
document itself) and the figures of one. Renderers never compute: the rows come made."""

from __future__ import annotations

import html
from typing import Any

from ..campaign.table import CampaignDir, Side, label, summary
from ..compare import Row, fmt_change

COLUMNS = ("layer", "metric", "what", "before", "after", "change", "significant", "samples")


def _v(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.3f}" if abs(x) < 1e5 else f"{x:,.0f}"


def _sig(r: Row) -> str:
    return {"yes": "yes", "no": "no (noise)", "n/a": "n/a",
            "n/m": "n/m (not measurable)"}[r.significant]


def _n(r: Row) -> str:
    if r.before_n is None and r.after_n is None:
        return ""
    return f"{r.before_n or 0:,} / {r.after_n or 0:,}"


def _cells(r: Row) -> tuple[str, ...]:
    unit = f" {r.unit}" if r.unit else ""
    return (r.layer, r.name, label(r.name), _v(r.before) + unit, _v(r.after) + unit,
            fmt_change(r), _sig(r), _n(r))


def _class(r: Row) -> str:
    if r.worse and r.significant != "no" and r.ratio not in (None, 1.0):
        return "worse"
    if r.significant == "yes":
        return "better"
    return "noise" if r.significant == "no" else ""


def compare_document(before: CampaignDir, after: CampaignDir, rows: list[Row],
                     changes: list[dict[str, str]], failed, only_before: list[str],
                     only_after: list[str]) -> dict[str, Any]:
    return {"tailgate_compare": 1, "kind": "campaign",
            "sources": {"before": [before.path], "after": [after.path]},
            "campaigns": {"before": summary(before), "after": summary(after)},
            "status_changes": changes, "rows": [r.to_json() | {"what": label(r.name)}
                                                for r in rows],
            "only_before": only_before, "only_after": only_after,
            "regressions": [{"gate": f"{g.metric}={g.max_pct:g}%", "metric": r.name,
                             "change_pct": r.change_pct} for g, r in failed]}


def _steps_line(s: dict[str, Any]) -> str:
    failed = [x for x in s["steps"] if x["status"] == "failed"]
    text = (f"{s['name']} ({s['dir']}): {len(s['steps'])} steps, {s['started']}, hosts "
            f"{', '.join(s['hosts'] or [])}, tailgate {s['tailgate']}")
    if failed:
        text += "; failed: " + "; ".join(f"{x['name']} ({x['reason']})" for x in failed)
    return text


def markdown(doc: dict[str, Any], rows: list[Row]) -> str:
    c = doc["campaigns"]
    out = ["# tailgate compare: campaigns", "", f"- before: {_steps_line(c['before'])}",
           f"- after: {_steps_line(c['after'])}", ""]
    out += ["| " + " | ".join(COLUMNS) + " |", "|---|---|---|---:|---:|---:|---|---:|"]
    out += ["| " + " | ".join(x.replace("|", "\\|") for x in _cells(r)) + " |" for r in rows]
    if doc["status_changes"]:
        out += ["", "Status changed:", "", "| layer | id | subject | before | after |",
                "|---|---|---|---|---|"]
        out += [f"| {x['layer']} | `{x['id']}` | {x['subject']} | {x['before']} | "
                f"{x['after']} |" for x in doc["status_changes"]]
    for side in ("before", "after"):
        if doc[f"only_{side}"]:
            out.append(f"\nOnly {side}: " + ", ".join(doc[f"only_{side}"]))
    for g in doc["regressions"]:
        out.append(f"\n**regression**: {g['metric']} {g['change_pct']:+.1f} % (gate {g['gate']})")
    return "\n".join(out) + "\n"


def terminal(doc: dict[str, Any], rows: list[Row], console) -> None:
    from rich.table import Table

    c = doc["campaigns"]
    console.print(f"before: {_steps_line(c['before'])}", highlight=False, markup=False)
    console.print(f"after:  {_steps_line(c['after'])}", highlight=False, markup=False)
    t = Table(title="campaign before / after, bottom-up")
    for col in COLUMNS:
        t.add_column(col, justify="right" if col in ("before", "after", "change", "samples")
                     else "left")
    for r in rows:
        cls = _class(r)
        t.add_row(*_cells(r), style={"worse": "red", "better": "green"}.get(cls, ""))
    console.print(t)
    if doc["status_changes"]:
        t = Table(title="status changed")
        for col in ("layer", "id", "subject", "before", "after"):
            t.add_column(col)
        for x in doc["status_changes"]:
            t.add_row(x["layer"], x["id"], x["subject"], str(x["before"]), str(x["after"]))
        console.print(t)
    for g in doc["regressions"]:
        console.print(f"regression: {g['metric']} {g['change_pct']:+.1f} % beyond "
                      f"--max-regression {g['gate']}", style="red", highlight=False,
                      markup=False)


WIDE = ("<style>.side{display:flex;gap:2em;align-items:flex-start;flex-wrap:wrap}"
        ".side>div{flex:1 1 40em;min-width:30em}</style>")


def html_page(doc: dict[str, Any], rows: list[Row], before: Side, after: Side) -> str:
    """The table beside the overlaid latency spectra (before and after on one plot each)."""
    from .plots import figure_div, page, spectrum_figure

    e = html.escape
    c = doc["campaigns"]
    parts = [WIDE, "<h1>tailgate compare: campaigns</h1>",
             f"<p>before: {e(_steps_line(c['before']))}<br>after: "
             f"{e(_steps_line(c['after']))}</p>"]
    if doc["regressions"]:
        parts.append("<p class='worse'><b>regressions:</b> " + e("; ".join(
            f"{g['metric']} {g['change_pct']:+.1f} % (gate {g['gate']})"
            for g in doc["regressions"])) + "</p>")
    head = "".join(f"<th>{e(x)}</th>" for x in COLUMNS)
    body = "".join(f"<tr class='{_class(r)}'>" + "".join(
        f"<td{' class=num' if i in (3, 4, 5, 7) else ''}>{e(x)}</td>"
        for i, x in enumerate(_cells(r))) + "</tr>" for r in rows)
    table = f"<table id='campaign-table'><tr>{head}</tr>{body}</table>"
    if doc["status_changes"]:
        table += ("<h2>Status changed</h2><table id='status-changes'><tr><th>layer</th>"
                  "<th>id</th><th>subject</th><th>before</th><th>after</th></tr>"
                  + "".join(f"<tr><td>{e(x['layer'])}</td><td><code>{e(x['id'])}</code></td>"
                            f"<td>{e(x['subject'])}</td><td>{e(str(x['before']))}</td>"
                            f"<td>{e(str(x['after']))}</td></tr>"
                            for x in doc["status_changes"]) + "</table>")
    plots = []
    names = [n for n in after.spectra if n in before.spectra]
    for i, name in enumerate(names):
        (hb, unit), (ha, _) = before.spectra[name], after.spectra[name]
        fig = spectrum_figure([("before", hb), ("after", ha)], f"{name}: by percentile", unit)
        plots.append(figure_div(fig, f"spectrum-{i}"))
    parts.append(f"<div class='side'><div>{table}</div><div>{''.join(plots)}</div></div>")
    return page("tailgate compare: campaigns", "".join(parts), bool(plots))


# -- one campaign -------------------------------------------------------------------------

def report_document(camp: CampaignDir, side: Side) -> dict[str, Any]:
    return {"tailgate_campaign_report": 1, "campaign": summary(camp),
            "metrics": [{"name": m.name, "what": label(m.name), "layer": m.layer,
                         "unit": m.unit, "value": m.value, "ci": list(m.ci) if m.ci else None,
                         "samples": m.count} for m in _ordered(side)]}


def _ordered(side: Side):
    from ..compare import ORDER

    order = {layer: i for i, layer in enumerate(ORDER)}
    return sorted(side.metrics, key=lambda m: order.get(m.layer, len(ORDER)))


def _mcells(m: dict[str, Any]) -> tuple[str, ...]:
    unit = f" {m['unit']}" if m["unit"] else ""
    ci = f"{_v(m['ci'][0])} .. {_v(m['ci'][1])}" if m["ci"] else ""
    return (m["layer"], m["name"], m["what"], _v(m["value"]) + unit, ci,
            f"{m['samples']:,}" if m["samples"] else "")


MCOLUMNS = ("layer", "metric", "what", "value", "95 % interval", "samples")


def _step_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    return [(s["name"], s["status"], f"{s['duration_s']:.1f} s" if s["duration_s"] is not None
             else "", s["reason"]) for s in doc["campaign"]["steps"]]


def report_markdown(doc: dict[str, Any]) -> str:
    c = doc["campaign"]
    out = [f"# tailgate campaign: {c['name']}", "",
           f"{c['started']} .. {c['finished']}, hosts {', '.join(c['hosts'] or [])}, "
           f"tailgate {c['tailgate']}", "", "| step | status | time | reason |", "|---|---|---:|---|"]
    out += ["| " + " | ".join(x.replace("|", "\\|") for x in r) + " |" for r in _step_rows(doc)]
    out += ["", "| " + " | ".join(MCOLUMNS) + " |", "|---|---|---|---:|---:|---:|"]
    out += ["| " + " | ".join(x.replace("|", "\\|") for x in _mcells(m)) + " |"
            for m in doc["metrics"]]
    return "\n".join(out) + "\n"


def report_terminal(doc: dict[str, Any], console) -> None:
    from rich.table import Table

    t = Table(title=f"campaign {doc['campaign']['name']}: steps")
    for col in ("step", "status", "time", "reason"):
        t.add_column(col)
    for r in _step_rows(doc):
        t.add_row(*r, style={"failed": "red", "gate": "yellow"}.get(r[1], ""))
    console.print(t)
    t = Table(title="figures, bottom-up")
    for col in MCOLUMNS:
        t.add_column(col)
    for m in doc["metrics"]:
        t.add_row(*_mcells(m))
    console.print(t)


def report_html(doc: dict[str, Any], side: Side) -> str:
    from .plots import figure_div, page, spectrum_figure

    e = html.escape
    c = doc["campaign"]
    steps = "".join("<tr>" + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>"
                    for r in _step_rows(doc))
    figs = "".join("<tr>" + "".join(f"<td>{e(x)}</td>" for x in _mcells(m)) + "</tr>"
                   for m in doc["metrics"])
    plots = [figure_div(spectrum_figure([(name, h)], f"{name}: by percentile", unit),
                        f"spectrum-{i}") for i, (name, (h, unit)) in enumerate(side.spectra.items())]
    body = (f"{WIDE}<h1>tailgate campaign: {e(str(c['name']))}</h1>"
            f"<p>{e(str(c['started']))} .. {e(str(c['finished']))}, hosts "
            f"{e(', '.join(c['hosts'] or []))}</p><table id='steps'><tr><th>step</th>"
            f"<th>status</th><th>time</th><th>reason</th></tr>{steps}</table>"
            "<div class='side'><div><table id='figures'><tr>"
            + "".join(f"<th>{e(x)}</th>" for x in MCOLUMNS) + f"</tr>{figs}</table></div>"
            f"<div>{''.join(plots)}</div></div>")
    return page(f"tailgate campaign {c['name']}", body, bool(plots))
