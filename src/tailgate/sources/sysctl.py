"""Kernel tunables under /proc/sys and the facts needed to judge them."""

from __future__ import annotations

import os
import re

from ..collect import Scope, collector
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
    if not all(re.fullmatch(r"-?[0-9]{1,20}", t) for t in text.split()):
        raise ParseError(f"not a list of integers: {text.strip()[:60]!r}")
    vals = [int(t) for t in text.split()]
    if count is not None and len(vals) != count:
        raise ParseError(f"expected {count} integers, got {len(vals)}: {text.strip()!r}")
    return vals


MAX_KNOB_BYTES = 64 * 1024
# Knobs that hold sizes or switches: their values must be that many integers >= 0.
_INT_KNOBS = {"net/ipv4/tcp_moderate_rcvbuf": 1, "net/ipv4/tcp_mem": 3, "net/ipv4/tcp_rmem": 3,
              "net/ipv4/tcp_wmem": 3, "net/core/rmem_max": 1, "kernel/io_uring_disabled": 1,
              "net/core/rps_sock_flow_entries": 1}


def read_knob(host: Host, path: str) -> str:
    """One /proc/sys value, as text; a size or switch that is not one is a parse error
    (the check would otherwise judge garbage), and so is an empty value."""
    # A sysctl value is at most a page or two; a bigger one is not the kernel's.
    value = host.read(f"/proc/sys/{path}", limit=MAX_KNOB_BYTES).strip()
    if not value:
        raise ParseError(f"/proc/sys/{path}: empty")
    if path in _INT_KNOBS:
        try:
            ints = parse_ints(value, _INT_KNOBS[path])
        except ParseError as exc:
            raise ParseError(f"/proc/sys/{path}: {exc}") from exc
        if any(v < 0 for v in ints):
            raise ParseError(f"/proc/sys/{path}: negative value {value[:60]!r}")
    return value


@collector("sysctl", multi=True, names=lambda t: [knob_name(path) for path in NET_KNOBS])
def sysctls(host: Host, scope: Scope) -> dict[str, object]:
    out: dict[str, object] = {}
    for path in NET_KNOBS:
        try:
            out[knob_name(path)] = read_knob(host, path)
        except SourceError as exc:
            out[knob_name(path)] = Fact(missing=str(exc))
    return out


_VERSION_RE = re.compile(r"^\s*version:\s*(\S+)", re.MULTILINE)


@collector("kernel.tcp_bbr")
def tcp_bbr(host: Host, scope: Scope) -> dict:
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
        # It names a directory under /lib/modules: "6.1.0-18-amd64", never a path or garbage.
        if not re.match(r"[0-9]+\.[0-9]+", release) or "/" in release:
            raise ParseError(f"/proc/sys/kernel/osrelease: not a release: {release[:40]!r}")
        path = f"/lib/modules/{release}/modules.builtin.modinfo"
        try:
            entries = host.read(path, nul_ok=True).split("\0")  # NUL-separated records
        except SourceError as exc:  # say where the directory's name came from
            raise SourceError(f"{exc} (the release from /proc/sys/kernel/osrelease)") from exc
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
def page_size(host: Host, scope: Scope) -> int:
    if host.live:
        return os.sysconf("SC_PAGE_SIZE")
    size = parse_ints(host.run(["getconf", "PAGESIZE"]), 1)[0]
    if size < 4096 or size & (size - 1):  # every Linux page size is a power of two >= 4 KiB
        raise ParseError(f"getconf PAGESIZE: not a page size: {size}")
    return size


@collector("numa.nodes")
def numa_nodes(host: Host, scope: Scope) -> list[int]:
    from .records import parse_cpulist

    return parse_cpulist(host.read("/sys/devices/system/node/online"), empty_ok=False)
