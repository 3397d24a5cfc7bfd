"""From every rank's timestamps to one message size's result (pure).

Each rank records, per measured iteration, when it entered the collective and
when it left (``CLOCK_MONOTONIC`` ns, shifted onto rank 0's clock). Then:

* **latency** of iteration *i* is the longest any rank spent in it,
  ``max_r (exit[r, i] - enter[r, i])``: what a training or inference step that
  ends with this collective waits. It is recorded into tailgate's histogram
  (:mod:`tailgate.hist`), the same one every bench uses, so P50..P999 and max
  come with their sample counts.
* **time** (for the bandwidths) is the mean of those latencies, so
  ``algbw = bytes / time`` and ``busbw = algbw * 2(n-1)/n`` as nccl-tests
  defines them. nccl-tests averages each rank's time over the iterations and
  then takes the slowest rank; the mean of per-iteration maxima is never
  smaller, and the difference is the cost of stragglers that move around.
* **straggler**: in a collective the ranks that arrive early wait for the last
  one, so the rank with the longest time in the call is usually a victim, not
  the cause. Each rank's *lag* at every timestamp (entering or leaving an
  iteration) is how far behind the earliest rank it is; a rank that gets
  stalled (descheduled, stopped, slow between iterations, slow inside the call
  after its data left) sees its lag grow, while a lag it merely carries along
  (an algorithm that always serves one rank last) does not grow. Each of the
  slowest 1 % of iterations (the tail) is blamed on the rank whose lag grew
  the most in it; the straggler is the rank blamed for the most tail time
  (``tail_ms``, ``tail_iterations``). ``delay_ms`` is all the lag a rank
  introduced, tail or not, and ``last_arrivals`` how often it entered last.
  A rank stopped inside the call *before* its data left makes every rank wait
  alike: no timestamp can tell that one apart, and no straggler is named for it
  with any confidence (the share says how clear the verdict is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...hist import Histogram, HistogramSpec, encode
from ..result import summarize
from .spec import algbw_gbps, bus_factor

NS_PER_US = 1e3
NS_PER_MS = 1e6


@dataclass(frozen=True)
class RankTimes:
    """One rank's measured iterations of one message size."""

    rank: int
    host: str
    enter_ns: np.ndarray  # int64, on rank 0's clock
    exit_ns: np.ndarray
    wrong: int | None  # wrong result elements summed over iterations; None: not checked


@dataclass(frozen=True)
class SizeRun:
    """What every rank measured for one size, gathered on rank 0."""

    collective: str
    nbytes: int
    count: int
    dtype: str
    op: str
    placement: str  # "out_of_place" | "in_place"
    ranks: Sequence[RankTimes]


