"""The chain of blame (pure): which thread served each request, and, for each wait of that
thread in the request's window, what the thread it waited for was doing.

Evidence in (diagnose.bt's lines, parsed by :mod:`.evidence`), per-request chains out:

* **Who served a request.** The probe prints each TCP read on a connection of the service's
  port, with the reading thread, on both sides: the client's read of a reply names the
  connection (its port) a request used — the last client read before the request's end is
  its own, the generator stamping each end right after its read — and the service's reads
  on that connection inside the request's window name the thread(s) that served it. A
  request none of this places is served by one of the threads that read the port at all
  (the serving pool), never by a thread that read nothing.
* **Whom it waited for.** A wait that ended in a wake-up was ended by its waker
  (``sched_waking``, in the waker's context); what the waker did between the wait's start
  and the wake-up (its own longest wait there, or its time on CPU) is the next link; a
  run-queue wait ends behind the task its thread got the CPU from. Waiters woken one by one
  through a lock (a convoy: each woken by the waiter before it) are one link. At most
  :data:`DEPTH` links; a chain that goes on is marked cut, and so is one whose waker was not
  yet tracked when the wait began (what it did then is not known).
* **Evidence belongs to the request it delayed.** :func:`owned` keeps, per request, only the
  waits of the threads that served it and, inside the window the request waited for them,
  of the service's threads in its chains: a thread
  that slept through the run beside the work (an idle worker, one parked on a futex for the
  whole run) is nobody's cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..spans import merge_spans, overlap_ns, subtract_spans
from .accounting import syscall_class
from .attribution import Attribution, Owned
from .engine import HELD, PREFILL, QUEUE, Windows
from .evidence import Behind, Events, Task, Wake

DEPTH = 3  # links per chain (the probe tracks wakers to the same depth)
MIN_LINK_NS = 200_000  # the probe's threshold: shorter waits are not printed
CONVOY_MAX = 32  # waiters woken one by one through a lock, followed to its holder
WAKE_SLACK_NS = 50_000  # sched_waking precedes the wake-up the wait ends at
WAITS_FOR_WORK = ("futex", "read", "write", "poll", "sleep", "blocked_other")
ENGINE_LINKS = ("engine_queue", "engine_held", "engine_prefill", "engine_decode",
                "engine")  # through_engine

# syscall names of the waits a sentence names (x86_64)
SYSCALLS = {0: "read", 1: "write", 7: "poll", 17: "pread64", 19: "readv", 23: "select",
            34: "pause", 35: "nanosleep", 43: "accept", 45: "recvfrom", 47: "recvmsg",
            61: "wait4", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
            270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
            295: "preadv", 441: "epoll_pwait2", 449: "futex_waitv"}

WHAT = {
    "runq": "runnable but not running", "stopped": "stopped (SIGSTOP or ptrace)",
    "throttled": "runnable but throttled (its cgroup's CPU quota spent)",
    "futex": "futex wait", "read": "blocked in a read", "write": "blocked in a write",
    "poll": "waiting for an event", "sleep": "asleep", "blocked_other": "blocked",
    "on_cpu": "on CPU", "timer": "a timer", "softirq": "a softirq", "irq": "an interrupt",
    "unknown": "not tracked before it woke it",
    # the engine's phase of the request (its own record, diagnose.engine), where the serving
    # thread waited for the engine's thread (through_engine)
    "engine_queue": "holding it in the engine's queue (no free slot)",
    "engine_held": "idle, the request not yet handed to it (the server reading, parsing or "
                   "tokenizing it)",
    "engine_prefill": "computing its prompt (the engine's prefill)",
    "engine_decode": "decoding its tokens (the engine's decode)",
    "engine": "working, its phase unknown (the engine's record of the request not placed)",
}

REMEDY = {
    "runq": "Give the thread at the end of the chain a CPU of its own: move the task it "
            "queued behind elsewhere (cpuset, taskset) or raise the thread's priority; a "
            "lock holder preempted holds up every waiter.",
    "throttled": "The chain ends in CFS throttling of the service's cgroup: raise or remove "
                 "its CPU quota (cpu.cfs_quota_us / cpu.max) for latency-critical work.",
    "stopped": "Find what stops the thread at the end of the chain (a debugger, a profiler, "
               "a freezer, a supervisor's SIGSTOP) and keep it off the serving path.",
    "futex": "Shorten or split the lock the chain ends on, or take the slow work out of its "
             "critical section.",
    "read": "The chain ends in a blocking read: make it asynchronous or take it off the "
            "serving path (a slow device, a pipe or socket whose writer is late).",
    "write": "The chain ends in a blocking write: make it asynchronous or take it off the "
             "serving path (a full pipe or socket, a slow device).",
    "poll": "The chain ends in a thread waiting for an event: find what delivers it late.",
    "sleep": "A thread the request waits for sleeps: never sleep on the serving path or "
             "while holding what others wait for.",
    "blocked_other": "The chain ends in a thread blocked outside the usual syscalls (a page "
                     "fault, another syscall): profile it (--profile) to see where.",
    "on_cpu": "The thread the request waited for was running all along: its own work is "
              "slow (profile it: --profile).",
    "timer": "The chain ends in a timer: the wait was as long as a timeout or a sleep asked "
             "for; shorten it.",
    "softirq": "The chain ends in a softirq (a packet's or a block I/O's arrival): the delay "
               "is before it, in the network or the device.",
    "irq": "The chain ends in a hardware interrupt: the delay is in the device.",
    "unknown": "The waker was not tracked before it woke the thread: run longer so that it "
               "is (the probe tracks a waker from its first wake-up on).",
    "engine_queue": QUEUE.remedy,
    "engine_held": HELD.remedy,
    "engine_prefill": PREFILL.remedy,
    "engine_decode": "The request waited for its own decode: cap its output (max_tokens) or "
                     "make each step faster (a smaller model or batch).",
    "engine": "The request waited for the engine, whose record of it could not be placed on "
              "tailgate's clock (see engine.join): its phase is unknown.",
}


@dataclass(frozen=True)
class Wait:
    """One wait of a tracked task (ns, CLOCK_MONOTONIC)."""

    tid: int
    kind: str  # runq | stopped | futex | read | write | poll | sleep | blocked_other
    a: int
    b: int
    nr: int = -1  # off-CPU: the syscall it blocked in
    behind: Behind | None = None  # runq: the task it got the CPU from


@dataclass(frozen=True)
class Link:
    depth: int
    kind: str  # a WAIT kind, on_cpu, timer, softirq, irq or unknown
    tid: int
    tgid: int
    comm: str
    a: int  # the link's time inside its window
    b: int
    nr: int = -1
    behind: Behind | None = None
    convoy: int = 0  # waiters woken one by one through it before this thread (a lock)
    cpu: int | None = None  # where an interrupt ran
    wa: int = 0  # the window the task was looked at in: from the wait before it began (or
    wb: int = 0  # the request was sent) to the wake-up that ended that wait
    via: int = 0  # an engine phase's link: the serving thread that woke the wait, not the engine

    @property
    def ms(self) -> float:
        return (self.b - self.a) / 1e6


@dataclass(frozen=True)
class Chain:
    request: int
    links: tuple[Link, ...]
    cut: str | None = None  # why the chain stops short of its cause: depth | untracked

    @property
    def signature(self) -> tuple[str, ...]:
        return tuple(lk.kind for lk in self.links)


@dataclass
class Tracks:
    """Every tracked task's waits and wake-ups, indexed for the walk."""

    waits: dict[int, list[Wait]] = field(default_factory=dict)  # tid -> sorted by start
    starts: dict[int, np.ndarray] = field(default_factory=dict)
    # the latest end of a task's waits up to each one (sorted by start, so nondecreasing):
    # the waits before the first that reaches past ``a`` all ended by ``a``
    reach: dict[int, np.ndarray] = field(default_factory=dict)
    wakes: dict[int, list[Wake]] = field(default_factory=dict)  # wakee -> sorted by time
    wake_t: dict[int, np.ndarray] = field(default_factory=dict)
    tasks: dict[int, Task] = field(default_factory=dict)
    service: set[int] = field(default_factory=set)  # the service's threads

    @classmethod
    def of(cls, ev: Events, service: set[int], throttled: np.ndarray | None = None) -> Tracks:
        """``throttled``: the service's cgroup's throttled periods; a service thread's
        run-queue wait mostly inside them was throttling (its cgroup's quota was spent), not
        a task ahead of it."""
        tr = cls(tasks=dict(ev.tasks), service=set(service))
        rows: dict[int, list[Wait]] = {}
        thr = (merge_spans(np.asarray(throttled, np.int64).reshape(-1, 2))
               if throttled is not None else np.zeros((0, 2), np.int64))
        for tid, a, b in ev.runq_not_after_stop():
            kind = "runq"
            if len(thr) and tid in service:
                inside = overlap_ns(np.array([a]), np.array([b]), thr)[0]
                kind = "throttled" if 2 * inside >= b - a else "runq"
            rows.setdefault(tid, []).append(Wait(tid, kind, a, b, -1, ev.behind.get((tid, a))))
        for tid, a, b in ev.intervals.get("stopped", []):
            rows.setdefault(tid, []).append(Wait(tid, "stopped", a, b))
        for tid, a, b, nr in ev.offcpu:
            rows.setdefault(tid, []).append(Wait(tid, syscall_class(nr), a, b, nr))
        for w in ev.waker_waits:
            kind = (w.kind if w.kind != "offcpu" else syscall_class(w.nr))
            rows.setdefault(w.tid, []).append(Wait(w.tid, kind, w.a, w.b, w.nr, w.behind))
        for tid, ws in rows.items():
            ws.sort(key=lambda w: w.a)
            tr.waits[tid] = ws
            tr.starts[tid] = np.array([w.a for w in ws], dtype=np.int64)
            tr.reach[tid] = np.maximum.accumulate(np.array([w.b for w in ws], dtype=np.int64))
        for wk in ev.wakes:
            tr.wakes.setdefault(wk.wakee, []).append(wk)
        for tid, ws in tr.wakes.items():
            ws.sort(key=lambda w: w.t)
            tr.wake_t[tid] = np.array([w.t for w in ws], dtype=np.int64)
        return tr

    def overlapping(self, tid: int, a: int, b: int) -> list[Wait]:
        """The task's waits that overlap ``[a, b]``."""
        ws = self.waits.get(tid)
        if not ws:
            return []
        # both ends bisected, not scanned: a busy thread has ~10^5 waits, and each link of
        # each chain asks (scanning from the first wait was 77 % of a 5-minute diagnose)
        hi = int(np.searchsorted(self.starts[tid], b, side="right"))
        lo = int(np.searchsorted(self.reach[tid], a, side="right"))
        return [w for w in ws[lo:hi] if w.b > a]

    def waker(self, w: Wait) -> Wake | None:
        """The wake-up that ended ``w`` (the last one inside it)."""
        ts = self.wake_t.get(w.tid)
        if ts is None:
            return None
        i = int(np.searchsorted(ts, w.b + WAKE_SLACK_NS, side="right")) - 1
        if i < 0 or ts[i] < w.a:
            return None
        return self.wakes[w.tid][i]

    def tgid(self, tid: int) -> int:
        t = self.tasks.get(tid)
        return t.tgid if t else 0

    def comm(self, tid: int) -> str:
        t = self.tasks.get(tid)
        return t.comm if t else ""


