"""Did the generator send on the schedule it was asked for? (pure: dispatch times in,
a verdict out)

Two tests on the workers' measured dispatch times (the first
``recording.MAX_ARRIVALS`` of each; the ``dispatch_s`` column of ``--log``: when the
generator got to the request — a request that then waited for a free connection
was still dispatched on time, and its wait shows in latency, not here):

* **gaps** — the gaps between consecutive sends against the requested distribution:
  Kolmogorov–Smirnov against the exponential at ``rate`` over all workers' sends merged
  (Poisson), against the gamma of shape *B* (``--burstiness``) and mean ``1/rate`` over
  them merged (gamma: each worker sends every N-th arrival of one global gamma sequence,
  so only the merged sends are that process), or the distance to the band ``N/rate ± δ``
  in each worker's own sends, pooled (constant). Poisson is tested merged because how
  the schedule was shared decides each worker's part: its own Poisson stream at
  ``rate/N``, or every N-th request of one global schedule (``--requests``, traces, LLM
  workloads), whose gaps are Erlang-N, not exponential; merged, both are the requested
  Poisson process. A constant schedule is every N-th slot either way. δ is the timer's
  resolution: ``TIMER_RESOLUTION_S`` plus the engine's tick period when it batches. A
  send within δ of its due time moves the gaps' CDF by at most ``max_x F(x+δ) - F(x)``
  (``1 - exp(-λδ)`` for Poisson); only the distance beyond that counts. When that
  tolerance is large (the mean gap is near the timer's resolution) the gaps say nothing
  and the test is reported as not testable.
* **counts** — sends per window (``max(20 mean gaps, 20 δ, 50 ms)``) against the
  requested mean, ``Σ (N - m)² / m`` against chi-square (the Poisson variance;
  lenient for a constant schedule; ``m / B`` for gamma, the variance of a renewal
  count, with windows of at least ``20·max(B, 1/B)`` mean gaps so the asymptotic
  variance holds): a generator that falls behind or sends in bursts (CPU quota, GC, a
  rate above what it can send) fails it at any rate.

A ramp (``--rate LO..HI``, :class:`.schedule.Ramp`) is tested in operational time:
each send time ``t`` becomes ``Λ(t)``, the arrivals expected by then, where the
schedule is the same process at unit rate; δ becomes ``δ·peak rate`` and the 50 ms
window ``50 ms·peak rate`` (the strictest point of the ramp).

The verdict is ``match`` when every test that could be run has p ≥ ``ALPHA``,
``deviate`` when one has p < ``ALPHA``, ``unknown`` when none could be run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .confidence import chi2_sf, exponential_cdf, ks_constant, ks_test
from .schedule import Ramp

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


def _name(arrival: str, burstiness: float = 1.0, ramp: Ramp | None = None) -> str:
    name = {"poisson": "Poisson", "gamma": f"gamma arrivals (burstiness {burstiness:g})"}.get(
        arrival, "the constant schedule")
    if ramp is not None:
        name += f" ramping {ramp.lo:g}..{ramp.hi:g}/s"
    return name


def arrival_test(arrival: str, rate: float, workers: int, warmup_s: float,
                 dispatches: Sequence[np.ndarray], tick_s: float = 0.0, *,
                 burstiness: float = 1.0, ramp: Ramp | None = None) -> dict[str, Any]:
    """The ``arrivals`` block of a result. ``dispatches``: per worker, its measured
    requests' dispatch offsets (seconds from the run's start, in dispatch order)."""
    delta = TIMER_RESOLUTION_S + tick_s
    arr = [np.asarray(d, dtype=np.float64) for d in dispatches if len(d)]
    out: dict[str, Any] = {"distribution": arrival, "resolution_us": round(delta * 1e6, 3),
                           "samples": int(sum(a.size for a in arr))}
    if arrival == "gamma":
        out["burstiness"] = burstiness
    min_window = MIN_WINDOW_S
    if ramp is not None:  # operational time: the same process at unit rate
        arr = [ramp.cumulative(a) for a in arr]
        warmup_s = float(ramp.cumulative(warmup_s))
        rate, delta, min_window = 1.0, delta * ramp.peak, MIN_WINDOW_S * ramp.peak
        out["ramp"] = ramp.json()
    if arrival in ("poisson", "gamma"):  # all workers' sends together (module docstring)
        lam = rate
        if len(arr) > 1:
            end = min(float(a[-1]) for a in arr)  # where every worker's sends were kept
            arr = [np.sort(np.concatenate([a[a <= end] for a in arr]))]
    else:
        lam = rate / workers  # each worker: every N-th slot of the constant schedule
    gaps = np.concatenate([np.diff(a) for a in arr]) if arr else np.zeros(0)
    out["gaps"] = _gap_test(arrival, lam, delta, gaps, burstiness, out["resolution_us"])
    shape = burstiness if arrival == "gamma" else 1.0
    out["counts"] = _count_test(lam, delta, warmup_s, arr, shape, min_window)
    if ramp is not None:  # the windows are of operational time: arrivals expected
        out["counts"]["window_arrivals"] = round(out["counts"].pop("window_ms") / 1e3, 6)
    tested = [t for t in (out["gaps"], out["counts"]) if t["pvalue"] is not None]
    name = _name(arrival, burstiness, ramp)
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
        per = (f"{c['window_ms']:g} ms" if "window_ms" in c
               else f"{c['window_arrivals']:g} expected arrivals")
        parts.append(f"sends per {per}: chi2 {c['statistic']:.1f} on "
                     f"{c['dof']} windows, p {c['pvalue']:.3g}")
    return "; ".join(parts)


def _gap_test(arrival: str, lam: float, delta: float, gaps: np.ndarray,
              burstiness: float = 1.0, resolution_us: float | None = None) -> dict[str, Any]:
    """``delta`` in the gaps' unit (seconds, or arrivals for a ramp); ``resolution_us``
    the timer's resolution as the message gives it."""
    res = f"{(delta * 1e6 if resolution_us is None else resolution_us):.0f} µs"
    none: dict[str, Any] = {"statistic": None, "tolerance": None, "pvalue": None, "n": 0}
    if gaps.size < 20:
        return {**none, "reason": f"only {gaps.size} gaps"}
    if arrival == "gamma":
        cdf = gamma_cdf(burstiness, 1.0 / (lam * burstiness))
        tol = shift_tolerance(cdf, burstiness, 1.0 / lam, delta)
        if tol > MAX_GAP_TOLERANCE:
            return {**none, "reason": f"the timer's resolution ({res}) moves "
                    f"the gaps' CDF by {tol:.2f}: gaps this small cannot be judged"}
        r = ks_test(gaps, cdf, tolerance=tol)
    elif arrival == "poisson":
        tol = -math.expm1(-lam * delta)
        if tol > MAX_GAP_TOLERANCE:
            return {**none, "reason": f"the timer's resolution ({res}) is "
                    f"{lam * delta:.2g}× the mean gap: gaps this small cannot be judged"}
        r = ks_test(gaps, exponential_cdf(lam), tolerance=tol)
    else:
        gap = 1.0 / lam
        if delta > gap / 4:
            return {**none, "reason": f"the timer's resolution ({res}) is over a quarter "
                    f"of the gap" + (f" ({gap * 1e6:.0f} µs)" if resolution_us is None
                                     or abs(delta * 1e6 - resolution_us) < 1e-3 else
                                     " at the ramp's peak")}
        r = ks_constant(gaps, gap, delta)
        tol = 0.0
    return {"statistic": round(r.statistic, 6), "tolerance": round(tol, 6),
            "pvalue": r.pvalue, "n": r.n}


