"""The pyramid report in the terminal, bottom-up L1 -> L4 (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..model import LAYERS, Report

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "unknown": "magenta"}
NAMES = {"L1": "physical interconnect and hardware clocks", "L2": "kernel scheduling and I/O stack",
         "L3": "user-space data plane and runtime", "L4": "inference engine and operator scheduling"}


def _observed(f) -> str:
    if f.observed is None:
        return ""
    value = f"{f.observed:.4g}" if isinstance(f.observed, float) else str(f.observed)
    return f"{value} {f.unit}".strip() if f.unit not in ("", "''") else value


def print_report(report: Report, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    host = report.host
    console.print(f"[bold]tailgate inspect[/] {host.get('hostname')}  kernel {host.get('kernel')}  "
                  f"interval {report.interval_s:.2f} s")
    for layer in LAYERS:
        findings = [f for f in report.findings if f.layer == layer]
        worst = ("fail" if any(f.status == "fail" for f in findings) else
                 "warn" if any(f.status == "warn" for f in findings) else "pass")
        table = Table(title=Text(f"{layer}  {NAMES[layer]}", style=STYLE[worst]),
                      title_justify="left", expand=True, show_edge=False, pad_edge=False)
        table.add_column("status", width=7)
        table.add_column("check", no_wrap=True)
        table.add_column("subject", max_width=18)
        table.add_column("observed", max_width=18)
        table.add_column("limit", max_width=10)
        table.add_column("reason", ratio=1)
        for f in findings:
            table.add_row(Text(f.status, style=STYLE[f.status]), f.id, f.subject, _observed(f),
                          "" if f.limit is None else str(f.limit), f.reason)
        console.print(table)
    v = report.verdict
    counts = "  ".join(f"{k} {n}" for k, n in v.counts.items())
    if v.first_failing_layer:
        console.print(Text(f"verdict: FAIL — fix {v.first_failing_layer} first "
                           f"({NAMES[v.first_failing_layer]})", style="bold red"))
    else:
        console.print(Text(f"verdict: {v.status.upper()}", style=STYLE[v.status]))
    console.print(counts)
