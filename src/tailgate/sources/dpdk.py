"""DPDK data planes, read through their telemetry socket.

A DPDK process (since 20.05, on by default) listens on
``<runtime dir>/dpdk_telemetry.v2``: a ``SOCK_SEQPACKET`` Unix socket that
greets a client with ``{"version", "pid", "max_output_len"}`` and answers each
command (``/ethdev/stats,0``) with one JSON message ``{"/ethdev/stats": data}``.
The runtime directory is ``/var/run/dpdk/<file prefix>`` for root and
``$XDG_RUNTIME_DIR/dpdk/<file prefix>`` otherwise.

Only read commands are sent (lists, info and statistics; never a reset). The
reply shapes differ between releases, and the parsers here accept all of them
(from DPDK's ``lib/ethdev/rte_ethdev_telemetry.c``, ``lib/mempool/rte_mempool.c``,
``lib/ring/rte_ring.c``, ``lib/eal/common/eal_common_lcore.c`` per LTS tag):

* 20.11: ``/ethdev/{list,stats,xstats,link_status}`` and ``/eal/params`` only: no
  ``/ethdev/info``, no ``/mempool/*``.
* 21.11, 22.11: ``/ethdev/info`` with integer offload masks (``rx_mbuf_alloc_fail`` in
  21.11 only) and ``/mempool/{list,info}`` without a fill count; no ``/eal/lcore/*``.
* 23.11: ``/eal/lcore/list`` and ``/eal/lcore/info`` (role, cpuset, busy cycles);
  ``dev_flags``/``ethdev_rss_hf`` as ``"0x.."`` strings, offloads as lists of names;
  ``/mempool/info`` adds ``common_pool_count`` and ``total_cache_count`` (the free objects).
* 24.11: ``/ring/list`` and ``/ring/info`` (size, capacity, used_count) as well.

``/ethdev/module_eeprom`` (22.07+) is read and kept for the optics; no check judges it yet.

A command the process does not offer answers ``null``; it is recorded as absent with
the reason, never as zero. The client (``Telemetry``) alone touches the socket; the
``parse_*`` functions are pure, so captured replies test them.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import time
from collections.abc import Callable
from typing import Any

from ..collect import Scope, collector
from ..host import Host
from ..model import Fact, ParseError, SourceError
from .records import loads_unique

SOCKET_NAME = "dpdk_telemetry.v2"
RUN_DIRS = ("/var/run/dpdk", "/run/dpdk")
DEFAULT_TIMEOUT_S = 1.0
MAX_REPLY = 1 << 20  # the server caps a reply at max_output_len (16 KiB up to 24.11)
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
_QUEUE_XSTAT = re.compile(r"^(rx|tx)_q([0-9]+)_(packets|bytes)$")


def valid_prefix(prefix: str) -> str:
    """A DPDK ``--file-prefix``: a directory name, nothing that walks out of the run dir."""
    if not _PREFIX_RE.match(prefix) or prefix in (".", ".."):
        raise ValueError(f"invalid DPDK file prefix: {prefix!r}")
    return prefix


# -- the client: the only code that touches a socket ----------------------------------------------

class Telemetry:
    """One read-only telemetry connection with a time-out on every exchange."""

    def __init__(self, path: str, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(path)
            self.hello = self._recv("connect")
        except OSError as exc:
            self.sock.close()
            raise SourceError(_socket_reason(exc, path)) from exc
        except SourceError:
            self.sock.close()
            raise
        if not isinstance(self.hello, dict) or "pid" not in self.hello:
            self.sock.close()
            raise SourceError(f"{path}: greeting is not DPDK telemetry's: {self.hello!r:.120}")

    def _recv(self, what: str) -> Any:
        try:
            data = self.sock.recv(MAX_REPLY)
        except TimeoutError as exc:
            raise SourceError(f"{self.path}: no answer to {what} within "
                              f"{self.sock.gettimeout():g} s") from exc
        except OSError as exc:
            raise SourceError(_socket_reason(exc, self.path)) from exc
        if not data:
            raise SourceError(f"{self.path}: the process closed the socket during {what} "
                              "(it exited, or its telemetry client limit is reached)")
        try:
            return loads_unique(data, "a JSON object's key")
        except ParseError as exc:
            raise ParseError(f"{self.path}: reply to {what}: {exc}") from exc
        except ValueError as exc:
            raise ParseError(f"{self.path}: reply to {what} is not JSON: {data[:80]!r}") from exc

    def clock(self) -> float:
        return time.monotonic()

    def query(self, command: str) -> Any:
        """Send ``/cmd[,param]`` and return the reply's data (``None``: not offered)."""
        try:
            self.sock.send(command.encode())
        except OSError as exc:
            raise SourceError(_socket_reason(exc, self.path)) from exc
        reply = self._recv(command)
        key = command.split(",", 1)[0]
        if not isinstance(reply, dict) or key not in reply:
            raise ParseError(f"{self.path}: reply to {command} has no {key!r} key: {reply!r:.120}")
        return reply[key]

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _socket_reason(exc: OSError, path: str) -> str:
    if exc.errno == errno.ENOENT:
        return f"{path}: absent (no DPDK process with telemetry there)"
    if exc.errno == errno.ECONNREFUSED:
        return f"{path}: connection refused (the process has exited; a stale runtime directory)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{path}: permission denied (run as the DPDK process's user or root)"
    if exc.errno in (errno.EPIPE, errno.ECONNRESET):
        return f"{path}: the process closed the connection (it exited mid-read)"
    return f"{path}: {exc.strerror or exc}"


