"""Verdict: order findings bottom-up and name the lowest failing layer."""

from __future__ import annotations

from collections import Counter

from .model import LAYERS, SEVERITY, Finding, Report, Snapshot, Verdict


def verdict(findings: list[Finding]) -> Verdict:
    counts = Counter(f.status for f in findings)
    status = "fail" if counts["fail"] else "warn" if counts["warn"] else "pass"
    first = next((layer for layer in LAYERS if any(
        f.layer == layer and f.status == "fail" for f in findings)), None)
    return Verdict(status=status, first_failing_layer=first,
                   counts={s: counts.get(s, 0) for s in ("pass", "warn", "fail", "skip", "unknown")})


def build_report(snap: Snapshot, findings: list[Finding]) -> Report:
    order = {layer: i for i, layer in enumerate(LAYERS)}
    ordered = sorted(findings, key=lambda f: order.get(f.layer, 99))  # stable: catalog order inside a layer
    return Report(
        version=snap.version,
        host=snap.host,
        target=snap.target,
        interval_s=snap.interval_s,
        taken_at=snap.taken_at,
        verdict=verdict(ordered),
        findings=tuple(ordered),
    )


def exit_status(report: Report, fail_on: str) -> int:
    """0 when nothing reaches ``fail_on`` (fail|warn), else 1."""
    threshold = SEVERITY[fail_on]
    return 1 if any(SEVERITY[f.status] >= threshold and f.status != "unknown"
                    for f in report.findings) else 0
