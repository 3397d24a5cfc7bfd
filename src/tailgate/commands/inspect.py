"""`tailgate inspect`: collect -> judge -> verdict -> render, and the CI exit status."""

from __future__ import annotations

import argparse
import contextlib
import os

from ..errors import UsageError
from ..outputs import check_writable, write_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="inspect a host against the red lines (pyramid report, JSON, JUnit, HTML)",
        description="Inspect this host (or a host root, or a saved snapshot) against the red "
        "lines of every layer and name the lowest failing layer: fix that one first.",
    )
    p.add_argument("--pid", action="append", default=[], metavar="PID",
                   help="a latency-critical process (repeatable)")
    p.add_argument("--cgroup", metavar="PATH",
                   help="the service's cgroup: a directory, or a path inside the cpu hierarchy")
    p.add_argument("--iface", action="append", default=[], metavar="IFACE",
                   help="the service's network interface (repeatable; default: all non-loopback)")
    p.add_argument("--dpdk", action="append", default=[], metavar="PREFIX",
                   help="a DPDK process's --file-prefix to read through its telemetry socket "
                   "(repeatable; default: every one under /var/run/dpdk and "
                   "$XDG_RUNTIME_DIR/dpdk)")
    p.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between the two counter samples (default 5)")
    p.add_argument("--probe-window", type=float, metavar="SECONDS",
                   help="also run the eBPF probes (runqlat, sockopt, mmsg, malloc for --pid, "
                   "softirq) for this many seconds and judge from them (root, bpftrace)")
    p.add_argument("--baseline", metavar="FILE", help="YAML file overriding red lines per id")
    p.add_argument("--platform", choices=("auto", "baremetal", "vm", "container"),
                   help="what the host is (default: the baseline's `platform`, else auto: "
                   "detected): on a vm the hardware checks of L1 are skipped, their hardware "
                   "belongs to the hypervisor; baremetal judges them anyway")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="read a host root mounted here instead of / (captured command "
                   "outputs under DIR/commands/)")
    p.add_argument("--state", metavar="DIR",
                   help="directory of the counter history (default: the XDG state directory, "
                   "~/.local/state/tailgate): each run's counters are kept there and per-hour "
                   "rates are computed against the last run of the same host")
    p.add_argument("--no-history", action="store_true",
                   help="neither read nor store the counter history (rates over --interval only)")
    p.add_argument("--save", metavar="FILE", help="write the collected snapshot as JSON")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="judge a saved snapshot instead of collecting")
    p.add_argument("--json", metavar="FILE|-", help="write the JSON report ('-' for stdout)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testcase per finding)")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--fail-on", choices=("fail", "warn", "unknown"), default="fail",
                   help="exit 1 when any finding is at or above this status: fail, warn "
                   "(warn or fail) or unknown (anything not measured, warn or fail); "
                   "default fail")
    p.add_argument("--require", action="extend", nargs="+", default=[], metavar="ID",
                   help="check ids that must be measured: exit 1 when one is unknown or "
                   "skipped (repeatable; also `required: true` per id in the baseline)")
    p.add_argument("--quiet", action="store_true", help="no terminal report")
    p.add_argument("--all", action="store_true", dest="all_findings",
                   help="print every finding in full (by default: fail, warn, unknown and "
                   "error in full, a pass as one line, each layer's skips as one line)")
    p.add_argument("--engine", metavar="URL",
                   help="an inference engine's Prometheus endpoint (vLLM, SGLang), e.g. "
                   "http://127.0.0.1:8000/metrics, scraped at both ends of the interval; "
                   "or a saved scrape file")
    p.add_argument("--dcgm", metavar="URL",
                   help="a DCGM exporter's /metrics (e.g. http://127.0.0.1:9400/metrics) or a "
                   "saved scrape: GPU health when neither NVML nor nvidia-smi answers")
    p.add_argument("--memory-stats", metavar="FILE",
                   help="torch.cuda.memory_stats() dumped as JSON, for GPU memory fragmentation")
    from .inspect_fleet import add_fleet_options

    add_fleet_options(p)
    p.set_defaults(func=run)


def scope_options(args: argparse.Namespace) -> dict:
    """The options of a parsed command line that name what to inspect (collect.scope_of)."""
    from ..service import SCOPE_OPTIONS

    return {k: getattr(args, k) for k in SCOPE_OPTIONS if getattr(args, k, None) is not None}


def snapshot_for(args: argparse.Namespace):
    if args.from_file:
        from ..userfiles import UserFileError, load_snapshot

        try:
            return load_snapshot(args.from_file)
        except UserFileError as exc:
            raise UsageError(str(exc)) from exc

    from ..collect import collect
    from ..host import Host
    from ..service import scope_of

    if args.interval < 0:
        raise UsageError("--interval must be >= 0")
    if not os.path.isdir(args.root):
        raise UsageError(f"--root {args.root}: not a directory")
    host = Host(args.root)
    scope = scope_of(host, **scope_options(args))
    with progress_display(args) as on_phase:
        snap = collect(host, scope, args.interval, on_phase)
    if not args.no_history:
        from ..history import HistoryError, HistoryUnavailable, attach_history

        try:
            attach_history(snap, args.state)
        except HistoryUnavailable as exc:  # a read-only $HOME must not stop an inspection
            import sys

            print(f"tailgate inspect: counter history unavailable: {exc}; running without it "
                  "(rates over --interval only; --state DIR to keep one, --no-history to "
                  "silence this)", file=sys.stderr)
        except HistoryError as exc:
            raise UsageError(f"counter history: {exc} (--no-history skips it)") from exc
    return snap


@contextlib.contextmanager
def progress_display(args: argparse.Namespace):
    """What inspect is doing and how far, on stderr (rich); nothing when stderr is not a
    terminal, with --quiet, or when the report itself goes to stdout (--json -)."""
    import sys

    if getattr(args, "quiet", False) or not sys.stderr.isatty() or args.json == "-":
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("tailgate inspect: {task.description}"), BarColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = bar.add_task("starting", total=None)

    def on_phase(what: str, done: float | None) -> None:
        bar.update(task, description=what, total=None if done is None else 1.0,
                   completed=done or 0.0)

    with bar:
        yield on_phase


def run(args: argparse.Namespace) -> int:
    if getattr(args, "ray", None):  # the fleet: every Ray node collects, judged here
        from .inspect_fleet import run_fleet

        return run_fleet(args)
    from ..baseline import default_baseline, load_baseline, required_ids
    from ..verdict import exit_status, judged_report, log_errors

    baseline = load_baseline(args.baseline) if args.baseline else default_baseline()
    required = required_ids(args.require, baseline)

    check_writable(args.save, args.json, args.junit, args.html)
    snap = snapshot_for(args)
    if args.save:
        from ..safe import strict_json

        write_output(args.save, strict_json(snap.to_json(), indent=1, sort_keys=True) + "\n")

    report = judged_report(snap, baseline, required, args.platform)
    log_errors(report)

    if args.json:
        from ..report.json_report import render_json

        write_output(args.json, render_json(report))
    if args.junit:
        from ..report.junit import render_junit

        write_output(args.junit, render_junit(report))
    if args.html:
        from ..report.html import render_html

        write_output(args.html, render_html(report))
    if not args.quiet and args.json != "-":
        from ..report.terminal import print_report

        print_report(report, all_findings=args.all_findings)
    return exit_status(report, args.fail_on)
