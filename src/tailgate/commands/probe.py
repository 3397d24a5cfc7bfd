"""`tailgate probe NAME`: kernel evidence from one eBPF probe (bpftrace), with a live progress
display while it samples and a summary at the end."""

from __future__ import annotations

import argparse
import json

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
        from ..report.probe_render import print_summary

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
