"""Checks judged from eBPF probe evidence (tailgate probe / inspect --probe-window).

Facts: ``probe.runqlat``, ``probe.sockopt``, ``probe.mmsg``, ``probe.malloc``
(summaries from :mod:`tailgate.probes.analyze`), and for context without a probe
``pressure.cpu`` (PSI) and ``proc.<pid>.schedstat`` (sampled at t0 and t1).
A figure a probe did not measure is never invented: without a window the
run-queue P999 is ``unknown``, with PSI and schedstat as context.
"""

from __future__ import annotations

import os
from typing import Any

from ..judge import Unknown, check
from ..model import Result, Snapshot


def _pids(snap: Snapshot) -> list[int]:
    return [int(p) for p in snap.target.get("pids") or []]


def _probe(snap: Snapshot, name: str) -> dict[str, Any]:
    fact = snap.fact(f"probe.{name}")
    if not fact.ok:
        raise Unknown(f"not measured: {fact.missing}")
    if not isinstance(fact.value, dict):
        raise Unknown(f"probe.{name}: malformed summary")
    return fact.value


def _window(summary: dict[str, Any]) -> str:
    return f"{summary.get('duration_s', 0):g} s"


# -- run-queue latency -------------------------------------------------------------------------

def sched_context(snap: Snapshot) -> dict[str, Any]:
    """What /proc says about CPU waiting without a probe: PSI and per-pid schedstat deltas.

    A mean wait per timeslice, never a percentile: a P999 cannot be read from a mean.
    """
    ctx: dict[str, Any] = {}
    psi = snap.fact("pressure.cpu")
    if psi.ok and isinstance(psi.value, dict):
        some = psi.value.get("some") or {}
        ctx["psi_cpu_some_avg10"] = some.get("avg10")
        ctx["psi_cpu_some_avg60"] = some.get("avg60")
        full = psi.value.get("full") or {}
        if full:
            ctx["psi_cpu_full_avg10"] = full.get("avg10")
    elif not psi.ok:
        ctx["psi"] = psi.missing
    for pid in _pids(snap):
        now, then = snap.fact(f"proc.{pid}.schedstat"), snap.before_fact(f"proc.{pid}.schedstat")
        if not (now.ok and then.ok):
            ctx[f"pid {pid}"] = now.missing or then.missing
            continue
        t0, t1 = then.value.get("start_ticks"), now.value.get("start_ticks")
        if t0 is not None and t1 is not None and t0 != t1:
            ctx[f"pid {pid}"] = (f"pid {pid} is another process at the end of the interval "
                                 f"(start time {t0} -> {t1} ticks in /proc/{pid}/stat: the "
                                 "PID was reused): no delta between two processes")
            continue
        try:
            wait = now.value["wait_ns"] - then.value["wait_ns"]
            slices = now.value["timeslices"] - then.value["timeslices"]
        except (KeyError, TypeError):
            ctx[f"pid {pid}"] = "malformed schedstat"
            continue
        if wait < 0 or slices < 0:
            ctx[f"pid {pid}"] = f"/proc/{pid}/schedstat went backwards during the interval"
            continue
        row: dict[str, Any] = {"wait_ms": round(wait / 1e6, 3), "timeslices": slices}
        if slices > 0:
            row["mean_wait_per_timeslice_us"] = round(wait / slices / 1e3, 3)
        if snap.interval_s > 0:
            row["waiting_fraction"] = round(wait / (snap.interval_s * 1e9), 4)
        ctx[f"pid {pid}"] = row
    return ctx


def _runqlat_result(subject: str, s: dict[str, Any], limit: float, window: str,
                    context: dict[str, Any]) -> Result:
    evidence = {k: s.get(k) for k in ("count", "p50", "p90", "p99", "p999", "max")}
    if s.get("buckets"):  # the non-empty log-linear buckets (us): the inspect page draws them
        evidence["buckets"] = s["buckets"]
    evidence.update(window=window, **({"context": context} if context else {}))
    count = int(s.get("count") or 0)
    if count == 0 or s.get("p999") is None:
        return Result("unknown", subject=subject, evidence=evidence,
                      reason=f"no run-queue waits seen during the {window} window")
    p999 = float(s["p999"])
    few = (f"; only {count} samples, so the P999 is the largest wait" if count < 1000 else "")
    if p999 < limit:
        return Result("pass", subject=subject, observed=p999, evidence=evidence,
                      reason=f"run-queue P999 {p999:g} us < {limit:g} us over {count} waits{few}")
    return Result("fail", subject=subject, observed=p999, evidence=evidence,
                  reason=f"run-queue P999 {p999:g} us >= {limit:g} us over {count} waits "
                  f"(P99 {s.get('p99')} us, max {s.get('max')} us){few}")


