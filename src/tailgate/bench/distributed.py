"""The bench across a Ray cluster: one engine per (node, slot), one start time, exact merge.

Theory of operation
-------------------
The run is planned exactly as on one host (:func:`.workers.plan` with
``workers = nodes x per_node``): worker ``k`` gets every n-th request of the one
schedule, so the shares add up to the schedule asked for. Worker ``k`` runs on
node ``k // per_node`` in a Ray actor pinned there (:mod:`tailgate.fleet.cluster`),
which does what a worker process does (:func:`.workers.run_here`): it opens its
initial connections (``prepare``), then runs its share from a start time.

The start time is agreed as wall-clock time (``time.time()``, the only clock
hosts share, kept close by NTP/PTP) a little ahead of the last "ready"; each
actor converts it to its own CLOCK_MONOTONIC once, so its schedule runs on the
monotonic clock like any worker's. Clock offset between hosts shows up as
lateness or as a shifted start, never as a wrong latency (latency is measured
on one host's clock).

Every worker returns a :class:`.engine.WorkerResult`; the results merge exactly
(:func:`.result.build_result`, histograms add). A worker that does not return —
its node died (raylet killed, host lost), its actor crashed, or it is still
silent past the run's end plus a grace period — is *lost*: every measured
request of its share is counted in ``requests.lost`` (so ``scheduled == sent +
abandoned + lost``), its node is named with the reason, and none of its
partial measurements are used (they never reached us).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..fleet.cluster import Node, pinned
from ..hist import Histogram, encode, merged
from .engine_types import EngineConfig, WorkerResult
from .outcome import ERROR_KINDS, KINDS
from .recording import LoadEngine
from .result import BenchResult, accounting, warnings

START_LEAD_S = 1.0  # agreed start this far after the last "ready": the "go" call's latency
GRACE_S = 10.0  # after the run's end plus the time-out, a silent worker is lost


class LoadWorker:
    """The Ray actor body: one engine (compiled where it applies, as on one host), prepared,
    then started at an agreed wall-clock time."""

    def __init__(self) -> None:
        self.engine: LoadEngine | None = None

    def prepare(self, cfg: EngineConfig) -> bool:
        from .workers import make_engine

        self.engine = make_engine(cfg)
        self.engine.prepare()
        return True

    def run(self, start_epoch_s: float) -> tuple[WorkerResult, float]:
        """(what it measured, how long before the agreed start the "go" arrived, s)."""
        assert self.engine is not None, "prepare() first"
        # The one conversion from the shared wall clock to this host's monotonic clock.
        start = time.monotonic() + (start_epoch_s - time.time())
        margin = start - time.monotonic()  # < 0: the go came late; lateness shows it
        try:
            return self.engine.run(start), margin
        finally:
            self.engine.close()

    def stop(self) -> None:
        """Ctrl-C on the driver: stop issuing; ``run`` returns what was measured (the actor
        serves two calls at once, so this one arrives while ``run`` is busy)."""
        if self.engine is not None:
            self.engine.stop()


@dataclass(frozen=True)
class Placed:
    """One worker's share on its node."""

    node: Node
    cfg: EngineConfig

    @property
    def owed(self) -> int:
        """Measured requests of this share (warm-up excluded): what it owes the run."""
        return int(np.count_nonzero(np.asarray(self.cfg.times) >= self.cfg.warmup_s))


@dataclass(frozen=True)
class Lost:
    """A worker that returned nothing: its node, its share and why."""

    placed: Placed
    reason: str


