"""A Ray cluster as tailgate uses it: connect, list the live nodes, pin work to one node.

Ray is an optional extra (``pip install 'tailgate[ray]'``): without it every
``--ray`` option is a usage error that says how to install it. Work is pinned to
a node with hard node-affinity scheduling (never moved elsewhere: a generator
that silently moved would double another node's load), and actors ask for no CPU
so that several load workers fit on a one-CPU node (``--per-node``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

INSTALL_HINT = "pip install 'tailgate[ray]'"


def import_ray() -> Any:
    """The ``ray`` module, or a UsageError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


@dataclass(frozen=True)
class Node:
    """One live Ray node: its id (hex) and the address its raylet listens on."""

    id: str
    address: str

    def to_json(self) -> dict[str, str]:
        return {"node_id": self.id, "address": self.address}


def connect(address: str) -> Any:
    """Join the cluster at ``address`` (``host:port`` or ``auto``) as a driver."""
    ray = import_ray()
    if not address or any(c.isspace() for c in address):
        raise UsageError(f"--ray {address!r}: expected HOST:PORT of the Ray head, or auto")
    if ray.is_initialized():
        return ray
    if address != "auto":
        _reachable(address)
    # Our own modules must import on every node. Run from a source tree (src/ layout, not
    # installed), that tree goes along in the workers' PYTHONPATH (it is the same path on
    # every node of a shared checkout); an installed tailgate needs nothing.
    import tailgate

    src = os.path.dirname(os.path.dirname(os.path.abspath(tailgate.__file__)))
    env = None
    if os.path.basename(src) not in ("site-packages", "dist-packages"):
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
            p for p in (src, os.environ.get("PYTHONPATH", "")) if p)}}
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False,
                 configure_logging=False, runtime_env=env)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UsageError(f"--ray {address}: cannot join the Ray cluster: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None
    return ray


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """A TCP connect to the head's GCS port first: ray.init retries an unreachable head for
    minutes, and a fleet command must fail fast with the reason instead."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--ray {address!r}: expected HOST:PORT of the Ray head, or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UsageError(f"--ray {address}: cannot reach the Ray head: "
                         f"{exc.strerror or exc}") from None


def live_nodes(ray: Any) -> list[Node]:
    """The live nodes, ordered by address then id (a stable order for the rows)."""
    nodes = [Node(n["NodeID"], n.get("NodeManagerAddress", "?"))
             for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: (n.address, n.id))


def pinned(ray: Any, node: Node) -> dict[str, Any]:
    """``.options(...)`` that run an actor or task on ``node`` and nowhere else."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node.id, soft=False),
            "num_cpus": 0}


def disconnect(ray: Any) -> None:
    if ray.is_initialized():
        ray.shutdown()
