"""The loop every rank runs: per size, warm up, then time each iteration on every rank.

Per iteration, on every rank: check the previous result and reset the buffer
(so a stale result cannot pass the check), then a barrier, then the ``gap_s``
pause (the compute of a step), then the timed collective call, until it has
completed on this rank. The barrier fences tailgate's own bookkeeping off: a
rank descheduled while it checks a megabyte cannot make the others wait inside
the timed call (on a busy 2-core VM that alone moved a 1 MiB AllReduce's P50
from 0.17 ms to 8 ms). Everything after the barrier is the workload's: a rank
that is late in its gap or slow in the call is late for real, and shows.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .analyze import RankTimes, SizeRun, clock_offsets
from .backends import Comm, boot_id
from .pattern import contribution_row, expected_row
from .spec import DType, element_count

CLOCK_SAMPLES = 9


@dataclass(frozen=True)
class Plan:
    """What every rank runs (identical on all ranks: they all parse the same command line)."""

    sizes: tuple[int, ...]
    dtype: DType
    op: str = "sum"
    placement: str = "out_of_place"
    iters: int = 1000
    warmup: int = 20
    gap_s: float = 0.0
    check: bool = True
    collective: str = "allreduce"


@dataclass
class Clock:
    """How the ranks' timestamps were put on one clock."""

    shared: bool
    offsets_ns: np.ndarray
    error_us: float

    def json(self) -> dict[str, Any]:
        if self.shared:
            return {"kind": "shared", "note": "all ranks on one kernel: one CLOCK_MONOTONIC"}
        return {"kind": "estimated", "error_us": round(self.error_us, 3),
                "note": "ranks on several hosts: offsets estimated from barrier exits"}


def sync_clocks(comm: Comm) -> tuple[Clock | None, list[str] | None]:
    """Rank 0 gets the clock offsets and every rank's host name (others get None)."""
    ident = comm.gather((socket.gethostname(), boot_id()))
    samples = []
    shared = comm.bcast(None if ident is None else len({b for _, b in ident}) == 1)
    if not shared:
        for _ in range(CLOCK_SAMPLES):
            comm.barrier()
            samples.append(time.monotonic_ns())
    gathered = comm.gather(samples)
    if comm.rank != 0:
        return None, None
    assert ident is not None and gathered is not None
    hosts = [h for h, _ in ident]
    if shared:
        return Clock(True, np.zeros(comm.size, dtype=np.int64), 0.0), hosts
    offsets, err = clock_offsets(np.array(gathered, dtype=np.int64))
    return Clock(False, offsets, err), hosts


def measure(comm: Comm, plan: Plan,
            on_event: Callable[[str], None] | None = None) -> tuple[list[SizeRun], Clock] | None:
    """Run the plan on this rank; rank 0 returns every size's gathered timings."""
    clock, hosts = sync_clocks(comm)
    expected = expected_row(comm.size, plan.op)
    mine = contribution_row(comm.rank, plan.op)
    out: list[SizeRun] = []
    if on_event and comm.rank == 0:
        on_event(f"{plan.collective}: {comm.size} rank(s), {comm.library}: measuring "
                 f"{len(plan.sizes)} size(s) x {plan.iters} iterations")
    for nbytes in plan.sizes:
        count = element_count(nbytes, plan.dtype)
        send, recv = comm.buffers(count, plan.dtype, mine, plan.placement)
        enter = np.empty(plan.iters, dtype=np.int64)
        leave = np.empty(plan.iters, dtype=np.int64)
        wrong = 0
        for it in range(plan.warmup + plan.iters):
            if plan.check and it > plan.warmup:
                wrong += comm.wrong(recv, expected)
            comm.reset(send, recv, plan.placement)
            comm.barrier()
            if plan.gap_s > 0:
                time.sleep(plan.gap_s)
            t0 = time.monotonic_ns()
            comm.allreduce(send, recv, plan.op, plan.placement)
            t1 = time.monotonic_ns()
            k = it - plan.warmup
            if k >= 0:
                enter[k], leave[k] = t0, t1
        if plan.check:
            wrong += comm.wrong(recv, expected)
        del send, recv
        parts = comm.gather((comm.rank, enter, leave, wrong if plan.check else None))
        if parts is not None:
            assert clock is not None and hosts is not None
            ranks = [RankTimes(r, hosts[r], e - clock.offsets_ns[r], x - clock.offsets_ns[r], w)
                     for r, e, x, w in parts]
            out.append(SizeRun(plan.collective, nbytes, count, plan.dtype.name, plan.op,
                               plan.placement, ranks))
            if on_event:
                on_event(f"{plan.collective}: {nbytes} B done")
    if comm.rank != 0:
        return None
    assert clock is not None
    return out, clock