def place(cfgs: Sequence[EngineConfig], nodes: Sequence[Node], per_node: int) -> list[Placed]:
    """Worker k on node k // per_node (``len(cfgs) == len(nodes) * per_node``)."""
    if len(cfgs) != len(nodes) * per_node:
        raise ValueError(f"{len(cfgs)} workers for {len(nodes)} nodes x {per_node}")
    return [Placed(nodes[k // per_node], cfg) for k, cfg in enumerate(cfgs)]


def renumber(placed: Sequence[Placed], first: int = 0) -> list[Placed]:
    """Unique worker ids across several runs launched together (a scenario)."""
    return [replace(p, cfg=replace(p.cfg, worker=first + i)) for i, p in enumerate(placed)]


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = next((t for t in text if t.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {first[:200]}"


@dataclass
class RayRun:
    """What came back: results (with each worker's start margin), lost workers, the start."""

    done: list[tuple[Placed, WorkerResult]]
    lost: list[Lost]
    start_epoch_s: float
    margins: dict[int, float]  # worker -> seconds between the "go" arriving and the start
    interrupted: bool = False


def run_on_ray(ray: Any, placed: Sequence[Placed], ready_timeout_s: float = 60.0,
               grace_s: float = GRACE_S) -> RayRun:
    """Run every share on its node (Ctrl-C stops them all and keeps what they measured)."""
    from ray.exceptions import RayError

    actor_cls = ray.remote(LoadWorker)
    # Two calls at once: `stop` must reach an actor that is busy in `run`.
    actors = [actor_cls.options(max_restarts=0, max_concurrency=2, **pinned(ray, p.node))
              .remote() for p in placed]
    lost: list[Lost] = []
    done: list[tuple[Placed, WorkerResult]] = []
    margins: dict[int, float] = {}
    start_epoch = time.time()
    interrupted = False
    try:
        preps = {actors[i].prepare.remote(p.cfg): i for i, p in enumerate(placed)}
        ready, late = ray.wait(list(preps), num_returns=len(preps), timeout=ready_timeout_s)
        going: list[int] = []
        for ref in ready:
            i = preps[ref]
            try:
                ray.get(ref)
                going.append(i)
            except RayError as exc:
                lost.append(Lost(placed[i], f"could not start: {_why(exc)}"))
        for ref in late:
            lost.append(Lost(placed[preps[ref]],
                             f"not ready within {ready_timeout_s:g} s (node unreachable?)"))
        start_epoch = time.time() + START_LEAD_S
        runs = {actors[i].run.remote(start_epoch): i for i in sorted(going)}
        longest = max((float(placed[i].cfg.times[-1]) for i in going
                       if placed[i].cfg.times.size), default=0.0)
        longest_timeout = max((placed[i].cfg.timeout_s for i in going), default=0.0)
        deadline = start_epoch + longest + longest_timeout + grace_s
        pending = list(runs)
        while pending:
            left = deadline - time.time()
            if left <= 0:
                break
            try:
                ready, pending = ray.wait(pending, num_returns=1, timeout=min(left, 1.0))
            except KeyboardInterrupt:
                if interrupted:  # a second Ctrl-C: stragglers are lost soon
                    deadline = min(deadline, time.time() + 2.0)
                    continue
                interrupted = True
                for i in runs.values():
                    actors[i].stop.remote()
                deadline = min(deadline, time.time() + 10.0)
                continue
            for ref in ready:
                i = runs[ref]
                try:
                    result, margin = ray.get(ref)
                    done.append((placed[i], result))
                    margins[result.worker] = margin
                except RayError as exc:
                    lost.append(Lost(placed[i], _why(exc)))
        for ref in pending:
            lost.append(Lost(placed[runs[ref]], f"no result within {grace_s:g} s after the "
                                                "run's end (node unreachable or stalled?)"))
    finally:
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - an actor already gone with its node
                pass
    done.sort(key=lambda x: x[1].worker)
    return RayRun(done, lost, start_epoch, margins, interrupted)


def node_rows(done: Sequence[tuple[Placed, WorkerResult]], lost: Sequence[Lost],
              window_s: float, margins: dict[int, float] | None = None,
              duration_s: float | None = None) -> list[dict[str, Any]]:
    """One row per node: what it was asked (its share over ``duration_s``), what it
    achieved (dispatched over the run's ``window_s``), its tail and errors (pure)."""
    asked_s = duration_s or window_s
    by_node: dict[str, dict[str, Any]] = {}
    order: list[Node] = []

    def row(node: Node) -> dict[str, Any]:
        if node.id not in by_node:
            order.append(node)
            by_node[node.id] = {"parts": [], "owed": 0, "lost": 0, "reasons": [],
                                "workers": 0}
        return by_node[node.id]

    for p, r in done:
        b = row(p.node)
        b["parts"].append(r)
        b["owed"] += p.owed
        b["workers"] += 1
    for lo in lost:
        b = row(lo.placed.node)
        b["owed"] += lo.placed.owed
        b["lost"] += lo.placed.owed
        b["workers"] += 1
        b["reasons"].append(lo.reason)
    out = []
    for node in order:
        b = by_node[node.id]
        parts: list[WorkerResult] = b["parts"]
        spec = parts[0].latency.spec if parts else None
        lat = merged((p.latency for p in parts), spec) if spec else Histogram()
        late = merged((p.lateness for p in parts), spec) if spec else Histogram()
        counts = np.sum([p.counts for p in parts], axis=0) if parts else np.zeros(len(KINDS))
        by_kind = dict(zip(KINDS, (int(c) for c in counts), strict=True))
        dispatched = sum(p.dispatched for p in parts)
        out.append({
            **node.to_json(),
            "status": "lost" if b["lost"] else "ok",
            "reason": "; ".join(dict.fromkeys(b["reasons"])) or None,
            "workers": b["workers"],
            "rate": {"target": round(b["owed"] / asked_s, 3) if asked_s > 0 else 0.0,
                     "achieved": round(dispatched / window_s, 3) if window_s > 0 else 0.0},
            "requests": {"scheduled": b["owed"], "sent": sum(p.sent for p in parts),
                         "ok": by_kind["ok"],
                         "errors": sum(by_kind[k] for k in ERROR_KINDS),
                         "abandoned": sum(p.abandoned for p in parts), "lost": b["lost"]},
            "latency_ms": {"p99": round(lat.value_at_percentile(99.0) / 1e6, 6),
                           "count": lat.total},
            "lateness_ms": {"p99": round(late.value_at_percentile(99.0) / 1e6, 6)},
            # how long before the agreed start its "go" arrived (the least over its workers;
            # negative: it started late)
            "start_margin_ms": round(1e3 * min(
                (margins or {}).get(p.worker, math.nan) for p in parts), 3) if parts and
            margins and all(p.worker in margins for p in parts) else None,
            "histograms": {"latency": encode(lat)},
        })
    return out


def with_nodes(result: BenchResult, rows: list[dict[str, Any]],
               parts: Sequence[WorkerResult]) -> BenchResult:
    """Add the per-node rows and the lost requests to a merged result; re-check accounting."""
    data = result.json
    lost = sum(r["requests"]["lost"] for r in rows)
    data["requests"]["lost"] = lost
    data["requests"]["scheduled"] += lost
    data["nodes"] = rows
    data["accounting"] = accounting(data)
    data["warnings"] = warnings(data, result.info, parts, [])
    for r in rows:
        if r["status"] == "lost":
            data["warnings"].insert(0, f"node {r['address']} ({r['node_id'][:12]}) lost: "
                                       f"{r['requests']['lost']} request(s) it owed are "
                                       f"counted as lost ({r['reason']})")
        elif (r["start_margin_ms"] or 0.0) < 0:
            data["warnings"].append(f"node {r['address']} got the start {-r['start_margin_ms']:.1f}"
                                    f" ms late (clock offset or a slow cluster): its first "
                                    f"requests are late (see its lateness)")
        elif r["lateness_ms"]["p99"] > max(1.0, 0.1 * data["latency_ms"]["p99"]):
            data["warnings"].append(f"generator node {r['address']} fell behind its schedule "
                                    f"(lateness p99 {r['lateness_ms']['p99']:.3f} ms): add "
                                    f"nodes or --per-node, or lower --rate")
    return result
