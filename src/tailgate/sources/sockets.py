"""Per-connection memory of a service: its established TCP sockets and their kernel cost.

``ss -tmpin state established`` lists each socket with ``users:(("nginx",pid=N,fd=F))``
and ``skmem:(r,rb,t,tb,f,w,o,bl,d)``: r/t are bytes queued for receive/transmit,
f the forward-allocated quota, w queued for write, o option memory — what the
socket holds beyond its fixed objects. The fixed objects (``tcp_sock``, the socket
inode, the file) are slab objects whose sizes /proc/slabinfo gives (root only).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterator

from ..collect import Scope, collector
from ..host import Host
from ..model import Fact, ParseError, SourceError
from .records import put

_SKMEM_RE = re.compile(r"skmem:\(([^)]*)\)")
_PID_RE = re.compile(r"pid=([0-9]+)")
_SKMEM_KEYS = {"r": "rmem_alloc", "rb": "rcvbuf", "t": "wmem_alloc", "tb": "sndbuf",
               "f": "fwd_alloc", "w": "wmem_queued", "o": "opt_mem", "bl": "backlog", "d": "drops"}
SLABS = ("TCP", "TCPv6", "sock_inode_cache", "filp")


def _lines(text: str) -> Iterator[str]:
    """The lines of ``text`` one at a time: a list of all of them (``splitlines()``) would
    cost ~60 bytes per line on top of the text itself."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        yield text[start:end].rstrip("\r")
        start = end + 1


def parse_ss(text: str, pids: Collection[int] | None = None) -> list[dict[str, object]]:
    """`ss -tmpi` output: one dict per socket with its owning pids and skmem fields; with
    ``pids``, only the sockets of those processes are kept (memory: the text, plus ~1 KiB
    per socket kept, whatever the number of sockets on the host)."""
    sockets: list[dict[str, object]] = []
    lines = _lines(text)
    head = [line for _, line in zip(range(3), lines, strict=False)]
    if not any(line.startswith(("State", "Recv-Q")) for line in head):
        # ss prints its header even with no socket: without it this is not ss output
        raise ParseError("ss: no 'State'/'Recv-Q' header line")
    seen, keep = False, False
    for line in itertools.chain(head, lines):
        if not line.strip() or line.startswith(("#", "State", "Recv-Q")):
            continue
        if not line[0].isspace():
            if line.count("pid=") != len(_PID_RE.findall(line)):  # the owner must be readable
                raise ParseError(f"ss: unreadable process in {line.strip()[-80:]!r}")
            owners = sorted({int(p) for p in _PID_RE.findall(line)})
            seen, keep = True, pids is None or any(p in pids for p in owners)
            if keep:
                sockets.append({"pids": owners,
                                "local": line.split()[-3] if len(line.split()) >= 5 else None})
            continue
        if not seen:
            raise ParseError("socket details before any socket line")
        m = _SKMEM_RE.search(line) if keep else None
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
        put(out, parts[0], int(parts[3]), "slabinfo cache")
    if not out:
        raise ParseError("slabinfo: no caches")
    return out


@collector("sockets.pid", multi=True, names=lambda t: [f"sockets.{pid}" for pid in t.pids])
def pid_sockets(host: Host, scope: Scope) -> dict[str, object]:
    if not scope.pids:
        return {}
    try:
        sockets = parse_ss(host.run(["ss", "-tmpin", "state", "established"]),
                           frozenset(scope.pids))
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
