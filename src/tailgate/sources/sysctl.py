"""Kernel tunables under /proc/sys and the facts needed to judge them."""

from __future__ import annotations

import os
import re

from ..collect import Target, collector
from ..host import Host
from ..model import Fact, ParseError, SourceError

# The network knobs the L2 checks read; each becomes its own fact, missing on its own.
NET_KNOBS = (
    "net/ipv4/tcp_congestion_control",
    "net/ipv4/tcp_available_congestion_control",
    "net/ipv4/tcp_moderate_rcvbuf",
    "net/ipv4/tcp_mem",
    "net/ipv4/tcp_rmem",
    "net/ipv4/tcp_wmem",
    "net/core/rmem_max",
    "net/core/default_qdisc",
    "kernel/io_uring_disabled",
)


def knob_name(path: str) -> str:
    return "sysctl." + path.replace("/", ".")


def parse_ints(text: str, count: int | None = None) -> list[int]:
    try:
        vals = [int(t) for t in text.split()]
    except ValueError as exc:
        raise ParseError(f"not a list of integers: {text.strip()!r}") from exc
    if count is not None and len(vals) != count:
        raise ParseError(f"expected {count} integers, got {len(vals)}: {text.strip()!r}")
    return vals


@collector("sysctl", multi=True, names=lambda t: [knob_name(path) for path in NET_KNOBS])
def sysctls(host: Host, target: Target) -> dict[str, object]:
    out: dict[str, object] = {}
    for path in NET_KNOBS:
        try:
            out[knob_name(path)] = host.read(f"/proc/sys/{path}").strip()
        except SourceError as exc:
            out[knob_name(path)] = Fact(missing=str(exc))
    return out


_VERSION_RE = re.compile(r"^\s*version:\s*(\S+)", re.MULTILINE)


@collector("kernel.tcp_bbr")
def tcp_bbr(host: Host, target: Target) -> dict:
    """Which BBR the kernel has. Mainline BBR (v1) declares no MODULE_VERSION; the
    BBRv3 tree declares version 3, visible in /sys/module/tcp_bbr/version once loaded
    or in `modinfo tcp_bbr`."""
    try:
        return {"version": host.read("/sys/module/tcp_bbr/version").strip(),
                "source": "/sys/module/tcp_bbr/version"}
    except SourceError:
        pass
    try:
        out = host.run(["modinfo", "tcp_bbr"])
    except SourceError as exc:
        loaded = host.exists("/sys/module/tcp_bbr")
        return {"version": None, "source": f"no module version ({exc})", "loaded": loaded}
    m = _VERSION_RE.search(out)
    return {"version": m.group(1) if m else None, "source": "modinfo tcp_bbr"}


@collector("hw.page_size")
def page_size(host: Host, target: Target) -> int:
    if host.live:
        return os.sysconf("SC_PAGE_SIZE")
    out = host.run(["getconf", "PAGESIZE"])
    return parse_ints(out, 1)[0]


@collector("numa.nodes")
def numa_nodes(host: Host, target: Target) -> list[int]:
    from .process import parse_cpulist

    return parse_cpulist(host.read("/sys/devices/system/node/online"))
