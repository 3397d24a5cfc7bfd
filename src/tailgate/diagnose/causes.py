"""The causes diagnose can name, with their layer, what the evidence is and the remedy (the
catalog's where one of its red lines is the cause)."""

from __future__ import annotations

from ..baseline import catalog
from .attribution import Cause


def _remedy(check_id: str) -> str:
    return " ".join(catalog()[check_id].remedy.split())


CAUSES = {
    "throttled": Cause("throttled", "L2", "the service's cgroup was CFS-throttled (its CPU "
                       "quota spent for the period)", _remedy("l2.cgroup.throttling"),
                       "l2.cgroup.throttling"),
    "runq": Cause("runq", "L2", "the service's threads waited >= 0.2 ms in the run queue "
                  "(runnable, another task on their CPU; throttled time excluded)",
                  _remedy("l2.sched.runqlat"), "l2.sched.runqlat"),
    "stopped": Cause("stopped", "L2", "the service was stopped (SIGSTOP or ptrace: not "
                     "running and not runnable)", "Find what stops the process (a debugger, a "
                     "ptrace-based profiler, a freezer or checkpointing agent, a supervisor "
                     "sending SIGSTOP) and keep it off the serving path."),
    "retransmit": Cause("retransmit", "L2", "a TCP segment of the service's port was "
                        "retransmitted (a packet was lost)", _remedy("l2.net.retransmit_rate"),
                        "l2.net.retransmit_rate"),
    "softirq": Cause("softirq", "L2", "a network softirq (NET_RX/NET_TX) ran >= 0.2 ms on "
                     "the service's CPU (packet processing preempting it)",
                     _remedy("l2.irq.isolation"), "l2.irq.isolation"),
    "futex": Cause("futex", "L3", "the service's threads waited >= 0.2 ms on a futex (lock "
                   "contention in user space)", "Shorten or split the contended lock "
                   "(per-core or sharded state, lock-free queues), or move the slow work out "
                   "of the critical section; `tailgate probe futex --pid P` names the threads."),
}
