"""How far a run's figures can be trusted: quantile confidence intervals, the arrival
test and the stationarity test (pure numpy; scipy is only the tests' reference).

* :func:`quantile_ci` — the distribution-free (order-statistic) interval of a
  percentile over a recorded histogram. With ``B ~ Binomial(n, q)`` the number
  of samples at or below the true quantile, the sorted samples ``X(r) <= X(s)``
  bracket it with probability ``P(r <= B < s)``; ``r`` and ``s`` are the ranks at
  the binomial bounds (``r = ppf(α/2)``, ``s = isf(α/2) + 1``, as
  ``scipy.stats.quantile_test`` does). When ``s`` would be past the last sample
  (e.g. P99.99 from 5,000 samples) the interval cannot be formed: the
  percentile is *not measurable*, whatever its point estimate says.
* :func:`ks_test` — the one-sample Kolmogorov–Smirnov statistic and its
  asymptotic p-value (the Kolmogorov distribution, as ``scipy.stats.kstest(...,
  method="asymp")``), with an optional *tolerance*: a generator whose every
  send is within δ of its due time moves the empirical CDF of the gaps by at
  most ``F(x + δ) - F(x)``, so only the distance beyond that counts against it.
* :func:`mann_kendall` — the trend test on a series (per-interval P99).
* :func:`exceedance_shift` — did the tail move between two parts of a run: the
  share of each part above the other part's percentile, a two-proportion test.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..hist import Histogram, HistogramSpec

DEFAULT_LEVEL = 0.95


# -- order-statistic intervals of a quantile -------------------------------------------

def _binomial_cdf(n: int, p: float) -> tuple[int, np.ndarray]:
    """``(k0, cdf)``: the Binomial(n, p) CDF at ``k0, k0+1, ...`` over every k that
    carries mass above ~1e-30 (12 standard deviations and a margin either side)."""
    mean, sd = n * p, math.sqrt(n * p * (1.0 - p))
    k0 = max(0, math.floor(mean - 12 * sd - 30))
    k1 = min(n, math.ceil(mean + 12 * sd + 30))
    k = np.arange(k0, k1, dtype=np.float64)
    # log pmf(k+1) - log pmf(k) = log((n - k) / (k + 1)) + log(p / (1 - p))
    steps = np.log((n - k) / (k + 1.0)) + math.log(p / (1.0 - p))
    logpmf = np.concatenate([[0.0], np.cumsum(steps)])
    pmf = np.exp(logpmf - logpmf.max())
    return k0, np.cumsum(pmf) / pmf.sum()


def order_statistic_ranks(n: int, q: float, level: float = DEFAULT_LEVEL
                          ) -> tuple[int | None, int | None]:
    """1-based ranks ``(r, s)`` of the samples bracketing quantile ``q`` (0 < q < 1) of
    ``n`` samples at ``level``; ``None`` for a bound that would lie outside the sample."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must be in (0, 1), not {q}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), not {level}")
    if n <= 0:
        return None, None
    a = (1.0 - level) / 2.0
    k0, cdf = _binomial_cdf(n, q)
    # ppf(a): the smallest k with F(k) >= a (below the window F is ~0, above it ~1)
    r = k0 + int(np.searchsorted(cdf, a, side="left"))
    # isf(a): the smallest k with 1 - F(k) <= a
    s = k0 + int(np.searchsorted(cdf, 1.0 - a, side="left")) + 1
    return (r if r >= 1 else None), (s if s <= n else None)


def samples_needed(q: float, level: float = DEFAULT_LEVEL) -> int:
    """The fewest samples from which the upper bound of quantile ``q`` can be formed:
    ``q**n <= (1 - level) / 2`` (all n samples below the quantile is then unlikely)."""
    return math.ceil(math.log((1.0 - level) / 2.0) / math.log(q))


@dataclass(frozen=True)
class QuantileCI:
    """The interval of one percentile; ``lo``/``hi`` in the histogram's unit, or None
    with ``reason`` when it cannot be formed."""

    percentile: float
    level: float
    count: int
    lo: int | None
    hi: int | None
    reason: str = ""

    @property
    def measurable(self) -> bool:
        return self.lo is not None and self.hi is not None

    @property
    def width(self) -> float:
        return math.inf if not self.measurable else float(self.hi - self.lo)  # type: ignore[operator]


