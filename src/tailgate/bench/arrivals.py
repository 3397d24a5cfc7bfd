"""Did the generator send on the schedule it was asked for? (pure: dispatch times in,
a verdict out)

Two tests on the workers' measured dispatch times (the first
``recording.MAX_ARRIVALS`` of each; the ``dispatch_s`` column of ``--log``: when the
generator got to the request — a request that then waited for a free connection
was still dispatched on time, and its wait shows in latency, not here):

* **gaps** — the gaps between consecutive sends against the requested
  distribution: Kolmogorov–Smirnov against the exponential at ``rate`` over all
  workers' sends merged (Poisson), or the distance to the band ``N/rate ± δ`` in each
  worker's own sends, pooled (constant). Poisson is tested merged because how the
  schedule was shared decides each worker's part: its own Poisson stream at
  ``rate/N``, or every N-th request of one global schedule (``--requests``, traces,
  LLM workloads), whose gaps are Erlang-N, not exponential; merged, both are the
  requested Poisson process. A constant schedule is every N-th slot either way. δ is the
  timer's resolution: ``TIMER_RESOLUTION_S`` plus the engine's tick period when
  it batches. A send within δ of its due time moves the gaps' CDF by at most
  ``1 - exp(-λδ)``; only the distance beyond that counts. When that tolerance is
  large (the mean gap is near the timer's resolution) the gaps say nothing and
  the test is reported as not testable.
* **counts** — sends per window (``max(20 mean gaps, 20 δ, 50 ms)``) against the
  requested mean, ``Σ (N - m)² / m`` against chi-square (the Poisson variance;
  lenient for a constant schedule): a generator that falls behind or sends in
  bursts (CPU quota, GC, a rate above what it can send) fails it at any rate.

The verdict is ``match`` when every test that could be run has p ≥ ``ALPHA``,
``deviate`` when one has p < ``ALPHA``, ``unknown`` when none could be run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .confidence import chi2_sf, exponential_cdf, ks_constant, ks_test

ALPHA = 0.01
# timerfd wake-up overshoot measured on our 2-core VMs (2,000 one-shot wake-ups 0.5 ms
# apart, uvloop): P50 25 µs, P90 32 µs, P99 77 µs. The tolerance covers the P99.
TIMER_RESOLUTION_S = 100e-6
MAX_GAP_TOLERANCE = 0.2  # beyond this CDF tolerance the gap test cannot tell
MIN_WINDOWS = 5
# Windows of at least 50 ms: a shared machine's scheduler hiccups (a few ms, which lateness
# reports) are not what this test is for, but a generator that cannot keep up or runs in
# bursts (a CPU quota's 100 ms period) is.
MIN_WINDOW_S = 0.05


def _name(arrival: str) -> str:
    return "Poisson" if arrival == "poisson" else "the constant schedule"


def arrival_test(arrival: str, rate: float, workers: int, warmup_s: float,
                 dispatches: Sequence[np.ndarray], tick_s: float = 0.0) -> dict[str, Any]:
    """The ``arrivals`` block of a result. ``dispatches``: per worker, its measured
    requests' dispatch offsets (seconds from the run's start, in dispatch order)."""
    delta = TIMER_RESOLUTION_S + tick_s
    arr = [np.asarray(d, dtype=np.float64) for d in dispatches if len(d)]
    out: dict[str, Any] = {"distribution": arrival, "resolution_us": round(delta * 1e6, 3),
                           "samples": int(sum(a.size for a in arr))}
    if arrival == "poisson":  # all workers' sends together (see the module docstring)
        lam = rate
        if len(arr) > 1:
            end = min(float(a[-1]) for a in arr)  # where every worker's sends were kept
            arr = [np.sort(np.concatenate([a[a <= end] for a in arr]))]
    else:
        lam = rate / workers  # each worker: every N-th slot of the constant schedule
    gaps = np.concatenate([np.diff(a) for a in arr]) if arr else np.zeros(0)
    out["gaps"] = _gap_test(arrival, lam, delta, gaps)
    out["counts"] = _count_test(lam, delta, warmup_s, arr)
    tested = [t for t in (out["gaps"], out["counts"]) if t["pvalue"] is not None]
    name = _name(arrival)
    if not tested:
        out["verdict"] = "unknown"
        out["statement"] = (f"arrivals not tested against {name}: "
                            + "; ".join(t["reason"] for t in (out["gaps"], out["counts"])))
    elif all(t["pvalue"] >= ALPHA for t in tested):
        out["verdict"] = "match"
        out["statement"] = f"arrivals match {name} (" + _detail(out) + ")"
    else:
        out["verdict"] = "deviate"
        out["statement"] = (f"arrivals deviate from {name}: the generator could not keep "
                            f"the schedule (" + _detail(out) + ")")
    return out


def _detail(out: dict[str, Any]) -> str:
    parts = []
    g, c = out["gaps"], out["counts"]
    if g["pvalue"] is not None:
        tol = f", less the timer's {g['tolerance']:.4f}" if g["tolerance"] else ""
        parts.append(f"gaps: KS D {g['statistic']:.4f}{tol}, p {g['pvalue']:.3g}")
    else:
        parts.append(f"gaps not tested: {g['reason']}")
    if c["pvalue"] is not None:
        parts.append(f"sends per {c['window_ms']:g} ms: chi2 {c['statistic']:.1f} on "
                     f"{c['dof']} windows, p {c['pvalue']:.3g}")
    return "; ".join(parts)


def _gap_test(arrival: str, lam: float, delta: float, gaps: np.ndarray) -> dict[str, Any]:
    none: dict[str, Any] = {"statistic": None, "tolerance": None, "pvalue": None, "n": 0}
    if gaps.size < 20:
        return {**none, "reason": f"only {gaps.size} gaps"}
    if arrival == "poisson":
        tol = -math.expm1(-lam * delta)
        if tol > MAX_GAP_TOLERANCE:
            return {**none, "reason": f"the timer's resolution ({delta * 1e6:.0f} µs) is "
                    f"{lam * delta:.2g}× the mean gap: gaps this small cannot be judged"}
        r = ks_test(gaps, exponential_cdf(lam), tolerance=tol)
    else:
        gap = 1.0 / lam
        if delta > gap / 4:
            return {**none, "reason": f"the timer's resolution ({delta * 1e6:.0f} µs) is "
                    f"over a quarter of the gap ({gap * 1e6:.0f} µs)"}
        r = ks_constant(gaps, gap, delta)
        tol = 0.0
    return {"statistic": round(r.statistic, 6), "tolerance": round(tol, 6),
            "pvalue": r.pvalue, "n": r.n}


def _count_test(lam: float, delta: float, warmup_s: float,
                arr: list[np.ndarray]) -> dict[str, Any]:
    w = max(20.0 / lam, 20.0 * delta, MIN_WINDOW_S)
    m = lam * w
    stat, dof = 0.0, 0
    for a in arr:
        k = int(math.floor((float(a.max()) - warmup_s) / w))
        if k <= 0:
            continue
        slot = np.floor((a - warmup_s) / w).astype(np.int64)
        counts = np.bincount(slot[(slot >= 0) & (slot < k)], minlength=k)[:k]
        stat += float(np.sum((counts - m) ** 2) / m)
        dof += k
    rec: dict[str, Any] = {"window_ms": round(w * 1e3, 3), "expected": round(m, 3),
                           "statistic": round(stat, 3), "dof": dof}
    if dof < MIN_WINDOWS:
        return {**rec, "pvalue": None,
                "reason": f"only {dof} whole {w * 1e3:g} ms window(s) of sends"}
    return {**rec, "pvalue": chi2_sf(stat, dof)}