# -- who served each request --------------------------------------------------------------

@dataclass(frozen=True)
class Serving:
    """Per request, the service's threads that read it (empty: not placed; see ``pool``)."""

    threads: list[tuple[int, ...]]
    pool: tuple[int, ...]  # every service thread that read the port at all
    placed: int  # requests whose own connection's reads named their thread

    def of(self, i: int) -> tuple[int, ...]:
        return self.threads[i] or self.pool


def serving(reads: list[tuple[int, int, int, int]], port: int | None, service: set[int],
            d: np.ndarray, ends: np.ndarray) -> Serving:
    """Which service threads read each request ``[d[i], ends[i]]`` (dispatch to end, ns),
    from the probe's reads on the service's ``port`` (``(tid, t, sport, dport)``)."""
    n = len(d)
    if port is None:
        return Serving([()] * n, (), 0)
    client = sorted((t, sport) for tid, t, sport, dport in reads if dport == port)
    mine: dict[int, list[tuple[int, int]]] = {}  # connection (client port) -> (t, tid)
    for tid, t, sport, dport in reads:
        if sport == port and tid in service:
            mine.setdefault(dport, []).append((t, tid))
    pool = tuple(sorted({tid for rows in mine.values() for _, tid in rows}))
    ct = np.array([t for t, _ in client], dtype=np.int64)
    cport = [p for _, p in client]
    conn_t = {c: np.array(sorted(t for t, _ in rows), dtype=np.int64) for c, rows in mine.items()}
    conn_tid = {c: [tid for _, tid in sorted(rows)] for c, rows in mine.items()}
    out: list[tuple[int, ...]] = []
    placed = 0
    last = np.searchsorted(ct, ends, side="right") - 1
    for i in range(n):
        j = int(last[i])
        if j < 0 or ct[j] < d[i] or cport[j] not in conn_t:
            out.append(())
            continue
        c = cport[j]
        # the service's side prints a line when a connection's reader changes: the reader
        # in effect when the request was sent, and any that took over before its reply
        lo, hi = np.searchsorted(conn_t[c], [d[i], ct[j]], side="right")
        tids = tuple(sorted(set(conn_tid[c][max(lo - 1, 0):hi])))
        out.append(tids)
        placed += bool(tids)
    return Serving(out, pool, placed)


