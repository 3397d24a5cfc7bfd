"""The shape of every fact: what a snapshot read back (``--from``) must hold to be judged.

A collector's parser makes sure of what it returns; a saved snapshot may come from
anywhere, so each of its facts is checked here against the schema of the fact of that
name before any check sees it: JSON types, integer and number ranges (counters are
u64, CPU ids below 8192, dBm within what a module can read), closed records (no key
the collector does not write) and string shapes. A fact that does not match is
*refused*: it becomes missing with the reason (the checks that read it say
``unknown``), never judged. A fact whose name no collector of this tailgate writes has
no schema and is refused the same way.

The schemas are the contract of the collectors too: tests collect every fixture root
and check that each fact they produce matches (tests/test_snapshot_schema.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

U64_MAX = 2**64 - 1
I64 = 2**63
MAX_CPUS = 8192
MAX_ITEMS = 1_000_000  # entries in one list or object of one fact
MAX_TEXT = 64 * 1024


class _Mismatch(Exception):
    """A value that does not match its schema; the message says where and why. Caught
    here (:func:`refusal` returns it as a reason): it never leaves this module."""


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class Schema:
    def check(self, v: Any, at: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Schema):
    lo: int = 0
    hi: int = U64_MAX

    def check(self, v: Any, at: str) -> None:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Mismatch(f"{at}: expected an integer, got {_kind(v)}")
        if not self.lo <= v <= self.hi:
            raise _Mismatch(f"{at}: {_short(v)} is outside {self.lo} .. {self.hi}")


@dataclass(frozen=True)
class Num(Schema):
    lo: float = -1e18
    hi: float = 1e18

    def check(self, v: Any, at: str) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Mismatch(f"{at}: expected a number, got {_kind(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise _Mismatch(f"{at}: {v!r} is not a finite number")
        if not self.lo <= v <= self.hi:
            raise _Mismatch(f"{at}: {_short(v)} is outside {self.lo:g} .. {self.hi:g}")


@dataclass(frozen=True)
class Str(Schema):
    pattern: str | None = None
    max: int = MAX_TEXT

    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, str):
            raise _Mismatch(f"{at}: expected a string, got {_kind(v)}")
        if len(v) > self.max:
            raise _Mismatch(f"{at}: a string of {len(v)} characters, over {self.max}")
        if self.pattern is not None and not re.fullmatch(self.pattern, v, re.ASCII):
            raise _Mismatch(f"{at}: {_short(v)} is not of the form {self.pattern}")


@dataclass(frozen=True)
class Bool(Schema):
    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, bool):
            raise _Mismatch(f"{at}: expected true or false, got {_kind(v)}")


@dataclass(frozen=True)
class Const(Schema):
    values: tuple[Any, ...]

    def check(self, v: Any, at: str) -> None:
        # bool is an int in Python: True must not stand for 1, nor 1 for True
        if not any(type(v) is type(c) and v == c for c in self.values):
            raise _Mismatch(f"{at}: {_short(v)} is none of {', '.join(map(repr, self.values))}")


def one_of(*values: Any) -> Const:
    return Const(tuple(values))


@dataclass(frozen=True)
class Opt(Schema):
    inner: Schema

    def check(self, v: Any, at: str) -> None:
        if v is not None:
            self.inner.check(v, at)


@dataclass(frozen=True)
class Either(Schema):
    """The first alternative whose ``tag`` field matches decides (no guessing between
    shapes): ``tag`` names a key whose value tells the alternatives apart."""

    tag: str
    alternatives: tuple[tuple[Any, Schema], ...]

    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, dict):
            raise _Mismatch(f"{at}: expected an object, got {_kind(v)}")
        for value, schema in self.alternatives:
            if type(v.get(self.tag)) is type(value) and v.get(self.tag) == value:
                schema.check(v, at)
                return
        raise _Mismatch(f"{at}.{self.tag}: {_short(v.get(self.tag))} is none of "
                       f"{', '.join(repr(a) for a, _ in self.alternatives)}")


@dataclass(frozen=True)
class List(Schema):
    item: Schema
    min: int = 0
    max: int = MAX_ITEMS

    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, list):
            raise _Mismatch(f"{at}: expected a list, got {_kind(v)}")
        if not self.min <= len(v) <= self.max:
            raise _Mismatch(f"{at}: {len(v)} items, expected {self.min} .. {self.max}")
        for i, x in enumerate(v):
            self.item.check(x, f"{at}[{i}]")


@dataclass(frozen=True)
class Tuple(Schema):
    items: tuple[Schema, ...]

    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, list) or len(v) != len(self.items):
            raise _Mismatch(f"{at}: expected a list of {len(self.items)}, got {_kind(v)}")
        for i, (x, s) in enumerate(zip(v, self.items, strict=True)):
            s.check(x, f"{at}[{i}]")


@dataclass(frozen=True)
class Map(Schema):
    """An object with free keys (interfaces, counters, PIDs), each value of one schema."""

    value: Schema
    key: Str = Str(max=4096)
    max: int = MAX_ITEMS

    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, dict):
            raise _Mismatch(f"{at}: expected an object, got {_kind(v)}")
        if len(v) > self.max:
            raise _Mismatch(f"{at}: {len(v)} entries, over {self.max}")
        for k, x in v.items():
            self.key.check(k, f"{at} key")
            self.value.check(x, f"{at}[{_short(k)}]")


@dataclass(frozen=True)
class Rec(Schema):
    """An object with named fields: ``fields`` required, ``optional`` may be absent, and
    ``rest`` the schema of any other key (None: no other key)."""

    fields: dict[str, Schema]
    optional: dict[str, Schema] = field(default_factory=dict)
    rest: Schema | None = None

    def check(self, v: Any, at: str) -> None:
        if not isinstance(v, dict):
            raise _Mismatch(f"{at}: expected an object, got {_kind(v)}")
        for k, s in self.fields.items():
            if k not in v:
                raise _Mismatch(f"{at}: no {k!r}")
            s.check(v[k], f"{at}.{k}")
        for k, x in v.items():
            if k in self.fields:
                continue
            s = self.optional.get(k, self.rest)
            if s is None:
                raise _Mismatch(f"{at}: unexpected key {_short(k)}")
            s.check(x, f"{at}.{k}")


@dataclass(frozen=True)
class Check(Schema):
    """``inner``, then a relation between its parts (``ok``; ``why`` when it fails)."""

    inner: Schema
    ok: Callable[[Any], bool]
    why: str

    def check(self, v: Any, at: str) -> None:
        self.inner.check(v, at)
        if not self.ok(v):
            raise _Mismatch(f"{at}: {self.why}")


# -- building blocks ------------------------------------------------------------------------

U64 = Int()
S64 = Int(-I64, I64 - 1)
CPU = Int(0, MAX_CPUS - 1)
CPUS = List(CPU, max=MAX_CPUS)
TEXT = Str()
NAME = Str(max=256)
NAMES = List(NAME)
IFACE = Str(max=15)
BDF = Str(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
COUNTERS = Map(U64)
SECONDS = Num(0, 1e9)
OPT_NUM = Opt(Num(0, 1e18))

# /proc and /sys
_NET_DEV = Rec({f"{d}_{k}": U64 for d, ks in (
    ("rx", ("bytes", "packets", "errs", "drop", "fifo", "frame", "compressed", "multicast")),
    ("tx", ("bytes", "packets", "errs", "drop", "fifo", "colls", "carrier", "compressed")))
    for k in ks})
_PRESSURE = Map(Rec({}, optional={"avg10": Num(0, 100), "avg60": Num(0, 100),
                                  "avg300": Num(0, 100), "total": U64}, rest=Num(0, U64_MAX)),
                key=one_of("some", "full"))  # type: ignore[arg-type]
_INTERRUPTS = Rec({"cpus": List(CPU, min=1, max=MAX_CPUS),
                   "irqs": Map(Rec({"counts": List(U64, max=MAX_CPUS), "desc": TEXT,
                                    "names": NAMES}), key=Str(r"[0-9]{1,10}"))})


def _ints(n: int) -> Str:
    return Str(r"[0-9]{1,20}" + r"\s+[0-9]{1,20}" * (n - 1))


_INT_KNOBS = {"net.ipv4.tcp_moderate_rcvbuf": 1, "net.ipv4.tcp_mem": 3,
              "net.ipv4.tcp_rmem": 3, "net.ipv4.tcp_wmem": 3, "net.core.rmem_max": 1,
              "kernel.io_uring_disabled": 1, "net.core.rps_sock_flow_entries": 1}

def _cpu_stat_ok(stat: dict[str, int]) -> bool:
    # what parse_cpu_stat guarantees, and the kernel's own relation: a period is
    # throttled or not, so never more throttled periods than periods
    return ("usage_usec" in stat or "nr_periods" in stat) and \
        stat.get("nr_throttled", 0) <= stat.get("nr_periods", stat.get("nr_throttled", 0))


# cgroup_of_pid and resolve_cgroup write absolute, normalised paths (a subject of the
# report: a path of another shape would be a cgroup no collector read)
_CGROUP = Rec({"path": Str(r"/[^\x00]*", max=4095),
               "stat": Check(Map(U64, key=Str(r"[a-z][a-z0-9_.]{0,63}")), _cpu_stat_ok,
                             "neither usage_usec nor nr_periods, or more throttled periods "
                             "(nr_throttled) than periods (nr_periods)"),
               "version": one_of(1, 2),
               "quota_us": Opt(Int(0, I64)), "period_us": Opt(Int(1, I64))},
              optional={"controller": Bool()})
_STATUS = Rec({"name": Opt(TEXT), "cpus_allowed": List(CPU, min=1, max=MAX_CPUS),
               "mems_allowed": CPUS, "threads": U64, "rss_bytes": Opt(Int(0, 2**74))})
_NIC = Either("virtual", (
    (True, Rec({"iface": IFACE, "virtual": Bool()})),
    (False, Rec({"iface": IFACE, "virtual": Bool(), "device": NAME, "pci": Opt(BDF),
                 "driver": Opt(NAME), "numa_node": Opt(Int(-1, 65535)),
                 "irqs": List(Int(0, 2**32)), "irq_affinity": Map(Opt(CPUS))},
                optional={"local_cpus": CPUS, "irq_names": Map(NAMES),
                          "interrupts_error": TEXT})),
))
_CPU_MAPS = Map(Opt(CPUS))

# ethtool
_LANES = Map(U64, key=Str(r"[0-9]{1,3}"))
_FEC = Either("supported", (
    (False, Rec({"supported": Bool(), "reason": TEXT})),
    (True, Rec({"supported": Bool(), "configured": Opt(NAMES), "active": Opt(NAME),
                "stats": Map(Rec({"total": U64, "lanes": _LANES})),
                "histogram": List(Rec({"symbol_errors": Tuple((U64, U64)), "total": U64,
                                       "lanes": _LANES}))})),
))
_DBM = Num(-60, 30)


def _power_agrees(r: dict[str, Any]) -> bool:
    """ethtool -m prints one reading twice: mW to 4 decimals, dBm to 2 (0.005 dB is 0.12 %)."""
    if r["dbm"] is None:
        return r["mw"] == 0
    return abs(10 ** (r["dbm"] / 10) - r["mw"]) <= 0.00005 + 0.0012 * r["mw"] + 1e-9
_MODULE = Either("supported", (
    (False, Rec({"supported": Bool(), "reason": TEXT})),
    (True, Rec({
        "supported": Bool(), "identifier": Opt(TEXT), "connector": Opt(TEXT),
        "transmitter_technology": Opt(TEXT), "transceiver_types": List(TEXT),
        "media": one_of("copper", "optical", "unknown"), "attached_cable": Bool(),
        "cable_length_m": Opt(Num(0, 1e6)), "lengths": Map(TEXT), "vendor": Opt(TEXT),
        "part": Opt(TEXT),
        "rx_power": List(Check(Rec({"lane": Int(1, 64), "mw": Num(0, 1000), "dbm": Opt(_DBM),
                                    "kind": one_of("oma", "avg")}), _power_agrees,
                               "mw and dbm are not one reading (ethtool prints both of one "
                               "value: mw to 4 decimals, dbm to 2)")),
        "lane_flags": Map(List(Int(1, 64), max=64)),
        "rx_thresholds_dbm": Map(Opt(_DBM))})),
))
_RING = Map(Opt(Int(0, 2**32)), key=one_of("RX", "RX Mini", "RX Jumbo", "TX"))  # type: ignore[arg-type]
_TIMESTAMPING = ("SOFTWARE", "HARDWARE", "LEGACY_HW", "ONESTEP", "P2P1STEP")

# PCIe
_PCI_DEVICE = Rec({"kind": one_of("nic", "gpu", "accelerator", "upstream", "unreadable"),
                   "upstream": List(BDF, max=64), "driver": Opt(NAME), "aer": Bool(),
                   "amdgpu_replay": Bool()},
                  optional={"class": Str(r"0x[0-9a-fA-F]{6}"), "vendor": Str(r"0x[0-9a-fA-F]{4}"),
                            "serves": List(BDF), "numa_node": Opt(Int(-1, 65535)),
                            "local_cpus": Opt(CPUS), "error": TEXT})
_LINK_FIELDS = {"current_gts": "current_link_speed", "current_width": "current_link_width",
                "max_gts": "max_link_speed", "max_width": "max_link_width"}


def _link_agrees(link: dict[str, Any]) -> bool:
    """Each parsed value is what its raw sysfs text reads as (read_link keeps both)."""
    from .model import ParseError
    from .sources.pci import parse_link_speed, parse_link_width

    for key, name in _LINK_FIELDS.items():
        raw = link["raw"].get(name)
        if raw is None:
            return False
        parse = parse_link_speed if key.endswith("_gts") else parse_link_width
        try:
            if parse(raw) != link[key]:
                return False
        except ParseError:
            return False
    return True


_LINK = Check(Rec({"current_gts": Opt(Num(0, 1000)), "current_width": Int(0, 32),
                   "max_gts": Opt(Num(0, 1000)), "max_width": Int(0, 32),
                   "raw": Map(Opt(TEXT))}), _link_agrees,
              "a speed or width that is not what its raw sysfs text "
              f"({', '.join(_LINK_FIELDS.values())}) reads as")

# eBPF probes (probes/analyze.py and probes/__init__.py _summary)
_PROBE_COMMON = {"probe": NAME, "unit": NAME, "duration_s": Opt(SECONDS), "wall_s": Opt(SECONDS),
                 "startup_s": Opt(SECONDS), "pids": List(Int(1, 2**22)), "lost_events": U64}
_PROBE_EXTRA = {"not_run": TEXT, "stopped": TEXT, "raw_ns": List(U64)}
_BUCKET = Rec({"min": Num(0, 1e18), "max": Num(0, 1e18), "count": U64})
_LATENCY = {"count": U64, "p50": OPT_NUM, "p90": OPT_NUM, "p99": OPT_NUM, "p999": OPT_NUM,
            "max": OPT_NUM, "buckets": List(_BUCKET)}
_SUMMARY = Rec({"unit": NAME, **_LATENCY})
_MMSG_FIELDS = ("single_recv", "single_send", "recvmmsg", "sendmmsg", "recvmmsg_msgs",
                "sendmmsg_msgs", "recvmmsg_vlen", "sendmmsg_vlen", "calls")
@dataclass(frozen=True)
class StrOrInt(Schema):
    """A socket type or protocol: its name when known (``tcp``), else its number."""

    def check(self, v: Any, at: str) -> None:
        if isinstance(v, str):
            NAME.check(v, at)
        else:
            Int(0, 2**32).check(v, at)


_PROBES = {
    "runqlat": Rec({**_PROBE_COMMON, **_LATENCY, "scope": one_of("host", "processes")},
                   optional={**_PROBE_EXTRA, "processes": Map(_SUMMARY)}),
    "sockopt": Rec({**_PROBE_COMMON, "processes": Map(Rec({
        "comm": TEXT, "setsockopt_rcvbuf": U64, "bytes": Opt(S64), "locked_adjustments": U64,
        "locked_sockets": U64, "autotuned_adjustments": U64, "tcp_pinned": Bool(),
        "sockets": List(Rec({"type": StrOrInt(), "protocol": StrOrInt(), "calls": U64}))})),
        "pinning": List(Int(0, 2**22))}, optional=_PROBE_EXTRA),
    "mmsg": Rec({**_PROBE_COMMON, "processes": Map(Rec({
        "comm": TEXT, **{k: U64 for k in _MMSG_FIELDS}, "batch": OPT_NUM,
        "msgs_per_call": OPT_NUM, "recv_batch": OPT_NUM, "send_batch": OPT_NUM}))},
        optional=_PROBE_EXTRA),
    "malloc": Rec({**_PROBE_COMMON, "processes": Map(Rec({
        "calls": U64, "functions": COUNTERS, "by_allocator": COUNTERS, "bytes": U64,
        "per_s": OPT_NUM, "callers": COUNTERS,
        "top_stacks": List(Rec({"count": U64, "frames": List(TEXT)}))},
        optional={"allocators": List(Rec({"family": NAME, "object": TEXT, "entries": NAMES})),
                  "unprobed": List(TEXT)}))}, optional=_PROBE_EXTRA),
    "softirq": Rec({**_PROBE_COMMON, "softirq": NAME, "cpus": Map(Rec({
        "time_us": Num(0, 1e18), "runs": U64, "max_us": Num(0, 1e18),
        "share": Opt(Num(0, 1e6))}), key=Str(r"[0-9]{1,4}"))}, optional=_PROBE_EXTRA),
}

# DPDK telemetry (sources/dpdk.py read_process)
@dataclass(frozen=True)
class CounterOrCounters(Schema):
    """``/ethdev/stats``: a counter, or a per-queue array of them."""

    def check(self, v: Any, at: str) -> None:
        if isinstance(v, list):
            List(U64, max=1024).check(v, at)
        else:
            U64.check(v, at)


_DPDK_PORT = Rec({"t": Num(0, 1e12), "stats": Map(CounterOrCounters()),
                  "xstats": Opt(COUNTERS), "link": Opt(Rec(
                      {"status": NAME}, optional={"speed_mbps": U64, "duplex": NAME}))},
                 optional={"info": Opt(Rec({}, optional={
                     "name": TEXT, "nb_rx_queues": U64, "nb_tx_queues": U64, "port_id": U64,
                     "mtu": U64, "dev_started": U64, "rx_mbuf_alloc_fail": U64,
                     "numa_node": S64, "ethdev_rss_hf": U64,
                     "rxq_state": List(Opt(S64)), "txq_state": List(Opt(S64))})),
                     "module_eeprom": Opt(Map(TEXT))})
_DPDK = Rec({"pid": Opt(Int(0, 2**22)), "version": TEXT, "ports": Map(_DPDK_PORT),
             "eal_params": Opt(List(TEXT)), "app_params": Opt(List(TEXT)),
             "mempools": Opt(Map(Rec({"size": U64}, optional={
                 "cache_size": U64, "populated_size": U64, "elt_size": U64,
                 "common_pool_count": U64, "total_cache_count": U64, "free": U64}))),
             "lcores": Opt(Map(Rec({"role": Opt(NAME)}, optional={
                 "cpuset": List(S64), "busy_cycles": U64, "total_cycles": U64}))),
             "rings": Opt(Map(Rec({}, optional={
                 "size": U64, "capacity": U64, "used_count": U64, "producer_type": NAME,
                 "consumer_type": NAME}))),
             "missing": Map(TEXT)})


# GPU health (sources/gpu.py) and PFC (sources/pfc.py)
@dataclass(frozen=True)
class CountOrFlag(Schema):
    """A retired-page or remapped-row field: a count, or a pending/failure flag."""

    def check(self, v: Any, at: str) -> None:
        if isinstance(v, bool):
            return
        U64.check(v, at)


# The names sources/gpu.py writes (nvidia-smi -q, NVML's reason bits, DCGM's fields): a
# reason, counter or unreadable source under another name would be one no check looks at.
_CLOCK_REASONS = one_of("idle", "applications_clocks", "sw_power_cap", "hw_slowdown",
                        "hw_thermal", "hw_power_brake", "sync_boost", "sw_thermal",
                        "display_clock")
_GPU = Rec({"ecc": Map(Map(U64)), "clock_events": Map(Bool(), key=_CLOCK_REASONS)},  # type: ignore[arg-type]
           optional={
    "uuid": Opt(TEXT), "retired_pages": Map(CountOrFlag()), "remapped_rows": Map(CountOrFlag()),
    "nvlink": Map(Map(U64)), "nvlink_state": Map(TEXT),
    "unreadable": Map(TEXT, key=one_of("nvlink", "nvlink_state", "clock_events", "ecc")),  # type: ignore[arg-type]
    "source": TEXT, "nvlink_read": Bool(), "ras_blocks": Map(Map(U64)), "xgmi": Map(U64),
    "ecc_mode": Opt(NAME), "xid_last": Int(0, 2**32),
    "clock_event_us": Map(U64, key=_CLOCK_REASONS),  # type: ignore[arg-type]
    "violation_us": Map(U64, key=one_of("power", "thermal", "sync_boost", "board_limit",  # type: ignore[arg-type]
                                        "reliability")),
    "nvlink_total": Map(U64, key=one_of("crc_flit", "crc_data", "replay", "recovery")),  # type: ignore[arg-type]
    "name": Opt(TEXT)})
_XID = Rec({"t_s": Opt(SECONDS), "bdf": Opt(TEXT), "code": Opt(Int(0, 2**16)), "text": TEXT},
           optional={"kind": NAME})
_GPU_BUS = Map(Rec({"vendor": one_of("nvidia", "amd"), "driver": Opt(NAME)}), key=BDF)
_PFC = Rec({"global": COUNTERS, "prio": Map(COUNTERS, key=Str(r"[0-7]")),
            "link_pause": Opt(Map(Bool())), "unreadable": Map(TEXT),
            "pfc": Opt(Rec({"enabled": List(Int(0, 7), max=8), "cap": Opt(Int(0, 8))})),
            "pfc_source": Opt(NAME), "rdma": NAMES},
           optional={"storm": COUNTERS, "traffic": Map(COUNTERS, key=Str(r"[0-7]"))})
_PLATFORM = Rec({"kind": one_of("baremetal", "vm", "container"), "hypervisor": Opt(NAME),
                 "container": Opt(NAME), "read": List(TEXT), "signs": List(TEXT)})


# Fact name (full match, ASCII) -> schema; the first match decides.
SCHEMAS: tuple[tuple[str, Schema], ...] = (
    # Tcp MaxConn is -1 ("no limit"), the one signed value; everything else counts
    # protocol and counter names are the kernel's (SNMP_MIB_ITEM: "Tcp", "RetransSegs",
    # "TCPTimeouts", "InType3"): a name of another shape is a counter no check knows
    (r"net\.(snmp|netstat)", Check(
        Map(Rec({}, optional={"MaxConn": Int(-1, U64_MAX)}, rest=U64),
            key=Str(r"[A-Z][A-Za-z0-9]{1,31}")),
        lambda v: all(re.fullmatch(r"[A-Z][A-Za-z0-9_]{0,63}", k, re.ASCII)
                      for c in v.values() for k in c),
        "a counter name that is not the kernel's ([A-Z][A-Za-z0-9_]*)")),
    (r"net\.softnet", List(Rec({"cpu": U64, "processed": U64, "dropped": U64,
                               "time_squeeze": U64}), min=1, max=MAX_CPUS)),
    (r"net\.dev", Map(_NET_DEV)),
    (r"proc\.softirqs", Map(List(U64, max=MAX_CPUS))),
    (r"proc\.interrupts", _INTERRUPTS),
    # MemTotal is RAM: at most the 52-bit physical address space of any architecture
    # Linux runs on (4 PiB); other fields (VmallocTotal) are address space, kB of a u64
    (r"proc\.meminfo", Check(Map(Int(0, 2**74)), lambda v: 0 < v.get("MemTotal", 0) <= 2**52,
                             "no MemTotal in 1 byte .. 4 PiB (2^52, the largest physical "
                             "address space)")),
    (r"pressure\.(cpu|io|memory)", Check(_PRESSURE, lambda v: "some" in v, "no 'some' line")),
    *((r"sysctl\." + re.escape(k), _ints(n)) for k, n in _INT_KNOBS.items()),
    (r"sysctl\.[a-z0-9_.]+", Str(max=64 * 1024)),
    (r"kernel\.tcp_bbr", Rec({"version": Opt(TEXT), "source": TEXT})),
    (r"hw\.page_size", Check(Int(4096, 2**30), lambda v: v & (v - 1) == 0,
                             "not a power of two")),
    (r"numa\.nodes", List(Int(0, 1023), min=1, max=1024)),
    (r"cgroup\.(target|pid\.[0-9]+)", _CGROUP),
    (r"proc\.[0-9]+\.status", _STATUS),
    (r"proc\.[0-9]+\.schedstat", Rec({"run_ns": U64, "wait_ns": U64, "timeslices": U64,
                                      "start_ticks": U64})),
    (r"proc\.[0-9]+\.io_uring", List(Rec({
        "fd": Int(0, 2**31), "sqpoll": Bool(), "sq_thread": Opt(Int(-1, 2**32)),
        "sq_thread_cpu": Opt(Int(-1, 2**32)), "user_bufs": U64, "user_files": U64}))),
    (r"proc\.[0-9]+\.numa_maps", Rec({"policies": Map(Int(1, U64_MAX)),
                                      "resident_bytes": Map(Int(0, 2**84))})),
    (r"proc\.[0-9]+\.gpus", Rec({"gpus": List(TEXT), "unresolved": List(TEXT)})),
    (r"sockets\.[0-9]+", Rec({"connections": U64, "skmem": List(COUNTERS)})),
    (r"kernel\.slabinfo", Map(Int(1, 2**32))),
    (r"(nic|rps|xps|tc\.qdisc|net\.pfc|ethtool\.(info|fec|phy|module|rss|rings|ts))", List(IFACE)),
    (r"net\.pfc\..+", _PFC),
    (r"host\.platform", _PLATFORM),
    (r"host\.edac", Rec({"mcs": Map(Rec({"ce": U64, "ue": U64, "dimms": Map(Rec({
        "label": Opt(TEXT), "ce": U64, "ue": U64}))}), key=Str(r"mc[0-9]{1,4}"))})),
    (r"cpu\.smi", Rec({"count": Opt(Int(0, 2**32)), "cpu": Int(0, 2**16)},
                      optional={"no_msr": TEXT})),
    (r"gpu\.health", Rec({"source": Opt(TEXT), "gpus": Map(_GPU), "tried": Map(TEXT)},
                         optional={"bus": _GPU_BUS, "attached": Opt(Int(0, 9999)),
                                   "refused": Map(TEXT), "pci_unreadable": Map(TEXT, key=BDF)})),
    (r"kernel\.events", Rec({"source": NAME, "uptime_s": SECONDS, "boot_id": Opt(TEXT),
                             "events": List(_XID)})),
    (r"gpu\.xid", Rec({"gpus": List(TEXT), "events": List(_XID), "uptime_s": Opt(SECONDS),
                       "boot_id": Opt(TEXT)},
                      optional={"bus": _GPU_BUS, "source": Opt(NAME), "unreadable": TEXT,
                                "pci_unreadable": Map(TEXT, key=BDF)})),
    (r"nic\.[^.].*", _NIC),
    (r"rps\..+", Rec({"rps_cpus": _CPU_MAPS, "rps_flow_cnt": Map(Opt(Int(0, 2**32)))})),
    (r"xps\..+", Rec({"queues": _CPU_MAPS, "online": List(CPU, min=1, max=MAX_CPUS)})),
    (r"tc\.qdisc\..+", Rec({"root": NAME, "leaves": List(Rec({
        "kind": NAME, "parent": Opt(NAME),
        "class": one_of("aqm", "tail-drop", "noqueue", "other")}))})),
    (r"ethtool\.info\..+", Rec({"driver": NAME}, rest=TEXT)),
    (r"ethtool\.fec\..+", _FEC),
    (r"ethtool\.phy\..+", COUNTERS),
    (r"ethtool\.module\..+", _MODULE),
    # the kernel refuses an indirection table entry beyond the RX rings (ethtool -X, -L)
    (r"ethtool\.rss\..+", Check(Rec({"rings": Int(0, 65535), "table": List(Int(0, 65535)),
                                     "key": Opt(Str(r"[0-9a-f]{2,1024}")),
                                     "functions": Map(Bool()), "transforms": Map(Bool()),
                                     "unknown_bits": COUNTERS}),
                                lambda v: all(t < v["rings"] for t in v["table"]),
                                "an indirection table entry names a ring beyond the RX rings")),
    (r"ethtool\.rings\..+", Rec({"current": _RING}, optional={"max": _RING})),
    (r"ethtool\.ts\..+", Rec({"capabilities": NAMES, "phc_index": Opt(Int(0, 2**31)),
                              "tx_modes": NAMES, "rx_filters": NAMES, "hardware": Bool()})),
    (r"ptp\.pmc", Rec({
        "time_status": List(Rec({"port": NAME, "master_offset_ns": S64, "gm_present": Bool(),
                                 "gm": Opt(NAME)})),
        "ports": List(Rec({"port": NAME, "state": Opt(NAME), "timestamping": Const(_TIMESTAMPING),
                           "interface": Opt(NAME)}))})),
    (r"ptp\.log", Rec({
        "samples": List(Rec({"prog": one_of("ptp4l", "phc2sys"), "kind": one_of("master", "phc"),
                             "offset_ns": S64, "state": Str(r"s[0-9]"), "freq_ppb": S64,
                             "delay_ns": S64})),
        "summaries": List(Rec({"prog": one_of("ptp4l", "phc2sys"), "rms_ns": U64,
                               "max_ns": U64}))},
        optional={"unavailable": TEXT})),
    (r"chrony\.tracking", Rec({
        "ref_id": Str(r"[0-9A-F]{8}"), "ref_name": Opt(TEXT),
        "kind": one_of("none", "local", "phc", "refclock", "ntp"), "stratum": Int(0, 255),
        "offset_ns": Num(-1e18, 1e18), "leap": TEXT, "synchronised": Bool()})),
    (r"pci\.devices", Map(_PCI_DEVICE, key=BDF)),
    (r"pci\.aer", Rec({"counters": Map(COUNTERS, key=BDF), "errors": Map(TEXT)})),
    (r"pci\.aer_uncorrectable", Rec({"counters": Map(Rec({"fatal": COUNTERS,
                                                           "nonfatal": COUNTERS}), key=BDF),
                                     "errors": Map(TEXT)})),
    (r"pci\.replay", Rec({"counters": Map(COUNTERS, key=BDF), "sources": Map(TEXT),
                          "errors": Map(TEXT)})),
    (r"pci\.links", Rec({"chains": Map(List(BDF, min=1, max=64), key=BDF),
                         "links": Map(Opt(_LINK), key=BDF), "errors": Map(TEXT)})),
    (r"cpu\.siblings", Map(CPUS, key=Str(r"[0-9]{1,4}"))),
    (r"engine\.metrics", Rec({"url": TEXT, "samples": List(Tuple((NAME, Map(TEXT), Num())))})),
    (r"engine\.memory_stats", Map(Map(Num(0, 2**64)))),
    *((r"probe\." + name, schema) for name, schema in _PROBES.items()),
    (r"dpdk", List(NAME)),
    (r"dpdk\..+", _DPDK),
)
_COMPILED = tuple((re.compile(p, re.ASCII), s) for p, s in SCHEMAS)


def schema_for(name: str) -> Schema | None:
    for pattern, schema in _COMPILED:
        if pattern.fullmatch(name):
            return schema
    return None


# The per-interface collectors (ethtool.per_iface, netdev.nics) write the list of the
# interfaces they read under their own name and one fact PREFIX.IFACE (a value or the reason
# it is missing) for each: the list and those facts name the same interfaces.
INDEX = re.compile(r"nic|rps|xps|tc\.qdisc|net\.pfc|ethtool\.(info|fec|phy|module|rss|rings|ts)",
                   re.ASCII)


def index_refusals(names: list[str], values: dict[str, Any]) -> dict[str, str]:
    """Why each interface list among ``values`` (fact name -> value, of one sample) does not
    name the interfaces whose facts the sample holds (``names``: every fact in it)."""
    out = {}
    for prefix, listed in values.items():
        if not INDEX.fullmatch(prefix) or not isinstance(listed, list):
            continue
        held = sorted(n[len(prefix) + 1:] for n in names if n.startswith(prefix + "."))
        if sorted(listed) != held:
            out[prefix] = (f"{prefix}: lists {_short(sorted(listed))} but holds the facts of "
                           f"{_short(held)}: not one collection")
    return out


def refusal(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the fact ``name`` (None when it matches its schema)."""
    schema = schema_for(name)
    if schema is None:
        return f"fact {name!r}: no such fact in this tailgate"
    try:
        schema.check(value, name)
    except _Mismatch as exc:
        return str(exc)
    except RecursionError:
        return f"{name}: nested too deep"
    return None