# -- pure parsers -------------------------------------------------------------------------------

def as_int(value: Any) -> int | None:
    """A counter as DPDK prints it: an integer, or (23.03+, uint_hex) a ``"0x.."`` string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return None
    return None


def parse_port_list(data: Any) -> list[int]:
    if data is None:
        return []
    if not isinstance(data, list):
        raise ParseError(f"/ethdev/list: expected a list of port ids, got {type(data).__name__}")
    ports = [as_int(p) for p in data]
    if any(p is None or p < 0 for p in ports):
        raise ParseError(f"/ethdev/list: not port ids: {data!r:.80}")
    return sorted(set(p for p in ports if p is not None))


def parse_stats(data: Any) -> dict[str, Any]:
    """``/ethdev/stats``: the basic counters and the per-queue arrays (``q_ipackets``...).

    Fields absent in a release stay absent. Per-queue arrays have
    RTE_ETHDEV_QUEUE_STAT_CNTRS (16) entries whatever the queue count.
    """
    if not isinstance(data, dict):
        raise ParseError(f"/ethdev/stats: expected an object, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, list):
            nums = [as_int(v) for v in value]
            if any(n is None for n in nums):
                raise ParseError(f"/ethdev/stats: {key} holds a non-counter")
            out[str(key)] = nums
        else:
            n = as_int(value)
            if n is None:
                raise ParseError(f"/ethdev/stats: {key} = {value!r:.40} is not a counter")
            out[str(key)] = n
    return out


def parse_xstats(data: Any) -> dict[str, int]:
    """``/ethdev/xstats``: name -> counter; names vary by driver and are kept as they are."""
    if not isinstance(data, dict):
        raise ParseError(f"/ethdev/xstats: expected an object, got {type(data).__name__}")
    out: dict[str, int] = {}
    for key, value in data.items():
        n = as_int(value)
        if n is not None:  # a driver's non-numeric entry is not a counter
            out[str(key)] = n
    return out


def parse_info(data: Any) -> dict[str, Any]:
    """``/ethdev/info`` (21.11+): the fields checks read, normalised across releases."""
    if not isinstance(data, dict):
        raise ParseError(f"/ethdev/info: expected an object, got {type(data).__name__}")
    out: dict[str, Any] = {}
    if isinstance(data.get("name"), str):
        out["name"] = data["name"]
    for key in ("nb_rx_queues", "nb_tx_queues", "port_id", "mtu", "dev_started",
                "rx_mbuf_alloc_fail", "numa_node", "ethdev_rss_hf"):
        n = as_int(data.get(key))
        if n is not None:
            out[key] = n
    for key in ("rxq_state", "txq_state"):
        if isinstance(data.get(key), list):
            out[key] = [as_int(v) for v in data[key]]
    return out


def parse_link(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("status"), str):
        raise ParseError(f"/ethdev/link_status: no status in {data!r:.80}")
    out: dict[str, Any] = {"status": data["status"]}
    speed = as_int(data.get("speed"))
    if speed is not None:
        out["speed_mbps"] = speed
    if isinstance(data.get("duplex"), str):
        out["duplex"] = data["duplex"]
    return out


def parse_module_eeprom(data: Any) -> dict[str, str] | None:
    """``/ethdev/module_eeprom`` (22.07+): the SFF-8079/8472/8636 fields DPDK decodes, named
    as ``ethtool -m`` prints them; kept as text. ``{}`` (no module) gives None."""
    if not isinstance(data, dict) or not data:
        return None
    return {str(k): str(v) for k, v in data.items() if isinstance(v, (str, int, float))}


def parse_mempool(data: Any) -> dict[str, Any]:
    """``/mempool/info``: size, and (23.03+) the free objects, common pool plus caches."""
    if not isinstance(data, dict):
        raise ParseError(f"/mempool/info: expected an object, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key in ("size", "cache_size", "populated_size", "elt_size", "common_pool_count",
                "total_cache_count"):
        n = as_int(data.get(key))
        if n is not None:
            out[key] = n
    if "size" not in out:
        raise ParseError(f"/mempool/info: no size in {data!r:.80}")
    if "common_pool_count" in out:
        out["free"] = out["common_pool_count"] + out.get("total_cache_count", 0)
    return out


def parse_ring(data: Any) -> dict[str, Any]:
    """``/ring/info`` (23.07+): capacity and how many entries are queued now."""
    if not isinstance(data, dict):
        raise ParseError(f"/ring/info: expected an object, got {type(data).__name__}")
    out = {k: as_int(data.get(k)) for k in ("size", "capacity", "used_count")}
    out = {k: v for k, v in out.items() if v is not None}
    for key in ("producer_type", "consumer_type"):
        if isinstance(data.get(key), str):
            out[key] = data[key]
    return out


def parse_lcore(data: Any) -> dict[str, Any]:
    """``/eal/lcore/info`` (23.03+): role (RTE, SERVICE, NON_EAL) and CPU set."""
    if not isinstance(data, dict):
        raise ParseError(f"/eal/lcore/info: expected an object, got {type(data).__name__}")
    out: dict[str, Any] = {"role": data.get("role") if isinstance(data.get("role"), str) else None}
    if isinstance(data.get("cpuset"), list):
        out["cpuset"] = [c for c in (as_int(v) for v in data["cpuset"]) if c is not None]
    for key in ("busy_cycles", "total_cycles"):
        n = as_int(data.get(key))
        if n is not None:
            out[key] = n
    return out


def _cpu_list(text: str) -> list[int]:
    """``1-3,5`` or ``(1,2)`` -> [1, 2, 3, 5]; ValueError on anything else."""
    out: list[int] = []
    for part in text.strip("()").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a or b - a > 4096:
            raise ValueError(f"bad range {part!r}")
        out.extend(range(a, b + 1))
    return out


def _split_top(text: str) -> list[str]:
    """Split ``--lcores`` at commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p]


