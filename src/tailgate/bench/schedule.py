"""The open-loop schedule: when each request is meant to start (pure, vectorised).

A schedule never looks at responses: request *i* is due at ``times[i]`` seconds
after the run's start whatever the server does, which is what keeps a stalled
server's tail in the figures (no coordinated omission).

Splitting over ``workers`` processes keeps the union exact: for ``constant``
worker *k* takes every *N*-th slot of the single global sequence ``i / rate``;
for ``poisson`` each worker draws an independent Poisson process at
``rate / N``, and the superposition of independent Poisson processes is a
Poisson process at ``rate``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Arrival = Literal["constant", "poisson"]
ARRIVALS: tuple[Arrival, ...] = ("constant", "poisson")


def arrival_times(rate: float, duration_s: float, arrival: Arrival = "constant", *,
                  worker: int = 0, workers: int = 1, seed: int | None = 0) -> np.ndarray:
    """Intended start offsets (seconds, ascending, all in ``[0, duration_s)``) of one worker.

    ``rate`` is the total rate of all workers together.
    """
    if rate <= 0 or duration_s < 0:
        raise ValueError("rate must be > 0 and duration >= 0")
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} not in 0..{workers - 1}")
    if arrival == "constant":
        total = int(np.floor(rate * duration_s + 1e-9))
        return np.arange(worker, total, workers, dtype=np.float64) / rate
    if arrival == "poisson":
        rng = np.random.default_rng(None if seed is None else [seed, worker])
        share = rate / workers
        # Draw in blocks until the horizon is passed (expected count + 6 sigma first).
        expected = share * duration_s
        n = int(expected + 6 * np.sqrt(expected) + 16)
        gaps = rng.exponential(1.0 / share, size=n)
        times = np.cumsum(gaps)
        while times.size and times[-1] < duration_s:
            more = np.cumsum(rng.exponential(1.0 / share, size=n)) + times[-1]
            times = np.concatenate([times, more])
        return times[times < duration_s]
    raise ValueError(f"unknown arrival process {arrival!r} (one of {', '.join(ARRIVALS)})")