def _count_test(lam: float, delta: float, warmup_s: float, arr: list[np.ndarray],
                shape: float = 1.0, min_window: float = MIN_WINDOW_S) -> dict[str, Any]:
    w = max(20.0 * max(shape, 1.0 / shape) / lam, 20.0 * delta, min_window)
    m = lam * w
    var = m / shape  # a renewal count's variance: m·CV² (Poisson: m)
    stat, dof = 0.0, 0
    for a in arr:
        k = int(math.floor((float(a.max()) - warmup_s) / w))
        if k <= 0:
            continue
        slot = np.floor((a - warmup_s) / w).astype(np.int64)
        counts = np.bincount(slot[(slot >= 0) & (slot < k)], minlength=k)[:k]
        stat += float(np.sum((counts - m) ** 2) / var)
        dof += k
    rec: dict[str, Any] = {"window_ms": round(w * 1e3, 3), "expected": round(m, 3),
                           "statistic": round(stat, 3), "dof": dof}
    if dof < MIN_WINDOWS:
        return {**rec, "pvalue": None,
                "reason": f"only {dof} whole {w * 1e3:g} ms window(s) of sends"}
    return {**rec, "pvalue": chi2_sf(stat, dof)}


def gamma_cdf(shape: float, scale: float):  # type: ignore[no-untyped-def]
    """The gamma distribution's CDF, vectorised: the regularised lower incomplete gamma
    ``P(shape, x/scale)`` by its series below ``shape + 1`` and its continued fraction
    above (Numerical Recipes §6.2), to double precision."""
    a = float(shape)
    lg = math.lgamma(a)

    def cdf(x: np.ndarray) -> np.ndarray:
        z = np.maximum(np.asarray(x, dtype=np.float64) / scale, 0.0)
        out = np.zeros_like(z)
        pos = z > 0
        lo = pos & (z < a + 1.0)
        hi = pos & ~lo
        if np.any(lo):
            zl = z[lo]
            term = np.full(zl.shape, 1.0 / a)
            total = term.copy()
            for n in range(1, 100_000):
                term = term * zl / (a + n)
                total += term
                if np.all(term < total * 1e-16):
                    break
            out[lo] = total * np.exp(-zl + a * np.log(zl) - lg)
        if np.any(hi):
            zh = z[hi]
            tiny = 1e-300
            b = zh + 1.0 - a
            c = np.full(zh.shape, 1.0 / tiny)
            d = 1.0 / b
            h = d.copy()
            for i in range(1, 100_000):
                an = -i * (i - a)
                b = b + 2.0
                d = an * d + b
                d = np.where(np.abs(d) < tiny, tiny, d)
                c = b + an / c
                c = np.where(np.abs(c) < tiny, tiny, c)
                d = 1.0 / d
                step = d * c
                h = h * step
                if np.all(np.abs(step - 1.0) < 1e-15):
                    break
            out[hi] = 1.0 - np.exp(-zh + a * np.log(zh) - lg) * h
        return np.clip(out, 0.0, 1.0)

    return cdf


def shift_tolerance(cdf, shape: float, mean: float, delta: float) -> float:  # type: ignore[no-untyped-def]
    """``max_x F(x+δ) - F(x)``: how far gaps each moved by at most δ can move the CDF.
    Decreasing densities (shape <= 1) peak at 0; otherwise a grid around the mode."""
    if shape <= 1.0:
        return float(cdf(np.array([delta]))[0])
    sd = mean / math.sqrt(shape)
    mode = mean * (shape - 1.0) / shape
    x = np.linspace(max(mode - 4 * sd - delta, 0.0), mode + 4 * sd, 4001)
    return float(np.max(cdf(x + delta) - cdf(x)))
