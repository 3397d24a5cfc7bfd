"""Per-process facts for --pid: allowed CPUs and memory nodes, memory policy, schedstat,
io_uring rings, GPUs held open."""

from __future__ import annotations

import posixpath
import re

from ..collect import Scope, collector
from ..host import Host
from ..model import Fact, ParseError, SourceError
from .records import is_uint, parse_cpulist, put


def parse_status(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            put(out, key.strip(), value.strip(), "status")
    if "Cpus_allowed_list" not in out:
        raise ParseError("no Cpus_allowed_list in status")
    return out


def parse_schedstat(text: str) -> dict[str, int]:
    """/proc/PID/schedstat: time on CPU (ns), time runnable waiting for a CPU (ns), timeslices."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    parts = lines[0].split() if lines else []
    if len(parts) != 3:
        raise ParseError(f"expected 3 fields, got {len(parts)}")
    if not all(re.fullmatch(r"[0-9]{1,20}", p) for p in parts):
        raise ParseError(f"not counters: {lines[0][:60]!r}")
    run, wait, slices = (int(p) for p in parts)
    return {"run_ns": run, "wait_ns": wait, "timeslices": slices}


def parse_stat_start(text: str) -> int:
    """/proc/PID/stat: the process's start time (field 22, clock ticks after boot), which
    tells a process from a later one given the same PID. The command name (field 2) may hold
    spaces and parentheses, so the fields are counted after its last ``)``."""
    _, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        raise ParseError(f"stat: {len(fields)} fields after the command name, expected >= 20")
    start = fields[19]
    if not (is_uint(start) and len(start) <= 20):
        raise ParseError(f"stat: starttime not a count: {start[:40]!r}")
    return int(start)


def parse_io_uring_fdinfo(text: str) -> dict[str, object]:
    """fdinfo of an io_uring fd (kernel 5.x+): SQPOLL thread and registered files/buffers.

    ``SqThread: -1`` means no SQPOLL. ``UserBufs: N`` is the count of registered
    buffers (older kernels list them without a count: then the indented entries
    are counted).
    """
    fields: dict[str, str] = {}
    current = None
    listed: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line[0] in " \t":
            if current:
                listed[current] = listed.get(current, 0) + 1
            continue
        key, _, value = line.partition(":")
        current = key.strip()
        put(fields, current, value.strip(), "io_uring fdinfo")
    if "SqMask" not in fields and "SqThread" not in fields:
        raise ParseError("not an io_uring fdinfo (no SqMask/SqThread)")

    def number(key: str) -> int | None:
        raw = fields.get(key, "")
        if raw == "":
            return listed.get(key) if key in fields else None
        # -1 is "none" for the SQPOLL thread and its CPU; every other field is a count.
        allowed = r"-1|[0-9]{1,10}" if key in ("SqThread", "SqThreadCpu") else r"[0-9]{1,10}"
        if not re.fullmatch(allowed, raw):
            raise ParseError(f"{key}: not a value: {raw[:40]!r}")
        return int(raw)

    sq_thread = number("SqThread")
    return {
        "sqpoll": sq_thread is not None and sq_thread >= 0,
        "sq_thread": sq_thread,
        "sq_thread_cpu": number("SqThreadCpu"),
        "user_bufs": number("UserBufs") or 0,
        "user_files": number("UserFiles") or 0,
    }


def _kib(value: str | None) -> int | None:
    """``1952 kB`` -> bytes; None when absent (kernel threads have no VmRSS)."""
    if not value:
        return None
    number = value.split()[0]
    if not (is_uint(number) and len(number) <= 20):
        raise ParseError(f"status: not a size in kB: {value[:40]!r}")
    return int(number) * 1024


def _count(text: str, what: str) -> int:
    if not (is_uint(text) and len(text) <= 20):
        raise ParseError(f"status: {what}: not a count: {text[:40]!r}")
    return int(text)


def read_status(host: Host, pid: int) -> dict[str, str]:
    """/proc/PID/status of a live process; a zombie has exited and says so."""
    st = parse_status(host.read(f"/proc/{pid}/status"))
    if st.get("State", "").startswith(("Z", "X")):
        raise SourceError(f"pid {pid} has exited ({st['State']})")
    return st


@collector("proc.pid.status", multi=True,
           names=lambda t: [f"proc.{pid}.status" for pid in t.pids])
def pid_status(host: Host, scope: Scope) -> dict[str, object]:
    out: dict[str, object] = {}
    for pid in scope.pids:
        name = f"proc.{pid}.status"
        try:
            st = read_status(host, pid)
            out[name] = {"name": st.get("Name"),
                         "cpus_allowed": parse_cpulist(st["Cpus_allowed_list"], empty_ok=False),
                         "mems_allowed": parse_cpulist(st.get("Mems_allowed_list", "")),
                         "threads": _count(st.get("Threads", "0") or "0", "Threads"),
                   "rss_bytes": _kib(st.get("VmRSS"))}
        except SourceError as exc:
            out[name] = Fact(missing=f"pid {pid}: {host.blame(exc)}"
                             + ("" if isinstance(exc, ParseError) else " (did the process exit?)"))
    return out


@collector("proc.pid.schedstat", counter=True, multi=True,
           names=lambda t: [f"proc.{pid}.schedstat" for pid in t.pids])
def pid_schedstat(host: Host, scope: Scope) -> dict[str, object]:
    out: dict[str, object] = {}
    for pid in scope.pids:
        try:
            # With its start time: a PID reused during the interval is another process,
            # whose counters must not be subtracted from the first one's.
            out[f"proc.{pid}.schedstat"] = {
                **parse_schedstat(host.read(f"/proc/{pid}/schedstat")),
                "start_ticks": parse_stat_start(host.read(f"/proc/{pid}/stat"))}
        except SourceError as exc:
            out[f"proc.{pid}.schedstat"] = Fact(missing=f"pid {pid}: {host.blame(exc)}")
    return out


@collector("proc.pid.io_uring", multi=True,
           names=lambda t: [f"proc.{pid}.io_uring" for pid in t.pids])
def pid_io_uring(host: Host, scope: Scope) -> dict[str, object]:
    """Every io_uring fd of the process, found by its ``anon_inode:[io_uring]`` link."""
    out: dict[str, object] = {}
    for pid in scope.pids:
        name = f"proc.{pid}.io_uring"
        try:
            read_status(host, pid)
            rings = []
            for fd in host.listdir(f"/proc/{pid}/fd"):
                try:
                    link = host.readlink(f"/proc/{pid}/fd/{fd}")
                except SourceError:
                    continue  # fd closed between listdir and readlink
                if link == "anon_inode:[io_uring]":
                    info = parse_io_uring_fdinfo(host.read(f"/proc/{pid}/fdinfo/{fd}"))
                    rings.append({"fd": int(fd), **info})
            out[name] = rings
        except ParseError as exc:
            out[name] = Fact(missing=f"pid {pid}: io_uring fdinfo: {host.blame(exc)}")
        except SourceError as exc:
            out[name] = Fact(missing=f"pid {pid}: {host.blame(exc)}")
    return out


# mm/mempolicy.c mpol_to_str(): a mode name, optional "=static"/"=relative" flags, then
# ":nodelist" for modes that have one. Two mode names hold a space.
_NUMA_MAPS_RE = re.compile(r"^([0-9a-f]+) (weighted interleave\S*|prefer \(many\)\S*|\S+)(?: (.*))?$")
_NODE_PAGES_RE = re.compile(r"^N([0-9]+)=([0-9]+)$")


def parse_policy(text: str) -> dict[str, object]:
    """``bind=static:0-1`` -> ``{"mode": "bind", "nodes": [0, 1], "flags": "static"}``."""
    head, _, nodes = text.partition(":")
    mode, _, flags = head.partition("=")
    return {"mode": mode, "nodes": parse_cpulist(nodes) if nodes else None, "flags": flags or None}


def parse_numa_maps(text: str) -> dict[str, object]:
    """/proc/PID/numa_maps: the memory policy of each mapping (the task's policy where the
    mapping has none of its own) and the pages resident on each node.

    ``{"policies": {"bind:0": vmas}, "resident_bytes": {"0": bytes}}``."""
    policies: dict[str, int] = {}
    resident: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _NUMA_MAPS_RE.match(line.strip())
        if not m:
            raise ParseError(f"numa_maps: not a mapping line: {line[:60]!r}")
        policies[m.group(2)] = policies.get(m.group(2), 0) + 1
        fields = (m.group(3) or "").split()
        page = next((int(f.split("=")[1]) * 1024 for f in fields
                     if f.startswith("kernelpagesize_kB=") and is_uint(f.split("=")[1])), 4096)
        for f in fields:
            n = _NODE_PAGES_RE.match(f)
            if n:
                resident[n.group(1)] = resident.get(n.group(1), 0) + int(n.group(2)) * page
    if not policies:
        raise ParseError("numa_maps: no mapping")
    for policy in policies:
        parse_policy(policy)  # a malformed node list is a parse error here, not in a check
    return {"policies": policies, "resident_bytes": resident}


@collector("proc.pid.numa_maps", multi=True,
           names=lambda t: [f"proc.{pid}.numa_maps" for pid in t.pids])
def pid_numa_maps(host: Host, scope: Scope) -> dict[str, object]:
    out: dict[str, object] = {}
    for pid in scope.pids:
        name = f"proc.{pid}.numa_maps"
        try:
            out[name] = parse_numa_maps(host.read(f"/proc/{pid}/numa_maps"))
        except SourceError as exc:
            out[name] = Fact(missing=f"pid {pid}: {exc}"
                             + (" (a kernel without CONFIG_NUMA has no numa_maps)"
                                if str(exc).endswith(": absent") else ""))
    return out


def _nvidia_minors(host: Host) -> dict[str, str]:
    """/dev/nvidiaN minor -> PCI address, from the NVIDIA driver's /proc/driver/nvidia/gpus."""
    out = {}
    base = "/proc/driver/nvidia/gpus"
    for bdf in host.listdir(base):
        m = re.search(r"^Device Minor:\s*([0-9]+)", host.read(f"{base}/{bdf}/information"), re.M)
        if m:
            out[m.group(1)] = bdf.lower()
    return out