@check("l2.sched.runqlat")
def runqlat(snap: Snapshot, p: dict) -> list[Result]:
    limit = float(p.get("limit", 500.0))
    context = sched_context(snap)
    fact = snap.fact("probe.runqlat")
    if not fact.ok or not isinstance(fact.value, dict):
        why = fact.missing if not fact.ok else "malformed probe summary"
        return [Result("unknown", evidence=context,
                       reason=f"P999 not measured ({why}); /proc gives only means "
                       "(see evidence)")]
    s = fact.value
    window = _window(s)
    if s.get("scope") == "processes":
        procs = s.get("processes") or {}
        if not procs:
            return [Result("unknown", evidence=context,
                           reason=f"no run-queue waits of the target during the {window} window")]
        return [_runqlat_result(f"pid {pid}", procs[pid], limit, window,
                                context.get(f"pid {pid}") or {})
                for pid in sorted(procs, key=int)]
    return [_runqlat_result("host", s, limit, window, context)]


# -- SO_RCVBUF pinning -------------------------------------------------------------------------

@check("l2.tcp.rcvbuf_lock")
def rcvbuf_lock(snap: Snapshot, p: dict) -> Result:
    limit = int(p.get("limit", 0))
    s = _probe(snap, "sockopt")
    procs = s.get("processes") or {}
    pinning = {pid: r for pid, r in procs.items() if r.get("tcp_pinned")}
    others = {pid: r for pid, r in procs.items() if not r.get("tcp_pinned")
              and r.get("setsockopt_rcvbuf")}
    evidence = {
        "window": _window(s),
        "pinning": {f"{pid} ({r.get('comm')})": {k: r.get(k) for k in (
            "setsockopt_rcvbuf", "bytes", "sockets", "locked_sockets", "locked_adjustments")}
            for pid, r in pinning.items()},
    }
    if others:
        evidence["non_tcp_setters"] = {f"{pid} ({r.get('comm')})": r.get("sockets")
                                       for pid, r in others.items()}
    names = ", ".join(f"{r.get('comm')} (pid {pid})" for pid, r in pinning.items())
    if len(pinning) > limit:
        return Result("fail", observed=len(pinning), evidence=evidence,
                      reason=f"receive buffer pinned with SO_RCVBUF on TCP sockets by: {names}")
    return Result("pass", observed=len(pinning), evidence=evidence,
                  reason=f"no TCP socket pinned with SO_RCVBUF during the {_window(s)} window "
                  "(calls made before it are seen only on locked sockets that received data)")


# -- syscall batching --------------------------------------------------------------------------

@check("l2.net.syscall_batching")
def syscall_batching(snap: Snapshot, p: dict) -> list[Result]:
    limit = float(p.get("limit", 32.0))
    min_rate = float(p.get("min_calls_per_s", 100.0))
    s = _probe(snap, "mmsg")
    duration = float(s.get("duration_s") or 0) or 1.0
    named = {str(x) for x in _pids(snap)}
    procs = s.get("processes") or {}
    results, quiet = [], {}
    for pid in sorted(procs, key=int):
        r = procs[pid]
        calls = int(r.get("calls") or 0)
        # Host-wide, a DNS lookup or an NTP poll is not a packet service; a --pid is judged.
        if calls == 0 or (pid not in named and calls / duration < min_rate):
            quiet[f"{pid} ({r.get('comm')})"] = calls
            continue
        batch = r.get("batch")
        evidence = {k: r.get(k) for k in ("comm", "single_recv", "single_send", "recvmmsg",
                                          "sendmmsg", "recv_batch", "send_batch",
                                          "msgs_per_call")}
        evidence["window"] = _window(s)
        subject = f"pid {pid} ({r.get('comm')})"
        if batch is not None and float(batch) >= limit:
            results.append(Result("pass", subject=subject, observed=batch, evidence=evidence,
                                  reason=f"datagram syscalls move {batch:g} messages per call "
                                  f"(batch asked for) >= {limit:g}"))
        else:
            results.append(Result("fail", subject=subject, observed=batch, evidence=evidence,
                                  reason=f"{calls} datagram syscalls with a mean batch of "
                                  f"{batch:g} < {limit:g}: "
                                  f"{r.get('single_recv', 0) + r.get('single_send', 0)} "
                                  "one-datagram recvfrom/sendto/recvmsg/sendmsg calls"))
    if not results:
        return [Result("skip", evidence={"below_rate": quiet} if quiet else {},
                       reason=f"no packet service seen during the {_window(s)} window (no "
                       f"process made >= {min_rate:g} datagram syscalls/s)")]
    return results


