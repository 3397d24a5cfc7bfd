"""`tailgate bench ... --sweep LO..HI`: the highest offered rate that meets every SLO.

The driver runs the ordinary bench (any protocol: http, tcp, openai+) once per
rate, reading each run's JSON, so every figure is a normal bench result:

1. **steps**: rates spaced geometrically from LO to HI, run in increasing
   order until one fails (running further into overload only burns time);
2. **bisection**: between the last rate that held and the first that failed,
   on the geometric midpoint, ``bisect`` times.

A rate *holds* when every ``--slo`` passes and the rate was sustained (http/tcp:
the achieved rate is at least 95 % of the offered one; openai+: the generator's
P99 lateness stays within one inter-arrival gap — an open-loop run that fell
behind its schedule did not really offer that rate). Without any --slo the
sweep only draws the curve.

The command builds a :class:`SweepSpec` from its options, and so does Python::

    from tailgate.bench.options import BenchOptions
    from tailgate.plan.sweep import SweepSpec, run_sweep
    sweep = run_sweep(SweepSpec.of("1k..50k", BenchOptions(
        target="http://127.0.0.1:8080/", duration="5s", slo=("p99<5ms",))))

The **knee** of the latency-throughput curve is found with Kneedle (Satopää et
al., ICDCS workshops 2011): normalise achieved rate and P99 to [0, 1] and take
the point farthest above the diagonal, i.e. where latency starts rising faster
than throughput. It is reported only where the curve saturated beyond it (a higher rate
not sustained, or its P99 at least twice the knee's): a flat curve has no knee, however
Kneedle reads its noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..bench.options import BenchOptions
from ..errors import InputError

SUSTAINED = 0.95


class SweepError(InputError):
    """Bad --sweep input (the message says why)."""


def parse_range(text: str, parse_rate: Callable[[str], float]) -> tuple[float, float]:
    """'1k..50k' -> (1000.0, 50000.0)."""
    if ".." not in text:
        raise SweepError(f"--sweep {text}: expected LO..HI, e.g. 1k..50k")
    lo_s, hi_s = text.split("..", 1)
    try:
        lo, hi = parse_rate(lo_s), parse_rate(hi_s)
    except ValueError as exc:
        raise SweepError(f"--sweep {text}: {exc}") from None
    if not 0 < lo < hi:
        raise SweepError(f"--sweep {text}: need 0 < LO < HI")
    return lo, hi


def steps(lo: float, hi: float, n: int) -> list[float]:
    if n < 2:
        raise SweepError("--sweep-steps must be >= 2")
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


@dataclass(frozen=True)
class Point:
    rate: float  # offered
    achieved: float
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    slo_pass: bool
    sustained: bool
    output_tokens_per_s: float | None = None
    goodput_rps: float | None = None
    slo: tuple[dict[str, Any], ...] = ()  # each SLO's verdict at this rate (bench's own)
    requests: dict[str, Any] | None = None  # the run's accounting (sent, ok, errors, ...)

    @property
    def holds(self) -> bool:
        return self.slo_pass and self.sustained

    def to_json(self) -> dict[str, Any]:
        return {"rate": self.rate, "achieved": self.achieved, "p50_ms": self.p50_ms,
                "p99_ms": self.p99_ms, "p999_ms": self.p999_ms, "slo_pass": self.slo_pass,
                "sustained": self.sustained, "holds": self.holds,
                "output_tokens_per_s": self.output_tokens_per_s,
                "goodput_rps": self.goodput_rps, "slo": list(self.slo),
                "requests": self.requests}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Point:
        """A point as `to_json` wrote it (`tailgate report` of a saved sweep); a field a
        sweep of an older tailgate did not write is None (its SLO list: empty)."""
        known = {k: d.get(k) for k in cls.__dataclass_fields__}
        return cls(**{**known, "slo": tuple(d.get("slo") or ())})


def point_from_result(rate: float, data: dict[str, Any]) -> Point:
    """A bench JSON (http/tcp or openai+) as one point of the curve."""
    lat = data.get("latency_ms") or {}
    achieved = float((data.get("rate") or {}).get("achieved") or 0.0)
    tp = data.get("throughput") or {}
    slo_pass = all(s.get("pass") for s in data.get("slo", [])) and not data.get("interrupted")
    if "throughput" in data:
        # openai+ runs: "achieved" spans first send to last response, so long generations
        # pull it down however well the server keeps up; what shows a rate was not held is
        # the generator falling behind its schedule (lateness beyond one inter-arrival gap)
        late = (data.get("lateness_ms") or {}).get("p99")
        sustained = late is not None and late <= 1000.0 / rate
    else:
        sustained = achieved >= SUSTAINED * rate
    return Point(rate, achieved, lat.get("p50"), lat.get("p99"), lat.get("p999"), slo_pass,
                 sustained, tp.get("output_tokens_per_s"), tp.get("goodput_rps"),
                 tuple(data.get("slo", [])), data.get("requests"))


def search(measure: Callable[[float], Point | None], lo: float, hi: float, n_steps: int,
           bisect: int) -> list[Point]:
    """Step up until a rate fails, then bisect between the last that held and it.

    ``measure`` returns None when the run was interrupted (the sweep stops there).
    """
    points: list[Point] = []
    last_ok, first_bad = None, None
    for rate in steps(lo, hi, n_steps):
        p = measure(rate)
        if p is None:
            return points
        points.append(p)
        if p.holds:
            last_ok = rate
        else:
            first_bad = rate
            break
    if first_bad is not None and last_ok is not None:
        for _ in range(bisect):
            mid = math.sqrt(last_ok * first_bad)
            p = measure(mid)
            if p is None:
                break
            points.append(p)
            if p.holds:
                last_ok = mid
            else:
                first_bad = mid
    return sorted(points, key=lambda q: q.rate)


def best(points: Sequence[Point]) -> Point | None:
    ok = [p for p in points if p.holds]
    return max(ok, key=lambda p: p.rate) if ok else None


SATURATED_P99 = 2.0  # a P99 this many times the knee's, at a higher rate, is saturation


def saturation(points: Sequence[Point], k: Point) -> str | None:
    """What above the knee shows the server saturated: a rate not sustained, or a P99 at
    least SATURATED_P99 times the knee's; None when nothing above it did."""
    for p in sorted(points, key=lambda q: q.rate):
        if p.rate <= k.rate:
            continue
        if not p.sustained:
            return f"{p.rate:,.1f}/s offered was not sustained ({p.achieved:,.1f}/s achieved)"
        if p.p99_ms is not None and k.p99_ms and p.p99_ms >= SATURATED_P99 * k.p99_ms:
            return (f"p99 {p.p99_ms:.3f} ms at {p.rate:,.1f}/s, {p.p99_ms / k.p99_ms:.1f}x "
                    "the knee's")
    return None