def quantile_ci(h: Histogram, percentile: float, level: float = DEFAULT_LEVEL) -> QuantileCI:
    """The order-statistic interval of ``percentile`` (0..100) over ``h``'s counts.

    The bounds are the bucket edges holding the samples of ranks ``r`` (its lowest
    value) and ``s`` (its highest), clipped to the exact recorded min/max: the
    histogram's resolution widens the interval, never narrows it."""
    q = percentile / 100.0
    n = h.total
    r, s = order_statistic_ranks(n, q, level) if n else (None, None)
    if r is None or s is None:
        need = samples_needed(q, level)
        why = (f"needs at least {need:,} samples for a {level * 100:g}% interval, "
               f"has {n:,}") if n < need else "the interval falls outside the samples"
        return QuantileCI(percentile, level, n, None, None, why)
    cum = np.cumsum(h.counts)
    i_lo, i_hi = np.searchsorted(cum, [r, s], side="left")
    lo = max(int(h.spec.lowest_equivalent(int(i_lo))), h.min)
    hi = min(int(h.spec.highest_equivalent(int(i_hi))), h.max)
    return QuantileCI(percentile, level, n, lo, hi)


# -- confidence targets: --confidence 'p99=10us@95%' ----------------------------------

_TARGET = re.compile(r"^\s*(p[0-9]+)\s*=\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|%)\s*"
                     r"(?:@\s*([0-9]*\.?[0-9]+)\s*%)?\s*$")
_TIME_NS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
PERCENTILE_NAMES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9, "p9999": 99.99}


@dataclass(frozen=True)
class ConfidenceTarget:
    """Run until the ``level`` interval of ``name`` is at most ``width_ns`` wide
    (absolute) or ``relative`` × its point estimate wide."""

    expr: str
    name: str
    percentile: float
    level: float
    width_ns: float | None = None
    relative: float | None = None

    def limit_ns(self, estimate_ns: float) -> float:
        if self.width_ns is not None:
            return self.width_ns
        return (self.relative or 0.0) * estimate_ns

    def met(self, ci: QuantileCI, estimate_ns: float) -> bool:
        return ci.measurable and ci.width <= self.limit_ns(estimate_ns)


def parse_targets(text: str) -> list[ConfidenceTarget]:
    """``'p99=10us@95%,p999=5%@99%'`` -> targets (ValueError, saying what is allowed)."""
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _TARGET.match(part)
        if not m or m.group(1) not in PERCENTILE_NAMES:
            raise ValueError(
                f"bad --confidence {part.strip()!r}: expected PERCENTILE=WIDTH[@LEVEL%], "
                f"e.g. p99=10us@95% (absolute width) or p999=5%@95% (relative to the "
                f"percentile); percentiles {', '.join(PERCENTILE_NAMES)}")
        name, num, unit = m.group(1), float(m.group(2)), m.group(3)
        level = float(m.group(4)) / 100.0 if m.group(4) else DEFAULT_LEVEL
        if not 0.5 <= level < 1.0:
            raise ValueError(f"--confidence {part.strip()!r}: level must be in [50%, 100%)")
        if num <= 0:
            raise ValueError(f"--confidence {part.strip()!r}: width must be > 0")
        if unit == "%":
            out.append(ConfidenceTarget(part.strip(), name, PERCENTILE_NAMES[name], level,
                                        relative=num / 100.0))
        else:
            out.append(ConfidenceTarget(part.strip(), name, PERCENTILE_NAMES[name], level,
                                        width_ns=num * _TIME_NS[unit]))
    if not out:
        raise ValueError("--confidence: no target given (e.g. p99=10us@95%)")
    return out


def targets_met(targets: list[ConfidenceTarget], h: Histogram) -> bool:
    """Every target's interval over ``h`` is narrow enough."""
    return all(t.met(quantile_ci(h, t.percentile, t.level),
                     h.value_at_percentile(t.percentile)) for t in targets)


