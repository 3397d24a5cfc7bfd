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
    "net/core/rps_sock_flow_entries",
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
    BBRv3 tree declares version 3. Read, in order: /sys/module/tcp_bbr/version (a loaded
    module; a loaded module without it declares no version), the built-in modules'
    ``modules.builtin.modinfo`` (BBR built in, CONFIG_TCP_CONG_BBR=y), `modinfo tcp_bbr`.
    When none of them can be read the version is unknown, never assumed."""
    tried: list[str] = []
    try:
        return {"version": host.read("/sys/module/tcp_bbr/version").strip(),
                "source": "/sys/module/tcp_bbr/version"}
    except SourceError as exc:
        tried.append(str(exc))
    if host.exists("/sys/module/tcp_bbr"):
        return {"version": None, "source": "/sys/module/tcp_bbr (loaded, no version attribute)"}
    try:
        release = host.read("/proc/sys/kernel/osrelease").strip()
        path = f"/lib/modules/{release}/modules.builtin.modinfo"
        entries = host.read(path).split("\0")
        mine = [e.partition("=") for e in entries if e.startswith("tcp_bbr.")]
        if mine:
            version = next((v for k, _, v in mine if k == "tcp_bbr.version"), None)
            return {"version": version, "source": path}
        tried.append(f"{path}: tcp_bbr is not built in")
    except SourceError as exc:
        tried.append(str(exc))
    try:
        out = host.run(["modinfo", "tcp_bbr"])
    except SourceError as exc:
        tried.append(str(exc))
        raise SourceError("the tcp_bbr version is not readable: " + "; ".join(tried)) from exc
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
