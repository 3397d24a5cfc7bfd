"""The shared vocabulary: facts, snapshots, findings and reports.

Data flows one way: collect -> Snapshot -> judge -> Findings -> verdict -> Report -> render.
Everything here is plain data that round-trips through JSON, so a snapshot saved
on one host can be judged on another (``--from``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "warn", "fail", "skip", "unknown"]
STATUSES: tuple[Status, ...] = ("pass", "warn", "fail", "skip", "unknown")
LAYERS = ("L1", "L2", "L3", "L4")
# How bad a status is, for "worst of" and for --fail-on.
SEVERITY = {"skip": 0, "pass": 0, "unknown": 1, "warn": 2, "fail": 3}


class SourceError(Exception):
    """A fact could not be read. The message is the reason shown to the user."""


class ParseError(SourceError):
    """A source was read but its content did not have the expected shape."""


@dataclass(frozen=True)
class Fact:
    """One thing read from the host: a JSON-able value, or the reason it is missing."""

    value: Any = None
    missing: str | None = None

    @property
    def ok(self) -> bool:
        return self.missing is None

    def to_json(self) -> dict[str, Any]:
        return {"missing": self.missing} if self.missing is not None else {"value": self.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fact:
        if "missing" in data:
            return cls(missing=str(data["missing"]))
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

    def fact(self, name: str) -> Fact:
        return self.facts.get(name) or Fact(missing=f"fact {name!r} was not collected")

    def before_fact(self, name: str) -> Fact:
        return self.before.get(name) or Fact(missing=f"no earlier sample of {name!r}")

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
        if not isinstance(data, dict) or data.get("tailgate_snapshot") != 1:
            raise ValueError("not a tailgate snapshot (missing 'tailgate_snapshot': 1)")
        return cls(
            host=dict(data.get("host") or {}),
            target=dict(data.get("target") or {}),
            interval_s=float(data.get("interval_s") or 0.0),
            taken_at=float(data.get("taken_at") or 0.0),
            facts={k: Fact.from_json(v) for k, v in (data.get("facts") or {}).items()},
            before={k: Fact.from_json(v) for k, v in (data.get("before") or {}).items()},
            version=str(data.get("version") or ""),
            earlier={k: Fact.from_json(v) for k, v in (data.get("earlier") or {}).items()},
            earlier_at=(float(data["earlier_at"]) if data.get("earlier_at") is not None
                        else None),
        )


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
    status: Literal["pass", "warn", "fail"]
    first_failing_layer: str | None
    counts: dict[str, int]


@dataclass(frozen=True)
class Report:
    version: str
    host: dict[str, Any]
    target: dict[str, Any]
    interval_s: float
    taken_at: float
    verdict: Verdict
    findings: tuple[Finding, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "tailgate": self.version,
            "host": self.host,
            "target": self.target,
            "interval_s": self.interval_s,
            "taken_at": self.taken_at,
            "verdict": asdict(self.verdict),
            "findings": [f.to_json() for f in self.findings],
        }
