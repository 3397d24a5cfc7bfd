"""`tailgate bench ... --ray ADDRESS` and `--scenario FILE.yaml`: many generators, one report.

Single target on Ray: the bench JSON as on one host, plus ``nodes`` (one row
per generator node) and ``requests.lost``. A scenario (one host or Ray)::

    {"tailgate_scenario": 1, "scenario": FILE, "status": "pass"|"fail",
     "failed": [{"target", "expr"}], "lost": N, "targets": [{"name", ...bench JSON}]}
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from ..errors import UsageError
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


def wanted(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "ray", None) or getattr(args, "scenario", None)
                or getattr(args, "nodes", None) is not None
                or getattr(args, "per_node", 1) != 1)


def _check_key(t: Any, path: str) -> None:
    """Per-key checks, so an error names the key's own line."""
    from ..bench.schedule import ARRIVALS, parse_ramp
    from ..bench.slo import SloError, parse_slo
    from ..bench.spec import parse_size
    from ..bench.target import TargetError, parse_header
    from ..bench.units import parse_duration, parse_rate

    def rate_or_ramp(text: str) -> None:
        if parse_ramp(text) is None:
            parse_rate(text)

    checks = {"rate": rate_or_ramp, "duration": parse_duration, "warmup": parse_duration,
              "timeout": parse_duration, "max_header_bytes": parse_size,
              "max_body_bytes": parse_size, "max_event_bytes": parse_size}
    llm = str(t.options.get("url", "")).startswith("openai+")
    for key, val in t.options.items():
        try:
            if key in checks:
                checks[key](str(val))
            elif key == "slo" and not llm:  # LLM SLOs (ttft_p99...) are the engine's to parse
                for e in val:
                    parse_slo(e)
            elif key == "header":
                for h in val:
                    parse_header(h)
            elif key == "arrival" and val not in ARRIVALS:
                raise ValueError(f"expected {', '.join(ARRIVALS[:-1])} or {ARRIVALS[-1]}, "
                                 f"not {val!r}")
            elif key == "burstiness" and not 1e-3 <= float(val) <= 1e3:
                raise ValueError(f"expected a gamma shape between 0.001 and 1000, not {val!r}")
        except (ValueError, SloError, TargetError) as exc:
            raise UsageError(f"{t.where(path, key)}: {exc}") from None


def _runs(args: argparse.Namespace) -> tuple[list[tuple[str, argparse.Namespace]], Any]:
    """(name, options) per target, and the scenario's targets (None for one TARGET)."""
    if not args.scenario:
        if args.target is None:
            raise UsageError("give TARGET or --scenario FILE")
        return [(args.target, args)], None
    if args.target is not None:
        raise UsageError("give TARGET or --scenario FILE, not both")
    from ..bench.scenario import ScenarioError, load_scenario, target_args

    try:
        targets = load_scenario(args.scenario)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    for t in targets:
        _check_key(t, args.scenario)
    return [(t.name, target_args(args, t)) for t in targets], targets


