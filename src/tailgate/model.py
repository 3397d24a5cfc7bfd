"""The shared vocabulary: facts, snapshots, findings and reports.

Data flows one way: collect -> Snapshot -> judge -> Findings -> verdict -> Report -> render.
Everything here is plain data that round-trips through JSON, so a snapshot saved
on one host can be judged on another (``--from``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .errors import ParseError, SourceError

__all__ = ["ParseError", "SourceError"]  # re-exported: every source imports them from here

# ``error``: a check or a parser raised. That is a defect of tailgate, not a fact about the
# host, so it is kept apart from ``unknown`` (could not tell) and never passes a gate.
Status = Literal["pass", "warn", "fail", "skip", "unknown", "error"]
STATUSES: tuple[Status, ...] = ("pass", "warn", "fail", "skip", "unknown", "error")
LAYERS = ("L1", "L2", "L3", "L4")
# How bad a status is, for "worst of" and for --fail-on.
SEVERITY = {"skip": 0, "pass": 0, "unknown": 1, "warn": 2, "fail": 3, "error": 4}
FAIL_ON = ("fail", "warn", "unknown")
VerdictStatus = Literal["pass", "incomplete", "warn", "fail", "error"]




@dataclass(frozen=True)
class Fact:
    """One thing read from the host: a JSON-able value, or the reason it is missing.

    ``error`` marks a missing fact whose collector or parser raised unexpectedly (a
    tailgate defect): a check that reads it yields ``error``, not ``unknown``.
    """

    value: Any = None
    missing: str | None = None
    error: bool = False

    @property
    def ok(self) -> bool:
        return self.missing is None

    def to_json(self) -> dict[str, Any]:
        if self.missing is None:
            return {"value": self.value}
        return {"missing": self.missing, **({"error": True} if self.error else {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fact:
        if "missing" in data:
            return cls(missing=str(data["missing"]), error=data.get("error") is True)
        return cls(value=data.get("value"))


@dataclass
class Snapshot:
    """Facts from one inspection.

    ``before`` holds counters sampled at t0 and ``facts`` everything sampled at
    t1, ``interval_s`` apart, so a check derives rates from the pair. ``target``
    records what the user asked to inspect (pids, cgroup, interfaces).
    """

    host: dict[str, Any]
    target: dict[str, Any]
    interval_s: float
    taken_at: float
    facts: dict[str, Fact] = field(default_factory=dict)
    before: dict[str, Fact] = field(default_factory=dict)
    version: str = ""
    # Counters of the last stored run of this host (history.py) and when they were
    # sampled: the long window for per-hour rates. Empty on a first run.
    earlier: dict[str, Fact] = field(default_factory=dict)
    earlier_at: float | None = None
    # Names of facts read that a collector failed to produce by raising (see Fact.error);
    # the judge resets it around each check. Not part of the snapshot's data.
    crashed_reads: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def _lookup(self, table: dict[str, Fact], name: str, absent: str) -> Fact:
        fact = table.get(name)
        if fact is None:
            # A collector that failed as a whole left its reason under its own name
            # ("ethtool.fec" for "ethtool.fec.eth0"): say that, not "not collected".
            parts = name.split(".")
            for i in range(len(parts) - 1, 0, -1):
                parent = table.get(".".join(parts[:i]))
                if parent is not None and not parent.ok:
                    fact = Fact(missing=parent.missing, error=parent.error)
                    break
            else:
                fact = Fact(missing=absent)
        if fact.error:
            self.crashed_reads[name] = fact.missing or ""
        return fact

    def fact(self, name: str) -> Fact:
        return self._lookup(self.facts, name, f"fact {name!r} was not collected")

    def before_fact(self, name: str) -> Fact:
        return self._lookup(self.before, name, f"no earlier sample of {name!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "tailgate_snapshot": 1,
            "version": self.version,
            "host": self.host,
            "target": self.target,
            "interval_s": self.interval_s,
            "taken_at": self.taken_at,
            "facts": {k: v.to_json() for k, v in sorted(self.facts.items())},
            "before": {k: v.to_json() for k, v in sorted(self.before.items())},
            "earlier": {k: v.to_json() for k, v in sorted(self.earlier.items())},
            "earlier_at": self.earlier_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Snapshot:
        """The snapshot in ``data``; ValueError naming the first field of the wrong shape
        (a snapshot may come from anywhere: its facts are judged, its target is trusted)."""
        if not isinstance(data, dict) or data.get("tailgate_snapshot") != 1:
            raise ValueError("not a tailgate snapshot (missing 'tailgate_snapshot': 1)")
        return cls(
            host=_mapping(data.get("host"), "host"),
            target=_target(data.get("target")),
            interval_s=_number(data.get("interval_s"), "interval_s"),
            taken_at=_number(data.get("taken_at"), "taken_at"),
            facts=_facts(data.get("facts"), "facts"),
            before=_facts(data.get("before"), "before"),
            version=str(data.get("version") or ""),
            earlier=_facts(data.get("earlier"), "earlier"),
            earlier_at=(_number(data["earlier_at"], "earlier_at")
                        if data.get("earlier_at") is not None else None),
        )


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected an object, got {type(value).__name__}")
    return dict(value)


def _number(value: Any, what: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: expected a finite number >= 0, got {value!r}")
    return float(value)


def _facts(value: Any, what: str) -> dict[str, Fact]:
    out = {}
    for name, fact in _mapping(value, what).items():
        if not isinstance(fact, dict) or not ({"value", "missing"} & set(fact)):
            raise ValueError(f"{what}.{name}: expected {{\"value\": ...}} or {{\"missing\": reason}}")
        out[name] = Fact.from_json(fact)
    return out


def _target(value: Any) -> dict[str, Any]:
    """What the snapshot says was inspected: pids, cgroup and interfaces checked like the
    command-line arguments they came from."""
    target = _mapping(value, "target")
    pids = target.get("pids") or []
    if not isinstance(pids, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p <= 2**22 for p in pids):
        raise ValueError("target.pids: expected a list of PIDs (1 .. 4194304)")
    ifaces = target.get("ifaces") or []
    if not isinstance(ifaces, list) or not all(isinstance(i, str) for i in ifaces):
        raise ValueError("target.ifaces: expected a list of interface names")
    if target.get("cgroup") is not None and not isinstance(target["cgroup"], str):
        raise ValueError("target.cgroup: expected a path")
    return target


@dataclass(frozen=True)
class Result:
    """What a check function returns: a judgment, before the catalog fills in the rest."""

    status: Status
    subject: str = "host"
    observed: Any = None
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    remedy: str | None = None  # overrides the catalog's remedy when set


@dataclass(frozen=True)
class Finding:
    id: str
    layer: str
    title: str
    status: Status
    subject: str
    observed: Any
    limit: Any
    unit: str
    reason: str
    evidence: dict[str, Any]
    remedy: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """The report's summary.

    ``status``: ``error`` when any finding is an error (tailgate failed, trust nothing),
    else ``fail``/``warn`` from the worst finding, else ``incomplete`` when something
    applicable was not measured (an ``unknown``, or a required id that was skipped),
    else ``pass``. ``unmeasured`` names each unknown finding, why, and what would
    measure it; ``unmet_required`` each required id that was not measured and passed
    or warned; ``errors`` each error finding.
    """

    status: VerdictStatus
    first_failing_layer: str | None
    counts: dict[str, int]
    unmeasured: tuple[dict[str, Any], ...] = ()
    required: tuple[str, ...] = ()
    unmet_required: tuple[dict[str, Any], ...] = ()
    errors: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Report:
    version: str
    host: dict[str, Any]
    target: dict[str, Any]
    interval_s: float
    taken_at: float
    verdict: Verdict
    findings: tuple[Finding, ...]
    # What the host is for the platform rule (judge.resolve_platform): kind, setting, detected.
    platform: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "tailgate": self.version,
            "host": self.host,
            "platform": self.platform,
            "target": self.target,
            "interval_s": self.interval_s,
            "taken_at": self.taken_at,
            "verdict": asdict(self.verdict),
            "findings": [f.to_json() for f in self.findings],
        }
