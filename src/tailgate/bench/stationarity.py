"""Did the tail hold still during the run? (pure: per-interval histograms in, a verdict out)

The measured window is cut into intervals by intended start (the ``--hdr``
intervals, or 20 of them). Two tests:

* **shift** — the first half against the second: the share of each half above
  the other half's P99 (1 % by construction in the other half), a one-sided
  two-proportion test each way. A stall, a GC storm or a noisy neighbour that
  arrived mid-run puts far more than 1 % of one half above the other's P99.
* **trend** — Mann–Kendall on the per-interval P99 (intervals with at least
  ``MIN_INTERVAL_SAMPLES``): a tail that rose or fell steadily.

``drifted`` needs statistical and practical weight at once: p < ``ALPHA`` and,
for the shift, at least ``SHIFT_RATIO`` times the expected share above (a
second-half P99 that is the first half's P97 or worse). On our shared 2-core
machines a busy neighbour moved a clean run's halves by up to 2.3 % above the
other's P99 (p < 0.001): significant at these counts, but not a stall.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..hist import Histogram
from .confidence import exceedance_shift, mann_kendall

ALPHA = 0.001
SHIFT_RATIO = 3.0
PERCENTILE = 99.0
MIN_INTERVALS = 4
MIN_INTERVAL_SAMPLES = 100


def stationarity_test(intervals: dict[int, Histogram], interval_s: float | None,
                      scale: float = 1e6) -> dict[str, Any]:
    """The ``stationarity`` block of a result (values in ``1/scale`` of the recorded unit)."""
    keys = sorted(k for k, h in intervals.items() if h.total)
    out: dict[str, Any] = {"interval_s": interval_s, "intervals": len(keys),
                           "percentile": "p99"}
    if len(keys) < MIN_INTERVALS or not interval_s:
        out.update(verdict="unknown", statement=f"stationarity not tested: {len(keys)} "
                   f"interval(s) with samples, {MIN_INTERVALS} needed")
        return out
    cut = keys[len(keys) // 2]
    first, second = Histogram(intervals[keys[0]].spec), Histogram(intervals[keys[0]].spec)
    for k in keys:
        (first if k < cut else second).add(intervals[k])
    expected = 1.0 - PERCENTILE / 100.0
    later = exceedance_shift(first, second, PERCENTILE)  # the second half's tail heavier
    earlier = exceedance_shift(second, first, PERCENTILE)  # the first half's tail heavier
    out["shift"] = {
        "split_s": round(cut * interval_s, 6),  # where the second half starts
        "first_half_p99": round(later.threshold / scale, 6),
        "second_half_p99": round(earlier.threshold / scale, 6),
        "second_above_first_p99": round(later.share_b, 6), "pvalue_later": later.pvalue,
        "first_above_second_p99": round(earlier.share_b, 6), "pvalue_earlier": earlier.pvalue,
    }
    series = [intervals[k].value_at_percentile(PERCENTILE) for k in keys
              if intervals[k].total >= MIN_INTERVAL_SAMPLES]
    trend = mann_kendall(np.array(series, dtype=np.float64))
    out["trend"] = {"intervals": trend.n, "s": trend.s, "z": round(trend.z, 4),
                    "pvalue": trend.pvalue if trend.n >= 3 else None}
    findings = []
    if later.pvalue < ALPHA and later.share_b >= SHIFT_RATIO * expected:
        findings.append(f"{later.share_b * 100:.2f}% of the second half's requests exceed the "
                        f"first half's P99 ({later.threshold / scale:.3f} ms; "
                        f"{expected * 100:g}% expected)")
    if earlier.pvalue < ALPHA and earlier.share_b >= SHIFT_RATIO * expected:
        findings.append(f"{earlier.share_b * 100:.2f}% of the first half's requests exceed "
                        f"the second half's P99 ({earlier.threshold / scale:.3f} ms; "
                        f"{expected * 100:g}% expected)")
    if trend.n >= 8 and trend.pvalue < ALPHA:
        findings.append(f"the per-interval P99 {'rose' if trend.s > 0 else 'fell'} steadily "
                        f"over {trend.n} intervals (Mann-Kendall p {trend.pvalue:.2g})")
    if findings:
        out["verdict"] = "drifted"
        out["statement"] = ("the tail drifted during the run: " + "; ".join(findings)
                            + ": one percentile does not describe this run")
    else:
        out["verdict"] = "stationary"
        out["statement"] = (f"the tail held still: first half P99 {later.threshold / scale:.3f}"
                            f" ms, second half {earlier.threshold / scale:.3f} ms")
    return out


def over_time(intervals: dict[int, Histogram], interval_s: float | None,
              scale: float = 1e6) -> dict[str, Any]:
    """The per-interval tail the test above reads, for a page to draw: each interval with
    samples, by intended start (``t_s`` from the end of the warm-up), its count, P50, P99
    and max (in ``1/scale`` of the recorded unit, ms by default)."""
    keys = sorted(k for k, h in intervals.items() if h.total)
    step = interval_s or 0.0
    out: dict[str, Any] = {"t_s": [round(k * step, 6) for k in keys],
                           "count": [intervals[k].total for k in keys]}
    for name, pct in (("p50", 50.0), ("p99", PERCENTILE)):
        out[f"{name}_ms"] = [round(min(intervals[k].value_at_percentile(pct),
                                       intervals[k].max) / scale, 6) for k in keys]
    out["max_ms"] = [round(intervals[k].max / scale, 6) for k in keys]
    return out