# -- heap allocations in the hot path ----------------------------------------------------------

def _watched(r: dict[str, Any]) -> str:
    found = r.get("allocators") or []
    return ", ".join(f"{a.get('family')} ({os.path.basename(str(a.get('object')))})"
                     for a in found) or "none"


def _site(r: dict[str, Any]) -> str | None:
    """Where the allocations come from: the top caller, or, when that is the Go runtime's
    own helper (runtime.makeslice), the first frame of the top stack outside the runtime."""
    callers = list((r.get("callers") or {}).items())
    if callers and not callers[0][0].startswith("runtime."):
        return f"{callers[0][0]} ({callers[0][1]} calls)"
    for st in r.get("top_stacks") or []:
        for frame in (st.get("frames") or [])[1:]:
            name = frame.rsplit("+", 1)[0]
            if not name.startswith("runtime."):
                return f"{name} ({st.get('count')} calls on this stack)"
    return f"{callers[0][0]} ({callers[0][1]} calls)" if callers else None


@check("l3.alloc.hot_path")
def alloc_hot_path(snap: Snapshot, p: dict) -> list[Result]:
    """Calls are counted at the entry points of the allocators found in the process
    (tailgate.probes.allocators). Zero calls pass only when every allocator it maps
    was probed: one that could not be (stripped, unrecognised, unreadable) or a
    summary that does not say what was watched leaves the finding unknown."""
    limit = float(p.get("limit", 0.0))
    s = _probe(snap, "malloc")
    procs = s.get("processes") or {}
    if not procs:
        raise Unknown("no process was probed (give --pid)")
    results = []
    for pid in sorted(procs, key=int):
        r = procs[pid]
        rate = float(r.get("per_s") or 0.0)
        unprobed = list(r.get("unprobed") or [])
        evidence = {"window": _window(s), "calls": r.get("calls"),
                    "allocators": r.get("allocators"), "by_allocator": r.get("by_allocator"),
                    "functions": r.get("functions"), "bytes": r.get("bytes"),
                    "callers": r.get("callers") or {},
                    "top_stacks": (r.get("top_stacks") or [])[:3]}
        if unprobed:
            evidence["unprobed"] = unprobed
        subject = f"pid {pid}"
        if rate > limit:
            site = _site(r)
            where = f"; called most from {site}" if site else ""
            by = r.get("by_allocator") or {}
            through = (" through " + ", ".join(f"{k} ({v})" for k, v in by.items())
                       if by else "")
            results.append(Result("fail", subject=subject, observed=rate, evidence=evidence,
                                  reason=f"{r.get('calls')} heap allocations in {_window(s)} "
                                  f"({rate:g}/s){through}{where}"))
        elif "allocators" not in r:
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason="the probe summary does not say which allocators were "
                                  "watched (from an older tailgate): zero calls prove nothing"))
        elif unprobed:
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"{r.get('calls') or 0} calls counted, but not every "
                                  f"allocator could be probed: {'; '.join(unprobed)}"))
        elif not r.get("allocators"):
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason="no allocator was probed in this process"))
        else:
            results.append(Result("pass", subject=subject, observed=rate, evidence=evidence,
                                  reason=(f"no heap allocations during the {_window(s)} window"
                                          if rate == 0 else f"{rate:g} allocations/s <= "
                                          f"{limit:g}") + f" (watched: {_watched(r)})"))
    return results
