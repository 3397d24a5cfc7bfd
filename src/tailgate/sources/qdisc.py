"""Transmit side of a NIC: queue disciplines (``tc -j qdisc show``) and XPS maps.

``tc -j qdisc show dev IF`` prints a JSON list of qdiscs, each with ``kind``,
``handle``, ``root: true`` or ``parent`` (the same keys from iproute2 4.15, which added
``-j`` to tc, to today); older iproute2 is read from its text output. A multiqueue NIC has a classful root
(``mq``) whose children, one per transmit queue, do the queueing: those leaves
are what drops packets on overflow, so they are what is judged.

XPS: ``/sys/class/net/IF/queues/tx-N/xps_cpus`` is a CPU mask in comma-separated
32-bit hex words, most significant first (``00000000,00000003`` = CPUs 0-1).
The file is absent for a single-queue device or without CONFIG_XPS.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..collect import Scope, collector
from ..host import Host
from ..model import ParseError, SourceError
from .netdev import per_iface
from .records import is_uint, loads_unique, parse_cpulist, parse_cpumask

# Active queue management: drops (or marks) early and by flow, not at the tail.
AQM = frozenset({"fq_codel", "codel", "fq", "cake", "red", "gred", "choke", "pie", "fq_pie",
                 "sfb", "hhf"})
# Plain FIFOs and shapers that drop whatever arrives when full.
TAIL_DROP = frozenset({"pfifo_fast", "pfifo", "bfifo", "pfifo_head_drop", "tbf", "plug"})
CLASSFUL = frozenset({"mq", "mqprio", "multiq", "htb", "hfsc", "prio", "drr", "qfq", "ets",
                      "cbq", "taprio", "atm"})
INGRESS = frozenset({"ingress", "clsact"})


def parse_tc_qdisc(text: str) -> list[dict[str, Any]]:
    """``tc -j qdisc show dev IF`` -> ``[{"kind", "handle", "parent", "root"}]`` (egress only)."""
    try:
        data = loads_unique(text, "tc -j qdisc")
    except json.JSONDecodeError as exc:
        raise ParseError(f"tc -j qdisc: not JSON: {exc.msg} at {exc.pos}") from exc
    if not isinstance(data, list):
        raise ParseError("tc -j qdisc: expected a JSON list")
    out = []
    for q in data:
        if not isinstance(q, dict) or not isinstance(q.get("kind"), str):
            raise ParseError(f"tc -j qdisc: entry without a kind: {q!r:.80}")
        if q["kind"] in INGRESS:
            continue
        out.append({"kind": q["kind"], "handle": q.get("handle"),
                    "parent": q.get("parent"), "root": bool(q.get("root"))})
    return out


_TEXT_RE = re.compile(r"^qdisc (\S+) ([0-9a-f]+:)(?: dev \S+)?\s*(root|parent (\S+))?")


def parse_tc_qdisc_text(text: str) -> list[dict[str, Any]]:
    """``tc qdisc show dev IF`` (text; iproute2 < 4.15 has no ``-j``) -> the same list as
    :func:`parse_tc_qdisc`. Each line: ``qdisc KIND HANDLE: [dev IF] root|parent ID ...``
    (tc_qdisc.c print_qdisc); option and statistics text after it is not read."""
    out = []
    seen = False
    for line in text.splitlines():
        if not line.startswith("qdisc "):
            continue
        seen = True
        m = _TEXT_RE.match(line)
        if not m:
            raise ParseError(f"tc qdisc: unreadable line {line[:80]!r}")
        if m.group(1) in INGRESS:
            continue
        out.append({"kind": m.group(1), "handle": m.group(2), "parent": m.group(4),
                    "root": m.group(3) == "root"})
    if not seen:
        raise ParseError("tc qdisc: no 'qdisc' line")
    return out


def classify(qdiscs: list[dict[str, Any]]) -> dict[str, Any]:
    """Root kind and the leaves that queue, each tagged ``aqm``/``tail-drop``/``other``."""
    roots = [q for q in qdiscs if q["root"]]
    if not roots:
        raise ParseError("tc -j qdisc: no root qdisc")
    root = roots[0]
    leaves = [q for q in qdiscs if q["kind"] not in CLASSFUL]
    if not leaves and root["kind"] in CLASSFUL:
        # Classes without an attached qdisc get the kernel's default pfifo.
        leaves = [{"kind": "pfifo (default)", "handle": None, "parent": root["handle"],
                   "root": False}]

    def tag(kind: str) -> str:
        if kind in AQM:
            return "aqm"
        if kind in TAIL_DROP or kind == "pfifo (default)":
            return "tail-drop"
        if kind == "noqueue":
            return "noqueue"
        return "other"

    return {"root": root["kind"],
            "leaves": [{"kind": q["kind"], "parent": q["parent"], "class": tag(q["kind"])}
                       for q in leaves]}


def xps_map(host: Host, iface: str) -> dict[str, Any]:
    base = f"/sys/class/net/{iface}/queues"
    queues = [q for q in host.listdir(base) if q.startswith("tx-")]
    if not queues:
        raise SourceError(f"{base}: no transmit queues")
    maps: dict[str, list[int] | None] = {}
    for q in sorted(queues, key=lambda n: int(n[3:]) if is_uint(n[3:]) else 0):
        path = f"{base}/{q}/xps_cpus"
        try:
            maps[q] = parse_cpumask(host.read(path))
        except SourceError as exc:
            # Single-queue devices list xps_cpus but reading it fails with ENOENT.
            if not str(exc).endswith(": absent"):
                raise
            maps[q] = None
    online = parse_cpulist(host.read("/sys/devices/system/cpu/online"))
    if not online:  # a running host has a CPU online: empty is a broken source, not "none"
        raise ParseError("/sys/devices/system/cpu/online: empty")
    return {"queues": maps, "online": online}


def qdiscs(host: Host, iface: str) -> list[dict[str, Any]]:
    """``tc -j`` where it exists (iproute2 >= 4.15), else the text of older releases
    (which refuse ``-j``: 'Option "-j" is unknown'); the first error is the one reported."""
    try:
        text = host.run(["tc", "-j", "qdisc", "show", "dev", iface])
    except SourceError as exc:
        try:
            text = host.run(["tc", "qdisc", "show", "dev", iface])
        except SourceError:
            raise exc from None
        return parse_tc_qdisc_text(text)
    return parse_tc_qdisc(text)


@collector("tc.qdisc", multi=True)
def tc_qdisc(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("tc.qdisc", host, scope, lambda i: classify(qdiscs(host, i)))


@collector("xps", multi=True)
def xps(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("xps", host, scope, lambda i: xps_map(host, i))
