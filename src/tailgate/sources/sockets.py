"""Per-connection memory of a service: its established TCP sockets and their kernel cost.

``ss -tmpin state established`` lists each socket with ``users:(("nginx",pid=N,fd=F))``
and ``skmem:(r,rb,t,tb,f,w,o,bl,d)``: r/t are bytes queued for receive/transmit,
f the forward-allocated quota, w queued for write, o option memory — what the
socket holds beyond its fixed objects. The fixed objects (``tcp_sock``, the socket
inode, the file) are slab objects whose sizes /proc/slabinfo gives (root only).
"""

from __future__ import annotations

import re

from ..collect import Scope, collector
from ..host import Host
from ..model import Fact, ParseError, SourceError

_SKMEM_RE = re.compile(r"skmem:\(([^)]*)\)")
_PID_RE = re.compile(r"pid=(\d+)")
_SKMEM_KEYS = {"r": "rmem_alloc", "rb": "rcvbuf", "t": "wmem_alloc", "tb": "sndbuf",
               "f": "fwd_alloc", "w": "wmem_queued", "o": "opt_mem", "bl": "backlog", "d": "drops"}
SLABS = ("TCP", "TCPv6", "sock_inode_cache", "filp")


def parse_ss(text: str) -> list[dict[str, object]]:
    """`ss -tmpi` output: one dict per socket with its owning pids and skmem fields."""
    sockets: list[dict[str, object]] = []
    if not any(line.startswith(("State", "Recv-Q")) for line in text.splitlines()[:3]):
        # ss prints its header even with no socket: without it this is not ss output
        raise ParseError("ss: no 'State'/'Recv-Q' header line")
    for line in text.splitlines():
        if not line.strip() or line.startswith(("#", "State", "Recv-Q")):
            continue
        if not line[0].isspace():
            if line.count("pid=") != len(_PID_RE.findall(line)):  # the owner must be readable
                raise ParseError(f"ss: unreadable process in {line.strip()[-80:]!r}")
            sockets.append({"pids": sorted({int(p) for p in _PID_RE.findall(line)}),
                            "local": line.split()[-3] if len(line.split()) >= 5 else None})
            continue
        if not sockets:
            raise ParseError("socket details before any socket line")
        m = _SKMEM_RE.search(line)
        if m:
            mem: dict[str, int] = {}
            for item in m.group(1).split(","):
                key = item.rstrip("0123456789")
                digits = item[len(key):]
                if key in _SKMEM_KEYS and digits:
                    mem[_SKMEM_KEYS[key]] = int(digits)
            sockets[-1]["skmem"] = mem
    return sockets


def parse_slabinfo(text: str) -> dict[str, int]:
    """/proc/slabinfo 2.x: object size in bytes per cache name."""
    out = {}
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")), "")
    if not first.startswith("slabinfo - version: 2."):
        raise ParseError("slabinfo: no 'slabinfo - version: 2.x' header (empty or not slabinfo)")
    for line in text.splitlines():
        if line.startswith(("slabinfo", "#")) or not line.strip():
            continue
        parts = line.split()
        if len(parts) < 4:
            raise ParseError(f"slabinfo: short line {line[:60]!r}")
        if not re.fullmatch(r"[0-9]{1,10}", parts[3]) or int(parts[3]) == 0:
            raise ParseError(f"slabinfo {parts[0][:40]}: objsize not a size: {parts[3][:20]!r}")
        out[parts[0]] = int(parts[3])
    if not out:
        raise ParseError("slabinfo: no caches")
    return out


@collector("sockets.pid", multi=True, names=lambda t: [f"sockets.{pid}" for pid in t.pids])
def pid_sockets(host: Host, scope: Scope) -> dict[str, object]:
    if not scope.pids:
        return {}
    try:
        sockets = parse_ss(host.run(["ss", "-tmpin", "state", "established"]))
    except SourceError as exc:
        return {f"sockets.{pid}": Fact(missing=host.blame(exc)) for pid in scope.pids}
    out: dict[str, object] = {}
    for pid in scope.pids:
        mine = [s for s in sockets if pid in s["pids"]]
        out[f"sockets.{pid}"] = {"connections": len(mine),
                                 "skmem": [s.get("skmem", {}) for s in mine]}
    return out


@collector("kernel.slabinfo")
def slabinfo(host: Host, scope: Scope) -> dict[str, int]:
    sizes = parse_slabinfo(host.read("/proc/slabinfo"))
    return {k: v for k, v in sizes.items() if k in SLABS}
