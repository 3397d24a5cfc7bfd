"""Turn a probe's bpftrace maps into its JSON summary: pure, no I/O.

Each function takes the parsed output (:class:`BpftraceOutput`) of one program
and returns the JSON-able summary that ``tailgate probe NAME --json`` writes and
that inspect stores as a fact. ``keep`` (a set of process ids, or None for all)
selects processes after the fact, for a cgroup with more processes than a
program's filter slots. Process ids are JSON object keys, so strings.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from . import loglin
from .output import BpftraceOutput, int_key, keyed

Keep = Collection[int] | None
US = 1e3  # ns per µs


def _us(ns: float) -> float:
    return round(ns / US, 3)


def _kept(pid: int, keep: Keep) -> bool:
    return pid != 0 and (keep is None or pid in keep)


def _comms(out: BpftraceOutput, name: str = "@comm") -> dict[int, str]:
    return {int_key(k): str(v) for k, v in out.map(name).items()}


def _latency(out: BpftraceOutput, per_process: bool, keep: Keep) -> dict[str, Any]:
    """Histogram maps ``@lat[tgid, key]`` and ``@max[tgid]`` -> summary (+ per process)."""
    hists: dict[int, dict[int, int]] = {}
    for (who, key), count in keyed(out.map("@lat"), 2):
        pid = int_key(who)
        if per_process and not _kept(pid, keep):
            continue
        h = hists.setdefault(pid, {})
        h[int_key(key)] = h.get(int_key(key), 0) + count
    maxes = {int_key(k[0]): v for k, v in keyed(out.map("@max"), 1)}
    total = loglin.merge(*hists.values())
    top_max = max((maxes.get(p, 0) for p in hists), default=None)
    summary = loglin.summarize(total, top_max)
    if per_process:
        summary["processes"] = {
            str(pid): loglin.summarize(h, maxes.get(pid)) for pid, h in sorted(hists.items())
        }
    return summary


def runqlat(out: BpftraceOutput, pids: Collection[int] = (), keep: Keep = None) -> dict[str, Any]:
    per_process = bool(pids) or keep is not None
    summary = _latency(out, per_process, keep)
    if per_process:
        for pid in sorted(set(pids) | set(keep or ())):
            summary["processes"].setdefault(str(pid), loglin.summarize({}, None))
    return {"probe": "runqlat", "scope": "processes" if per_process else "host", **summary}


def runqlat_raw(out: BpftraceOutput) -> list[int]:
    """The raw samples (ns) that runqlat prints in mode 2, for accuracy tests."""
    samples = []
    for chunk in out.printf:
        samples += [int(x) for x in chunk.split()]
    return samples


def futex(out: BpftraceOutput, pids: Collection[int] = (), keep: Keep = None) -> dict[str, Any]:
    summary = _latency(out, True, keep)
    threads: dict[int, dict[str, Any]] = {}
    counts = {tuple(k): v for k, v in keyed(out.map("@thread_n"), 3)}
    for (who, tid, comm), ns in keyed(out.map("@thread_ns"), 3):
        pid = int_key(who)
        if not _kept(pid, keep):
            continue
        threads.setdefault(pid, {})[str(int_key(tid))] = {
            "comm": comm, "waits": counts.get((who, tid, comm), 0), "wait_us": _us(ns)}
    for pid, proc in summary["processes"].items():
        by_thread = threads.get(int(pid), {})
        proc["wait_us"] = round(sum(t["wait_us"] for t in by_thread.values()), 3)
        proc["threads"] = dict(sorted(by_thread.items(), key=lambda kv: -kv[1]["wait_us"]))
    for pid in pids:
        summary["processes"].setdefault(str(pid), {**loglin.summarize({}, None),
                                                   "wait_us": 0.0, "threads": {}})
    return {"probe": "futex", **summary}


def _per_pid(out: BpftraceOutput, names: dict[str, str], keep: Keep,
             scale: float = 1.0) -> dict[int, dict[str, Any]]:
    procs: dict[int, dict[str, Any]] = {}
    for field, mapname in names.items():
        for (who,), value in keyed(out.map(mapname), 1):
            pid = int_key(who)
            if _kept(pid, keep):
                procs.setdefault(pid, {})[field] = value / scale if scale != 1.0 else value
    return procs


def offcpu(out: BpftraceOutput, pids: Collection[int] = (), keep: Keep = None) -> dict[str, Any]:
    comms = _comms(out)
    procs = _per_pid(out, {"blocked_n": "@blocked_n", "preempted_n": "@preempted_n"}, keep)
    for pid, d in _per_pid(out, {"blocked_ns": "@blocked_ns", "preempted_ns": "@preempted_ns"},
                           keep).items():
        procs.setdefault(pid, {}).update(d)
    rows = {}
    for pid in sorted(set(procs) | set(pids)):
        d = procs.get(pid, {})
        rows[str(pid)] = {
            "comm": comms.get(pid, ""),
            "blocked_us": _us(d.get("blocked_ns", 0)), "blocked_count": d.get("blocked_n", 0),
            "preempted_us": _us(d.get("preempted_ns", 0)),
            "preempted_count": d.get("preempted_n", 0),
        }
    ordered = dict(sorted(rows.items(), key=lambda kv: -(kv[1]["blocked_us"]
                                                         + kv[1]["preempted_us"])))
    return {"probe": "offcpu", "unit": "us", "processes": ordered}


def switches(out: BpftraceOutput, pids: Collection[int] = (), keep: Keep = None) -> dict[str, Any]:
    comms = _comms(out)
    procs = _per_pid(out, {"voluntary": "@voluntary", "involuntary": "@involuntary"}, keep)
    rows = {}
    for pid in sorted(set(procs) | set(pids)):
        d = procs.get(pid, {})
        rows[str(pid)] = {"comm": comms.get(pid, ""), "voluntary": d.get("voluntary", 0),
                          "involuntary": d.get("involuntary", 0)}
    ordered = dict(sorted(rows.items(),
                          key=lambda kv: -(kv[1]["voluntary"] + kv[1]["involuntary"])))
    return {"probe": "switches", "unit": "switches",
            "voluntary": sum(r["voluntary"] for r in rows.values()),
            "involuntary": sum(r["involuntary"] for r in rows.values()),
            "processes": ordered}


SOCK_TYPES = {1: "stream", 2: "datagram", 3: "raw", 5: "seqpacket"}
PROTOCOLS = {6: "tcp", 17: "udp", 132: "sctp"}


def sockopt(out: BpftraceOutput, pids: Collection[int] = (), keep: Keep = None) -> dict[str, Any]:
    rows: dict[int, dict[str, Any]] = {}

    def row(pid: int, comm: str = "") -> dict[str, Any]:
        r = rows.setdefault(pid, {"comm": comm, "setsockopt_rcvbuf": 0, "sockets": [],
                                  "bytes": None, "locked_adjustments": 0,
                                  "locked_sockets": 0, "autotuned_adjustments": 0})
        if comm and not r["comm"]:
            r["comm"] = comm
        return r

    for (who, stype, proto, comm), n in keyed(out.map("@setsockopt"), 4):
        pid = int_key(who)
        if _kept(pid, keep):
            r = row(pid, comm)
            r["setsockopt_rcvbuf"] += n
            r["sockets"].append({"type": SOCK_TYPES.get(int_key(stype), int_key(stype)),
                                 "protocol": PROTOCOLS.get(int_key(proto), int_key(proto)),
                                 "calls": n})
    for (who,), value in keyed(out.map("@bytes"), 1):
        if _kept(int_key(who), keep):
            row(int_key(who))["bytes"] = value
    for field, name in (("locked_adjustments", "@locked"),
                        ("autotuned_adjustments", "@autotuned")):
        for (who, comm), n in keyed(out.map(name), 2):
            if _kept(int_key(who), keep):
                row(int_key(who), comm)[field] += n
    for (who, _cookie), _n in keyed(out.map("@locked_sockets"), 2):
        if _kept(int_key(who), keep):
            row(int_key(who))["locked_sockets"] += 1
    for r in rows.values():
        r["tcp_pinned"] = bool(r["locked_sockets"]) or any(
            s["protocol"] == "tcp" for s in r["sockets"])
    return {"probe": "sockopt", "unit": "calls",
            "processes": {str(p): rows[p] for p in sorted(rows)},
            "pinning": sorted(p for p, r in rows.items() if r["tcp_pinned"])}


def mmsg(out: BpftraceOutput, pids: Collection[int] = (), keep: Keep = None) -> dict[str, Any]:
    fields = ("single_recv", "single_send", "recvmmsg", "sendmmsg", "recvmmsg_msgs",
              "sendmmsg_msgs", "recvmmsg_vlen", "sendmmsg_vlen")
    rows: dict[int, dict[str, Any]] = {}
    for f in fields:
        for (who, comm), n in keyed(out.map(f"@{f}"), 2):
            pid = int_key(who)
            if _kept(pid, keep):
                r = rows.setdefault(pid, {"comm": comm, **{k: 0 for k in fields}})
                r[f] += n
    for r in rows.values():
        calls = r["single_recv"] + r["single_send"] + r["recvmmsg"] + r["sendmmsg"]
        asked = r["single_recv"] + r["single_send"] + r["recvmmsg_vlen"] + r["sendmmsg_vlen"]
        moved = r["single_recv"] + r["single_send"] + r["recvmmsg_msgs"] + r["sendmmsg_msgs"]
        r["calls"] = calls
        # The batch a program asks for (vlen; 1 for a single call) is its design;
        # what a receive returns also depends on how many datagrams were waiting.
        r["batch"] = round(asked / calls, 2) if calls else None
        r["msgs_per_call"] = round(moved / calls, 2) if calls else None
        r["recv_batch"] = (round(r["recvmmsg_msgs"] / r["recvmmsg"], 2) if r["recvmmsg"]
                           else (1.0 if r["single_recv"] else None))
        r["send_batch"] = (round(r["sendmmsg_msgs"] / r["sendmmsg"], 2) if r["sendmmsg"]
                           else (1.0 if r["single_send"] else None))
    return {"probe": "mmsg", "unit": "msgs/call",
            "processes": {str(p): rows[p] for p in sorted(rows)}}


def _frames(stack: str) -> list[str]:
    return [ln.strip() for ln in stack.splitlines() if ln.strip()]


def malloc(out: BpftraceOutput, pids: Collection[int] = (), keep: Keep = None,
           duration_s: float | None = None, top: int = 5,
           allocators: dict[str, dict[str, Any]] | None = None,
           names: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """``allocators``: per pid (a string), what was found before probing
    (:meth:`tailgate.probes.allocators.Detection.to_json`): the allocators probed and
    the reasons others could not be. ``names``: per pid, ``{address: "function+offset"}``
    for the return addresses in ``@sites`` (an older program printed ``@callers`` and
    ``@stacks`` already named by bpftrace)."""
    rows: dict[int, dict[str, Any]] = {}

    def row(pid: int) -> dict[str, Any]:
        return rows.setdefault(pid, {"calls": 0, "functions": {}, "by_allocator": {},
                                     "bytes": 0, "per_s": None, "callers": {},
                                     "top_stacks": []})

    for pid in pids:
        row(pid)
    for (who, probe), n in keyed(out.map("@calls"), 2):
        pid = int_key(who)
        if _kept(pid, keep):
            r = row(pid)
            r["calls"] += n
            # "family:entry" (an older program keyed "uprobe:libc:malloc")
            family, _, fn = probe.rpartition(":")
            r["functions"][fn] = r["functions"].get(fn, 0) + n
            family = family.rpartition(":")[2] or "libc"
            r["by_allocator"][family] = r["by_allocator"].get(family, 0) + n
    for (who,), n in keyed(out.map("@bytes"), 1):
        if _kept(int_key(who), keep):
            row(int_key(who))["bytes"] = n
    stacks: dict[int, list[tuple[int, str]]] = {}
    for (who, stack), n in keyed(out.map("@stacks"), 2):
        pid = int_key(who)
        if _kept(pid, keep):
            stacks.setdefault(pid, []).append((n, stack))
    for pid, items in stacks.items():
        items.sort(key=lambda t: -t[0])
        row(pid)["top_stacks"] = [{"count": n, "frames": _frames(s)} for n, s in items[:top]]
    callers: dict[int, dict[str, int]] = {}
    for (who, caller), n in keyed(out.map("@callers"), 2):
        pid = int_key(who)
        if _kept(pid, keep):
            by = callers.setdefault(pid, {})
            by[caller.strip()] = by.get(caller.strip(), 0) + n
    site_stacks: dict[int, dict[tuple[str, ...], int]] = {}
    for key, n in keyed(out.map("@sites"), 5):
        pid, *addrs = (int_key(k) for k in key)
        if not _kept(pid, keep):
            continue
        named = (names or {}).get(str(pid), {})
        frames = tuple(named.get(str(a), hex(a)) for a in addrs if a)
        if not frames:
            continue
        by = callers.setdefault(pid, {})
        caller = frames[0].rsplit("+", 1)[0] if str(addrs[0]) in named else frames[0]
        by[caller] = by.get(caller, 0) + n
        st = site_stacks.setdefault(pid, {})
        st[frames] = st.get(frames, 0) + n
    for pid, st in site_stacks.items():
        ranked = sorted(st.items(), key=lambda kv: -kv[1])[:top]
        row(pid)["top_stacks"] = [{"count": n, "frames": list(f)} for f, n in ranked]
    for pid, by in callers.items():
        row(pid)["callers"] = dict(sorted(by.items(), key=lambda kv: -kv[1])[:top])
    if duration_s:
        for r in rows.values():
            r["per_s"] = round(r["calls"] / duration_s, 3)
    for pid_s, found in (allocators or {}).items():
        if _kept(int(pid_s), keep) or int(pid_s) in pids:
            r = row(int(pid_s))
            r["allocators"] = list(found.get("allocators") or [])
            r["unprobed"] = list(found.get("unprobed") or [])
    return {"probe": "malloc", "unit": "calls", "duration_s": duration_s,
            "processes": {str(p): rows[p] for p in sorted(rows)}}


def softirq(out: BpftraceOutput, pids: Collection[int] = (), keep: Keep = None,
            duration_s: float | None = None) -> dict[str, Any]:
    runs = {int_key(k[0]): v for k, v in keyed(out.map("@n"), 1)}
    longest = {int_key(k[0]): v for k, v in keyed(out.map("@max"), 1)}
    cpus = {}
    for (cpu,), ns in sorted(keyed(out.map("@ns"), 1), key=lambda kv: int_key(kv[0][0])):
        c = int_key(cpu)
        cpus[str(c)] = {"time_us": _us(ns), "runs": runs.get(c, 0),
                        "max_us": _us(longest.get(c, 0)),
                        "share": round(ns / (duration_s * 1e9), 6) if duration_s else None}
    return {"probe": "softirq", "unit": "us", "softirq": "NET_RX", "duration_s": duration_s,
            "cpus": cpus}
