"""CPU topology: which logical CPUs share a physical core (hyperthread siblings).

``/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`` is a cpulist of the
logical CPUs on cpuN's core, cpuN included (``core_cpus_list`` is its name since
Linux 5.6; both are read). An offline CPU has no topology directory: it runs nothing.
"""

from __future__ import annotations

import re

from ..collect import Scope, collector
from ..host import Host
from ..model import SourceError
from .records import parse_cpulist

_CPU_RE = re.compile(r"^cpu([0-9]+)$")


def cpu_siblings(host: Host) -> dict[str, list[int]]:
    """``{"N": [siblings of cpuN, N included]}`` for every online CPU."""
    base = "/sys/devices/system/cpu"
    out: dict[str, list[int]] = {}
    failures: list[str] = []
    for name in host.listdir(base):
        m = _CPU_RE.match(name)
        if not m or not host.exists(f"{base}/{name}/topology"):
            continue
        for fname in ("thread_siblings_list", "core_cpus_list"):
            try:
                out[m.group(1)] = parse_cpulist(host.read(f"{base}/{name}/topology/{fname}"))
                break
            except SourceError as exc:
                failures.append(str(exc))
    if not out:
        raise SourceError("no CPU topology in /sys/devices/system/cpu/cpu*/topology"
                          + (f" ({failures[0]})" if failures else ""))
    return out


@collector("cpu.siblings")
def siblings_fact(host: Host, scope: Scope) -> dict[str, list[int]]:
    return cpu_siblings(host)
