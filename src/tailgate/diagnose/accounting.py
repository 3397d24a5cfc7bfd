"""Each request's time, accounted (pure): its latency split into additive parts.

A request lasts from its intended start to its end. Its window is cut, in this order, into:

1. ``generator``: intended start -> dispatch (the load generator's own lateness; exact). The
   rest is the service's window. A request ends when the kernel received its reply's last
   bytes (the compiled engine's stamp, as bench's latency does): the generator's read after
   that is in no latency (bench's ``generator.read_lag_ms``).
2. service-wide parts (they hold every thread of the service; exact to their source's
   resolution): ``throttled`` (the cgroup's quota, polled), ``softirq`` (network softirqs on the
   service's CPUs, when probed), ``retransmit`` (a retransmitted segment: the 200 ms before it,
   TCP_RTO_MIN, an estimate of the wait it ended). Overlaps go to the earlier in this list.
3. per-thread parts, from the probe's intervals of each thread, made disjoint per thread in
   this order: ``stopped``, ``runq`` (runnable, not running), ``engine_wait`` (a futex wait
   of an LLM server's HTTP thread for its engine's loop, which the chain of blame resolved to
   the engine's phase of the request: :func:`tailgate.diagnose.chain.through_engine`; no
   lock's), ``futex``, then voluntary
   off-CPU waits by the syscall the thread blocked in: ``read``, ``write``, ``poll``,
   ``sleep``, ``blocked_other`` (any other syscall, a page fault, no syscall). The rest of the
   thread's time in the window is ``on_cpu``: running, or in waits shorter than the probe's
   200 us threshold (an upper bound of its CPU time). Before a thread's first switch out (the
   probe's first sight of it) its state is not known (``unseen``, counted as residual).
4. ``in_transit``: a thread's wait (read, poll, futex, ...) begun before the request was sent
   and lasting into its window: the thread waited for the request to arrive (it was in the
   client, the network or a socket queue); and, for the one thread that served it, a wait
   begun inside the window and lasting past its end (it was done: the reply was on its way).
   Among several candidate threads, such a final wait is another request's thread going back
   to waiting for work: it is left out and that thread's other parts are scaled to the window.
5. ``residual``: what no thread accounts for (every thread of the service was idle, waiting for
   work, for the whole window: the request was in the network, the client, or somewhere the
   probes do not see).

Which thread served which request is not recorded. A thread's busy time in a window is the
time it was not waiting for work (in futex, read, write, poll, other waits); the threads busy
at all in it are the candidates. One candidate: its parts are the request's, exact. Several:
each part is their mean weighted by busy time (apportioned: the thread that did most in the
window counts most; the request is counted as apportioned). None: the residual.
Parts are clipped so that they never overlap, hence parts + residual == latency exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..spans import merge_spans, overlap_ns, subtract_spans

SERVICE_PARTS = ("throttled", "softirq", "retransmit")
THREAD_PARTS = ("unseen", "stopped", "runq", "engine_wait", "futex", "read", "write", "poll",
                "sleep", "blocked_other")
PARTS = ("generator", *SERVICE_PARTS, *THREAD_PARTS[1:], "on_cpu",
         "in_transit", "residual")
# waiting for work, or for a reply (the engine's: engine_wait)
WAITS = ("engine_wait", "futex", "read", "write", "poll", "blocked_other")
# what a part is, where its key alone would mislead: the HTTP thread's futex wait for the
# engine is no lock (the terminal, the HTML and the JSON's "labels" show this)
LABELS = {"engine_wait": "waits on the engine (futex)"}
# not serving: waiting for work, for the request to arrive, or not known
IDLE_PARTS = ("unseen", *WAITS, "in_transit")
RTO_MIN_NS = 200_000_000

# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl) by what the thread waited for
_CLASS = {
    "read": (0, 17, 19, 45, 47, 295, 299, 327),  # read pread64 readv recvfrom recvmsg preadv ..
    "write": (1, 18, 20, 44, 46, 296, 307, 328, 40, 275, 276),  # .. sendfile splice tee
    "poll": (7, 23, 43, 232, 270, 271, 281, 288, 426, 441),  # poll select accept epoll_wait ..
    "sleep": (34, 35, 230, 61, 247),  # pause nanosleep clock_nanosleep wait4 waitid
    "futex": (202, 449),  # futex futex_wait
}
SYSCALL_CLASS = {nr: cls for cls, nrs in _CLASS.items() for nr in nrs}


METHOD = {
    "exact": "generator lateness, sending and reading; on one candidate thread, each of its "
             "parts (to the probe's 200 us threshold: shorter waits count as on_cpu)",
    "apportioned": "when several threads may have served a request (which one did is not "
                   "recorded), each per-thread part is their mean",
    "estimated": "throttled (from cpu.stat polls every 5 ms); retransmit (the 200 ms of "
                 "TCP_RTO_MIN before each retransmission)",
    "in_transit": "a serving thread's wait begun before the request was sent: it waited for "
                  "the request to arrive",
    "engine_wait": "a serving thread's futex wait that the chain of blame resolved to the "
                   "engine's phase of the request (its HTTP thread waiting for the engine's "
                   "loop to queue, prefill or decode it): the engine's time, no lock",
    "residual": "the window's time no thread of the service accounts for (all idle, waiting "
                "for work: the request was in the network or the client)",
}


def syscall_class(nr: int) -> str:
    """The part a voluntary wait inside syscall ``nr`` (-1: none) belongs to."""
    return SYSCALL_CLASS.get(nr, "blocked_other")


@dataclass(frozen=True)
class Accounting:
    parts: dict[str, np.ndarray]  # part -> ns per request (sums to the latency)
    latency: np.ndarray  # ns per request
    apportioned: np.ndarray  # bool per request: several threads were candidates
    candidates: np.ndarray  # int per request: threads that may have served it
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        total = sum(self.parts.values())
        if not np.array_equal(total, self.latency):
            raise AssertionError("accounting parts do not add up to the latency")


def _disjoint(spans: dict[str, np.ndarray], order: tuple[str, ...], cut: np.ndarray
              ) -> dict[str, np.ndarray]:
    """Each kind's spans less ``cut`` and less the kinds before it in ``order``."""
    out: dict[str, np.ndarray] = {}
    taken = merge_spans(cut.reshape(-1, 2))
    for kind in order:
        s = subtract_spans(spans.get(kind, np.zeros((0, 2), np.int64)).reshape(-1, 2), taken)
        out[kind] = s
        taken = merge_spans(np.concatenate([taken, s])) if len(s) else taken
    return out