def run_fleet(args: argparse.Namespace) -> int:
    from ..bench.result import build_result, owed_by_worker
    from ..bench.slo import evaluate
    from ..bench.workers import WorkerFailure, plan, run_workers
    from .bench import spec_of

    for flag in ("log", "hdr", "html", "sweep", "confidence"):
        if getattr(args, flag, None):
            raise UsageError(f"--{flag} is not available with --ray or --scenario yet")
    if args.ray is None and (args.nodes is not None or args.per_node != 1):
        raise UsageError("--nodes and --per-node need --ray ADDRESS")
    if args.per_node < 1 or (args.nodes is not None and args.nodes < 1):
        raise UsageError("--nodes and --per-node must be >= 1")
    runs, scenario_targets = _runs(args)
    check_writable(args.json)

    parsed = []
    plans = []  # per target: how workers.plan splits it (the schedule and protocol extras)
    for i, (name, ns) in enumerate(runs):
        try:
            spec = spec_of(ns)
            if spec.protocol == "udp":  # one socket's loop of its own (bench.udp)
                raise UsageError("udp:// targets run alone, not with --ray or --scenario "
                                 "(yet): run `tailgate bench udp://...` for each")
            parsed.append((name, spec.info, spec.target, list(spec.slos)))
            plans.append({"schedule": spec.schedule, **spec.engine_fields})
        except UsageError as exc:
            if scenario_targets is None:
                raise
            raise UsageError(f"{scenario_targets[i].where(args.scenario)}: {exc}") from None

    ray = None
    if args.ray:
        from ..bench.distributed import place, renumber, run_on_ray
        from ..fleet.cluster import connect, disconnect, live_nodes

        ray = connect(args.ray)
        try:
            nodes = live_nodes(ray)
            if args.nodes is not None:
                if args.nodes > len(nodes):
                    raise UsageError(f"--nodes {args.nodes}: the cluster has {len(nodes)} live "
                                     "node(s)")
                nodes = nodes[:args.nodes]
            if not nodes:
                raise UsageError(f"--ray {args.ray}: no live node")
            placed_all = []
            groups: list[list[int]] = []
            for gi, (_name, info, target, _slos) in enumerate(parsed):
                n = len(nodes) * args.per_node
                info2 = replace(info, workers=n, connections=max(info.connections, n),
                                max_connections=max(info.max_connections, n))
                cfgs = plan(info2, target, **plans[gi])
                placed = renumber(place(cfgs, nodes, args.per_node), len(placed_all))
                groups.append([p.cfg.worker for p in placed])
                placed_all.extend(placed)
            timeout = max(info.timeout_s for _, info, _, _ in parsed)
            ran = run_on_ray(ray, placed_all, ready_timeout_s=timeout + 30.0)
        finally:
            disconnect(ray)
        infos = [replace(info, workers=len(nodes) * args.per_node) for _, info, _, _ in parsed]
    else:
        cfgs_all = []
        groups = []
        for gi, (_name, info, target, _slos) in enumerate(parsed):
            cfgs = [replace(c, worker=len(cfgs_all) + k)
                    for k, c in enumerate(plan(info, target, **plans[gi]))]
            groups.append([c.worker for c in cfgs])
            cfgs_all.extend(cfgs)
        try:
            results, interrupted, missing = run_workers(
                cfgs_all, ready_timeout_s=max(i.timeout_s for _, i, _, _ in parsed) + 30.0)
        except WorkerFailure as exc:
            raise UsageError(str(exc)) from None
        infos = [info for _, info, _, _ in parsed]

    sections = []
    for gi, (name, _info, _target, slos) in enumerate(parsed):
        info = infos[gi]
        ids = set(groups[gi])
        if ray is not None:
            from ..bench.distributed import node_rows, with_nodes

            mine = [(p, r) for p, r in ran.done if r.worker in ids]
            my_lost = [lo for lo in ran.lost if lo.placed.cfg.worker in ids]
            parts = [r for _, r in mine]
            result = build_result(info, parts, ran.interrupted)
            rows = node_rows(mine, my_lost, result.json["duration_s"], ran.margins,
                             info.duration_s)
            result = with_nodes(result, rows, parts)
        else:
            parts = [r for r in results if r.worker in ids]
            result = build_result(info, parts, interrupted,
                                  [w for w in missing if w in ids],
                                  owed=owed_by_worker(c for c in cfgs_all if c.worker in ids))
        if getattr(args, "percentiles", None):
            from ..bench.result import add_percentiles

            add_percentiles(result, args.percentiles)
        result.json["slo"] = evaluate(slos, result.json)
        if ray is not None:  # the agreed start every node converted to its own clock
            result.json["clock"] = {"start_epoch_s": ran.start_epoch_s}
        sections.append((name, result))
    return _report(args, sections, scenario_targets is not None)


def _report(args: argparse.Namespace, sections: list, scenario: bool) -> int:
    from ..bench.distributed import nodes_text
    from ..bench.result import summary_text

    stream = sys.stderr if args.json == "-" else sys.stdout
    failed = [{"target": name, "expr": s["expr"]} for name, r in sections
              for s in r.json["slo"] if not s["pass"]]
    lost = sum(r.json["requests"].get("lost", 0) for _, r in sections)
    if scenario:
        doc: dict[str, Any] = {
            "tailgate_scenario": 1, "scenario": args.scenario,
            "status": "fail" if failed or lost else "pass", "failed": failed, "lost": lost,
            "ray": args.ray, "targets": [{"name": n, **r.json} for n, r in sections]}
    else:
        doc = sections[0][1].json
    if args.json:
        write_output(args.json, json.dumps(doc, indent=2) + "\n")
    for name, r in sections:
        if scenario:
            print(f"== target {name} ==", file=stream)
        print(summary_text(r, spectrum=args.spectrum, columns=[
            n for n, _ in getattr(args, "percentiles", None) or ()] or None), file=stream)
        if "nodes" in r.json:
            print(nodes_text(r.json["nodes"]), file=stream)
        if scenario:
            print(file=stream)
    if scenario:
        verdict = "FAIL" if failed or lost else "PASS"
        why = "; ".join(f"{f['target']}: {f['expr']}" for f in failed)
        if lost:
            why = "; ".join(x for x in (why, f"{lost} request(s) lost with their node") if x)
        print(f"mixed peak ({len(sections)} targets): {verdict}" + (f" ({why})" if why else ""),
              file=stream)
    elif failed:
        print("SLO failed: " + ", ".join(f["expr"] for f in failed), file=stream)
    from .bench import no_success

    nothing = [(name, why) for name, r in sections if (why := no_success(r.json))]
    for name, why in nothing:
        print(f"tailgate bench: {name + ': ' if scenario else ''}{why}", file=sys.stderr)
    if any(r.json["interrupted"] for _, r in sections):
        return 130
    return 1 if failed or lost or nothing else 0
