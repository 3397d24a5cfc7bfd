"""`tailgate probe NAME`: kernel evidence from one eBPF probe (bpftrace), with a live progress
display while it samples and a summary at the end."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import UsageError
from ..outputs import check_writable, write_output
from ..service import existing_cgroup, existing_pids

NAMES = ("runqlat", "offcpu", "futex", "switches", "sockopt", "mmsg", "malloc", "softirq")
MAX_DURATION_S = 3600.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe",
        help="collect kernel evidence with an eBPF probe (bpftrace, root)",
        description="Run one eBPF probe (a bpftrace program shipped with tailgate) for a "
        "while and summarise what it saw. Needs root, bpftrace and a mounted tracefs. "
        "Probes: runqlat (run-queue latency P50..P999), offcpu (blocked vs preempted time), "
        "futex (lock waits per thread), switches (voluntary vs involuntary), sockopt "
        "(SO_RCVBUF pinning), mmsg (datagram syscall batching), malloc (heap allocations of "
        "--pid, with stacks), softirq (NET_RX time per CPU).",
    )
    p.add_argument("name", choices=NAMES, metavar="NAME", help=" | ".join(NAMES))
    p.add_argument("--duration", type=float, default=5.0, metavar="SECONDS",
                   help="how long to sample (default 5)")
    p.add_argument("--pid", action="append", default=[], metavar="PID",
                   help="only this process (repeatable, at most 8)")
    p.add_argument("--cgroup", metavar="PATH",
                   help="only the processes of this cgroup (a directory, or a path inside the "
                   "cpu hierarchy)")
    p.add_argument("--json", metavar="FILE|-", help="write the summary as JSON ('-' for stdout)")
    p.add_argument("--print-program", action="store_true",
                   help="print the bpftrace program and the command line, and exit")
    p.set_defaults(func=run)


def _request(args: argparse.Namespace, host):
    from ..probes import MAX_PIDS, Request

    if not 0 < args.duration <= MAX_DURATION_S:
        raise UsageError(f"--duration must be between 0 and {MAX_DURATION_S:g} seconds")
    pids = existing_pids(host, args.pid)
    keep = None
    if args.cgroup:
        if pids:
            raise UsageError("give --pid or --cgroup, not both")
        from ..model import SourceError
        from ..sources.cgroup import cgroup_members

        path = existing_cgroup(host, args.cgroup)
        try:
            members = cgroup_members(host, path)
        except SourceError as exc:
            raise UsageError(f"--cgroup {args.cgroup}: {exc}") from exc
        if not members:
            raise UsageError(f"--cgroup {args.cgroup}: no processes in it")
        keep = members
        if len(members) <= MAX_PIDS:
            pids = tuple(sorted(members))
    req = Request(args.name, args.duration, pids, keep)
    try:
        run = req.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return req, run


def run(args: argparse.Namespace) -> int:
    from ..host import Host
    from ..model import SourceError
    from ..probes import driver, measure

    host = Host("/")
    req, bt = _request(args, host)
    if args.print_program:
        if args.name == "malloc":
            return _print_malloc_program(req)
        print(f"# {' '.join(bt.argv())}")
        print(driver.program_text(args.name), end="")
        return 0
    reason = driver.unavailable(host)
    if reason:
        raise UsageError(f"cannot probe: {reason}")
    check_writable(args.json)

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    err = Console(stderr=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                  TextColumn("{task.fields[phase]}"), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(f"probe {args.name}", total=args.duration, phase="attaching")

        def progress(phase: str, sampled: float) -> None:
            bar.update(task, completed=sampled, phase=phase)

        try:
            summary = measure(req, progress)
        except SourceError as exc:
            raise UsageError(f"probe {args.name} failed: {exc}") from exc
    if summary.get("not_run"):  # malloc: no allocator of the target could be probed
        why = "; ".join(f"pid {pid}: {w}" for pid, r in summary["processes"].items()
                        for w in r.get("unprobed") or [])
        raise UsageError(f"cannot probe {args.name}: {why}")
    if args.json:
        write_output(args.json, json.dumps(summary, indent=1) + "\n")
    if args.json != "-":
        print_summary(summary, Console())
    return 0


def _print_malloc_program(req) -> int:
    """The malloc program is generated for the target's allocators: show it and what it
    could not probe."""
    from ..probes import prepare

    run, context = prepare(req)
    for pid, found in context["allocators"].items():
        for a in found["allocators"]:
            print(f"# pid {pid}: {a['family']} in {a['object']}")
        for why in found["unprobed"]:
            print(f"# pid {pid}: not probed: {why}")
    if run is None:
        raise UsageError("cannot probe: no allocator of "
                         f"{', '.join(map(str, req.pids))} can be probed")
    print(f"# bpftrace -f json -e PROGRAM {' '.join(run.params())}")
    print(run.text, end="")
    return 0


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