def knee_of(points: Sequence[Point]) -> tuple[Point | None, str]:
    """The knee, only where the curve saturated beyond it, with the evidence; else None
    and why (Kneedle finds a "knee" in the noise of a flat curve, often its last point)."""
    k = knee(points)
    if k is None:
        return None, "no knee: the curve has no bend (fewer than 3 points, or flat)"
    why = saturation(points, k)
    if why is None:
        top = max(points, key=lambda q: q.rate)
        return None, (f"no knee: nothing saturated up to {top.rate:,.1f}/s (every rate "
                      f"sustained, p99 within {SATURATED_P99:g}x): raise the sweep's HI")
    return k, why


def knee(points: Sequence[Point]) -> Point | None:
    """Kneedle on (achieved rate, P99): the point farthest above the normalised diagonal
    (a candidate: :func:`knee_of` keeps it only where the curve saturated beyond it)."""
    pts = [p for p in points if p.p99_ms is not None]
    if len(pts) < 3:
        return None
    xs = [p.achieved for p in pts]
    ys = [p.p99_ms for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 <= x0 or y1 <= y0:
        return None
    diffs = [(x - x0) / (x1 - x0) - (y - y0) / (y1 - y0) for x, y in zip(xs, ys, strict=True)]
    i = max(range(len(pts)), key=lambda k: diffs[k])
    return pts[i] if diffs[i] > 0 else None


@dataclass(frozen=True)
class Sweep:
    """A finished sweep: its points in the order run, the highest rate that held (with an
    SLO), and the knee (or why there is none)."""

    target: str
    slo: tuple[str, ...]
    points: tuple[Point, ...]
    top: Point | None
    knee: Point | None
    knee_reason: str

    @property
    def has_slo(self) -> bool:
        return bool(self.slo)

    @property
    def passed(self) -> bool:
        """Exit status 0: some rate met every SLO (or there was none to meet)."""
        return self.top is not None or not self.has_slo

    def to_json(self) -> dict[str, Any]:
        return {"tailgate_sweep": 1, "target": self.target, "slo": list(self.slo),
                "points": [p.to_json() for p in self.points],
                "max_rate_meeting_slo": self.top.to_json() if self.top else None,
                "knee": self.knee.to_json() if self.knee else None,
                "knee_reason": self.knee_reason}


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep: offered rates from ``lo`` to ``hi`` in ``steps`` geometric steps,
    then ``bisect`` bisections, each rate a run of the bench ``bench`` (its rate set per
    point, its outputs off: the sweep writes its own)."""

    lo: float
    hi: float
    steps: int
    bisect: int
    bench: BenchOptions

    @classmethod
    def of(cls, rates: str, bench: BenchOptions, steps: int = 6, bisect: int = 3) -> SweepSpec:
        """``rates`` (LO..HI, e.g. ``1k..50k``) and the bench options checked (SweepError)."""
        from ..bench.units import parse_rate

        lo, hi = parse_range(rates, parse_rate)
        if bench.hdr or bench.log:
            raise SweepError("--sweep runs many benches: --hdr and --log are for a single run")
        return cls(lo, hi, steps, bisect,
                   bench.with_(json=None, html=None, hdr=None, log=None, quiet=True))

    @property
    def slo(self) -> tuple[str, ...]:
        return tuple(self.bench.slo)


def run_sweep(spec: SweepSpec, on_point: Callable[[float, Point], None] | None = None) -> Sweep:
    """The --sweep driver: one bench spec per offered rate, each run by the library call;
    ``on_point`` sees each rate's point as it is measured (the command's progress lines)."""
    from ..bench.runner import run
    from ..bench.spec import build

    def measure(rate: float) -> Point | None:
        result = run(build(spec.bench.with_(rate=f"{rate:.6g}")))
        if result.stopped:
            return None
        p = point_from_result(rate, result.json)
        if on_point is not None:
            on_point(rate, p)
        return p

    if spec.slo:
        points = search(measure, spec.lo, spec.hi, spec.steps, spec.bisect)
    else:  # no objective: the whole curve
        points = [p for p in (measure(r) for r in steps(spec.lo, spec.hi, spec.steps))
                  if p is not None]
    top = best(points) if spec.slo else None
    k, knee_why = knee_of(points)
    return Sweep(spec.bench.target or "", spec.slo, tuple(points), top, k, knee_why)
