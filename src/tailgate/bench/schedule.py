"""The open-loop schedule: when each request is meant to start (pure, vectorised).

A schedule never looks at responses: request *i* is due at ``times[i]`` seconds
after the run's start whatever the server does, which is what keeps a stalled
server's tail in the figures (no coordinated omission).

Arrival processes (``--arrival``): ``constant`` (gap ``1/rate``), ``poisson``
(exponential gaps, mean ``1/rate``) and ``gamma`` (gamma gaps of shape
``burstiness`` *B* and mean ``1/rate``, as ``vllm bench serve --burstiness``: *B* = 1
is Poisson, *B* < 1 burstier, *B* > 1 more regular; the gaps' coefficient of
variation is ``1/sqrt(B)``).

Splitting over ``workers`` processes keeps the union exact: for ``constant``
worker *k* takes every *N*-th slot of the single global sequence ``i / rate``;
for ``poisson`` each worker draws an independent Poisson process at
``rate / N``, and the superposition of independent Poisson processes is a
Poisson process at ``rate``. Independent gamma processes do not superpose into a
gamma process, so for ``gamma`` every worker draws the one global sequence (one
seed) and takes every *N*-th arrival of it.

A :class:`Ramp` (``--rate LO..HI``) makes the rate a function of time: ``lo``
until ``start_s`` (the warm-up), rising (or falling) linearly to ``hi`` at
``end_s``. The process is drawn at unit rate in *operational time* ``u`` and each
arrival placed at ``t = Λ⁻¹(u)``, where ``Λ(t)`` is the expected number of arrivals
by ``t``: a constant schedule keeps gaps of ``1/rate(t)``, Poisson becomes the
inhomogeneous Poisson process of that rate, gamma keeps its shape. The arrival
test (:mod:`.arrivals`) maps the sends back through ``Λ`` and tests them there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Arrival = Literal["constant", "poisson", "gamma"]
ARRIVALS: tuple[Arrival, ...] = ("constant", "poisson", "gamma")
_GAMMA_STREAM = 0x6A  # the gamma sequence's seed word (one global stream for all workers)


@dataclass(frozen=True)
class Ramp:
    """The offered rate over time: ``lo`` until ``start_s``, then linear to ``hi`` at
    ``end_s`` (requests/s, seconds from the run's start)."""

    lo: float
    hi: float
    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if not (self.lo > 0 and self.hi > 0 and math.isfinite(self.lo)
                and math.isfinite(self.hi)):
            raise ValueError("a ramp's rates must be > 0")
        if not 0 <= self.start_s < self.end_s:
            raise ValueError("a ramp needs a duration > 0")

    @property
    def slope(self) -> float:
        return (self.hi - self.lo) / (self.end_s - self.start_s)

    @property
    def peak(self) -> float:
        return max(self.lo, self.hi)

    @property
    def mean_rate(self) -> float:
        """The offered rate averaged over the ramp (its measured part)."""
        return (self.lo + self.hi) / 2

    def rate_at(self, t: np.ndarray | float) -> np.ndarray:
        t = np.clip(np.asarray(t, dtype=np.float64), self.start_s, self.end_s)
        return self.lo + self.slope * (t - self.start_s)

    def cumulative(self, t: np.ndarray | float) -> np.ndarray:
        """Λ(t): arrivals expected by ``t`` (seconds from the run's start)."""
        t = np.asarray(t, dtype=np.float64)
        s, e = self.start_s, self.end_s
        before = self.lo * np.minimum(t, s)
        x = np.clip(t - s, 0.0, e - s)
        during = self.lo * x + 0.5 * self.slope * x * x
        after = self.hi * np.maximum(t - e, 0.0)
        return before + during + after

    def inverse(self, u: np.ndarray) -> np.ndarray:
        """Λ⁻¹(u): the time by which ``u`` arrivals are expected."""
        u = np.asarray(u, dtype=np.float64)
        s, e = self.start_s, self.end_s
        u_s = self.lo * s
        u_e = float(self.cumulative(e))
        du = np.clip(u - u_s, 0.0, u_e - u_s)
        # t - s solves lo x + slope x²/2 = du; this form is stable for any slope sign
        with np.errstate(invalid="ignore"):
            x = 2 * du / (self.lo + np.sqrt(np.maximum(self.lo ** 2 + 2 * self.slope * du,
                                                       0.0)))
        t = np.where(u < u_s, u / self.lo, s + x)
        return np.where(u > u_e, e + (u - u_e) / self.hi, t)

    def json(self) -> dict[str, float | str]:
        return {"from_rps": self.lo, "to_rps": self.hi, "start_s": self.start_s,
                "end_s": self.end_s, "shape": "linear"}


def parse_ramp(text: str) -> tuple[float, float] | None:
    """``"1k..10k"`` -> (1000.0, 10000.0); None for a single rate (ValueError if malformed)."""
    if ".." not in text:
        return None
    from .units import parse_rate

    lo, _, hi = text.partition("..")
    return parse_rate(lo.strip()), parse_rate(hi.strip())


def arrival_times(rate: float, duration_s: float, arrival: Arrival = "constant", *,
                  worker: int = 0, workers: int = 1, seed: int | None = 0,
                  burstiness: float = 1.0, ramp: Ramp | None = None) -> np.ndarray:
    """Intended start offsets (seconds, ascending, all in ``[0, duration_s)``) of one worker.

    ``rate`` is the total rate of all workers together (with a ``ramp``, the ramp's
    rates are used instead).
    """
    if rate <= 0 or duration_s < 0:
        raise ValueError("rate must be > 0 and duration >= 0")
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} not in 0..{workers - 1}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError("burstiness must be > 0")
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r} (one of {', '.join(ARRIVALS)})")
    if ramp is None:
        return _times(rate, duration_s, arrival, worker, workers, seed, burstiness)
    horizon = float(ramp.cumulative(duration_s))
    u = _times(1.0, horizon, arrival, worker, workers, seed, burstiness)
    t = ramp.inverse(u)
    return t[t < duration_s]


def _times(rate: float, duration_s: float, arrival: str, worker: int, workers: int,
           seed: int | None, burstiness: float) -> np.ndarray:
    if arrival == "constant":
        total = int(np.floor(rate * duration_s + 1e-9))
        return np.arange(worker, total, workers, dtype=np.float64) / rate
    if arrival == "poisson":
        rng = np.random.default_rng(None if seed is None else [seed, worker])
        share = rate / workers
        return _renewal(lambda n: rng.exponential(1.0 / share, size=n), share * duration_s,
                        1.0, duration_s)
    # gamma: one global sequence, every N-th arrival (see the module docstring)
    rng = np.random.default_rng(None if seed is None else [seed, _GAMMA_STREAM])
    scale = 1.0 / (rate * burstiness)
    times = _renewal(lambda n: rng.gamma(burstiness, scale, size=n), rate * duration_s,
                     1.0 / burstiness, duration_s)
    return times[worker::workers]


def _renewal(draw, expected: float, cv2: float, duration_s: float) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Cumulative sums of drawn gaps up to ``duration_s`` (drawn in blocks: the expected
    count plus 6 sigma first, ``cv2`` being the gaps' squared coefficient of variation)."""
    n = int(expected + 6 * np.sqrt(expected * cv2) + 16)
    times = np.cumsum(draw(n))
    while times.size and times[-1] < duration_s:
        more = np.cumsum(draw(n)) + times[-1]
        times = np.concatenate([times, more])
    return times[times < duration_s]