def judge_targets(targets: list[ConfidenceTarget], h: Histogram,
                  after_s: float | None, ceiling_s: float) -> dict[str, Any]:
    """The result's ``confidence`` block: each target over the final histogram (ms),
    whether all were reached and after how many measured seconds (``after_s``: when
    the run first saw them met; None when it did not while running, and then, if the
    final histogram meets them, they were reached at the ceiling)."""
    recs = []
    for t in targets:
        ci = quantile_ci(h, t.percentile, t.level)
        est = h.value_at_percentile(t.percentile)
        recs.append({"expr": t.expr, "percentile": t.name, "level": t.level,
                     "limit_ms": round(t.limit_ns(est) / 1e6, 6),
                     "relative": t.relative,
                     "width_ms": round(ci.width / 1e6, 6) if ci.measurable else None,
                     "lo_ms": None if ci.lo is None else round(ci.lo / 1e6, 6),
                     "hi_ms": None if ci.hi is None else round(ci.hi / 1e6, 6),
                     "reached": t.met(ci, est),
                     **({} if ci.measurable else {"reason": ci.reason})})
    reached = all(r["reached"] for r in recs)
    out: dict[str, Any] = {"targets": recs, "reached": reached, "after_s": None}
    if reached:
        out["after_s"] = round(after_s if after_s is not None else ceiling_s, 3)
    elif after_s is not None:
        # met over the completed requests, but not once those in flight were counted
        out["stopped_after_s"] = round(after_s, 3)
    return out


class ConfidenceWatch:
    """Merges the workers' progress messages (measured latency deltas) and says when
    every target is met; ``after_s`` is then the measured time it took.

    Judged once per round (every worker reported since the last judgement) and
    met in ``rounds`` consecutive rounds: the requests still in flight are the
    slow ones, so one lucky look at the completed ones is not enough. The final
    result is judged again over every request (:func:`judge_targets`)."""

    def __init__(self, targets: list[ConfidenceTarget], spec: HistogramSpec,
                 warmup_s: float = 0.0, workers: int = 1, rounds: int = 2) -> None:
        self.targets = targets
        self.latency = Histogram(spec)
        self.warmup_s = warmup_s
        self.workers = workers
        self.rounds = rounds
        self.start: float | None = None  # the run's monotonic start (set by the caller)
        self.last_t = 0.0
        self.after_s: float | None = None
        self._heard: set[int] = set()
        self._met = 0

    def update(self, worker: int, msg: dict[str, Any]) -> None:
        self.latency.add_sparse(msg["lat_idx"], msg["lat_cnt"], msg["lat_lo"], msg["lat_hi"])
        self.last_t = max(self.last_t, msg.get("t", 0.0))
        self._heard.add(worker)

    def reached(self) -> bool:
        if self.after_s is not None:
            return True
        if len(self._heard) < self.workers:
            return False
        self._heard.clear()
        ok = self.latency.total > 0 and targets_met(self.targets, self.latency)
        self._met = self._met + 1 if ok else 0
        if self._met >= self.rounds:
            start = self.start if self.start is not None else self.last_t
            self.after_s = max(self.last_t - start - self.warmup_s, 0.0)
        return self.after_s is not None


# -- Kolmogorov–Smirnov ---------------------------------------------------------------

def kolmogorov_sf(x: float) -> float:
    """P(K > x) for the Kolmogorov distribution (``scipy.stats.kstwobign.sf``)."""
    if x <= 0:
        return 1.0
    if x < 1.0:
        # the theta-function form converges fast for small x
        s = sum(math.exp(-((2 * k - 1) ** 2) * math.pi ** 2 / (8 * x * x)) for k in range(1, 8))
        return max(0.0, 1.0 - math.sqrt(2 * math.pi) / x * s)
    return min(1.0, 2.0 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * x * x)
                              for k in range(1, 101)))


@dataclass(frozen=True)
class KsResult:
    statistic: float  # sup |F_n - F|
    tolerance: float  # the part of it the timer's resolution explains
    pvalue: float  # of the distance beyond the tolerance
    n: int


