"""Evidence over the diagnose window, on CLOCK_MONOTONIC (bpftrace's ``nsecs`` and Python's
``time.monotonic_ns`` are the same clock): probe events and counter polls."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..host import Host
from ..model import SourceError
from ..probes.output import BpftraceOutput
from ..sources.cgroup import parse_cpu_stat

KINDS = {"R": "runq", "S": "stopped", "F": "futex"}
# the kernel's softirq vectors (include/linux/interrupt.h), by number
SOFTIRQS = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED",
            "HRTIMER", "RCU")
NET_SOFTIRQS = (2, 3)
PROBE_BIN_NS = 20_000_000  # the probe's @swbin and @sirq bins (diagnose.bt)


@dataclass(frozen=True)
class Behind:
    """The task a run-queue wait ended behind: the one its thread got the CPU from (tid 0:
    the CPU was idle, the wait was the wake-up's own latency)."""

    tid: int
    tgid: int
    cpu: int
    comm: str


@dataclass(frozen=True)
class Wake:
    """A watched task woken (``sched_waking``): by task ``tid`` of ``tgid`` on ``cpu``, or, when
    ``ctx`` is not ``task``, in an interrupt that ran on top of that task."""

    wakee: int
    t: int
    tid: int
    tgid: int
    cpu: int
    ctx: str  # task | timer | softirq | irq
    comm: str


@dataclass(frozen=True)
class WakerWait:
    """A wait of a waker (a task tracked because it woke a service thread or another waker)."""

    kind: str  # runq | stopped | offcpu
    tid: int
    a: int
    b: int
    nr: int = -1  # offcpu: the syscall it blocked in (-1: none)
    preempted: bool = False  # runq: after an involuntary switch
    behind: Behind | None = None  # runq: the task it got the CPU from


@dataclass(frozen=True)
class Task:
    """A task the probe tracked: depth 1 a thread of the service, 2 a waker of one, 3 a
    waker's waker; ``since``: its first switch out (before it, what it did is not known)."""

    tid: int
    tgid: int
    depth: int
    since: int
    comm: str


CONTEXTS = ("task", "timer", "softirq", "irq")


@dataclass
class Events:
    """Intervals (ns) per kind, and retransmission instants with their ports."""

    intervals: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)  # tid,a,b
    retransmits: list[tuple[int, int, int]] = field(default_factory=list)  # t, sport, dport
    softirqs: list[tuple[int, int, int, int]] = field(default_factory=list)  # vec, cpu, a, b
    preempted: set[tuple[int, int]] = field(default_factory=set)  # (tid, a) of runq waits
    offcpu: list[tuple[int, int, int, int]] = field(default_factory=list)  # tid, a, b, syscall
    exits: dict[int, int] = field(default_factory=dict)  # tid -> its last switch out
    # the chain of blame (diagnose.chain): whom a run-queue wait was behind, who woke whom,
    # the wakers' own waits, the tasks tracked, and the reads of the service's connections
    behind: dict[tuple[int, int], Behind] = field(default_factory=dict)  # (tid, a) of runq
    wakes: list[Wake] = field(default_factory=list)
    waker_waits: list[WakerWait] = field(default_factory=list)
    tasks: dict[int, Task] = field(default_factory=dict)
    reads: list[tuple[int, int, int, int]] = field(default_factory=list)  # tid, t, sport, dport
    malformed: int = 0

    def softirq_spans(self, cpus: tuple[int, ...], vecs: tuple[int, ...] = NET_SOFTIRQS
                      ) -> np.ndarray:
        """Long runs of the network softirqs on ``cpus`` (they preempt whatever runs there)."""
        return np.array([(a, b) for v, c, a, b in self.softirqs if v in vecs and c in cpus],
                        dtype=np.int64).reshape(-1, 2)

    def spans(self, kind: str) -> np.ndarray:
        """Intervals of ``kind``; ``runq_preempted``: the run-queue waits that followed a
        preemption (the thread used up its slice while another task wanted its CPU)."""
        rows = self.intervals.get(kind, [])
        if kind == "runq":
            rows = self.runq_not_after_stop()
        elif kind == "runq_preempted":
            rows = [r for r in self.runq_not_after_stop() if (r[0], r[1]) in self.preempted]
        return np.array([(a, b) for _, a, b in rows], dtype=np.int64).reshape(-1, 2)

    def runq_not_after_stop(self, slack_ns: int = 50_000) -> list[tuple[int, int, int]]:
        """Run-queue waits, less those that begin where a stop of the same thread ended: a
        continued thread is woken and queued, and that wait belongs to the stop."""
        ends: dict[int, set[int]] = {}
        for tid, _, b in self.intervals.get("stopped", []):
            ends.setdefault(tid, set()).add(b // slack_ns)
        return [(tid, a, b) for tid, a, b in self.intervals.get("runq", [])
                if not ({a // slack_ns, a // slack_ns - 1} & ends.get(tid, set()))]


ATTACHED = "tailgate-diagnose: attached"  # diagnose.bt's BEGIN line: every probe attached


def _behind(parts: list[str]) -> Behind:
    tid, tgid, cpu = (int(x) for x in parts[:3])
    if tid < 0 or tgid < 0 or cpu < 0:
        raise ValueError(parts)
    return Behind(tid, tgid, cpu, " ".join(parts[3:]))


def parse_events(chunks: list[str]) -> Events:
    """The probe's printf lines (pure). A line that is not an event is counted, not fatal."""
    ev = Events()
    for chunk in chunks:
        for line in chunk.splitlines():
            parts = line.split()
            try:
                kind = parts[0] if parts else ""
                if kind == "R" and len(parts) in (5, *range(9, 16)):
                    tid, a, b = (int(x) for x in parts[1:4])
                    if b < a or a <= 0 or parts[4] not in ("0", "1"):
                        raise ValueError(line)
                    ev.intervals.setdefault("runq", []).append((tid, a, b))
                    if parts[4] == "1":
                        ev.preempted.add((tid, a))
                    if len(parts) > 5:
                        ev.behind[(tid, a)] = _behind(parts[5:])
                elif kind in KINDS and len(parts) == 4:
                    tid, a, b = (int(x) for x in parts[1:4])
                    if b < a or a <= 0:
                        raise ValueError(line)
                    ev.intervals.setdefault(KINDS[kind], []).append((tid, a, b))
                elif kind == "r" and len(parts) >= 9:
                    tid, a, b = (int(x) for x in parts[1:4])
                    if b < a or a <= 0 or parts[4] not in ("0", "1"):
                        raise ValueError(line)
                    ev.waker_waits.append(WakerWait("runq", tid, a, b, -1, parts[4] == "1",
                                                    _behind(parts[5:])))
                elif kind == "s" and len(parts) == 4:
                    tid, a, b = (int(x) for x in parts[1:4])
                    if b < a or a <= 0:
                        raise ValueError(line)
                    ev.waker_waits.append(WakerWait("stopped", tid, a, b))
                elif kind == "o" and len(parts) == 5:
                    tid, a, b, nr = (int(x) for x in parts[1:])
                    if b < a or a <= 0 or nr < -1:
                        raise ValueError(line)
                    ev.waker_waits.append(WakerWait("offcpu", tid, a, b, nr))
                elif kind == "W" and len(parts) >= 7:
                    wakee, t, tid, tgid, cpu, ctx = (int(x) for x in parts[1:7])
                    if t <= 0 or not 0 <= ctx < len(CONTEXTS) or cpu < 0:
                        raise ValueError(line)
                    ev.wakes.append(Wake(wakee, t, tid, tgid, cpu, CONTEXTS[ctx],
                                         " ".join(parts[7:])))
                elif kind == "N" and len(parts) >= 5:
                    tid, tgid, depth, t = (int(x) for x in parts[1:5])
                    if t <= 0 or not 1 <= depth <= 3:
                        raise ValueError(line)
                    old = ev.tasks.get(tid)
                    # a waker found later at a smaller depth keeps its first sight
                    ev.tasks[tid] = Task(tid, tgid, depth, old.since if old else t,
                                         " ".join(parts[5:]))
                elif kind == "C" and len(parts) == 5:
                    tid, t, sport, dport = (int(x) for x in parts[1:])
                    if t <= 0 or not (0 < sport < 65536 and 0 < dport < 65536):
                        raise ValueError(line)
                    ev.reads.append((tid, t, sport, dport))
                elif kind == "Q" and len(parts) == 5:
                    vec, cpu, a, b = (int(x) for x in parts[1:])
                    if b < a or a <= 0 or not 0 <= vec < len(SOFTIRQS):
                        raise ValueError(line)
                    ev.softirqs.append((vec, cpu, a, b))
                elif kind == "O" and len(parts) == 5:
                    tid, a, b, nr = (int(x) for x in parts[1:])
                    if b < a or a <= 0 or nr < -1:
                        raise ValueError(line)
                    ev.offcpu.append((tid, a, b, nr))
                elif kind == "X" and len(parts) == 3:
                    tid, t = int(parts[1]), int(parts[2])
                    if t <= 0:
                        raise ValueError(line)
                    ev.exits[tid] = t
                elif kind == "T" and len(parts) == 4:
                    t, sport, dport = (int(x) for x in parts[1:])
                    ev.retransmits.append((t, sport, dport))
                elif parts and line.strip() != ATTACHED:
                    raise ValueError(line)
            except ValueError:
                ev.malformed += 1
    return ev


def idle_priority() -> None:
    """Put the calling thread below the generator (:func:`tailgate.sched.background`): a poll
    must never make the load generator late on a CPU they share. Each poll is stamped when it
    reads, so a poll that waited is placed where it read."""
    from ..sched import background

    background()


@dataclass
class ProbeMaps:
    """The probe's maps: context switches per target thread and per 20 ms bin, softirq time
    per vector, CPU and 20 ms bin."""

    switches: dict[int, dict[str, int]] = field(default_factory=dict)  # tid -> vol/invol
    switch_bins: dict[str, dict[int, int]] = field(default_factory=dict)  # kind -> bin -> n
    softirq_bins: dict[tuple[str, int], dict[int, int]] = field(default_factory=dict)  # ns
    open_waits: dict[int, tuple[int, int]] = field(default_factory=dict)  # tid -> since, nr
    first_seen: dict[int, int] = field(default_factory=dict)  # tid -> its first switch out

    def switch_totals(self) -> dict[str, int]:
        return {k: sum(t.get(k, 0) for t in self.switches.values())
                for k in ("voluntary", "involuntary")}


def parse_maps(output: BpftraceOutput) -> ProbeMaps:
    """The probe's maps (pure). Keys are integers joined by commas (bpftrace -f json)."""
    pm = ProbeMaps()
    kind = {0: "voluntary", 1: "involuntary"}
    for key, n in output.map("@sw").items():
        tid, invol = (int(x) for x in key.split(","))
        pm.switches.setdefault(tid, {"voluntary": 0, "involuntary": 0})[kind[invol]] += int(n)
    for key, n in output.map("@swbin").items():
        invol, b = (int(x) for x in key.split(","))
        pm.switch_bins.setdefault(kind[invol], {})[b] = int(n)
    for key, ns in output.map("@sirq").items():
        vec, cpu, b = (int(x) for x in key.split(","))
        name = SOFTIRQS[vec] if 0 <= vec < len(SOFTIRQS) else f"vec{vec}"
        pm.softirq_bins.setdefault((name, cpu), {})[b] = int(ns)
    nrs = output.map("@osc")
    for tid, since in output.map("@oc").items():
        pm.open_waits[int(tid)] = (int(since), int(nrs.get(tid, 0)) - 1)
    pm.first_seen = {int(tid): int(t) for tid, t in output.map("@seen").items()}
    return pm


@dataclass
class CounterPolls:
    """cpu.stat of the target's cgroups, polled on a thread."""

    cgroups: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)  # t, n, ns
    errors: dict[str, str] = field(default_factory=dict)

    def throttle_spans(self) -> np.ndarray:
        """Throttled intervals: ``throttled_time`` grows by d between two polls ending at t, so
        the cgroup was throttled for [t - d, t] (within one poll period). d may be longer
        than the poll's gap: the kernel adds a throttle's whole length when it ends. (It
        also sums the CPUs throttled at once, which only the per-CPU rq could tell apart.)"""
        spans = []
        for rows in self.cgroups.values():
            for (_, _, ns0), (t1, _, ns1) in zip(rows, rows[1:], strict=False):
                if ns1 > ns0:
                    spans.append((t1 - (ns1 - ns0), t1))
        return np.array(sorted(spans), dtype=np.int64).reshape(-1, 2)


class Poller:
    """Poll small counter files every ``period_s`` until stopped (bounded by ``limit_s``)."""

    def __init__(self, host: Host, cgroups: list[str], period_s: float = 0.005,
                 limit_s: float = 3600.0) -> None:
        self.host, self.cgroups = host, cgroups
        self.period_s, self.limit_s = period_s, limit_s
        self.polls = CounterPolls()
        self.cpu_s = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="diagnose-poll", daemon=True)

    def _run(self) -> None:
        idle_priority()
        end = time.monotonic() + self.limit_s
        while not self.stop.is_set() and time.monotonic() < end:
            now = time.monotonic_ns()
            for path in self.cgroups:
                try:
                    st = parse_cpu_stat(self.host.read(f"{path}/cpu.stat"))
                    ns = st.get("throttled_time", st.get("throttled_usec", 0) * 1000)  # v1 | v2
                    self.polls.cgroups.setdefault(path, []).append(
                        (now, int(st.get("nr_throttled", 0)), int(ns)))
                except (SourceError, ValueError) as exc:
                    self.polls.errors.setdefault(path, str(exc))
            self.cpu_s = time.thread_time()  # this thread's own CPU: part of the overhead
            self.stop.wait(self.period_s)

    def __enter__(self) -> Poller:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)


def chain_pids(ev: Events) -> set[int]:
    """The processes the chain of blame names (wakers, tasks run-queue waits were behind)."""
    out = {t.tgid for t in ev.tasks.values()} | {w.tgid for w in ev.wakes}
    out |= {b.tgid for b in ev.behind.values()}
    out |= {w.behind.tgid for w in ev.waker_waits if w.behind is not None}
    out.discard(0)
    return out


def task_cgroups(host: Host, pids: set[int]) -> dict[int, str]:
    """Each live process's cgroup (its v1 ``cpu`` controller's, else its v2 one's), as
    ``/proc/PID/cgroup`` names it; a process gone since is left out (named without one)."""
    from ..sources.cgroup import parse_proc_cgroup

    out: dict[int, str] = {}
    for pid in sorted(pids):
        try:
            groups = parse_proc_cgroup(host.read(f"/proc/{pid}/cgroup"))
        except SourceError:
            continue
        path = groups.get("cpu", groups.get(""))
        if path is not None:
            out[pid] = path
    return out