# -- the walk -----------------------------------------------------------------------------

def _link(tr: Tracks, w: Wait, depth: int, a: int, b: int, convoy: int = 0) -> Link:
    return Link(depth, w.kind, w.tid, tr.tgid(w.tid), tr.comm(w.tid), max(a, w.a), min(b, w.b),
                w.nr, w.behind, convoy, None, a, b)


def _follow(tr: Tracks, first: Wait, a: int, b: int, request: int) -> Chain:
    """The chain from ``first`` (a wait of a serving thread, counted inside ``[a, b]``)."""
    links = [_link(tr, first, 1, a, b)]
    w, lo = first, max(a, first.a)
    convoy = 0
    while True:
        if w.kind in ("runq", "throttled"):  # ends when it gets the CPU: the chain's end
            return Chain(request, tuple(links))
        wake = tr.waker(w)
        if wake is None:
            return Chain(request, tuple(links), None if w.kind == "stopped" else "no wake-up")
        depth = links[-1].depth + 1
        if wake.ctx != "task" or wake.tid == 0:
            kind = wake.ctx if wake.ctx != "task" else "irq"
            if depth > DEPTH:
                return Chain(request, tuple(links), "depth")
            links.append(Link(depth, kind, wake.tid, wake.tgid, wake.comm, wake.t, wake.t,
                              cpu=wake.cpu))
            return Chain(request, tuple(links))
        hi = wake.t
        task = tr.tasks.get(wake.tid)
        if task is None or task.since > lo:
            if depth > DEPTH:
                return Chain(request, tuple(links), "depth")
            links.append(Link(depth, "unknown", wake.tid, wake.tgid, wake.comm, lo, hi,
                              wa=lo, wb=hi))
            return Chain(request, tuple(links), "untracked")
        theirs = [x for x in tr.overlapping(wake.tid, lo, hi)
                  if min(hi, x.b) - max(lo, x.a) >= MIN_LINK_NS]
        if not theirs:  # it ran (or waited less than the threshold) until it woke ours
            if depth > DEPTH:
                return Chain(request, tuple(links), "depth")
            links.append(Link(depth, "on_cpu", wake.tid, wake.tgid, wake.comm, lo, hi,
                              wa=lo, wb=hi))
            return Chain(request, tuple(links))
        nxt = max(theirs, key=lambda x: min(hi, x.b) - max(lo, x.a))
        same_lock = (nxt.kind == "futex" == links[-1].kind and wake.tgid == links[-1].tgid
                     and convoy < CONVOY_MAX)
        if same_lock:  # another waiter of the same lock, woken before ours: follow it
            convoy += 1
            last = links[-1]
            links[-1] = Link(last.depth, last.kind, last.tid, last.tgid, last.comm, last.a,
                             last.b, last.nr, last.behind, convoy, None, last.wa, last.wb)
            w, lo = nxt, max(lo, nxt.a)
            continue
        if depth > DEPTH:
            return Chain(request, tuple(links), "depth")
        links.append(_link(tr, nxt, depth, lo, hi))
        w, lo, convoy = nxt, max(lo, nxt.a), 0