def parse_eal_lcores(params: list[str]) -> dict[str, Any]:
    """The lcores an EAL command line (``/eal/params``) asks for: ``-l``, ``-c``,
    ``--lcores`` and ``--main-lcore`` (``--master-lcore`` before 20.11).

    Returns ``{"lcores": [...], "main": id, "cpus": {lcore: [cpu, ...]}}``; without an
    lcore option EAL takes every CPU, which this cannot know, so ``lcores`` is absent.
    """
    lcores: list[int] | None = None
    cpus: dict[int, list[int]] = {}
    main: int | None = None
    args = list(params)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        step = 1 if eq else 2
        if name == "-l" or (arg.startswith("-l") and len(arg) > 2 and not arg.startswith("--")):
            if name == "-l":
                lcores = _cpu_list(value)
            else:
                lcores, step = _cpu_list(arg[2:]), 1
            cpus = {c: [c] for c in lcores}
        elif name == "-c":
            mask = int(value, 16)
            lcores = [b for b in range(mask.bit_length()) if mask >> b & 1]
            cpus = {c: [c] for c in lcores}
        elif name == "--lcores":
            lcores, cpus = [], {}
            for item in _split_top(value):
                ids, at, where = item.partition("@")
                group = _cpu_list(ids)
                for lc in group:
                    cpus[lc] = _cpu_list(where) if at else [lc]
                lcores.extend(group)
        elif name in ("--main-lcore", "--master-lcore"):
            main = int(value)
        else:
            step = 1
        i += step
    out: dict[str, Any] = {}
    if lcores is not None:
        lcores = sorted(set(lcores))
        out["lcores"] = lcores
        out["cpus"] = {str(k): v for k, v in sorted(cpus.items())}
        out["main"] = main if main is not None else (lcores[0] if lcores else None)
    elif main is not None:
        out["main"] = main
    return out


