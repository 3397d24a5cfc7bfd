"""Log-linear latency buckets: the same arithmetic as the bpftrace programs, and quantiles.

A probe does not ship raw samples to user space (one per context switch would
cost more than the switch); it counts them in buckets inside the kernel. A
power-of-two histogram (bpftrace's ``hist()``) is too coarse for a P999: a
bucket [8 ms, 16 ms) leaves the answer uncertain by a factor of two. The
programs here compute a log-linear key instead, in nanoseconds:

* below 128 ns the key is the value itself (buckets of width 1);
* above, with ``e = floor(log2(v))``, ``key = (e - 5) * 64 + ((v >> (e - 6)) & 63)``:
  64 sub-buckets per power of two, so a bucket's width is at most 1/64 of its
  lower bound.

A quantile is read by nearest rank (the value of the ``ceil(q * n)``-th smallest
sample), estimated as the midpoint of the bucket holding that rank and clamped
to the largest sample seen. The exact sample lies in the same bucket, so the
estimate is within half a bucket of it: a relative error below 1/128 (0.8 %),
whatever the distribution.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

SUB_BITS = 6
SUB = 1 << SUB_BITS  # sub-buckets per power of two
QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p999", 0.999))


def bucket_key(value_ns: int) -> int:
    """The bucket key of a sample (ns), exactly as the probes compute it in the kernel."""
    v = int(value_ns)
    if v < 0:
        raise ValueError(f"negative sample: {value_ns!r}")
    e = v.bit_length() - 1
    if e < SUB_BITS:
        return v
    return (e - SUB_BITS + 1) * SUB + ((v >> (e - SUB_BITS)) & (SUB - 1))


def bucket_bounds(key: int) -> tuple[int, int]:
    """``(low, high)`` in ns of a bucket: it holds the integers ``low <= v < high``."""
    if key < 0:
        raise ValueError(f"negative bucket key: {key!r}")
    if key < 2 * SUB:
        return key, key + 1
    e = key // SUB + SUB_BITS - 1
    width = 1 << (e - SUB_BITS)
    low = (SUB + key % SUB) * width
    return low, low + width


def quantile(buckets: Mapping[int, int], q: float, max_ns: int | None = None) -> float | None:
    """Nearest-rank quantile ``q`` (0 < q <= 1) in ns from ``{key: count}``; None when empty."""
    total = sum(buckets.values())
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total - 1e-9))
    seen = 0
    for key in sorted(buckets):
        seen += buckets[key]
        if seen >= rank:
            low, high = bucket_bounds(key)
            estimate = (low + high - 1) / 2  # midpoint of the integers in the bucket
            if max_ns is not None:
                estimate = min(estimate, float(max_ns))
            return max(estimate, float(low))
    raise AssertionError("unreachable: rank beyond total")


def exact_quantile(samples: Iterable[int], q: float) -> float | None:
    """Nearest-rank quantile of raw samples: the reference the buckets are held to."""
    ordered = sorted(samples)
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered) - 1e-9))
    return float(ordered[rank - 1])


def merge(*histograms: Mapping[int, int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in histograms:
        for key, count in h.items():
            out[key] = out.get(key, 0) + int(count)
    return out


def summarize(buckets: Mapping[int, int], max_ns: int | None, unit: str = "us") -> dict:
    """Count, quantiles, max and the non-empty buckets, converted from ns to ``unit``."""
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6}[unit]

    def conv(ns: float | None) -> float | None:
        return None if ns is None else round(ns / scale, 3)

    out: dict = {"unit": unit, "count": int(sum(buckets.values()))}
    for name, q in QUANTILES:
        out[name] = conv(quantile(buckets, q, max_ns))
    out["max"] = conv(max_ns) if out["count"] else None
    out["buckets"] = [
        {"min": conv(lo), "max": conv(hi), "count": int(buckets[k])}
        for k in sorted(buckets)
        if buckets[k]
        for lo, hi in [bucket_bounds(k)]
    ]
    return out
