"""Scheduling of tailgate's own helper threads beside a latency-critical one."""

from __future__ import annotations

import os


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