def gpus_held(host: Host, pid: int) -> dict[str, object]:
    """PCI addresses of the GPUs ``pid`` has open: /dev/nvidiaN (NVIDIA) and /dev/dri/*
    (DRM: amdgpu, i915, ...), from its fds. ``{"gpus": [bdf], "unresolved": [device]}``."""
    devices = set()
    for fd in host.listdir(f"/proc/{pid}/fd"):
        try:
            link = host.readlink(f"/proc/{pid}/fd/{fd}")
        except SourceError:
            continue  # closed between listdir and readlink
        if re.fullmatch(r"/dev/nvidia[0-9]+|/dev/dri/(card|renderD)[0-9]+", link):
            devices.add(link)
    gpus, unresolved = set(), []
    minors: dict[str, str] | None = None
    for dev in sorted(devices):
        if dev.startswith("/dev/nvidia"):
            if minors is None:
                try:
                    minors = _nvidia_minors(host)
                except SourceError:
                    minors = {}
            bdf = minors.get(dev.removeprefix("/dev/nvidia"))
        else:
            try:
                bdf = posixpath.basename(host.readlink(f"/sys/class/drm/{posixpath.basename(dev)}/device"))
            except SourceError:
                bdf = None
        if bdf:
            gpus.add(bdf)
        else:
            unresolved.append(dev)
    return {"gpus": sorted(gpus), "unresolved": unresolved}


@collector("proc.pid.gpus", multi=True, names=lambda t: [f"proc.{pid}.gpus" for pid in t.pids])
def pid_gpus(host: Host, scope: Scope) -> dict[str, object]:
    out: dict[str, object] = {}
    for pid in scope.pids:
        try:
            read_status(host, pid)
            out[f"proc.{pid}.gpus"] = gpus_held(host, pid)
        except SourceError as exc:
            out[f"proc.{pid}.gpus"] = Fact(missing=f"pid {pid}: {exc}")
    return out
