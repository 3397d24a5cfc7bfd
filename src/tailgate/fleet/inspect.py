"""Fleet inspection: collect on every Ray node, judge centrally, one fleet view.

Each node runs the same collection `tailgate inspect --save` runs (a Ray task
pinned to the node: :func:`collect_here`) and sends back the snapshot document;
the driver judges every snapshot with one baseline (pure, as for one host) and
builds the fleet view (:func:`fleet_view`, pure): per layer how many hosts fail
and which, and the lowest failing layer of the fleet. All nodes collect in
parallel under one per-node time-out: a node that does not answer in time, or
whose task dies with it, is ``unknown`` with the reason, and the fleet run ends
on time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..model import LAYERS, Report
from .cluster import Node, pinned


def collect_here(interval_s: float, options: dict[str, Any], history: bool,
                 state: str | None) -> dict[str, Any]:
    """Runs on a node: this host's snapshot document (what --save writes)."""
    from ..collect import Scope, collect
    from ..host import Host

    host = Host("/")
    snap = collect(host, Scope(options=dict(options)), interval_s)
    if history:
        from ..history import attach_history

        attach_history(snap, state)
    return snap.to_json()


@dataclass(frozen=True)
class NodeSnapshot:
    node: Node
    snapshot: dict[str, Any] | None
    reason: str = ""  # why there is no snapshot


def collect_fleet(ray: Any, nodes: Sequence[Node], interval_s: float,
                  options: dict[str, Any], history: bool, state: str | None,
                  node_timeout_s: float) -> list[NodeSnapshot]:
    """Every node's snapshot, or why not, within ``node_timeout_s`` (all nodes in parallel)."""
    from ray.exceptions import RayError

    task = ray.remote(collect_here)
    refs = {task.options(max_retries=0, **pinned(ray, n)).remote(
        interval_s, options, history, state): n for n in nodes}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=node_timeout_s)
    out: dict[str, NodeSnapshot] = {}
    for ref in ready:
        node = refs[ref]
        try:
            out[node.id] = NodeSnapshot(node, ray.get(ref))
        except RayError as exc:
            first = next((t for t in str(exc).splitlines() if t.strip()), "")
            out[node.id] = NodeSnapshot(node, None, f"collection failed on the node: "
                                                    f"{type(exc).__name__}: {first[:200]}")
    for ref in late:
        out[refs[ref].id] = NodeSnapshot(refs[ref], None, f"no snapshot within "
                                         f"{node_timeout_s:g} s (node slow or unreachable)")
        try:
            ray.cancel(ref, force=True)
        except Exception:  # noqa: BLE001 - best effort: the node may be gone
            pass
    return [out[n.id] for n in nodes]


@dataclass(frozen=True)
class HostReport:
    """One node's outcome: its report, or why it has none."""

    node: Node
    report: Report | None
    reason: str = ""

    @property
    def name(self) -> str:
        host = self.report.host.get("hostname") if self.report else None
        return f"{self.node.address}" + (f" ({host})" if host else "")


def fleet_view(hosts: Sequence[HostReport],
               probes: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The fleet document (pure): per layer the failing hosts, the fleet's lowest failing
    layer, one row per host, the cross-node clock skew (``probes``: the round-trip clock
    readings of :func:`~tailgate.fleet.clock.probe_clocks`), and each host's report."""
    from .clock import clock_skew

    layers = {}
    for layer in LAYERS:
        by = {s: [h.node.address for h in hosts if h.report is not None and any(
            f.layer == layer and f.status == s for f in h.report.findings)]
            for s in ("fail", "warn", "unknown", "error")}
        layers[layer] = {"failing_hosts": len(by["fail"]), "failing": by["fail"],
                         "warn": by["warn"], "unknown": by["unknown"], "error": by["error"]}
    first = next((layer for layer in LAYERS if layers[layer]["failing"]), None)
    rows = []
    for h in hosts:
        if h.report is None:
            rows.append({**h.node.to_json(), "hostname": None, "status": "unknown",
                         "first_failing_layer": None, "counts": None, "reason": h.reason})
        else:
            v = h.report.verdict
            rows.append({**h.node.to_json(), "hostname": h.report.host.get("hostname"),
                         "status": v.status, "first_failing_layer": v.first_failing_layer,
                         "counts": v.counts, "reason": None})
    statuses = {r["status"] for r in rows}
    if "error" in statuses:
        status = "error"
    elif "fail" in statuses:
        status = "fail"
    elif "warn" in statuses:
        status = "warn"
    elif statuses & {"unknown", "incomplete"}:
        status = "incomplete"
    else:
        status = "pass"
    return {"tailgate_fleet": 1, "status": status, "first_failing_layer": first,
            "hosts_total": len(hosts),
            "hosts_unreachable": sum(1 for h in hosts if h.report is None),
            "layers": layers, "hosts": rows, "clock_skew": clock_skew(hosts, probes),
            "reports": [{"address": h.node.address, "node_id": h.node.id,
                         "report": h.report.to_json()} for h in hosts if h.report is not None]}


def deadline_for(interval_s: float, probe_window_s: float | None) -> float:
    """The default per-node time-out: the collection's own length plus 30 s."""
    return interval_s + (probe_window_s or 0.0) + 30.0

