"""The pyramid report in the terminal: findings bottom-up L1 -> L4, then the pyramid.

One line per finding (status, id, subject, observed vs limit), its reason
indented below, so it reads the same in an 80-column CI log as in a wide
terminal. The closing pyramid puts L1 at the base and marks the layer to fix first.

By default the report fits a screen: the findings that need the reader (fail, warn,
error) in full, an unknown as its line and, at the end, what would measure it (its ids
grouped by that), a pass as its line, and a layer's skips as one line grouped by their
shared reason; ``all_findings`` prints every finding with its reason. The JSON,
JUnit and HTML reports always hold every finding.
"""

from __future__ import annotations

import textwrap
from collections import Counter

from rich.console import Console
from rich.text import Text

from ..model import LAYERS, Finding, Report
from ..safe import clean_report

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim",
         "unknown": "magenta", "error": "bold white on red", "incomplete": "magenta"}
NAMES = {"L1": "physical interconnect and hardware clocks",
         "L2": "kernel scheduling and I/O stack",
         "L3": "user-space data plane and runtime",
         "L4": "inference engine and operator scheduling"}


def _value(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _measure(f: Finding) -> str:
    unit = "" if f.unit in ("", "''") else f" {f.unit}"
    if f.observed is None or f.observed == "":
        return "" if f.limit is None else f"limit {_value(f.limit)}{unit}"
    limit = "" if f.limit is None else f" (limit {_value(f.limit)})"
    return f"{_value(f.observed)}{unit}{limit}"


def _line(f: Finding) -> Text:
    line = Text("  ")
    line.append(f"{f.status.upper():<7}", style=STYLE[f.status])
    line.append(f" {f.id:<27}", style="bold" if f.status == "fail" else "")
    line.append(f" {f.subject}")
    measure = _measure(f)
    if measure:
        line.append(f"  {measure}", style="cyan")
    return line


def _wrapped(text: str, width: int) -> Text:
    indent = " " * 11
    return Text(textwrap.fill(text, max(40, width - 1), initial_indent=indent,
                              subsequent_indent=indent))


def _layer_status(findings: list[Finding]) -> str:
    statuses = {f.status for f in findings}
    for s in ("error", "fail", "warn", "unknown", "pass"):
        if s in statuses:
            return s
    return "skip"


NEEDS_READER = ("fail", "warn", "unknown", "error")


def _headline(reason: str) -> str:
    """A reason's first clause (before its details in parentheses or after a ';'): what
    skips of one layer share ("no NVIDIA GPU on this host")."""
    return reason.split(" (", 1)[0].split("; ", 1)[0].strip() or "no reason given"


def _skipped(findings: list[Finding], width: int) -> Text:
    """A layer's skips as one line: how many, grouped by their shared reason."""
    groups: dict[str, int] = {}
    for f in findings:
        key = _headline(f.reason or "")
        groups[key] = groups.get(key, 0) + 1
    parts = [f"{why} ({n})" if n > 1 else why
             for why, n in sorted(groups.items(), key=lambda kv: -kv[1])]  # stable: first seen
    return Text(textwrap.fill(f"{len(findings)} skipped: " + "; ".join(parts),
                              max(40, width - 1), initial_indent="  ",
                              subsequent_indent=" " * 11), style=STYLE["skip"])


def print_report(report: Report, console: Console | None = None, verbose: bool = False,
                 all_findings: bool = False) -> None:
    console = console or Console(highlight=False, soft_wrap=False)
    report = clean_report(report, keep_newlines=False)  # host text may hold escape sequences
    host = report.host
    console.print(Text.assemble(("tailgate inspect ", "bold"), str(host.get("hostname")),
                                f"  kernel {host.get('kernel')}  interval {report.interval_s:.2f} s"))
    if report.platform:
        console.print(Text(f"platform: {platform_line(report.platform)}", style="dim"))
    by_layer = {layer: [f for f in report.findings if f.layer == layer] for layer in LAYERS}
    # an unmeasured id is closed by what would measure it (_unmeasured): by default that
    # line says it, and its finding is one line above
    closed = {u["id"] for u in report.verdict.unmeasured} if not all_findings else set()
    for layer in LAYERS:
        findings = by_layer[layer]
        console.print()
        console.print(Text(f"{layer}  {NAMES[layer]}", style="bold " + STYLE[_layer_status(findings)]))
        for f in findings:
            if not all_findings and f.status == "skip":
                continue
            console.print(_line(f))
            if f.reason and (verbose or (f.status in NEEDS_READER and f.id not in closed)
                             or (all_findings and (f.status != "pass" or len(f.reason) < 70))):
                console.print(_wrapped(f.reason, console.width), style="dim")
            if f.status in ("fail", "warn") and f.remedy:
                console.print(_wrapped("remedy: " + f.remedy, console.width), style="italic")
        skips = [f for f in findings if f.status == "skip"]
        if skips and not all_findings:
            console.print(_skipped(skips, console.width))
    console.print()
    _pyramid(report, by_layer, console, grouped=not all_findings)
    if not all_findings:
        console.print(Text("(--all prints every finding with its reason)", style="dim"))


def platform_line(platform: dict) -> str:
    """``virtual machine (kvm), in a container (docker) (detected): L1's hardware checks
    are skipped``: what the host is and what that does to the checks."""
    from ..sources.platform import describe

    kind = platform.get("kind")
    if kind is None:
        return f"unknown ({platform.get('missing') or 'not detected'}): every check runs"
    detected = platform.get("detected")
    if platform.get("setting") == "auto" and isinstance(detected, dict):
        text = f"{describe(detected)} (detected)"
    else:
        text = f"{describe({'kind': kind})} (set by --platform or the baseline)"
    if kind == "vm":
        text += ": L1's hardware checks are skipped, inspect the hypervisor's host for them"
    return text


def _pyramid(report: Report, by_layer: dict[str, list[Finding]], console: Console,
             grouped: bool = False) -> None:
    first = report.verdict.first_failing_layer
    width = 44
    for i, layer in enumerate(reversed(LAYERS)):  # L4 at the top, L1 the base
        counts = Counter(f.status for f in by_layer[layer])
        summary = " ".join(f"{counts[s]}{s[0]}" for s in ("error", "fail", "warn", "pass", "unknown",
                                                          "skip") if counts[s])
        label = f"{layer} {_layer_status(by_layer[layer]).upper():<7}"
        box = label.center(width - 2 * (len(LAYERS) - 1 - i) * 4)
        line = Text(" " * ((len(LAYERS) - 1 - i) * 4))
        line.append(f"[{box}]", style=STYLE[_layer_status(by_layer[layer])])
        line.append(f"  {summary}")
        if layer == first:
            line.append("  <- fix first", style="bold red")
        console.print(line)
    v = report.verdict
    if v.status == "error":
        console.print(Text(f"verdict: ERROR - tailgate failed in {len(v.errors)} check(s) "
                           f"({', '.join(sorted({e['id'] for e in v.errors}))}): this report "
                           "proves nothing; please report the bug", style=STYLE["error"]))
    elif first:
        console.print(Text(f"verdict: FAIL - fix {first} ({NAMES[first]}) first", style="bold red"))
    elif v.status == "incomplete":
        console.print(Text(f"verdict: INCOMPLETE - nothing crossed a red line, but "
                           f"{len({u['id'] for u in v.unmeasured} | {u['id'] for u in v.unmet_required})}"
                           " id(s) were not measured", style=STYLE["incomplete"]))
    else:
        console.print(Text(f"verdict: {v.status.upper()}", style=STYLE[v.status]))
    _unmeasured(v, console, grouped)
    console.print(Text("(e error, f fail, w warn, p pass, u unknown, s skip)", style="dim"))


def _unmeasured(v, console: Console, grouped: bool = False) -> None:
    """What stayed unmeasured and what would measure it, one line per id (``grouped``: one
    line per remedy, the ids it would measure before it)."""
    if v.unmet_required:
        console.print(Text("required but not measured (the gate fails):", style="bold red"))
        for u in v.unmet_required:
            console.print(_wrapped(f"{u['id']} ({'/'.join(u['statuses']) or 'absent'}): "
                                   f"{u['reason']}", console.width))
    by_id: dict[str, list[dict]] = {}
    for u in v.unmeasured:
        by_id.setdefault(u["id"], []).append(u)
    if not by_id:
        return
    # each reason is printed at its finding above; here, what would measure it
    console.print(Text("not measured (what would measure it):", style="magenta"))
    by_needs: dict[str, list[str]] = {}
    for cid, items in by_id.items():
        needs = items[0]["needs"] or items[0]["reason"]
        by_needs.setdefault(needs if grouped else cid, []).append(cid)
        if not grouped:
            console.print(_wrapped(f"{cid}: {needs}", console.width))
    if grouped:
        for needs, ids in by_needs.items():
            console.print(_wrapped(f"{', '.join(ids)}: {needs}", console.width))
