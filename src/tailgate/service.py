"""The service a command watches, named by ``--pid`` and ``--cgroup``, and the rest of what
inspect is asked to look at (:func:`scope_of`): checked against the host it runs on. Every
error here is a :class:`~tailgate.errors.UsageError` (exit status 2).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .collect import Scope
from .errors import UsageError


def existing_pids(host, values: list[str]) -> tuple[int, ...]:
    """--pid values as integers of processes that exist on ``host`` (duplicates dropped)."""
    from .host import PID_MAX_LIMIT, PID_MAX_MIN, valid_pid
    from .model import SourceError

    try:  # the host's own ceiling; the kernel's when it cannot be read or is implausible
        pid_max = int(host.read("/proc/sys/kernel/pid_max").strip())
        # the kernel refuses a pid_max outside [301, 2^22]: a value there is no real host's
        pid_max = pid_max if PID_MAX_MIN <= pid_max <= PID_MAX_LIMIT else PID_MAX_LIMIT
    except (SourceError, ValueError):
        pid_max = PID_MAX_LIMIT
    try:
        pids = tuple(dict.fromkeys(valid_pid(v, pid_max) for v in values))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    for pid in pids:
        try:
            present = host.exists(f"/proc/{pid}")
        except SourceError as exc:
            raise UsageError(f"--pid {pid}: {exc}") from exc
        if not present:
            raise UsageError(f"no such process: --pid {pid}")
    return pids


def existing_cgroup(host, spec: str) -> str:
    """--cgroup as the absolute directory of an existing cgroup on ``host``."""
    from .model import SourceError
    from .sources.cgroup import resolve_cgroup

    try:
        path = resolve_cgroup(host, spec)
    except (SourceError, ValueError) as exc:
        raise UsageError(f"--cgroup: {exc}") from exc
    if path is None:
        raise UsageError(f"no such cgroup: --cgroup {spec}")
    return path


SCOPE_OPTIONS = ("iface", "pid", "cgroup", "engine", "dcgm", "memory_stats", "dpdk",
                 "probe_window")


def scope_of(host, iface: Sequence[str] = (), pid: Sequence[str] = (),
             cgroup: str | None = None, engine: str | None = None, dcgm: str | None = None,
             memory_stats: str | None = None, dpdk: Sequence[str] | None = None,
             probe_window: float | None = None) -> Scope:
    """The checked :class:`Scope` of inspect's options (named as its flags): the pids and
    the cgroup exist on ``host``, the interfaces' names are valid; a usage error names the
    option."""
    from .host import valid_iface

    try:
        ifaces = tuple(valid_iface(i) for i in iface)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    pids = existing_pids(host, list(pid))
    cgroup = existing_cgroup(host, cgroup) if cgroup else None
    options: dict[str, Any] = {}
    for name, url in (("engine", engine), ("dcgm", dcgm)):
        if url:
            if not url.startswith(("http://", "https://")) and not os.path.isfile(url):
                raise UsageError(f"--{name} {url}: not an http(s):// URL nor a file")
            options[name] = url
    if memory_stats:
        options["memory_stats"] = os.path.abspath(memory_stats)
    if dpdk:
        from .sources.dpdk import valid_prefix

        try:
            options["dpdk"] = [valid_prefix(x) for x in dpdk]
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    if probe_window is not None:
        if not 0 < probe_window <= 3600:
            raise UsageError("--probe-window must be between 0 and 3600 seconds")
        options["probe_window"] = probe_window
    return Scope(pids=pids, cgroup=cgroup, ifaces=ifaces, options=options)
