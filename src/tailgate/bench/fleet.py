"""Many generators, one report: ``bench --ray ADDRESS`` (one target, its rate split over a
Ray cluster's nodes) and ``bench --scenario FILE`` (a scenario's targets at once, on this
host or on Ray). A :class:`FleetSpec` holds each target's checked
:class:`~.spec.BenchSpec`; :func:`run` plans their workers as the local runner does
(:func:`.runner.configs`), runs them together and judges each target's merged result with
the runner's last step (:func:`.runner.judge`); :func:`document` is what ``--json`` writes.

Single target on Ray: the bench JSON as on one host, plus ``nodes`` (one row per generator
node) and ``requests.lost``. A scenario (one host or Ray)::

    {"tailgate_scenario": 1, "scenario": FILE, "status": "pass"|"fail",
     "failed": [{"target", "expr"}], "lost": N, "targets": [{"name", ...bench JSON}]}
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any

from ..errors import UsageError
from .result import BenchResult
from .runner import configs, judge
from .spec import BenchSpec, spec_of

Section = tuple[str, BenchResult]  # a target's name and its judged result


@dataclass(frozen=True)
class FleetSpec:
    """The targets (name, checked spec), the scenario file they came from (None: one
    TARGET), and the Ray cluster with the nodes and workers per node to use (None: here)."""

    targets: tuple[tuple[str, BenchSpec], ...]
    scenario: str | None
    ray: str | None
    nodes: int | None
    per_node: int


def wanted(args: argparse.Namespace) -> bool:
    """Whether a parsed ``bench`` command line asks for many generators."""
    return bool(getattr(args, "ray", None) or getattr(args, "scenario", None)
                or getattr(args, "nodes", None) is not None
                or getattr(args, "per_node", 1) != 1)


def build(args: argparse.Namespace) -> FleetSpec:
    """The checked fleet of a parsed ``bench`` command line; a usage error names the option
    (or the scenario's file, line and target)."""
    for flag in ("log", "hdr", "html", "sweep", "confidence"):
        if getattr(args, flag, None):
            raise UsageError(f"--{flag} is not available with --ray or --scenario yet")
    if args.ray is None and (args.nodes is not None or args.per_node != 1):
        raise UsageError("--nodes and --per-node need --ray ADDRESS")
    if args.per_node < 1 or (args.nodes is not None and args.nodes < 1):
        raise UsageError("--nodes and --per-node must be >= 1")
    runs, scenario_targets = _runs(args)
    targets = []
    for i, (name, ns) in enumerate(runs):
        try:
            spec = spec_of(ns)
            if spec.protocol == "udp":  # one socket's loop of its own (bench.udp)
                raise UsageError("udp:// targets run alone, not with --ray or --scenario "
                                 "(yet): run `tailgate bench udp://...` for each")
        except UsageError as exc:
            if scenario_targets is None:
                raise
            raise UsageError(f"{scenario_targets[i].where(args.scenario)}: {exc}") from None
        targets.append((name, spec))
    return FleetSpec(tuple(targets), args.scenario, args.ray, args.nodes, args.per_node)


def _runs(args: argparse.Namespace) -> tuple[list[tuple[str, argparse.Namespace]], Any]:
    """(name, options) per target, and the scenario's targets (None for one TARGET)."""
    if not args.scenario:
        if args.target is None:
            raise UsageError("give TARGET or --scenario FILE")
        return [(args.target, args)], None
    if args.target is not None:
        raise UsageError("give TARGET or --scenario FILE, not both")
    from .scenario import ScenarioError, check_key, load_scenario, target_args

    try:
        targets = load_scenario(args.scenario)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    for t in targets:
        check_key(t, args.scenario)
    return [(t.name, target_args(args, t)) for t in targets], targets


def run(fleet: FleetSpec) -> list[Section]:
    """Run every target at once (here, or on the Ray cluster) and return each one's judged
    result, in the spec's order."""
    start_epoch_s = None
    if fleet.ray:
        sections, start_epoch_s = _on_ray(fleet)
    else:
        sections = _here(fleet)
    for (_, spec), (_, result) in zip(fleet.targets, sections, strict=True):
        judge(spec, result)
        if start_epoch_s is not None:  # the agreed start every node converted to its clock
            result.json["clock"] = {"start_epoch_s": start_epoch_s}
    return sections


def _here(fleet: FleetSpec) -> list[Section]:
    from .result import build_result, owed_by_worker
    from .workers import WorkerFailure, run_workers

    cfgs_all: list = []
    groups = []
    for _name, spec in fleet.targets:
        cfgs = [replace(c, worker=len(cfgs_all) + k) for k, c in enumerate(configs(spec))]
        groups.append({c.worker for c in cfgs})
        cfgs_all.extend(cfgs)
    try:
        results, interrupted, missing = run_workers(
            cfgs_all, ready_timeout_s=max(s.info.timeout_s for _, s in fleet.targets) + 30.0)
    except WorkerFailure as exc:
        raise UsageError(str(exc)) from None
    return [(name, build_result(spec.info, [r for r in results if r.worker in ids],
                                interrupted, [w for w in missing if w in ids],
                                owed=owed_by_worker(c for c in cfgs_all if c.worker in ids)))
            for (name, spec), ids in zip(fleet.targets, groups, strict=True)]


def _on_ray(fleet: FleetSpec) -> tuple[list[Section], float]:
    from ..fleet.cluster import connect, disconnect, live_nodes
    from .distributed import node_rows, place, renumber, run_on_ray, with_nodes
    from .result import build_result

    ray = connect(fleet.ray)
    try:
        nodes = live_nodes(ray)
        if fleet.nodes is not None:
            if fleet.nodes > len(nodes):
                raise UsageError(f"--nodes {fleet.nodes}: the cluster has {len(nodes)} live "
                                 "node(s)")
            nodes = nodes[:fleet.nodes]
        if not nodes:
            raise UsageError(f"--ray {fleet.ray}: no live node")
        n = len(nodes) * fleet.per_node
        placed_all: list = []
        groups = []
        for _name, spec in fleet.targets:
            info = replace(spec.info, workers=n, connections=max(spec.info.connections, n),
                           max_connections=max(spec.info.max_connections, n))
            placed = renumber(place(configs(spec, info), nodes, fleet.per_node),
                              len(placed_all))
            groups.append({p.cfg.worker for p in placed})
            placed_all.extend(placed)
        timeout = max(spec.info.timeout_s for _, spec in fleet.targets)
        ran = run_on_ray(ray, placed_all, ready_timeout_s=timeout + 30.0)
    finally:
        disconnect(ray)
    sections = []
    for (name, spec), ids in zip(fleet.targets, groups, strict=True):
        info = replace(spec.info, workers=n)
        mine = [(p, r) for p, r in ran.done if r.worker in ids]
        parts = [r for _, r in mine]
        result = build_result(info, parts, ran.interrupted)
        rows = node_rows(mine, [lo for lo in ran.lost if lo.placed.cfg.worker in ids],
                         result.json["duration_s"], ran.margins, info.duration_s)
        sections.append((name, with_nodes(result, rows, parts)))
    return sections, ran.start_epoch_s


def failed(sections: list[Section]) -> list[dict[str, str]]:
    """Each SLO a target failed: ``{"target", "expr"}``."""
    return [{"target": name, "expr": s["expr"]} for name, r in sections
            for s in r.json["slo"] if not s["pass"]]


def lost(sections: list[Section]) -> int:
    """Requests lost with their node (Ray)."""
    return sum(r.json["requests"].get("lost", 0) for _, r in sections)


def document(fleet: FleetSpec, sections: list[Section]) -> dict[str, Any]:
    """What ``--json`` writes: the bench JSON of one target, or the scenario's document."""
    if fleet.scenario is None:
        return sections[0][1].json
    bad, gone = failed(sections), lost(sections)
    return {"tailgate_scenario": 1, "scenario": fleet.scenario,
            "status": "fail" if bad or gone else "pass", "failed": bad, "lost": gone,
            "ray": fleet.ray, "targets": [{"name": n, **r.json} for n, r in sections]}