def ks_test(sample: np.ndarray, cdf, tolerance: float = 0.0) -> KsResult:  # type: ignore[no-untyped-def]
    """One-sample KS of ``sample`` against the vectorised ``cdf``; p-value asymptotic."""
    x = np.sort(np.asarray(sample, dtype=np.float64))
    n = x.size
    if n == 0:
        raise ValueError("KS test of an empty sample")
    f = np.asarray(cdf(x), dtype=np.float64)
    i = np.arange(1, n + 1, dtype=np.float64)
    d = float(max(np.max(i / n - f), np.max(f - (i - 1) / n)))
    excess = max(d - tolerance, 0.0)
    return KsResult(d, tolerance, kolmogorov_sf(math.sqrt(n) * excess), n)


def exponential_cdf(rate: float):  # type: ignore[no-untyped-def]
    return lambda x: -np.expm1(-rate * np.maximum(x, 0.0))


def ks_constant(gaps: np.ndarray, gap: float, tolerance_s: float) -> KsResult:
    """The KS distance from the gaps to the band of schedules within ``tolerance_s`` of
    the constant ``gap``: ``max(share below gap - tol, share above gap + tol)``.

    A point mass has no sampling noise: with every send within the timer's
    resolution the distance is 0; the p-value (Kolmogorov, as for :func:`ks_test`)
    says how unlikely that share of off-slot gaps is as a chance excursion."""
    g = np.asarray(gaps, dtype=np.float64)
    n = g.size
    if n == 0:
        raise ValueError("KS test of an empty sample")
    d = max(np.count_nonzero(g < gap - tolerance_s), np.count_nonzero(g > gap + tolerance_s)) / n
    return KsResult(float(d), 0.0, kolmogorov_sf(math.sqrt(n) * d), n)


def chi2_sf(x: float, dof: int) -> float:
    """P(chi2(dof) > x), Wilson–Hilferty's normal approximation (within ~0.002 of the
    exact value at dof >= 5: enough to call a 1 % test)."""
    if dof <= 0:
        return 1.0
    if x <= 0:
        return 1.0
    c = 2.0 / (9.0 * dof)
    z = ((x / dof) ** (1.0 / 3.0) - (1.0 - c)) / math.sqrt(c)
    return 0.5 * math.erfc(z / math.sqrt(2))


# -- trend and shift of the tail --------------------------------------------------------

@dataclass(frozen=True)
class TrendResult:
    s: int
    z: float
    pvalue: float
    n: int


def mann_kendall(values: np.ndarray) -> TrendResult:
    """Mann–Kendall S, its normal z (tie-corrected variance, no continuity correction:
    as ``scipy.stats.kendalltau(range(n), values, method="asymptotic")``) and p."""
    y = np.asarray(values, dtype=np.float64)
    n = y.size
    if n < 3:
        return TrendResult(0, 0.0, 1.0, n)
    diff = np.sign(y[None, :] - y[:, None])
    s = int(np.triu(diff, 1).sum())
    _, ties = np.unique(y, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(ties * (ties - 1) * (2 * ties + 5)))) / 18.0
    z = s / math.sqrt(var) if var > 0 else 0.0
    return TrendResult(s, z, math.erfc(abs(z) / math.sqrt(2)), n)


@dataclass(frozen=True)
class ShiftResult:
    """Share of ``b`` above ``a``'s percentile (``expected`` by construction in ``a``)."""

    threshold: int  # a's percentile value (histogram unit)
    share_a: float
    share_b: float
    z: float
    pvalue: float  # one-sided: b has more above the threshold than a


def exceedance_shift(a: Histogram, b: Histogram, percentile: float) -> ShiftResult:
    """Does ``b`` have a heavier tail than ``a`` at ``a``'s ``percentile``?

    Both shares are counted on whole buckets above the bucket of ``a``'s
    percentile, so the histogram's resolution affects both alike."""
    t = a.value_at_percentile(percentile)
    idx = int(a.spec.index_of(np.array([t]))[0])
    na, nb = a.total, b.total
    xa, xb = int(a.counts[idx + 1:].sum()), int(b.counts[idx + 1:].sum())
    if na == 0 or nb == 0:
        return ShiftResult(t, 0.0, 0.0, 0.0, 1.0)
    pa, pb = xa / na, xb / nb
    pool = (xa + xb) / (na + nb)
    se = math.sqrt(pool * (1 - pool) * (1 / na + 1 / nb))
    z = (pb - pa) / se if se > 0 else 0.0
    return ShiftResult(t, pa, pb, z, 0.5 * math.erfc(z / math.sqrt(2)))