def _held_from(spans: np.ndarray, d: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each window ``[d, end]``: how long the span under way at ``d`` (begun before it)
    lasts into the window (``spans``: sorted, disjoint)."""
    if len(spans) == 0:
        return np.zeros(len(d), np.int64)
    i = np.searchsorted(spans[:, 0], d, side="left") - 1  # the last span begun before d
    ok = i >= 0
    out = np.zeros(len(d), np.int64)
    out[ok] = np.clip(np.minimum(ends[ok], spans[i[ok], 1]) - d[ok], 0, None)
    return out


def _held_to(spans: np.ndarray, d: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each window ``[d, end]``: how long a span begun inside it (after ``d``) and lasting
    to its end or past it covers of it."""
    if len(spans) == 0:
        return np.zeros(len(d), np.int64)
    i = np.searchsorted(spans[:, 0], ends, side="left") - 1  # the last span begun before end
    ok = i >= 0
    ok[ok] &= (spans[i[ok], 0] > d[ok]) & (spans[i[ok], 1] >= ends[ok])
    out = np.zeros(len(d), np.int64)
    out[ok] = ends[ok] - spans[i[ok], 0]
    return out


def account(starts: np.ndarray, ends: np.ndarray, sends: np.ndarray | None,
            threads: dict[int, dict[str, np.ndarray]], service: dict[str, np.ndarray]
            ) -> Accounting:
    """Split each request ``[starts[i], ends[i]]`` (ns) into :data:`PARTS`. ``sends``: when
    the generator dispatched it (0 or None: not known, no lateness counted); ``threads``: per
    thread id, its intervals per part of :data:`THREAD_PARTS`; ``service``: intervals of
    :data:`SERVICE_PARTS` (``retransmit``: instants, as ``[t, t]`` rows)."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    lat = ends - starts
    n = len(lat)
    if sends is None:
        sends = np.zeros(n, np.int64)
    d = np.where(sends > 0, np.clip(sends, starts, ends), starts)
    parts: dict[str, np.ndarray] = {p: np.zeros(n, np.int64) for p in PARTS}
    parts["generator"] = d - starts
    svc = dict(service)
    rtx = svc.get("retransmit", np.zeros((0, 2), np.int64)).reshape(-1, 2)
    if len(rtx):  # the wait a retransmission ended: at least the minimum time-out before it
        svc["retransmit"] = merge_spans(np.stack([rtx[:, 1] - RTO_MIN_NS, rtx[:, 1]], axis=1))
    svc = _disjoint(svc, SERVICE_PARTS, np.zeros((0, 2), np.int64))
    for p in SERVICE_PARTS:
        parts[p] = overlap_ns(d, ends, svc[p])
    svc_all = merge_spans(np.concatenate([svc[p] for p in SERVICE_PARTS]))
    left = (ends - d) - sum(parts[p] for p in SERVICE_PARTS)  # the threads' share of the window
    per: list[dict[str, np.ndarray]] = []
    for tid in sorted(threads):
        own = _disjoint({k: merge_spans(np.asarray(v, np.int64).reshape(-1, 2))
                         for k, v in threads[tid].items()}, THREAD_PARTS, svc_all)
        t = {k: overlap_ns(d, ends, own[k]) for k in THREAD_PARTS}
        t["in_transit"] = np.zeros(n, np.int64)
        after = np.zeros(n, np.int64)
        for k in WAITS:
            # a wait begun before the request was sent waited for it to arrive
            held = _held_from(own[k], d, ends)
            # one begun inside the window and lasting past it: the thread was done (its reply
            # on the way, or it went back to waiting for work)
            tail = _held_to(own[k], d, ends)
            t[k] -= held + tail
            t["in_transit"] += held
            after += tail
        per.append((t, after))
    kinds = (*THREAD_PARTS, "in_transit")
    cand = sum(((left - sum(t[k] for k in IDLE_PARTS) - after) > 0).astype(np.int64)
               for t, after in per) if per else np.zeros(n, np.int64)
    sums = {p: np.zeros(n, np.float64) for p in (*kinds, "on_cpu")}
    weight = np.zeros(n, np.float64)
    for t, after in per:
        on_cpu = left - sum(t.values()) - after
        busy = left - sum(t[k] for k in IDLE_PARTS) - after  # time it was not waiting for work
        weight += busy
        # alone, the thread's time after it was done is the reply's transit; among several,
        # its parts before are scaled to the window (they are its share of what happened)
        scale = np.where(cand > 1, left / np.maximum(left - after, 1), 1.0)
        for k in kinds:
            sums[k] += busy * t[k] * scale
        sums["in_transit"] += busy * np.where(cand > 1, 0, after)
        sums["on_cpu"] += busy * on_cpu * scale
    served = weight > 0
    # the candidates' mean weighted by how long each was busy, in whole ns, the rounding's
    # remainder on on_cpu: parts stay integers and add up exactly
    w = np.where(served, weight, 1.0)
    for k in kinds:
        parts[k] = np.where(served, np.floor(sums[k] / w), 0).astype(np.int64)
    given = sum(parts[k] for k in kinds)
    parts["on_cpu"] = np.where(served, left - given, 0)
    # time a thread was not yet seen (before its first switch out) is not known: residual
    parts["residual"] = np.where(served, parts.pop("unseen"), left)
    acc = Accounting(parts, lat, cand > 1, cand)
    acc.check()
    return acc


def _dist(x_ns: np.ndarray, lat: np.ndarray) -> dict[str, float | None]:
    if not len(x_ns):
        return {"median_ms": None, "p90_ms": None, "max_ms": None, "share": None}
    return {"median_ms": round(float(np.median(x_ns)) / 1e6, 4),
            "p90_ms": round(float(np.percentile(x_ns, 90)) / 1e6, 4),
            "max_ms": round(float(x_ns.max()) / 1e6, 4),
            "share": round(float(x_ns.sum() / max(int(lat.sum()), 1)), 4)}


def summarise(acc: Accounting) -> dict[str, Any]:
    """Per part, its distribution over the requests above the P99, above the P999 and over all
    (median, P90, max, and its share of their summed latency); the part whose time per request
    grows most from all requests to the P99 tail; how many requests were apportioned."""
    lat = acc.latency
    n = len(lat)
    out: dict[str, Any] = {"requests": n, "parts": list(PARTS), "labels": dict(LABELS)}
    if n == 0:
        out.update(grows_most=None, sets={})
        return out
    p99, p999 = (float(np.percentile(lat, q, method="inverted_cdf")) for q in (99, 99.9))
    sets = {"p99": lat >= p99, "p999": lat >= p999, "all": np.ones(n, dtype=bool)}
    out["p99_ms"], out["p999_ms"] = round(p99 / 1e6, 4), round(p999 / 1e6, 4)
    out["sets"] = {name: {"requests": int(m.sum()),
                          "apportioned": int(acc.apportioned[m].sum()),
                          "exact": int((acc.candidates[m] == 1).sum()),
                          "unserved": int((acc.candidates[m] == 0).sum()),
                          "parts": {p: _dist(acc.parts[p][m], lat[m]) for p in PARTS}}
                   for name, m in sets.items()}
    # Growth in time per request, not in share: a part that fills every request (on CPU, 72 %
    # of a fast request's time) cannot grow much in share even when it is 5 ms of each slow
    # request against 0.1 ms of the others; a share-based choice named the run queue there.
    tail = sets["p99"]
    growth = {p: (float(acc.parts[p][tail].mean()) - float(acc.parts[p].mean())) / 1e6
              for p in PARTS}
    top = max(PARTS, key=lambda p: growth[p])
    out["growth_ms"] = {p: round(g, 4) for p, g in growth.items()}
    out["grows_most"] = top if growth[top] > 0 else None
    t, a = out["sets"]["p99"], out["sets"]["all"]
    tail_ms = float(acc.parts[top][tail].mean()) / 1e6
    out["sentence"] = (
        f"in the {t['requests']} requests above the P99 ({out['p99_ms']:.3f} ms), "
        f"{LABELS.get(top, top)} grows most: {tail_ms:.3f} ms a request against "
        f"{tail_ms - growth[top]:.3f} ms over all {n} "
        f"({100 * t['parts'][top]['share']:.0f} % of the tail's time, "
        f"{100 * a['parts'][top]['share']:.0f} % over all); residual "
        f"{100 * t['parts']['residual']['share']:.0f} %; {t['exact']} of them on one thread "
        f"(exact), {t['apportioned']} apportioned over several"
        if out["grows_most"] else "no part takes more time a request in the tail")
    return out
