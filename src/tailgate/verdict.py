"""Verdict: order findings bottom-up, name the lowest failing layer, and decide the gate.

A report passes only when every applicable id passed. What could not be measured
makes it ``incomplete`` (each unmeasured id is named with what would measure it);
a check or parser that raised makes it ``error``, whatever else it says.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable

from .baseline import catalog
from .errors import EXIT_BUG, EXIT_GATE, EXIT_OK
from .model import FAIL_ON, LAYERS, SEVERITY, STATUSES, Finding, Report, Snapshot, Verdict

UNMEASURED = ("unknown", "skip", "error")  # what leaves a required id unmet


def _needs(check_id: str) -> str:
    entry = catalog().get(check_id)
    return entry.needs if entry is not None else ""


def verdict(findings: list[Finding], required: Iterable[str] = ()) -> Verdict:
    counts = Counter(f.status for f in findings)
    required = tuple(dict.fromkeys(required))
    unmet = tuple(
        {"id": cid, "statuses": sorted({f.status for f in mine}),
         "reason": "; ".join(dict.fromkeys(f.reason for f in mine if f.status in UNMEASURED))
         or "no finding"}
        for cid in required
        for mine in [[f for f in findings if f.id == cid]]
        if not mine or any(f.status in UNMEASURED for f in mine))
    if counts["error"]:
        status = "error"
    elif counts["fail"]:
        status = "fail"
    elif counts["warn"]:
        status = "warn"
    elif counts["unknown"] or unmet:
        status = "incomplete"
    else:
        status = "pass"
    first = next((layer for layer in LAYERS if any(
        f.layer == layer and f.status == "fail" for f in findings)), None)
    unmeasured = tuple({"id": f.id, "subject": f.subject, "reason": f.reason,
                        "needs": _needs(f.id)} for f in findings if f.status == "unknown")
    errors = tuple({"id": f.id, "subject": f.subject, "reason": f.reason}
                   for f in findings if f.status == "error")
    return Verdict(status=status, first_failing_layer=first,
                   counts={s: counts.get(s, 0) for s in STATUSES},
                   unmeasured=unmeasured, required=required, unmet_required=unmet, errors=errors)


def build_report(snap: Snapshot, findings: list[Finding], required: Iterable[str] = (),
                 platform: dict | None = None) -> Report:
    """The report; ``platform`` is what :func:`tailgate.judge.resolve_platform` decided
    (the detected platform, auto, when not given)."""
    if platform is None:
        from .judge import resolve_platform

        platform = resolve_platform(snap)
    order = {layer: i for i, layer in enumerate(LAYERS)}
    ordered = sorted(findings, key=lambda f: order.get(f.layer, 99))  # stable: catalog order inside a layer
    return Report(
        version=snap.version,
        host=snap.host,
        target=snap.target,
        interval_s=snap.interval_s,
        taken_at=snap.taken_at,
        verdict=verdict(ordered, required),
        findings=tuple(ordered),
        platform=platform,
    )


def judged_report(snap: Snapshot, baseline, required: Iterable[str] = (),
                  platform: str | None = None) -> Report:
    """judge -> verdict in one step, the platform resolved once for both: ``platform``
    (--platform) when given, else the baseline's ``platform`` key (auto by default)."""
    from .judge import judge, resolve_platform

    resolved = resolve_platform(snap, platform or baseline.platform)
    return build_report(snap, judge(snap, baseline, resolved), required, resolved)


def exit_status(report: Report, fail_on: str = "fail") -> int:
    """The gate: 3 when any finding is an error (tailgate failed); 1 when a finding is at
    or above ``fail_on`` (fail|warn|unknown) or a required id was not measured; else 0."""
    if fail_on not in FAIL_ON:
        raise ValueError(f"fail_on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")
    if any(f.status == "error" for f in report.findings):
        return EXIT_BUG
    threshold = SEVERITY[fail_on]
    if report.verdict.unmet_required or any(SEVERITY[f.status] >= threshold
                                            for f in report.findings):
        return EXIT_GATE
    return EXIT_OK


ERROR_LOG_ENV = "TAILGATE_ERROR_LOG"


def log_errors(report: Report) -> None:
    """Append every ``error`` finding as a JSON line to $TAILGATE_ERROR_LOG, when set: the
    test suite sets it so that a tailgate bug in any run, even in a subprocess, fails it."""
    path = os.environ.get(ERROR_LOG_ENV)
    errors = [f for f in report.findings if f.status == "error"]
    if not path or not errors:
        return
    with open(path, "a", encoding="utf-8") as fh:
        for f in errors:
            fh.write(json.dumps({"where": f"tailgate inspect (pid {os.getpid()})",
                                 **f.to_json()}, default=str) + "\n")