def analyze(run: SizeRun, spec: HistogramSpec | None = None,
            min_tail_samples: int = 10) -> tuple[dict[str, Any], Histogram]:
    """The JSON block of one size and the histogram of its per-iteration latencies (ns)."""
    ranks = sorted(run.ranks, key=lambda r: r.rank)
    if not ranks:
        raise ValueError("no rank reported any timing")
    iters = {len(r.enter_ns) for r in ranks} | {len(r.exit_ns) for r in ranks}
    if len(iters) != 1:
        raise ValueError(f"ranks measured different numbers of iterations: {sorted(iters)}")
    enter = np.stack([np.asarray(r.enter_ns, dtype=np.int64) for r in ranks])
    leave = np.stack([np.asarray(r.exit_ns, dtype=np.int64) for r in ranks])
    inside = leave - enter  # [rank, iteration]
    if inside.size and inside.min() < 0:
        raise ValueError("a rank left an iteration before it entered it")
    latency = inside.max(axis=0) if inside.size else np.zeros(0, dtype=np.int64)
    hist = Histogram(spec) if spec is not None else Histogram()
    hist.record(latency)
    n = len(ranks)
    mean_s = float(latency.mean()) / 1e9 if latency.size else 0.0
    algbw = algbw_gbps(run.nbytes, mean_s)
    # Lag behind the earliest rank at each timestamp, entering and leaving in turn.
    tail_ms = np.zeros(n)
    tail_count = np.zeros(n, dtype=np.int64)
    if latency.size:
        points = np.empty((n, 2 * latency.size), dtype=np.int64)
        points[:, 0::2], points[:, 1::2] = enter, leave
        lag = points - points.min(axis=0)
        grew = np.clip(np.diff(lag, axis=1, prepend=0), 0, None)
        introduced = grew.sum(axis=1)
        per_iter = grew[:, 0::2] + grew[:, 1::2]  # [rank, iteration]: outside, then inside
        last = enter.argmax(axis=0)
        # The tail: the slowest 1 % of iterations (at least one), each blamed on the rank
        # whose lag grew the most in it.
        k_tail = max(1, latency.size // 100)
        for i in np.argsort(latency, kind="stable")[-k_tail:]:
            culprit = int(per_iter[:, i].argmax())
            tail_ms[culprit] += latency[i] / NS_PER_MS
            tail_count[culprit] += 1
    else:
        introduced = np.zeros(n, dtype=np.int64)
        last = np.zeros(0, dtype=np.int64)
    per_rank = []
    for k, r in enumerate(ranks):
        per_rank.append({
            "rank": r.rank, "host": r.host,
            "mean_us": round(float(inside[k].mean()) / NS_PER_US, 3) if latency.size else 0.0,
            "max_us": round(float(inside[k].max()) / NS_PER_US, 3) if latency.size else 0.0,
            "last_arrivals": int(np.count_nonzero(last == k)),
            "delay_ms": round(float(introduced[k]) / NS_PER_MS, 6),
            "tail_iterations": int(tail_count[k]),
            "tail_ms": round(float(tail_ms[k]), 6),
            "wrong": r.wrong,
        })
    total = float(tail_ms.sum())
    straggler = None
    if n > 1 and latency.size:
        top = max(per_rank, key=lambda p: (p["tail_ms"], p["delay_ms"]))
        straggler = {"rank": top["rank"], "host": top["host"],
                     "tail_iterations": top["tail_iterations"], "tail_ms": top["tail_ms"],
                     "share": round(top["tail_ms"] / total, 4) if total else 0.0,
                     "delay_ms": top["delay_ms"], "last_arrivals": top["last_arrivals"]}
    wrongs = [r.wrong for r in ranks]
    block: dict[str, Any] = {
        "bytes": run.nbytes, "count": run.count, "dtype": run.dtype, "op": run.op,
        "placement": run.placement, "iterations": int(latency.size),
        "time_us": round(mean_s * 1e6, 3),
        "algbw_gbps": round(algbw, 6),
        "busbw_gbps": round(algbw * bus_factor(run.collective, n), 6),
        "wrong": None if any(w is None for w in wrongs) else int(sum(wrongs)),  # type: ignore[arg-type]
        "latency_ms": summarize(hist, NS_PER_MS),
        # the histogram itself (HdrHistogram V2, ns): runs merge exactly, e.g. for a compare
        "histogram_ns": encode(hist),
        "straggler": straggler,
        "per_rank": per_rank,
    }
    return block, hist


def clock_offsets(samples: np.ndarray) -> tuple[np.ndarray, float]:
    """Each rank's clock offset from rank 0, from timestamps taken as barriers ended.

    ``samples[r, k]`` is rank r's clock just after barrier k. Ranks leave a
    barrier at nearly the same moment, so ``median_k(samples[r] - samples[0])``
    estimates rank r's offset; the spread of the differences bounds the error.
    Returns (offsets in ns, error bound in microseconds).
    """
    diffs = samples - samples[0]
    offsets = np.median(diffs, axis=1).astype(np.int64)
    spread = float(np.max(np.abs(diffs - offsets[:, None]))) if diffs.size else 0.0
    return offsets, spread / NS_PER_US
