"""Scheduling of tailgate's own helper threads beside a latency-critical one."""

from __future__ import annotations

import os
import time

# How long a background thread works before it gives its core back (see Breather).
YIELD_NS = 50_000


def background() -> bool:
    """Put the calling thread below the thread that made it, so it never delays that one on a
    CPU they share: SCHED_IDLE under an ordinary thread (any runnable task preempts it at
    once), or SCHED_OTHER under a real-time one (``chrt``), where an idle-policy thread would
    never run at all on a host whose CPUs ordinary work keeps busy: recording, polling and
    sampling would stop. False where the policy cannot be set (it then competes as before)."""
    try:
        if os.sched_getscheduler(0) in (os.SCHED_FIFO, os.SCHED_RR):
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        else:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


class Breather:
    """Call it often from a background thread's long stretch of work; at most every
    ``every_ns`` of it, it gives the core back (``sched_yield``).

    An idle-policy thread is not preempted by a busy thread that stays runnable: the
    scheduler picks it now and then (EEVDF: once its deadline comes first), and it then
    keeps the core for its whole slice, up to a tick (4 ms at HZ=250), while the
    latency-critical thread waits runnable (measured: the generator's loop 1.3-3.7 ms late
    behind the recorder, every ~150 ms at 1,000 LLM streams). A yield moves the background
    thread's deadline back, so a waiting thread the scheduler counts as eligible runs at
    once; one that has had more than its share of the core is not, and may still wait for
    the tick (measured: the late requests halved, not gone; docs/benchmarks.md round four).
    A call costs ~0.2 us, a yield ~1 us when nothing else waits."""

    __slots__ = ("_last", "every_ns")

    def __init__(self, every_ns: int = YIELD_NS) -> None:
        self.every_ns = every_ns
        self._last = time.monotonic_ns()

    def __call__(self) -> None:
        if time.monotonic_ns() - self._last > self.every_ns:
            os.sched_yield()
            self._last = time.monotonic_ns()
