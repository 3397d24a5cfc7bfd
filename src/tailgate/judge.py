"""Judge: pure functions from (snapshot, baseline) to findings.

A check module registers one function per SPEC id::

    @check("l2.net.drop_rate")
    def drop_rate(snap: Snapshot, p: dict) -> Result | list[Result]: ...

``p`` is the baseline's parameters for that id. A check reads facts with
:func:`need`, which raises :class:`Unknown` for a missing fact, so the finding
becomes ``unknown`` with the fact's reason. Every catalog id yields at least one
finding: an id with no registered check is ``unknown``, "not implemented yet".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .baseline import Baseline, catalog
from .model import Finding, Result, Snapshot

CHECK_MODULES = (
    "tailgate.checks.l1_physical",
    "tailgate.checks.l2_kernel",
    "tailgate.checks.l3_dataplane",
    "tailgate.checks.l4_inference",
    "tailgate.checks.probed",
    "tailgate.checks.l3_connections",
    "tailgate.checks.l3_dpdk",
)

CheckFn = Callable[[Snapshot, dict[str, Any]], "Result | list[Result]"]
_CHECKS: dict[str, CheckFn] = {}


class Unknown(Exception):
    """Raised inside a check when it cannot tell; the message is the reason."""


def check(check_id: str) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if check_id not in catalog():
            raise RuntimeError(f"check {check_id!r} is not in the catalog")
        if check_id in _CHECKS:
            raise RuntimeError(f"check {check_id!r} registered twice")
        _CHECKS[check_id] = fn
        return fn

    return register


def checks() -> dict[str, CheckFn]:
    for mod in CHECK_MODULES:
        importlib.import_module(mod)
    return _CHECKS


def need(snap: Snapshot, name: str, *, before: bool = False) -> Any:
    fact = snap.before_fact(name) if before else snap.fact(name)
    if not fact.ok:
        raise Unknown(fact.missing)
    return fact.value


def finding(check_id: str, result: Result, params: dict[str, Any]) -> Finding:
    entry = catalog()[check_id]
    return Finding(
        id=check_id,
        layer=entry.layer,
        title=entry.title,
        status=result.status,
        subject=result.subject,
        observed=result.observed,
        limit=params.get("limit"),
        unit=entry.unit,
        reason=result.reason,
        evidence=result.evidence,
        remedy=result.remedy if result.remedy is not None else entry.remedy,
    )


def run_check(check_id: str, fn: CheckFn | None, snap: Snapshot, params: dict[str, Any]) -> list[Finding]:
    if fn is None:
        results: list[Result] = [Result("unknown", reason="not implemented yet")]
    else:
        try:
            out = fn(snap, params)
            results = out if isinstance(out, list) else [out]
        except Unknown as exc:
            results = [Result("unknown", reason=str(exc))]
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            results = [Result("unknown", reason=f"internal error in check: {type(exc).__name__}: {exc}")]
        if not results:
            results = [Result("unknown", reason="the check returned no result")]
    return [finding(check_id, r, params) for r in results]


def judge(snap: Snapshot, baseline: Baseline) -> list[Finding]:
    registered = checks()
    findings: list[Finding] = []
    for check_id in catalog():
        params = baseline.get(check_id)
        if check_id in baseline.disabled:
            off = Result("skip", reason=f"disabled by the baseline ({baseline.source})")
            findings.append(finding(check_id, off, params))
            continue
        findings += run_check(check_id, registered.get(check_id), snap, params)
    return findings
