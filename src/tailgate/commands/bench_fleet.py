"""`tailgate bench ... --ray ADDRESS` and `--scenario FILE.yaml`: many generators, one
report. The fleet is ``tailgate.bench.fleet``'s (spec, run, document); this module holds its
options and the call; its text is report/bench_text's."""

from __future__ import annotations

import argparse
import json
import sys

from ..outputs import check_writable, write_output


def add_fleet_options(p: argparse.ArgumentParser) -> None:
    # TARGET is not given with --scenario (the file names the targets): optional here, so
    # the positional's own definition stays as the bench command declares it.
    for action in p._actions:
        if action.dest == "target":
            action.nargs = "?"
    g = p.add_argument_group("many generators (Ray) and scenarios")
    g.add_argument("--ray", metavar="ADDRESS",
                   help="run the load from the nodes of the Ray cluster at ADDRESS (HOST:PORT "
                   "of the head, or auto): one worker per node, the rate split, one agreed "
                   "start, histograms merged exactly, a row per node; needs "
                   "pip install 'tailgate[ray]'")
    g.add_argument("--nodes", type=int, metavar="N",
                   help="with --ray: use N of the live nodes (default: all)")
    g.add_argument("--per-node", type=int, default=1, metavar="K",
                   help="with --ray: K load workers on each node (default 1)")
    g.add_argument("--scenario", metavar="FILE",
                   help="run the targets of a YAML scenario at once, each with its own "
                   "url, rate, duration, request options and SLOs; one report with a section "
                   "per target and one verdict (on this host, or with --ray on the cluster)")


def run_fleet(args: argparse.Namespace) -> int:
    from ..bench import fleet
    from ..report.bench_text import fleet_text
    from ..slo import no_success

    spec = fleet.build(args)
    check_writable(args.json)
    sections = fleet.run(spec)
    if args.json:
        write_output(args.json, json.dumps(fleet.document(spec, sections), indent=2) + "\n")
    scenario = spec.scenario is not None
    failed, lost = fleet.failed(sections), fleet.lost(sections)
    stream = sys.stderr if args.json == "-" else sys.stdout
    text = fleet_text(sections, scenario, failed, lost, spectrum=args.spectrum, columns=[
        n for n, _ in getattr(args, "percentiles", None) or ()] or None)
    if text:
        print(text, file=stream)
    nothing = [(name, why) for name, r in sections if (why := no_success(r.json))]
    for name, why in nothing:
        print(f"tailgate bench: {name + ': ' if scenario else ''}{why}", file=sys.stderr)
    if any(r.json["interrupted"] for _, r in sections):
        return 130
    return 1 if failed or lost or nothing else 0
