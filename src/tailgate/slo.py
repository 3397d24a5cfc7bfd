"""Service-level objectives: ``p999<5ms``, ``error_rate<0.1%``, ``rate>=9900`` (pure).

Grammar: ``METRIC OP VALUE[UNIT]`` with OP one of ``< <= > >=``.

* time metrics — ``p50 p90 p95 p99 p999 p9999 max mean`` of the latency, or with a
  prefix ``latency. service. lateness.`` (``service.p99<1ms``); the value needs a
  unit ``ns us µs ms s``;
* ``error_rate`` — errors / sent, as a fraction or with ``%``;
* ``errors`` — error count; ``rate`` — achieved requests/s (``k`` suffix allowed).

:func:`evaluate` takes the result JSON (see :mod:`tailgate.bench.result`) so any producer of
that shape — the OpenAI bench too — can be gated the same way; extra metrics
are looked up as ``metrics[name]`` in the JSON when a producer supplies them.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

from .errors import InputError

_EXPR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(<=|>=|<|>)\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
                   r"\s*([A-Za-zµ%]*)\s*$")
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_TIME_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}
TIME_STATS = ("p50", "p90", "p95", "p99", "p999", "p9999", "max", "mean")
SERIES = {"latency": "latency_ms", "service": "service_time_ms", "lateness": "lateness_ms"}


class SloError(InputError):
    """An SLO expression that cannot be parsed (message says why and what is allowed)."""


@dataclass(frozen=True)
class Slo:
    """One parsed objective. ``limit`` is in the metric's unit: ms for times,
    a fraction for ``error_rate``, a count for ``errors``, req/s for ``rate``."""

    expr: str
    metric: str  # canonical: "latency.p999", "error_rate", "errors", "rate", or a custom name
    op: str
    limit: float
    unit: str

    def holds(self, observed: float) -> bool:
        return bool(_OPS[self.op](observed, self.limit))


def parse_slo(expr: str, custom: dict[str, str] | None = None) -> Slo:
    """Parse one expression. ``custom`` maps extra metric names to their unit
    ("ms", "fraction", "count", "rate") for producers with more metrics."""
    m = _EXPR.match(expr)
    if not m:
        raise SloError(f"bad SLO {expr!r}: expected METRIC<VALUE, e.g. p999<5ms, "
                       f"error_rate<0.1%, rate>=9900")
    name, op, num, unit = m.group(1), m.group(2), float(m.group(3)), m.group(4)
    series, _, stat = name.rpartition(".")
    if not series and stat in TIME_STATS:
        series = "latency"
    if custom and name in custom:
        kind = custom[name]
        if kind == "ms":
            return Slo(expr, name, op, _time_ms(expr, num, unit), "ms")
        return Slo(expr, name, op, _plain(expr, num, unit, kind), kind)
    if series in SERIES and stat in TIME_STATS:
        return Slo(expr, f"{series}.{stat}", op, _time_ms(expr, num, unit), "ms")
    if name == "error_rate":
        return Slo(expr, name, op, _plain(expr, num, unit, "fraction"), "fraction")
    if name == "errors":
        return Slo(expr, name, op, _plain(expr, num, unit, "count"), "count")
    if name == "rate":
        return Slo(expr, name, op, _plain(expr, num, unit, "rate"), "req/s")
    known = ", ".join([*TIME_STATS, "service.p99", "lateness.p99", "error_rate", "errors",
                       "rate", *(custom or {})])
    raise SloError(f"unknown SLO metric {name!r} in {expr!r} (known: {known})")


def _time_ms(expr: str, num: float, unit: str) -> float:
    if unit not in _TIME_UNITS_MS:
        raise SloError(f"{expr!r}: a time needs a unit (ns, us, ms, s)")
    return num * _TIME_UNITS_MS[unit]


def _plain(expr: str, num: float, unit: str, kind: str) -> float:
    if kind == "fraction":
        if unit == "%":
            return num / 100.0
        if unit == "" and num <= 1.0:
            return num
        raise SloError(f"{expr!r}: give a rate as a fraction (0.001) or a percentage (0.1%)")
    if kind == "rate" and unit in ("k", "K"):
        return num * 1e3
    if unit:
        raise SloError(f"{expr!r}: unexpected unit {unit!r}")
    return num


def observe(slo: Slo, result: dict[str, Any]) -> float | None:
    """The observed value of ``slo``'s metric in a result JSON (None: not available)."""
    series, _, stat = slo.metric.rpartition(".")
    if series in SERIES:
        block = result.get(SERIES[series]) or {}
        if not block.get("count"):
            return None
        return block.get(stat)
    req = result.get("requests") or {}
    sent = req.get("sent", 0)
    errors = sum((req.get("errors") or {}).values())
    if slo.metric == "error_rate":
        return errors / sent if sent else None
    if slo.metric == "errors":
        return float(errors)
    if slo.metric == "rate":
        return (result.get("rate") or {}).get("achieved")
    return (result.get("metrics") or {}).get(slo.metric)


def _not_measurable(slo: Slo, result: dict[str, Any]) -> str | None:
    """Why ``slo``'s percentile has no confidence interval in ``result`` (None: it has one,
    or the producer gives no intervals)."""
    series, _, stat = slo.metric.rpartition(".")
    if series not in SERIES:
        return None
    ci = ((result.get(SERIES[series]) or {}).get("ci") or {}).get(stat)
    if ci is None or ci.get("measurable", True):
        return None
    return str(ci.get("reason", "no confidence interval"))


def evaluate(slos: list[Slo], result: dict[str, Any]) -> list[dict[str, Any]]:
    """One JSON record per SLO: ``{"expr", "metric", "limit", "unit", "observed", "pass"}``.

    The one place that decides what an SLO means, for every path that judges a bench
    result (``bench``, ``--scenario``, ``--ray``, sweeps, collectives): an SLO whose
    metric has no samples fails, with ``"reason"`` (an objective nobody measured is not
    met), and so does one on a percentile whose confidence interval cannot be formed
    from the samples (its ``ci`` says not measurable).
    """
    out = []
    for slo in slos:
        observed = observe(slo, result)
        rec: dict[str, Any] = {"expr": slo.expr, "metric": slo.metric, "op": slo.op,
                               "limit": slo.limit, "unit": slo.unit, "observed": observed}
        unmeasurable = _not_measurable(slo, result)
        if observed is None:
            rec["pass"] = False
            rec["reason"] = "no samples"
        elif unmeasurable:
            rec["pass"] = False
            rec["reason"] = f"not measurable: {unmeasurable}"
        else:
            rec["pass"] = slo.holds(observed)
        out.append(rec)
    return out


def no_success(data: dict[str, Any]) -> str | None:
    """Why a run in which no request succeeded fails, SLO or not; None when one did."""
    req = data.get("requests") or {}
    if req.get("ok"):
        return None
    errors = {k: v for k, v in (req.get("errors") or {}).items() if v}
    examples = req.get("error_examples") or {}
    first = next((ex[0].get("reason") for k in errors for ex in [examples.get(k) or []] if ex), None)
    detail = ", ".join(f"{n:,} {k}" for k, n in sorted(errors.items(), key=lambda kv: -kv[1]))
    return (f"no request succeeded ({req.get('sent', 0):,} sent"
            + (f": {detail}" if detail else "") + (f"; e.g. {first}" if first else "") + ")")
