"""`tailgate inspect --ray ADDRESS`: every node of a Ray cluster collected, judged here.

Exit status as for one host, over every host: 3 when a host's report has an
error finding, 1 when a host has a finding at or above ``--fail-on`` (a host
without a snapshot counts as ``unknown``), else 0.
"""

from __future__ import annotations

import argparse

from ..errors import EXIT_BUG, EXIT_GATE, EXIT_OK, UsageError
from ..outputs import check_writable, write_output

HOST_ONLY = ("pid", "cgroup", "dpdk", "engine", "dcgm", "memory_stats", "from_file", "save")
# why --save is one host's: it writes one snapshot; the fleet's snapshots are in --json


def add_fleet_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fleet (Ray)")
    g.add_argument("--ray", metavar="ADDRESS",
                   help="inspect every node of the Ray cluster at ADDRESS (HOST:PORT of the "
                   "head, or auto): each collects, this host judges, and a fleet view says per "
                   "layer which hosts fail; needs pip install 'tailgate[ray]'")
    g.add_argument("--node-timeout", type=float, metavar="SECONDS",
                   help="with --ray: a node without a snapshot this long after the start is "
                   "unknown (default: --interval + --probe-window + 30)")


def run_fleet(args: argparse.Namespace) -> int:
    from ..baseline import default_baseline, load_baseline, required_ids
    from ..fleet.cluster import connect, disconnect, live_nodes
    from ..fleet.inspect import (
        HostReport,
        collect_fleet,
        deadline_for,
        fleet_view,
    )
    from ..model import Snapshot
    from ..report.fleet_render import fleet_junit, fleet_text
    from ..verdict import exit_status, judged_report, log_errors

    for name in HOST_ONLY:
        if getattr(args, name, None):
            flag = "--from" if name == "from_file" else "--" + name.replace("_", "-")
            raise UsageError(f"{flag} names one host's things: not with --ray")
    if args.root != "/":
        raise UsageError("--root is one host's: not with --ray")
    if args.interval < 0:
        raise UsageError("--interval must be >= 0")
    window = args.probe_window
    if window is not None and not 0 < window <= 3600:
        raise UsageError("--probe-window must be between 0 and 3600 seconds")
    timeout = args.node_timeout if args.node_timeout is not None else deadline_for(
        args.interval, window)
    if timeout <= 0:
        raise UsageError("--node-timeout must be > 0")
    baseline = load_baseline(args.baseline) if args.baseline else default_baseline()
    required = required_ids(args.require, baseline)
    check_writable(args.json, args.junit, args.html)
    if args.iface:
        raise UsageError("--iface names one host's interfaces: not with --ray (each node "
                         "inspects all its non-loopback interfaces)")

    ray = connect(args.ray)
    try:
        nodes = live_nodes(ray)
        if not nodes:
            raise UsageError(f"--ray {args.ray}: no live node")
        got = collect_fleet(ray, nodes, args.interval, {} if not window else
                            {"probe_window": window}, not args.no_history, args.state, timeout)
        from ..fleet.clock import probe_clocks

        probes = probe_clocks(ray, [ns.node for ns in got if ns.snapshot is not None])
    finally:
        disconnect(ray)

    hosts = []
    for ns in got:
        if ns.snapshot is None:
            hosts.append(HostReport(ns.node, None, ns.reason))
            continue
        snap = Snapshot.from_json(ns.snapshot)
        report = judged_report(snap, baseline, required, getattr(args, "platform", None))
        log_errors(report)
        hosts.append(HostReport(ns.node, report))
    view = fleet_view(hosts, probes)
    if args.json:
        from ..safe import strict_json

        write_output(args.json, strict_json(view, indent=1) + "\n")
    if args.junit:
        write_output(args.junit, fleet_junit(hosts))
    if args.html:
        from ..report.fleet_html import render_fleet_html

        write_output(args.html, render_fleet_html(view, hosts))
    if not args.quiet and args.json != "-":
        print(fleet_text(view))
    codes = [exit_status(h.report, args.fail_on) for h in hosts if h.report is not None]
    if EXIT_BUG in codes:
        return EXIT_BUG
    if EXIT_GATE in codes or (args.fail_on == "unknown" and view["hosts_unreachable"]):
        return EXIT_GATE
    return EXIT_OK
