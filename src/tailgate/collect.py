"""Collect: run every registered source against a Host and build a Snapshot.

A source module registers collectors by fact name::

    @collector("net.snmp", counter=True)
    def net_snmp(host: Host, scope: Scope) -> dict: ...

A collector returns a JSON-able value, or a ``dict[str, Fact]`` when
``multi=True`` (one fact per pid or interface, each named by the collector).
It raises :class:`~tailgate.model.SourceError` when the fact cannot be read;
that becomes a missing fact with the reason, never a default value. Counter
collectors run twice, ``interval_s`` apart, so checks can derive rates.

A multi collector names the facts it is to produce with ``names(scope)``, so
that when it fails as a whole each of those facts is missing with the reason (a
check then says why, not "not collected"); facts named ``<collector>.<key>``
fall back to the collector's own fact. Any exception other than ``SourceError``
is a defect of tailgate: the facts are missing with ``error=True`` and the checks
that read them report ``error``.
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
    "tailgate.sources.dpdk",
    "tailgate.sources.topology",
    "tailgate.sources.gpu",
    "tailgate.sources.pfc",
    "tailgate.sources.platform",
    "tailgate.sources.hwerrors",
    "tailgate.sources.kernel_log",
    # helpers add their source modules here (one line each)
)


@dataclass(frozen=True)
class Scope:
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
    fn: Callable[[Host, Scope], Any]
    counter: bool
    multi: bool
    names: Callable[[Scope], list[str]] | None = None


_COLLECTORS: dict[str, Collector] = {}


def collector(name: str, *, counter: bool = False, multi: bool = False,
              names: Callable[[Scope], list[str]] | None = None):
    def register(fn: Callable[[Host, Scope], Any]) -> Callable[[Host, Scope], Any]:
        if name in _COLLECTORS:
            raise RuntimeError(f"collector {name!r} registered twice")
        _COLLECTORS[name] = Collector(name, fn, counter, multi, names)
        return fn

    return register


def collectors() -> dict[str, Collector]:
    for mod in SOURCE_MODULES:
        importlib.import_module(mod)
    return _COLLECTORS


def _failed(c: Collector, scope: Scope, fact: Fact) -> dict[str, Fact]:
    """Every fact ``c`` was to produce, missing with the same reason."""
    out = {c.name: fact}
    if c.multi and c.names is not None:
        out.update((n, fact) for n in c.names(scope))
    return out


def crash_fact(what: str, exc: BaseException) -> Fact:
    """A collector or parser raised something other than SourceError: a tailgate bug."""
    return Fact(missing=f"tailgate bug: {what} raised {type(exc).__name__}: {exc}", error=True)


def run_collector(c: Collector, host: Host, scope: Scope) -> dict[str, Fact]:
    host.forget_source()
    try:
        value = c.fn(host, scope)
    except SourceError as exc:
        return _failed(c, scope, Fact(missing=host.blame(exc)))
    except Exception as exc:  # noqa: BLE001 - one broken collector must not hide the others
        return _failed(c, scope, crash_fact(f"collector {c.name}", exc))
    if not c.multi:
        return {c.name: Fact(value=value)}
    return {k: v if isinstance(v, Fact) else Fact(value=v) for k, v in value.items()}


def _sample(host: Host, scope: Scope, chosen: list[Collector]) -> dict[str, Fact]:
    """Run collectors concurrently: most wait on a file or a command (ethtool, pmc), so a
    sample takes as long as its slowest source rather than the sum of all of them."""
    facts: dict[str, Fact] = {}
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="collect")
    try:
        for part in pool.map(lambda c: run_collector(c, host, scope), chosen):
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
            kernel = host.read("/proc/sys/kernel/osrelease").strip() or "unknown (empty osrelease)"
        except SourceError as exc:  # a report never prints "None": it says what was not read
            kernel = f"unknown ({exc})"
        return {"hostname": name, "kernel": kernel, "root": str(host.root), "cpus": None}
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "root": "/",
        "cpus": os.cpu_count(),
    }


Phase = Callable[[str, float | None], None]  # (what is being done, fraction done or None)


def collect(host: Host, scope: Scope, interval_s: float, on_phase: Phase | None = None
            ) -> Snapshot:
    """Two samples ``interval_s`` apart; ``on_phase`` (a progress display) is told each step."""
    def phase(what: str, done: float | None = None) -> None:
        if on_phase is not None:
            on_phase(what, done)

    every = list(collectors().values())
    counters = [c for c in every if c.counter]
    started = time.time()
    phase(f"sampling {len(counters)} counter sources (t0)")
    before = _sample(host, scope, counters)
    t0 = time.monotonic()
    if interval_s > 0:
        end = t0 + interval_s
        while (left := end - time.monotonic()) > 0:
            phase(f"waiting the {interval_s:g} s interval", 1.0 - left / interval_s)
            time.sleep(min(left, 0.25) if on_phase is not None else left)
    # The window ends when t1 sampling starts: a probe window runs inside that sample, beside
    # the counter reads, and must not stretch the denominator of every rate.
    measured = time.monotonic() - t0
    window = scope.options.get("probe_window")
    phase(f"sampling {len(every)} sources (t1)"
          + (f", eBPF probes for {window:g} s" if window else ""))
    facts = _sample(host, scope, every)
    return Snapshot(
        host=host_info(host),
        target=scope.to_json(),
        interval_s=round(measured, 6),
        taken_at=started,
        facts=facts,
        before=before,
        version=__version__,
    )
