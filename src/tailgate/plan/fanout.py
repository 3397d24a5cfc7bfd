"""Tail at scale: what a leaf's latency distribution becomes behind fan-out, hops and hedging.

Dean and Barroso, "The Tail at Scale" (CACM 2013): a request that waits for N
leaves waits for the slowest, so the leaf's P99 becomes the median experience
at fan-out 100 or so. Computed exactly on a measured distribution (a tailgate
bench histogram), not on a fitted curve:

* **fan-out** to N independent leaves: ``F_max(x) = F(x) ** N``, so the
  end-to-end q-quantile is the leaf's ``q ** (1/N)`` quantile;
* **hops** in sequence: the sum of independent draws, a convolution of the two
  discrete distributions, rebinned to HdrHistogram's 2-significant-digit
  buckets (under 1 % wide) for each hop (the rebinned value is the mean of what fell into
  the bucket, so the mean is kept exactly);
* **hedging** after delay ``d`` (e.g. the leaf's P95): a second copy is sent
  when the first has not answered by ``d``, and the first answer wins, so
  ``P(L > x) = S(x)`` for ``x < d`` and ``S(x) * S(x - d)`` beyond; the extra
  load is ``S(d)`` copies per request.

Distributions are (values, probabilities) pairs, values ascending, in the
histogram's unit (nanoseconds for tailgate bench).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..hist import DEFAULT_SPEC, Histogram, HistogramSpec


@dataclass(frozen=True)
class Dist:
    """A discrete latency distribution: ascending ``values`` with ``probs`` summing to 1."""

    values: np.ndarray
    probs: np.ndarray

    def __post_init__(self) -> None:
        if self.values.size == 0:
            raise ValueError("empty distribution (no latency samples)")

    @classmethod
    def from_histogram(cls, h: Histogram) -> Dist:
        """Each bucket at its highest equivalent value: the value HdrHistogram's
        percentiles report, so this distribution's quantiles are the histogram's."""
        idx, counts = h.nonzero()
        if counts.sum() == 0:
            raise ValueError("empty histogram (no latency samples)")
        vals = h.spec.highest_equivalent(idx).astype(np.float64)
        return cls(vals, counts / counts.sum())

    @classmethod
    def from_samples(cls, samples: np.ndarray) -> Dist:
        vals, counts = np.unique(np.asarray(samples, dtype=np.float64), return_counts=True)
        return cls(vals, counts / counts.sum())

    def cdf(self, x: np.ndarray | float) -> np.ndarray:
        """P(X <= x)."""
        c = np.cumsum(self.probs)
        i = np.searchsorted(self.values, x, side="right")
        return np.where(i > 0, c[np.maximum(i - 1, 0)], 0.0)

    def quantile(self, q: float) -> float:
        """Smallest value whose CDF reaches q (HdrHistogram's rule, up to float rounding)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], not {q}")
        c = np.cumsum(self.probs)
        i = int(np.searchsorted(c, q * c[-1] - 1e-12, side="left"))
        return float(self.values[min(i, self.values.size - 1)])

    def mean(self) -> float:
        return float(np.dot(self.values, self.probs))

    def sample(self, n: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        # inverse-CDF by binary search: far faster than rng.choice(p=...) for many draws
        c = np.cumsum(self.probs)
        i = np.searchsorted(c, rng.random(n) * c[-1], side="right")
        return self.values[np.minimum(i, self.values.size - 1)]


def fan_out(d: Dist, n: int) -> Dist:
    """The maximum of n independent draws: CDF to the n-th power."""
    if n < 1:
        raise ValueError(f"fan-out must be >= 1, not {n}")
    c = np.minimum(np.cumsum(d.probs), 1.0)
    cn = c ** n
    probs = np.diff(cn, prepend=0.0)
    keep = probs > 0
    return Dist(d.values[keep], probs[keep] / probs[keep].sum())


def _rebin(values: np.ndarray, probs: np.ndarray, spec: HistogramSpec) -> Dist:
    v = np.clip(np.rint(values), 0, spec.highest).astype(np.int64)
    idx = spec.index_of(v)
    w = np.bincount(idx, weights=probs)
    vw = np.bincount(idx, weights=probs * values)
    nz = np.nonzero(w > 0)[0]
    means = vw[nz] / w[nz]
    order = np.argsort(means)
    return Dist(means[order], w[nz][order] / w[nz].sum())


# Hops are summed on 2-significant-digit buckets (under 1 % wide): the outer product of
# two 3-digit histograms can hold tens of millions of pairs, of two 2-digit ones a few
# hundred thousand; each bucket keeps the mean of what fell in it, so means stay exact.
HOP_SPEC = HistogramSpec(lowest=1, highest=DEFAULT_SPEC.highest, digits=2)


def convolve(a: Dist, b: Dist, spec: HistogramSpec = HOP_SPEC) -> Dist:
    """The sum of independent draws from a and b, rebinned to spec's buckets."""
    a, b = _rebin(a.values, a.probs, spec), _rebin(b.values, b.probs, spec)
    sums = np.add.outer(a.values, b.values).ravel()
    probs = np.multiply.outer(a.probs, b.probs).ravel()
    return _rebin(sums, probs, spec)


def hedge(d: Dist, delay: float) -> tuple[Dist, float]:
    """First answer of the request and of a copy sent at ``delay`` if it is still waiting.

    Returns (distribution, extra copies per request = P(X > delay)).
    """
    if delay < 0:
        raise ValueError(f"hedge delay must be >= 0, not {delay}")
    grid = np.unique(np.concatenate([d.values, d.values + delay]))
    surv = 1.0 - d.cdf(grid)
    late = grid >= delay
    surv = np.where(late, surv * (1.0 - d.cdf(grid - delay)), surv)
    probs = np.diff(1.0 - surv, prepend=0.0)
    probs = np.clip(probs, 0.0, None)
    keep = probs > 0
    extra = float(1.0 - d.cdf(delay))
    return Dist(grid[keep], probs[keep] / probs[keep].sum()), extra


@dataclass(frozen=True)
class Plan:
    leaf: Dist
    end_to_end: Dist
    fanout: int
    hops: int
    hedge_delay: float | None
    hedge_extra_load: float


def plan(leaf: Dist, fanout: int = 1, hops: int = 1, hedge_delay: float | None = None,
         spec: HistogramSpec = HOP_SPEC) -> Plan:
    """Each hop fans out to ``fanout`` leaves (each leaf hedged if asked); hops add up."""
    if hops < 1:
        raise ValueError(f"hops must be >= 1, not {hops}")
    per_leaf, extra = (leaf, 0.0) if hedge_delay is None else hedge(leaf, hedge_delay)
    hop = fan_out(per_leaf, fanout)
    total = hop
    for _ in range(hops - 1):
        total = convolve(total, hop, spec)
    return Plan(leaf, total, fanout, hops, hedge_delay, extra)


def monte_carlo(leaf: Dist, fanout: int, hops: int, hedge_delay: float | None, requests: int,
                rng: np.random.Generator) -> np.ndarray:
    """End-to-end latencies of ``requests`` simulated requests (the check on :func:`plan`)."""
    total = np.zeros(requests)
    for _ in range(hops):
        x = leaf.sample((requests, fanout), rng)
        if hedge_delay is not None:
            copy = hedge_delay + leaf.sample((requests, fanout), rng)
            x = np.where(x > hedge_delay, np.minimum(x, copy), x)
        total += x.max(axis=1)
    return total


def from_percentiles(table: dict[str, float]) -> Dist:
    """A step distribution from a bench JSON's percentile table (p50, p90, p95 when the
    bench wrote it, p99 ... p9999, max).

    Each probability mass sits at the upper end of its interval (p50 holds the
    lowest half, and so on), so every quantile is an upper bound: coarse, used
    only when no histogram was saved (`tailgate bench --hdr FILE` keeps one).
    """
    points = [("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999), ("p9999", 0.9999),
              ("max", 1.0)]
    vals, cum = [], []
    for key, q in points:
        if key in table and table[key] is not None:
            vals.append(float(table[key]))
            cum.append(q)
    if not vals or cum[-1] != 1.0:
        raise ValueError("a percentile table needs at least 'max' (bench JSON latency_ms)")
    # HdrHistogram's top percentiles report a bucket's highest equivalent value, which
    # may pass the exact max by under one bucket (1e-3): keep the larger, in order
    if any(b < a * 0.99 for a, b in zip(vals, vals[1:], strict=False)):
        raise ValueError("percentiles are not ascending")
    probs = np.diff(np.array(cum), prepend=0.0)
    return Dist(np.maximum.accumulate(np.array(vals)), probs)
