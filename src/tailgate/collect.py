"""Collect: run every registered source against a Host and build a Snapshot.

A source module registers collectors by fact name::

    @collector("net.snmp", counter=True)
    def net_snmp(host: Host, target: Target) -> dict: ...

A collector returns a JSON-able value, or a ``dict[str, Fact]`` when
``multi=True`` (one fact per pid or interface, each named by the collector).
It raises :class:`~tailgate.model.SourceError` when the fact cannot be read;
that becomes a missing fact with the reason, never a default value. Counter
collectors run twice, ``interval_s`` apart, so checks can derive rates.
"""

from __future__ import annotations

import importlib
import os
import platform
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .host import Host
from .model import Fact, Snapshot, SourceError

SOURCE_MODULES = (
    "tailgate.sources.procfs",
    "tailgate.sources.sysctl",
    "tailgate.sources.cgroup",
    "tailgate.sources.process",
    "tailgate.sources.netdev",
    "tailgate.sources.sockets",
    "tailgate.sources.engine",
    "tailgate.sources.ethtool",
    "tailgate.sources.pci",
    "tailgate.sources.ptp",
    "tailgate.sources.qdisc",
    "tailgate.sources.probes",
    # helpers add their source modules here (one line each)
)


@dataclass(frozen=True)
class Target:
    """What the user asked to inspect, beyond the host itself."""

    pids: tuple[int, ...] = ()
    cgroup: str | None = None
    ifaces: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"pids": list(self.pids), "cgroup": self.cgroup, "ifaces": list(self.ifaces),
                **self.options}


@dataclass(frozen=True)
class Collector:
    name: str
    fn: Callable[[Host, Target], Any]
    counter: bool
    multi: bool


_COLLECTORS: dict[str, Collector] = {}


def collector(name: str, *, counter: bool = False, multi: bool = False):
    def register(fn: Callable[[Host, Target], Any]) -> Callable[[Host, Target], Any]:
        if name in _COLLECTORS:
            raise RuntimeError(f"collector {name!r} registered twice")
        _COLLECTORS[name] = Collector(name, fn, counter, multi)
        return fn

    return register


def collectors() -> dict[str, Collector]:
    for mod in SOURCE_MODULES:
        importlib.import_module(mod)
    return _COLLECTORS


def run_collector(c: Collector, host: Host, target: Target) -> dict[str, Fact]:
    host.forget_source()
    try:
        value = c.fn(host, target)
    except SourceError as exc:
        return {c.name: Fact(missing=host.blame(exc))}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        # A parser bug on unexpected input must not crash the whole inspection.
        return {c.name: Fact(missing=host.blame(
            ValueError(f"parse error: {type(exc).__name__}: {exc}")))}
    if not c.multi:
        return {c.name: Fact(value=value)}
    return {k: v if isinstance(v, Fact) else Fact(value=v) for k, v in value.items()}


def _sample(host: Host, target: Target, chosen: list[Collector]) -> dict[str, Fact]:
    """Run collectors concurrently: most wait on a file or a command (ethtool, pmc), so a
    sample takes as long as its slowest source rather than the sum of all of them."""
    facts: dict[str, Fact] = {}
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="collect")
    try:
        for part in pool.map(lambda c: run_collector(c, host, target), chosen):
            facts.update(part)
    except BaseException:
        # Ctrl-C: kill the commands still running so their threads end now, drop what
        # was not started, and let the caller discard the partial sample.
        host.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return facts


def host_info(host: Host) -> dict[str, Any]:
    if not host.live:
        try:
            name = host.read("/proc/sys/kernel/hostname").strip()
        except SourceError:
            name = str(host.root)
        try:
            kernel = host.read("/proc/sys/kernel/osrelease").strip()
        except SourceError:
            kernel = None
        return {"hostname": name, "kernel": kernel, "root": str(host.root), "cpus": None}
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "root": "/",
        "cpus": os.cpu_count(),
    }


def collect(host: Host, target: Target, interval_s: float) -> Snapshot:
    every = list(collectors().values())
    counters = [c for c in every if c.counter]
    started = time.time()
    before = _sample(host, target, counters)
    t0 = time.monotonic()
    if interval_s > 0:
        time.sleep(interval_s)
    # The window ends when t1 sampling starts: a probe window runs inside that sample, beside
    # the counter reads, and must not stretch the denominator of every rate.
    measured = time.monotonic() - t0
    facts = _sample(host, target, every)
    return Snapshot(
        host=host_info(host),
        target=target.to_json(),
        interval_s=round(measured, 6),
        taken_at=started,
        facts=facts,
        before=before,
        version=__version__,
    )