def chains(tr: Tracks, serve: Serving, d: np.ndarray, ends: np.ndarray,
           which: np.ndarray | None = None) -> list[list[Chain]]:
    """Per request (those of ``which``, a boolean mask; all by default), one chain for each
    wait of its serving threads inside its window ``[d, end]`` lasting the probe's threshold
    or more. A wait for work begun before the request was sent (the thread waited for it to
    arrive), or begun inside the window and lasting past it (the thread was done), is none."""
    out: list[list[Chain]] = []
    for i in range(len(d)):
        if which is not None and not which[i]:
            out.append([])
            continue
        a, b = int(d[i]), int(ends[i])
        found = []
        for tid in serve.of(i):
            for w in tr.overlapping(tid, a, b):
                if w.kind in WAITS_FOR_WORK and (w.a < a or w.b > b):
                    continue
                if min(b, w.b) - max(a, w.a) < MIN_LINK_NS:
                    continue
                found.append(_follow(tr, w, a, b, i))
        out.append(found)
    return out


# -- ownership: evidence for the requests it delayed --------------------------------------

@dataclass(frozen=True)
class Scope:
    """Whose evidence counts for one request: its serving threads' over its whole window, and
    each service thread of its chains' only inside the window it was waited for in."""

    serving: tuple[int, ...]
    clips: tuple[tuple[int, int, int], ...] = ()  # (tid, a, b)


def scopes(serve: Serving, per_request: list[list[Chain]], service: set[int]) -> list[Scope]:
    out = []
    for i, cs in enumerate(per_request):
        mine = serve.of(i)
        clips = {(lk.tid, lk.wa, lk.wb) for c in cs for lk in c.links[1:]
                 if lk.tid in service and lk.tid not in mine and lk.wb > lk.wa}
        out.append(Scope(mine, tuple(sorted(clips))))
    return out


def owned(starts: np.ndarray, ends: np.ndarray, scope: list[Scope],
          spans_by_tid: dict[int, np.ndarray],
          inner: tuple[np.ndarray, np.ndarray] | None = None) -> Owned:
    """Per request, how the spans of one kind that belong to it (:class:`Scope`) cover its
    window ``[starts[i], ends[i]]``. Requests with no chain thread are grouped by their
    serving threads (most requests: one union per group). A serving thread's span that holds
    a request's whole window is none of that request's: the thread did nothing for it (it
    was waiting before the request began and still after it ended: a thread of the pool
    parked while others served it). ``inner``: each request's service window ``(d, e)``
    (:func:`windows`) for waits for work (futex), of which a serving thread's count only
    those inside it, as :func:`chains` takes them: one begun before the request was sent
    waited for it to arrive (an idle thread's wait for a job), one lasting past its reply
    was the thread done with it. What was counted (``spans``) is clipped to the windows it
    was counted in."""
    if inner is not None:
        return _owned_inner(starts, ends, scope, spans_by_tid, *inner)
    tally = _Tally(starts, ends, spans_by_tid)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, sc in enumerate(scope):
        if not sc.clips:
            groups.setdefault(sc.serving, []).append(i)
            continue
        ix = np.array([i])
        rows = []
        for t in sc.serving:
            sp = spans_by_tid.get(t, tally.none)
            if len(sp) and not _covering(sp, starts[ix], ends[ix])[0]:
                rows.append(sp)
                tally.threads.add(t)
        tally.one(i, rows, sc.clips)
    for tids, idx in list(groups.items()):
        ix = np.array(idx)
        # (requests a thread's span holds whole: regrouped without that thread)
        cov = {t: _covering(spans_by_tid[t], starts[ix], ends[ix]) for t in tids
               if len(spans_by_tid.get(t, tally.none))}
        sub: dict[tuple[int, ...], list[int]] = {}
        for k, i in enumerate(idx):
            sub.setdefault(tuple(t for t, c in cov.items() if not c[k]), []).append(i)
        for mine, sidx in sub.items():
            if not mine:
                continue
            tally.threads.update(mine)
            tally.add(np.array(sidx), merge_spans(np.concatenate([spans_by_tid[t] for t in mine])))
    return tally.owned()


def _owned_inner(starts: np.ndarray, ends: np.ndarray, scope: list[Scope],
                 spans_by_tid: dict[int, np.ndarray], d: np.ndarray, e: np.ndarray) -> Owned:
    """:func:`owned` for waits for work: per request, its serving threads' spans inside its
    service window ``[d, e]`` and its chain threads' clipped as ever."""
    tally = _Tally(starts, ends, spans_by_tid)
    d, e = np.asarray(d, np.int64), np.asarray(e, np.int64)
    # (a thread's spans are sorted and disjoint: those inside a window are a run of them)
    serving = {t for sc in scope for t in sc.serving}
    bounds = {t: (np.searchsorted(sp[:, 0], d, side="left"),
                  np.searchsorted(sp[:, 1], e, side="right"))
              for t, sp in spans_by_tid.items() if t in serving}
    for i, sc in enumerate(scope):
        rows = []
        for t in sc.serving:
            if t in bounds:
                lo, hi = int(bounds[t][0][i]), int(bounds[t][1][i])
                if hi > lo:
                    rows.append(spans_by_tid[t][lo:hi])
                    tally.threads.add(t)
        tally.one(i, rows, sc.clips)
    return tally.owned()