def testpmd_forwarding_cores(app_params: list[str]) -> int | None:
    """testpmd's ``--nb-cores=N`` (the forwarding lcores it uses), if given."""
    for i, arg in enumerate(app_params):
        if arg.startswith("--nb-cores="):
            return int(arg.split("=", 1)[1])
        if arg == "--nb-cores" and i + 1 < len(app_params):
            return int(app_params[i + 1])
    return None


# -- reading one process -------------------------------------------------------------------------

def _try(tel: Telemetry, command: str, parse, missing: dict[str, str]) -> Any:
    """One optional command: its parsed reply, or None with the reason in ``missing``."""
    data = tel.query(command)
    if data is None:
        missing[command] = f"{command}: not offered by this DPDK release or application"
        return None
    try:
        return parse(data)
    except ParseError as exc:
        missing[command] = str(exc)
        return None


def _list(data: Any) -> list[Any]:
    """A list reply's items that can name a thing (a ring, a pool, an lcore)."""
    if not isinstance(data, list):
        return []
    return [x for x in data if isinstance(x, (str, int)) and not isinstance(x, bool)]


def read_process(path: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 client: Callable[[str, float], Telemetry] = Telemetry) -> dict[str, Any]:
    """Everything tailgate reads from one DPDK process, as one JSON-able sample.

    Raises SourceError when the socket cannot be read at all, or the process exits
    mid-read (a half sample must not be judged as a whole one). ``client`` stands in
    for the socket when captured replies are replayed (tests, fixtures).
    """
    missing: dict[str, str] = {}
    with client(path, timeout_s) as tel:
        hello = tel.hello
        sample: dict[str, Any] = {
            "pid": as_int(hello.get("pid")),
            "version": str(hello.get("version", "")),
            "ports": {},
        }
        # The counters first, each between two clock readings: rates divide by the time
        # between two reads of the same counters, not by the interval of the whole
        # inspection, and nothing slower sits between connecting and reading them.
        counters: dict[int, tuple[float, Any]] = {}
        for port in parse_port_list(tel.query("/ethdev/list")):
            t0 = tel.clock()
            stats = tel.query(f"/ethdev/stats,{port}")
            counters[port] = ((t0 + tel.clock()) / 2, stats)

        offered = tel.query("/")
        commands = {c for c in _list(offered) if isinstance(c, str)}
        eal = tel.query("/eal/params")
        sample["eal_params"] = [str(a) for a in eal] if isinstance(eal, list) else None
        if eal is None:
            missing["/eal/params"] = "/eal/params: not offered"
        app = tel.query("/eal/app_params") if "/eal/app_params" in commands else None
        sample["app_params"] = [str(a) for a in app] if isinstance(app, list) else None

        for port, (when, stats) in counters.items():
            entry: dict[str, Any] = {"t": when}
            # xstats a moment later: the per-queue split and driver counters, not the rate
            xstats = tel.query(f"/ethdev/xstats,{port}")
            if stats is None:
                # The port went away between /ethdev/list and now (hot-unplug).
                missing[f"/ethdev/stats,{port}"] = f"port {port}: no statistics (removed?)"
                continue
            entry["stats"] = parse_stats(stats)
            entry["xstats"] = parse_xstats(xstats) if xstats is not None else None
            if "/ethdev/info" in commands:
                entry["info"] = _try(tel, f"/ethdev/info,{port}", parse_info, missing)
            else:
                missing[f"/ethdev/info,{port}"] = "/ethdev/info: not offered (before DPDK 21.11)"
            entry["link"] = _try(tel, f"/ethdev/link_status,{port}", parse_link, missing)
            if "/ethdev/module_eeprom" in commands:  # 22.07+: the optic, decoded like ethtool -m
                eeprom = tel.query(f"/ethdev/module_eeprom,{port}")
                entry["module_eeprom"] = parse_module_eeprom(eeprom)
                if entry["module_eeprom"] is None:
                    missing[f"/ethdev/module_eeprom,{port}"] = (
                        f"port {port}: no module EEPROM (a virtual device, or no pluggable module)")
            sample["ports"][str(port)] = entry

        pools: dict[str, Any] = {}
        names = tel.query("/mempool/list") if "/mempool/list" in commands else None
        for name in _list(names):
            info = _try(tel, f"/mempool/info,{name}", parse_mempool, missing)
            if info is not None:
                pools[str(name)] = info
        sample["mempools"] = pools if isinstance(names, list) else None
        if names is None:
            missing["/mempool/list"] = "/mempool/list: not offered (before DPDK 21.05)"

        if "/eal/lcore/list" in commands:
            lcores: dict[str, Any] = {}
            for lc in _list(tel.query("/eal/lcore/list")):
                info = _try(tel, f"/eal/lcore/info,{lc}", parse_lcore, missing)
                if info is not None:
                    lcores[str(lc)] = info
            sample["lcores"] = lcores
        else:
            sample["lcores"] = None
            missing["/eal/lcore/list"] = "/eal/lcore/list: not offered (before DPDK 23.03)"

        if "/ring/list" in commands:
            rings: dict[str, Any] = {}
            for name in _list(tel.query("/ring/list")):
                info = _try(tel, f"/ring/info,{name}", parse_ring, missing)
                if info is not None:
                    rings[str(name)] = info
            sample["rings"] = rings
        else:
            sample["rings"] = None
            missing["/ring/list"] = "/ring/list: not offered (before DPDK 24.03)"
    sample["missing"] = missing
    return sample


