"""Judge: pure functions from (snapshot, baseline) to findings.

A check module registers one function per SPEC id::

    @check("l2.net.drop_rate")
    def drop_rate(snap: Snapshot, p: dict) -> Result | list[Result]: ...

``p`` is the baseline's parameters for that id. A check reads facts with
:func:`need`, which raises :class:`Unknown` for a missing fact, so the finding
becomes ``unknown`` with the fact's reason. Every catalog id yields at least one
finding: an id with no registered check is ``unknown``, "not implemented yet".

Any other exception raised by a check is a defect of tailgate: the finding's status
is ``error``, with the exception in its reason and evidence. So is a check that read
a fact whose collector raised (``Fact.error``): what it said about that fact is not
a judgment of the host.

The platform rule: a check marked ``physical`` in the catalog (hardware a guest cannot
have: its NIC's PHY and optics, FEC, PCIe links, a hardware PTP clock) is ``skip`` on a
virtual machine, with :data:`VM_SKIP` as its reason and what it would have said on bare
metal in its evidence. The platform is the ``host.platform`` fact (``auto``), or what the
baseline's ``platform`` key or ``--platform`` says. An error stays an error.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable
from typing import Any

from .baseline import Baseline, catalog
from .errors import SourceError
from .model import Finding, Result, Snapshot

CHECK_MODULES = (
    "tailgate.checks.l1_physical",
    "tailgate.checks.l1_pcie_link",
    "tailgate.checks.l2_kernel",
    "tailgate.checks.l3_dataplane",
    "tailgate.checks.l4_inference",
    "tailgate.checks.probed",
    "tailgate.checks.l3_connections",
    "tailgate.checks.l3_dpdk",
    "tailgate.checks.l1_gpu",
    "tailgate.checks.l1_pfc",
    "tailgate.checks.l1_host",
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


def _crash(check_id: str, exc: BaseException) -> Result:
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    return Result("error", reason=f"tailgate bug: check {check_id} raised "
                                  f"{type(exc).__name__}: {exc}",
                  evidence={"check": check_id, "exception": f"{type(exc).__name__}: {exc}",
                            "traceback": [f"{f.filename}:{f.lineno} in {f.name}" for f in frames]})


def _crashed_facts(check_id: str, results: list[Result], crashed: dict[str, str]) -> list[Result]:
    """A check that read a fact whose collector raised: its unknowns are that error, and
    a pass or fail built around it still carries one error finding naming the fact."""
    names = ", ".join(sorted(crashed))
    out = [r if r.status != "unknown" else Result(
        "error", subject=r.subject, observed=r.observed, evidence={**r.evidence, "crashed_facts": crashed},
        reason=f"tailgate bug: collecting {names} raised: {r.reason}") for r in results]
    if not any(r.status == "error" for r in out):
        out.append(Result("error", reason=f"tailgate bug: check {check_id} read {names}, whose "
                                          f"collector raised: {'; '.join(crashed.values())}",
                          evidence={"crashed_facts": crashed}))
    return out


def run_check(check_id: str, fn: CheckFn | None, snap: Snapshot, params: dict[str, Any]) -> list[Finding]:
    if fn is None:
        results: list[Result] = [Result("unknown", reason="not implemented yet")]
    else:
        snap.crashed_reads.clear()
        try:
            out = fn(snap, params)
            results = out if isinstance(out, list) else [out]
            if not results:
                raise RuntimeError("the check returned no result")
            if not all(isinstance(r, Result) for r in results):
                raise TypeError(f"the check returned {results!r}, not Result objects")
        except (Unknown, SourceError) as exc:  # SourceError: a precise parse failure of host data
            results = [Result("unknown", reason=str(exc))]
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            results = [_crash(check_id, exc)]
        if snap.crashed_reads:
            results = _crashed_facts(check_id, results, dict(snap.crashed_reads))
        snap.crashed_reads.clear()
    return [finding(check_id, r, params) for r in results]


VM_SKIP = "virtual machine: its physical layer belongs to the host; inspect the host"
KINDS = ("baremetal", "vm", "container")


def resolve_platform(snap: Snapshot, setting: str = "auto") -> dict[str, Any]:
    """What the host is for the platform rule: ``{"kind", "setting", "detected"}`` (and
    ``"missing"``, the reason, when the platform could not be detected). ``kind`` is None
    when ``setting`` is auto and nothing told: every check then runs."""
    fact = snap.fact("host.platform")
    detected = fact.value if fact.ok and isinstance(fact.value, dict) else None
    out: dict[str, Any] = {"setting": setting, "detected": detected}
    if detected is not None and detected.get("kind") not in KINDS:
        out["missing"] = f"host.platform: unknown kind {str(detected.get('kind'))[:40]!r}"
        detected = out["detected"] = None
    elif not fact.ok:
        out["missing"] = fact.missing
    out["kind"] = setting if setting in KINDS else detected["kind"] if detected else None
    return out


def _describe(platform: dict[str, Any]) -> str:
    from .sources.platform import describe

    if platform["setting"] != "auto":
        return "set by --platform or the baseline's platform"
    return f"detected {describe(platform['detected'])}; --platform baremetal judges it"


def _on_vm(check_id: str, found: list[Finding], params: dict[str, Any],
           platform: dict[str, Any]) -> list[Finding]:
    """One skip for a physical check on a VM, keeping what it found (and any error)."""
    errors = [f for f in found if f.status == "error"]
    would = [{"status": f.status, "subject": f.subject, "observed": f.observed,
              "reason": f.reason} for f in found if f.status != "error"]
    skip = Result("skip", reason=f"{VM_SKIP} ({_describe(platform)})",
                  evidence={"platform": platform["kind"], "on_bare_metal_this_check_says": would})
    return [finding(check_id, skip, params), *errors]


def judge(snap: Snapshot, baseline: Baseline,
          platform: dict[str, Any] | None = None) -> list[Finding]:
    """Findings of every catalog id; ``platform`` is :func:`resolve_platform`'s answer
    (resolved from the baseline's ``platform`` when not given)."""
    registered = checks()
    platform = platform or resolve_platform(snap, baseline.platform)
    findings: list[Finding] = []
    for check_id, entry in catalog().items():
        params = baseline.get(check_id)
        if check_id in baseline.disabled:
            off = Result("skip", reason=f"disabled by the baseline ({baseline.source})")
            findings.append(finding(check_id, off, params))
            continue
        found = run_check(check_id, registered.get(check_id), snap, params)
        if entry.physical and platform["kind"] == "vm":
            found = _on_vm(check_id, found, params, platform)
        findings += found
    return findings