class _Tally:
    """What :func:`owned` counts, however a request's serving threads' spans were bounded:
    per request whether its spans touch its window and how long they lie inside it, the
    spans counted (clipped to the windows they were counted in), the threads that had any."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray,
                 spans_by_tid: dict[int, np.ndarray]) -> None:
        self.starts, self.ends, self.spans_by_tid = starts, ends, spans_by_tid
        self.hit = np.zeros(len(starts), dtype=bool)
        self.inside = np.zeros(len(starts), dtype=np.int64)
        self.none = np.zeros((0, 2), np.int64)
        self.counted: list[np.ndarray] = []
        self.threads: set[int] = set()

    def add(self, ix: np.ndarray, m: np.ndarray) -> None:
        """Requests ``ix`` own the merged spans ``m``."""
        self.inside[ix] = overlap_ns(self.starts[ix], self.ends[ix], m)
        # an instant or a span touching the window's edge covers it too (as spans.touched())
        self.hit[ix] = _touches(self.starts[ix], self.ends[ix], m)
        self.counted.append(_within(m, self.starts[ix], self.ends[ix]))

    def one(self, i: int, rows: list[np.ndarray],
            clips: tuple[tuple[int, int, int], ...]) -> None:
        """Request ``i``: its serving threads' spans (``rows``, already bounded) and each
        chain thread's clipped to where it was waited for (``clips``), merged."""
        for t, a, b in clips:
            sp = self.spans_by_tid.get(t, self.none)
            sp = np.clip(sp[(sp[:, 1] >= a) & (sp[:, 0] <= b)], a, b)
            rows.append(sp)
            self.threads.update([t] if len(sp) else [])
        m = merge_spans(np.concatenate(rows)) if rows else self.none
        if len(m):
            self.add(np.array([i]), m)

    def owned(self) -> Owned:
        spans = merge_spans(np.concatenate(self.counted)) if self.counted else self.none
        return Owned(self.hit, self.inside, spans, threads=len(self.threads))


