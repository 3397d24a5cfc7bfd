"""The probe summary on the terminal (every figure is also in ``probe --json``)."""

from __future__ import annotations

from typing import Any


def _latency_table(title: str, rows: dict[str, dict[str, Any]], unit: str):
    from rich.table import Table

    t = Table(title=title)
    for col in ("who", "count", "p50", "p90", "p99", "p999", "max"):
        t.add_column(col if col in ("who", "count") else f"{col} ({unit})", justify="right")
    for who, s in rows.items():
        t.add_row(who, str(s.get("count")), *(_num(s.get(k)) for k in
                                               ("p50", "p90", "p99", "p999", "max")))
    return t


def _num(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if isinstance(v, float) else str(v)


def _table(title: str, rows: dict[str, dict[str, Any]], cols: tuple[str, ...], limit: int = 15):
    from rich.table import Table

    t = Table(title=title)
    t.add_column("pid", justify="right")
    for c in cols:
        t.add_column(c, justify="left" if c == "comm" else "right")
    for pid, r in list(rows.items())[:limit]:
        t.add_row(pid, *(_num(r.get(c)) for c in cols))
    if len(rows) > limit:
        t.caption = f"{len(rows) - limit} more in --json"
    return t


def print_summary(s: dict[str, Any], console) -> None:
    """The end-of-run summary on the terminal (all figures also in --json)."""
    name = s["probe"]
    head = f"{name}: {s.get('duration_s'):g} s window, probes attached in {s.get('startup_s')} s"
    if s.get("lost_events"):
        head += f", {s['lost_events']} events lost"
    console.print(head)
    procs = s.get("processes") or {}
    if name in ("runqlat", "futex"):
        what = "run-queue latency" if name == "runqlat" else "futex waits"
        rows = {"all": s, **{f"pid {p}": r for p, r in procs.items()}}
        console.print(_latency_table(what, rows, s.get("unit", "us")))
        if name == "futex":
            for pid, r in list(procs.items())[:5]:
                console.print(_table(f"futex wait per thread, pid {pid}", r.get("threads") or {},
                                     ("comm", "waits", "wait_us"), limit=8))
    elif name == "offcpu":
        console.print(_table("time off CPU (us)", procs, ("comm", "blocked_us", "blocked_count",
                                                          "preempted_us", "preempted_count")))
    elif name == "switches":
        console.print(_table(f"context switches: {s['voluntary']} voluntary, "
                             f"{s['involuntary']} involuntary", procs,
                             ("comm", "voluntary", "involuntary")))
    elif name == "sockopt":
        console.print(_table("SO_RCVBUF", procs, ("comm", "setsockopt_rcvbuf", "bytes",
                                                  "locked_sockets", "autotuned_adjustments",
                                                  "tcp_pinned")))
    elif name == "mmsg":
        console.print(_table("datagram syscalls", procs, ("comm", "single_recv", "single_send",
                                                          "recvmmsg", "sendmmsg", "recv_batch",
                                                          "send_batch", "batch")))
    elif name == "malloc":
        console.print(_table("heap allocations", procs, ("calls", "per_s", "bytes")))
        for pid, r in procs.items():
            for a in r.get("allocators") or []:
                calls = (r.get("by_allocator") or {}).get(a["family"], 0)
                console.print(f"pid {pid}: {calls} calls into {a['family']} ({a['object']})",
                              markup=False, highlight=False)
            for why in r.get("unprobed") or []:
                console.print(f"pid {pid}: not probed: {why}", markup=False, highlight=False)
            for caller, n in list((r.get("callers") or {}).items())[:3]:
                console.print(f"pid {pid}: {n} x called from {caller}")
            for st in (r.get("top_stacks") or [])[:3]:
                console.print(f"pid {pid}: {st['count']} x " + " <- ".join(st["frames"][:6]))
    elif name == "softirq":
        console.print(_cpu_table(s.get("cpus") or {}))
    if not procs and name not in ("runqlat", "softirq"):
        console.print("nothing seen during the window")


def _cpu_table(cpus: dict[str, dict[str, Any]]):
    from rich.table import Table

    t = Table(title="NET_RX softirq per CPU")
    for c in ("cpu", "time_us", "runs", "max_us", "share"):
        t.add_column(c, justify="right")
    for cpu, r in cpus.items():
        t.add_row(cpu, *(_num(r.get(c)) for c in ("time_us", "runs", "max_us", "share")))
    return t