# -- discovery and the collector ------------------------------------------------------------------

def run_dirs(host: Host) -> list[str]:
    """Where DPDK puts runtime directories: /var/run/dpdk for root, else $XDG_RUNTIME_DIR/dpdk."""
    dirs = list(RUN_DIRS)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and host.live:
        dirs.append(os.path.join(xdg, "dpdk"))
    return dirs


def discover(host: Host, prefixes: tuple[str, ...] = ()) -> dict[str, str | None]:
    """file prefix -> telemetry socket path (None: a runtime directory without one)."""
    found: dict[str, str | None] = {}
    for base in run_dirs(host):
        if not host.exists(base):
            continue
        names = host.listdir(base)
        for name in names:
            if prefixes and name not in prefixes:
                continue
            sock = str(host.path(f"{base}/{name}/{SOCKET_NAME}"))
            if found.get(name):
                continue  # /run and /var/run are usually the same directory
            found[name] = sock if os.path.exists(sock) else None
    return found


@collector("dpdk", counter=True, multi=True,
           names=lambda t: ["dpdk", *(f"dpdk.{p}" for p in t.options.get("dpdk") or ())])
def dpdk(host: Host, scope: Scope) -> dict[str, Fact]:
    """``dpdk``: the file prefixes seen; ``dpdk.<prefix>``: one process's sample."""
    prefixes = tuple(scope.options.get("dpdk") or ())
    found = discover(host, prefixes)
    facts: dict[str, Fact] = {}
    for prefix in prefixes:
        if prefix not in found:
            facts[f"dpdk.{prefix}"] = Fact(missing=f"DPDK file prefix {prefix!r}: no runtime "
                                           f"directory under {' or '.join(run_dirs(host))}")
    for prefix, sock in sorted(found.items()):
        if sock is None:
            if prefixes:  # asked for by name: say why it cannot be read
                facts[f"dpdk.{prefix}"] = Fact(
                    missing=f"DPDK file prefix {prefix!r}: no {SOCKET_NAME} in its runtime "
                    "directory (the process exited, runs with --no-telemetry, or predates "
                    "DPDK 20.05)")
            continue  # auto-discovery: a stale directory left by an exited process
        try:
            facts[f"dpdk.{prefix}"] = Fact(value=read_process(sock, min(host.timeout_s, 2.0)))
        except SourceError as exc:
            facts[f"dpdk.{prefix}"] = Fact(missing=str(exc))
    facts["dpdk"] = Fact(value=sorted(k.removeprefix("dpdk.") for k in facts))
    return facts