def _covering(sp: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per window, whether one of ``sp`` (merged spans) holds it whole."""
    j = np.searchsorted(sp[:, 0], starts, side="right") - 1
    ok = j >= 0
    out = np.zeros(len(starts), dtype=bool)
    out[ok] = sp[j[ok], 1] >= ends[ok]
    return out


def _within(m: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``m`` (merged spans) clipped to the union of the windows (an instant in one kept)."""

    w = merge_spans(np.stack([starts, ends], axis=1).astype(np.int64))
    inst = m[(m[:, 0] == m[:, 1]) & _touches(m[:, 0], m[:, 1], w)]
    out = subtract_spans(m, subtract_spans(m, w))
    return merge_spans(np.concatenate([out, inst])) if len(inst) else out


def _touches(starts: np.ndarray, ends: np.ndarray, m: np.ndarray) -> np.ndarray:
    idx = np.searchsorted(m[:, 0], ends, side="right") - 1
    ok = idx >= 0
    out = np.zeros(len(starts), dtype=bool)
    out[ok] = m[idx[ok], 1] >= starts[ok]
    return out


def spans_by_tid(rows: list[tuple[int, int, int]]) -> dict[int, np.ndarray]:
    """``(tid, a, b)`` rows grouped into merged spans per thread."""
    by: dict[int, list[tuple[int, int]]] = {}
    for tid, a, b in rows:
        by.setdefault(tid, []).append((a, b))
    return {t: merge_spans(np.array(v, dtype=np.int64)) for t, v in by.items()}


# -- what the chains say ------------------------------------------------------------------

def link_json(lk: Link, cgroups: dict[int, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"depth": lk.depth, "kind": lk.kind, "tid": lk.tid, "pid": lk.tgid,
                           "comm": lk.comm, "cgroup": cgroups.get(lk.tgid),
                           "start_ns": lk.a, "end_ns": lk.b, "ms": round(lk.ms, 3)}
    if lk.nr >= 0:
        out["syscall"] = SYSCALLS.get(lk.nr, f"syscall {lk.nr}")
    if lk.behind is not None:
        out["behind"] = {"tid": lk.behind.tid, "pid": lk.behind.tgid, "comm": lk.behind.comm,
                         "cpu": lk.behind.cpu, "cgroup": cgroups.get(lk.behind.tgid)}
    if lk.convoy:
        out["convoy"] = lk.convoy
    if lk.cpu is not None:
        out["cpu"] = lk.cpu
    if lk.via:
        out["woken_by"] = lk.via
    return out


def _task(lk: Link, cgroups: dict[int, str], service_pids: set[int]) -> str:
    if lk.tgid in service_pids:
        return f"`{lk.comm}` (tid {lk.tid})"
    cg = cgroups.get(lk.tgid)
    return (f"`{lk.comm}` (pid {lk.tgid}, tid {lk.tid}" + (f", cgroup {cg}" if cg else "")
            + "; not a process of the service)")


def describe(c: Chain, cgroups: dict[int, str], service_pids: set[int],
             tail_share: float | None = None) -> str:
    """The chain in words: "futex wait 11.8 ms (92 % of the tail's latency) of `handler` (tid
    4100) <- its waker `worker-3` (tid 4102) runnable but not running for 11.1 ms behind
    `batch-job` (pid 881, cgroup /batch) on CPU 1"."""
    words = []
    for k, lk in enumerate(c.links):
        name = SYSCALLS.get(lk.nr, f"syscall {lk.nr}")
        syscall = f" ({name})" if lk.nr >= 0 and lk.kind != "futex" and name != lk.kind else ""
        if k == 0:
            s = f"{WHAT[lk.kind]}{syscall} {lk.ms:.1f} ms"
            if tail_share is not None:
                s += f" ({100 * tail_share:.0f} % of the tail's latency)"
            s += f" of `{lk.comm}` (tid {lk.tid})"
            if lk.convoy:
                s += f", woken through {lk.convoy} other waiter{'s' * (lk.convoy > 1)}"
        elif lk.kind in ("timer", "softirq", "irq"):
            s = f"woken from {WHAT[lk.kind]} on CPU {lk.cpu} (it ran on top of `{lk.comm}`)"
        elif lk.kind == "unknown":
            s = f"woken by {_task(lk, cgroups, service_pids)}, not tracked before (cut)"
        elif lk.via:
            s = (f"its engine {_task(lk, cgroups, service_pids)} {WHAT[lk.kind]} for "
                 f"{lk.ms:.1f} ms (the wait was ended by tid {lk.via}, another serving thread: "
                 "a wake-up for another request's result)")
        else:
            # a futex's waker: the lock's holder, or the thread that signals a condition
            s = f"its waker {_task(lk, cgroups, service_pids)} {WHAT[lk.kind]}{syscall} for {lk.ms:.1f} ms"
        if lk.behind is not None:
            b = lk.behind
            if b.tid == 0:
                s += f" on CPU {b.cpu} (it was idle: the wake-up's own latency)"
            else:
                cg = cgroups.get(b.tgid)
                s += (f" behind `{b.comm}` (pid {b.tgid}" + (f", cgroup {cg}" if cg else "")
                      + f") on CPU {b.cpu}")
        words.append(s)
    text = " <- ".join(words)
    if c.cut == "depth":
        text += f" <- ... (cut: the chain goes on past {DEPTH} links)"
    elif c.cut == "no wake-up":
        text += " <- (cut: the wake-up that ended it was not recorded)"
    return text


def remedy(c: Chain) -> str:
    """The remedy follows the last link."""
    return REMEDY[c.links[-1].kind]


# -- the whole: built once per run, used by attribution and by the report --------------------

LAYER = {"runq": "L2", "throttled": "L2", "stopped": "L2", "read": "L2", "write": "L2", "timer": "L2",
         "softirq": "L2", "irq": "L2", "futex": "L3", "poll": "L3", "sleep": "L3",
         "blocked_other": "L2", "on_cpu": "L3", "unknown": "L3", "engine_queue": "L4",
         "engine_held": HELD.layer, "engine_prefill": "L4", "engine_decode": "L4", "engine": "L4"}
BAND_REQUESTS = 20  # the slowest requests drawn as bands on the timeline


@dataclass
class Blame:
    """Who served each request, each request's chains, and whose evidence is whose."""

    tracks: Tracks
    serve: Serving
    per_request: list[list[Chain]]
    scope: list[Scope]  # per request: whose evidence counts for it
    service: set[int]
    note: str | None = None
    d: np.ndarray | None = None  # each request's service window: dispatch (:func:`windows`)
    e: np.ndarray | None = None  # to its reply's arrival

    @classmethod
    def of(cls, ev: Events, service: set[int], port: int | None, starts: np.ndarray,
           ends: np.ndarray, sends: np.ndarray | None = None,
           throttled: np.ndarray | None = None, reads: np.ndarray | None = None) -> Blame:
        """``starts``/``ends``: each request's intended start and end (ns; the end is its
        reply's arrival in the kernel where known); ``sends``: its dispatch;
        ``throttled``: the service's cgroup's throttled periods; ``reads``: when the
        generator read each reply (None: at its end), which finds the reply's connection
        among the probe's reads (the generator reads a reply after the kernel had it)."""
        d, e = windows(starts, ends, sends)
        tr = Tracks.of(ev, service, throttled)
        serve = serving(ev.reads, port, service, d, ends if reads is None else reads)
        note = None
        if not serve.pool:
            # no read of the service's port seen (no TCP target, or passive): every thread of
            # the service may have served each request, as before the chain was recorded
            serve = Serving([()] * len(d), tuple(sorted(service)), 0)
            note = ("no read on the service's port was seen: each request's evidence is from "
                    "every thread of the service")
        per = chains(tr, serve, d, e)
        return cls(tr, serve, per, scopes(serve, per, service), service, note, d, e)

    def owned(self, starts: np.ndarray, ends: np.ndarray, rows: list[tuple[int, int, int]]
              ) -> Owned:
        return owned(starts, ends, self.scope, spans_by_tid(rows))


def through_engine(blame: Blame, win: Windows) -> list[tuple[int, int, int]]:
    """Resolve each serving thread's futex wait for the engine to the engine's phase of its
    request. An LLM server's HTTP thread hands the request to the engine's loop and waits on
    a condition variable until the engine has a token for it: that wait, ended by a thread
    of the same server that read no request (the engine's loop: the HTTP threads read them),
    lasted while the engine queued, prefilled or decoded the request, and its cause is that
    phase (the engine's own record on tailgate's clock: ``win``), not a lock. The chain's
    second link becomes the phase that overlapped the wait most, on the engine's thread (its
    own host evidence still counts for the request inside that window: the scope's clip);
    the chain stops there.

    A wait another serving thread ended is the engine's too where it lay wholly before its
    request's first token, in its queue or prefill: no result of its own could come then, so
    the thread was waiting for the engine and woke for another request's (llama-server's
    HTTP threads share one condition for every result, and each result wakes them all, a
    herd whose mutex hand-offs are peer wake-ups; seen in a one-slot run as futex claimed
    first, 12 % of the slow requests' latency beside 94 % queue wait). Its link is the
    engine's phase on the thread that woke the others in that process (``via``: the peer).

    Returns the waits resolved, ``(tid, a, b)``: no futex evidence."""
    pool = set(blame.serve.pool)
    resolved: list[tuple[int, int, int]] = []
    peers: list[tuple[int, int, Chain]] = []
    engine: dict[int, Link] = {}  # a process's engine thread: the waker of its resolved waits
    for i, cs in enumerate(blame.per_request):
        for k, c in enumerate(cs):
            if len(c.links) < 2 or c.links[0].kind != "futex":
                continue
            first, waker = c.links[0], c.links[1]
            if (waker.kind in ("timer", "softirq", "irq") or waker.tid not in blame.service
                    or waker.tgid != first.tgid):
                continue
            if waker.tid in pool:
                peers.append((i, k, c))
                continue
            phase, a, b = win.phase(i, first.a, first.b)
            kind = f"engine_{phase}" if phase else "engine"
            cs[k] = Chain(c.request, (first, Link(2, kind, waker.tid, waker.tgid, waker.comm,
                                                  a, b, wa=waker.wa, wb=waker.wb)))
            engine.setdefault(waker.tgid, waker)
            resolved.append((first.tid, first.a, first.b))
    for i, k, c in peers:
        first, peer = c.links[0], c.links[1]
        eng = engine.get(first.tgid)
        phase, a, b = win.phase(i, first.a, first.b)
        if (eng is None or phase not in ("queue", "prefill")
                or not win.sent[i] <= first.a < first.b <= win.anchor[i]):
            continue  # a lock's hand-off, or a wake-up once its own tokens could come
        blame.per_request[i][k] = Chain(c.request, (first, Link(
            2, f"engine_{phase}", eng.tid, eng.tgid, eng.comm, a, b, wa=a, wb=b, via=peer.tid)))
        resolved.append((first.tid, first.a, first.b))
    blame.scope = scopes(blame.serve, blame.per_request, blame.service)
    return resolved


def windows(starts: np.ndarray, ends: np.ndarray, sends: np.ndarray | None
            ) -> tuple[np.ndarray, np.ndarray]:
    """Each request's service window: dispatch (or intended start) to its end, as
    diagnose.accounting cuts it."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    d = starts if sends is None else np.where(sends > 0, np.clip(sends, starts, ends), starts)
    return d, ends


def judge(blame: Blame, starts: np.ndarray, ends: np.ndarray, crit: dict[str, float],
          cgroups: dict[int, str], service_pids: set[int]) -> dict[str, Any]:
    """Each chain signature (its links' kinds) judged as a cause is: claimed when it covers
    the slow requests far more than the requests at large (diagnose.attribution's rule); the
    claimed chain that lasted most of the tail's latency named, with the remedy of its last
    link, and every link of every request above the P99."""
    from .attribution import MIN_TAIL, Cause, _score

    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    lat = ends - starts
    n = len(lat)
    out: dict[str, Any] = {"depth": DEPTH, "placed": blame.serve.placed, "requests": n,
                           "serving_pool": list(blame.serve.pool), "note": blame.note,
                           "signatures": [], "slow": []}
    if n == 0:
        out["verdict"] = None
        return out
    p90, p99, p999 = (float(np.percentile(lat, q, method="inverted_cdf")) for q in (90, 99, 99.9))
    tail, tail90, tail999 = lat >= p99, lat >= p90, lat >= p999
    sigs: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, list]] = {}
    for i, cs in enumerate(blame.per_request):
        for c in cs:
            hit, inside, first = sigs.setdefault(c.signature, (np.zeros(n, bool),
                                                               np.zeros(n, np.int64), []))
            hit[i] = True
            inside[i] = min(int(lat[i]), int(inside[i]) + c.links[0].b - c.links[0].a)
            first.append((c.links[0].a, c.links[0].b))
    judged = []
    for sig, (hit, inside, first) in sigs.items():
        cause = Cause("chain:" + "<-".join(sig), LAYER.get(sig[-1], "L3"),
                      "a wait followed this chain: " + " <- ".join(WHAT[k] for k in sig),
                      REMEDY[sig[-1]])
        own = Owned(hit, inside, merge_spans(np.array(first, dtype=np.int64)))
        a = _no_pervasive_phase(sig, _score(cause, own, starts, ends, tail, tail999, "P99",
                                            p99, crit), crit)
        if not a.claimed:
            b = _no_pervasive_phase(sig, _score(cause, own, starts, ends, tail90, tail999,
                                                "P90", p90, crit), crit)
            if b.claimed:
                a = b
        judged.append((sig, a))
    judged.sort(key=lambda sa: (not sa[1].claimed, sa[1].extra.get("tail") == "P90",
                                -sa[1].time_share, -len(sa[0])))
    for sig, a in judged:
        out["signatures"].append({"links": list(sig), **a.to_json()})
    best = next(((sig, a) for sig, a in judged if a.claimed), None)
    out["verdict"] = None
    if best is not None and int(tail.sum()) >= MIN_TAIL:
        sig, a = best
        level = tail if a.extra.get("tail") == "P99" else tail90
        cands = [c for i in np.flatnonzero(level) for c in blame.per_request[i]
                 if c.signature == sig]
        rep = max(cands, key=lambda c: c.links[0].b - c.links[0].a)
        out["verdict"] = {"links": list(sig), "tail": a.extra.get("tail"),
                          "tail_time_share": round(a.time_share, 4),
                          "tail_cover": round(a.tail_cover, 4), "lift": round(a.lift, 3),
                          "request": rep.request, "cut": rep.cut,
                          "example": [link_json(lk, cgroups) for lk in rep.links],
                          "sentence": describe(rep, cgroups, service_pids, a.time_share),
                          "remedy": remedy(rep)}
    for i in np.flatnonzero(tail)[np.argsort(-lat[tail], kind="stable")]:
        out["slow"].append({"request": int(i), "latency_ms": round(float(lat[i]) / 1e6, 4),
                            "threads": list(blame.serve.of(int(i))),
                            "placed": bool(blame.serve.threads[int(i)]),
                            "chains": [{"links": [link_json(lk, cgroups) for lk in c.links],
                                        "cut": c.cut,
                                        "sentence": describe(c, cgroups, service_pids)}
                                       for c in blame.per_request[int(i)]]})
    return out


def _no_pervasive_phase(sig: tuple[str, ...], a: Attribution, crit: dict[str, float]
                        ) -> Attribution:
    """A chain ending in the engine's phase is claimed only where it covered the slow
    requests markedly more than the rest (as diagnose.engine judges the phases): every
    request of an LLM server waits for the engine's prefill and decode, and a phase every
    request has explains no tail however much of it it lasts."""
    if sig[-1] in ENGINE_LINKS and a.claimed and a.lift < crit["min_lift"]:
        a.claimed = False
    return a


def bands(blame: Blame, starts: np.ndarray, ends: np.ndarray, t0: int,
          limit: int = BAND_REQUESTS) -> list[dict[str, Any]]:
    """The chains of the ``limit`` slowest requests as timeline bands (the report's generic
    band layer: ``{"row", "start_ms", "end_ms", "kind", "label", "source", "request"}``, ms
    from ``t0``, the timeline's start): the request itself on its own row, then each link on
    the row of its task."""
    lat = np.asarray(ends, np.int64) - np.asarray(starts, np.int64)
    out: list[dict[str, Any]] = []
    for i in np.argsort(-lat, kind="stable")[:limit]:
        i = int(i)
        out.append({"row": "requests", "start_ms": round((int(starts[i]) - t0) / 1e6, 3),
                    "end_ms": round((int(ends[i]) - t0) / 1e6, 3), "kind": "request",
                    "label": f"request {i}: {lat[i] / 1e6:.2f} ms", "source": "chain",
                    "request": i})
        for c in blame.per_request[i]:
            for lk in c.links:
                row = f"{lk.comm} ({lk.tid})" if lk.tid else f"CPU {lk.cpu} {lk.kind}"
                label = f"{WHAT[lk.kind]} {lk.ms:.2f} ms"
                if lk.behind is not None and lk.behind.tid:
                    label += f" behind {lk.behind.comm} ({lk.behind.tgid})"
                out.append({"row": row, "start_ms": round((lk.a - t0) / 1e6, 3),
                            "end_ms": round((lk.b - t0) / 1e6, 3), "kind": lk.kind,
                            "label": label, "source": "chain", "request": i})
    return out


OWNED_KINDS = ("runq", "stopped", "futex")  # the per-thread causes (diagnose.causes)


def owned_causes(blame: Blame, ev: Events, starts: np.ndarray, ends: np.ndarray,
                 throttled: np.ndarray, resolved: list[tuple[int, int, int]] = ()
                 ) -> dict[str, Owned]:
    """The per-thread causes' evidence, each wait counted only for the requests of its
    thread (run-queue time inside a throttled period is throttling, as before; a futex
    call's time runnable after its wake-up is run-queue time, as diagnose.accounting has
    it: a waker that sat in the run queue is no lock wait). ``resolved``: the waits
    :func:`through_engine` resolved to the engine's phases; the futex calls they were in
    are none of the futex cause's."""

    rows = {"runq": ev.runq_not_after_stop(), "stopped": ev.intervals.get("stopped", []),
            "futex": _not_resolved(ev.intervals.get("futex", []), resolved)}
    out = {}
    runq = spans_by_tid(rows["runq"])
    for kind in OWNED_KINDS:
        by = spans_by_tid(rows[kind])
        if kind == "runq" and len(throttled):
            by = {t: subtract_spans(s, throttled) for t, s in by.items()}
        inner = None
        if kind == "futex":
            by = {t: subtract_spans(s, runq[t]) if t in runq else s for t, s in by.items()}
            if blame.d is not None and blame.e is not None:
                inner = (blame.d, blame.e)  # a wait for work: only inside the request
        out[kind] = owned(starts, ends, blame.scope, by, inner)
    return out


def _not_resolved(rows: list[tuple[int, int, int]], resolved: list[tuple[int, int, int]]
                  ) -> list[tuple[int, int, int]]:
    """The futex calls ``(tid, a, b)`` that overlap none of the thread's resolved waits (a
    call brackets its off-CPU wait)."""
    return split_resolved(rows, resolved)[0]


def split_resolved(rows: list[tuple[int, int, int]], resolved: list[tuple[int, int, int]]
                   ) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """``rows`` (``(tid, a, b)``: futex calls, or off-CPU waits in one) split into those
    that overlap none of their thread's ``resolved`` waits (:func:`through_engine`) and
    those that do: the thread's waits for the engine."""
    if not resolved or not rows:
        return rows, []
    by = spans_by_tid(list(resolved))
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    keep = np.ones(len(arr), bool)
    for tid, m in by.items():
        ix = np.flatnonzero(arr[:, 0] == tid)
        keep[ix] = ~_touches(arr[ix, 1], arr[ix, 2], m)

    def rows_of(mask: np.ndarray) -> list[tuple[int, int, int]]:
        return [(int(t), int(a), int(b)) for t, a, b in arr[mask]]

    return rows_of(keep), rows_of(~keep)


def report(blame: Blame, doc: dict[str, Any], starts: np.ndarray, ends: np.ndarray,
           crit: dict[str, float], cgroups: dict[int, str], service_pids: set[int]) -> None:
    """Put the chains in the diagnose document: ``chains`` (every link of every request above
    the P99, each chain signature judged), ``verdict.chain`` (the claimed chain, its sentence
    and the remedy of its last link) and the slowest requests' links as
    ``timeline.bands``."""
    out = judge(blame, starts, ends, crit, cgroups, service_pids)
    doc["chains"] = out
    doc["verdict"]["chain"] = out["verdict"]
    tl = doc.setdefault("timeline", {})
    tl.setdefault("bands", []).extend(bands(blame, starts, ends, int(tl["t0_monotonic_ns"])))
