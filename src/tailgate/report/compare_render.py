"""Render a comparison: terminal, Markdown and HTML (JSON is the document itself)."""

from __future__ import annotations

import html
from typing import Any

from ..compare import Row, fmt_change
from ..hist import Histogram


def _v(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.3f}" if abs(x) < 1e5 else f"{x:,.0f}"


def _n(r: Row) -> str:
    if r.before_n is None and r.after_n is None:
        return ""
    return f"{r.before_n or 0:,} / {r.after_n or 0:,}"


def _sig(r: Row) -> str:
    return {"yes": "yes", "no": "no (noise)", "n/a": "n/a",
            "n/m": "n/m (not measurable)"}[r.significant]


def markdown(doc: dict[str, Any], rows: list[Row]) -> str:
    out = [f"# tailgate compare ({doc['kind']})", ""]
    for n in doc.get("measured_differently", ()):
        out += [f"**{n}**", ""]
    if doc["status_changes"]:
        out += ["Findings whose status changed:", "", "| layer | id | subject | before | after |",
                "|---|---|---|---|---|"]
        out += [f"| {c['layer']} | `{c['id']}` | {c['subject']} | {c['before']} | {c['after']} |"
                for c in doc["status_changes"]]
        out.append("")
    out += ["| layer | metric | before | after | change | significant | samples |",
            "|---|---|---:|---:|---:|---|---:|"]
    for r in rows:
        unit = f" {r.unit}" if r.unit else ""
        out.append(f"| {r.layer} | {r.name} | {_v(r.before)}{unit} | {_v(r.after)}{unit} | "
                   f"{fmt_change(r)} | {_sig(r)} | {_n(r)} |")
    for g in doc["regressions"]:
        out.append(f"\n**regression**: {g['metric']} {g['change_pct']:+.1f} % (gate {g['gate']})")
    return "\n".join(out) + "\n"


def terminal(doc: dict[str, Any], rows: list[Row], console) -> None:
    from rich.table import Table

    for n in doc.get("measured_differently", ()):
        console.print(f"[yellow]{n}[/yellow]", markup=True, highlight=False)
    if doc["status_changes"]:
        t = Table(title="findings whose status changed")
        for col in ("layer", "id", "subject", "before", "after"):
            t.add_column(col)
        for c in doc["status_changes"]:
            t.add_row(c["layer"], c["id"], c["subject"], c["before"], c["after"])
        console.print(t)
    t = Table(title=f"before / after ({doc['kind']})")
    for col, just in (("layer", "left"), ("metric", "left"), ("before", "right"),
                      ("after", "right"), ("change", "right"), ("significant", "left"),
                      ("samples", "right")):
        t.add_column(col, justify=just)
    for r in rows:
        style = "red" if r.worse and r.significant != "no" else (
            "green" if not r.worse and r.significant == "yes" else "")
        unit = f" {r.unit}" if r.unit else ""
        t.add_row(r.layer, r.name, _v(r.before) + unit, _v(r.after) + unit, fmt_change(r),
                  _sig(r), _n(r), style=style)
    console.print(t)
    for g in doc["regressions"]:
        console.print(f"[red]regression[/red]: {g['metric']} {g['change_pct']:+.1f} % "
                      f"beyond --max-regression {g['gate']}", markup=True, highlight=False)


def html_page(doc: dict[str, Any], rows: list[Row],
              spectra: dict[str, list[tuple[str, Histogram]]]) -> str:
    from .plots import figure_div, page, spectrum_figure

    e = html.escape
    parts = [f"<h1>tailgate compare: {e(doc['kind'])}</h1>",
             "<p>before: " + e(", ".join(doc["sources"]["before"])) + "<br>after: "
             + e(", ".join(doc["sources"]["after"])) + "</p>"]
    parts += [f"<p class='differently'><b>{e(n)}</b></p>"
              for n in doc.get("measured_differently", ())]
    if doc["regressions"]:
        parts.append("<p class='worse'><b>regressions:</b> " + e("; ".join(
            f"{g['metric']} {g['change_pct']:+.1f} % (gate {g['gate']})"
            for g in doc["regressions"])) + "</p>")
    if doc["status_changes"]:
        parts.append("<h2>Findings whose status changed</h2><table id='status-changes'><tr>"
                     "<th>layer</th><th>id</th><th>subject</th><th>before</th><th>after</th></tr>"
                     + "".join(f"<tr><td>{e(c['layer'])}</td><td><code>{e(c['id'])}</code></td>"
                               f"<td>{e(c['subject'])}</td><td>{e(str(c['before']))}</td>"
                               f"<td>{e(str(c['after']))}</td></tr>"
                               for c in doc["status_changes"]) + "</table>")
    body = []
    for r in rows:
        cls = "worse" if r.worse and r.significant != "no" else (
            "noise" if r.significant == "no" else "better" if r.significant == "yes" else "")
        unit = f" {r.unit}" if r.unit else ""
        body.append(f"<tr class='{cls}'><td>{e(r.layer)}</td><td>{e(r.name)}</td>"
                    f"<td class='num'>{e(_v(r.before) + unit)}</td>"
                    f"<td class='num'>{e(_v(r.after) + unit)}</td>"
                    f"<td class='num'>{e(fmt_change(r))}</td><td>{e(_sig(r))}</td>"
                    f"<td class='num'>{e(_n(r))}</td></tr>")
    parts.append("<h2>Before / after</h2><table id='before-after'><tr><th>layer</th>"
                 "<th>metric</th><th>before</th><th>after</th><th>change</th>"
                 "<th>significant</th><th>samples</th></tr>" + "".join(body) + "</table>")
    for i, (name, series) in enumerate(spectra.items()):
        fig = spectrum_figure(series, f"{name}: latency by percentile")
        parts.append(figure_div(fig, f"spectrum-{i}"))
    return page(f"tailgate compare ({doc['kind']})", "".join(parts), bool(spectra))
