"""CPU bandwidth control of the service's cgroup, on cgroup v1 and v2.

v1: ``cpu.stat`` has nr_periods, nr_throttled, throttled_time (ns); the quota is
``cpu.cfs_quota_us`` (-1 = none) per ``cpu.cfs_period_us``.
v2: ``cpu.stat`` has nr_periods, nr_throttled, throttled_usec once the cpu
controller is enabled (only usage_usec/user_usec/system_usec without it); the
quota is ``cpu.max`` (``max 100000`` = none).
"""

from __future__ import annotations

import posixpath
import re

from ..collect import Scope, collector
from ..host import Host
from ..model import Fact, ParseError, SourceError
from .records import is_uint, put


def parse_cpu_stat(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            continue  # not a "key value" line (a captured prompt, a future format)
        if not re.fullmatch(r"[0-9]{1,20}", parts[1]):  # counters: never negative
            raise ParseError(f"cpu.stat {parts[0][:40]}: not a counter: {parts[1][:40]!r}")
        put(out, parts[0], int(parts[1]), "cpu.stat")
    if "usage_usec" not in out and "nr_periods" not in out:
        raise ParseError("cpu.stat has neither usage_usec nor nr_periods")
    return out


def parse_cpu_max(text: str) -> tuple[int | None, int]:
    """cgroup v2 cpu.max: ``$MAX $PERIOD``; MAX is ``max`` when unlimited."""
    parts = text.split()
    if len(parts) not in (1, 2):
        raise ParseError(f"cpu.max: malformed {text.strip()!r}")
    num = re.compile(r"[0-9]{1,19}")
    if not ((parts[0] == "max" or num.fullmatch(parts[0]))
            and (len(parts) == 1 or num.fullmatch(parts[1]))):
        raise ParseError(f"cpu.max: malformed {text.strip()[:60]!r}")
    quota = None if parts[0] == "max" else int(parts[0])
    period = int(parts[1]) if len(parts) == 2 else 100000
    if period == 0 or quota == 0:
        raise ParseError(f"cpu.max: a zero quota or period {text.strip()[:60]!r}")
    return quota, period


def parse_mounts(text: str) -> list[tuple[str, str, list[str]]]:
    """(mount point, fstype, options) of cgroup and cgroup2 mounts in /proc/mounts."""
    out = []
    if not text.strip():  # the root file system at least is always mounted
        raise ParseError("/proc/mounts is empty")
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1], parts[2], parts[3].split(",")))
    return out


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/PID/cgroup -> {controller: path}; the v2 entry is keyed ''."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        for ctrl in parts[1].split(",") if parts[1] else [""]:
            put(out, ctrl, parts[2], "cgroup controller")
    if not out:  # every process is in some cgroup: nothing here is a broken source
        raise ParseError("no 'hierarchy:controllers:path' line")
    return out


def _cpu_mounts(host: Host) -> list[str]:
    """Mount points where cpu bandwidth files can live: v1 `cpu` first, then cgroup2."""
    try:
        mounts = parse_mounts(host.read("/proc/mounts"))
    except SourceError:
        return []
    v1 = [m for m, fs, opts in mounts if fs == "cgroup" and "cpu" in opts]
    v2 = [m for m, fs, _ in mounts if fs == "cgroup2"]
    return v1 + v2


PATH_MAX = 4096
NAME_MAX = 255


def _under(path: str, mount: str) -> bool:
    return mount == "/" or path == mount or path.startswith(mount.rstrip("/") + "/")


def resolve_cgroup(host: Host, spec: str) -> str | None:
    """An absolute cgroup directory for ``spec``: a directory under a cgroup mount as
    given, or a path inside a cpu (v1) or unified (v2) hierarchy. None when nothing
    matches; ValueError for a path the kernel could not hold (PATH_MAX, NAME_MAX, NUL).
    The path is normalised first, so ``..`` never climbs out of the mount."""
    raw = spec.encode("utf-8", "surrogateescape")
    if not raw or b"\0" in raw or len(raw) >= PATH_MAX:
        raise ValueError(f"a cgroup path is 1 to {PATH_MAX - 1} bytes without NUL "
                         f"(got {len(raw)} bytes)")
    if any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise ValueError(f"a cgroup path component is at most {NAME_MAX} bytes")
    mounts = _cpu_mounts(host)
    if spec.startswith("/"):
        given = posixpath.normpath(spec)
        if any(_under(given, m) for m in mounts) and host.exists(
                posixpath.join(given, "cgroup.procs")):
            return given
    inner = posixpath.normpath("/" + spec).lstrip("/")  # "/../x" -> "x": stays in the mount
    for mount in mounts:
        candidate = posixpath.normpath(posixpath.join(mount, inner))
        if _under(candidate, mount) and host.exists(posixpath.join(candidate, "cgroup.procs")):
            return candidate
    return None


def cgroup_members(host: Host, path: str) -> frozenset[int]:
    """The processes of a cgroup (its cgroup.procs)."""
    text = host.read(posixpath.join(path, "cgroup.procs"))
    bad = next((t for t in text.split() if not (is_uint(t) and len(t) <= 7)), None)
    if bad is not None:  # the kernel writes one PID per line, in ASCII digits
        raise ParseError(f"{path}/cgroup.procs: not a PID: {bad[:20]!r}")
    return frozenset(int(t) for t in text.split())


def cgroup_of_pid(host: Host, pid: int) -> str:
    groups = parse_proc_cgroup(host.read(f"/proc/{pid}/cgroup"))
    mounts = parse_mounts(host.read("/proc/mounts"))
    for ctrl, fstype in (("cpu", "cgroup"), ("", "cgroup2")):
        if ctrl not in groups:
            continue
        for mount, fs, opts in mounts:
            if fs == fstype and (ctrl == "" or ctrl in opts):
                inner = posixpath.normpath("/" + groups[ctrl]).lstrip("/")  # never above the mount
                path = posixpath.normpath(posixpath.join(mount, inner))
                if host.exists(path):
                    return path
    raise SourceError(f"pid {pid}: its cpu cgroup is not mounted under {host.root}")


def _knob(host: Host, path: str, signed: bool = False) -> int:
    """One integer file (-1 allowed where ``signed``: cfs_quota_us "no quota")."""
    text = host.read(path).strip()
    if not re.fullmatch(r"-1|[0-9]{1,19}" if signed else r"[0-9]{1,19}", text):
        raise ParseError(f"{path}: not a value: {text[:40]!r}")
    return int(text)


def read_cpu_bandwidth(host: Host, path: str) -> dict[str, object]:
    stat = parse_cpu_stat(host.read(posixpath.join(path, "cpu.stat")))
    info: dict[str, object] = {"path": path, "stat": stat}
    if host.exists(posixpath.join(path, "cpu.cfs_quota_us")):
        quota = _knob(host, posixpath.join(path, "cpu.cfs_quota_us"), signed=True)
        period = _knob(host, posixpath.join(path, "cpu.cfs_period_us"))
        if period == 0:
            raise ParseError(f"{path}/cpu.cfs_period_us: 0")
        info.update(version=1, quota_us=None if quota < 0 else quota, period_us=period)
    elif host.exists(posixpath.join(path, "cpu.max")):
        quota, period = parse_cpu_max(host.read(posixpath.join(path, "cpu.max")))
        info.update(version=2, quota_us=quota, period_us=period)
    else:
        # cgroup v2 without the cpu controller: no bandwidth control is possible here.
        info.update(version=2, quota_us=None, period_us=None, controller=False)
    return info


def target_cgroups(host: Host | None, scope: Scope) -> dict[str, str]:
    """Fact name -> cgroup path for --cgroup and every --pid."""
    out = {}
    if scope.cgroup:
        out["cgroup.target"] = scope.cgroup
    for pid in scope.pids:
        out[f"cgroup.pid.{pid}"] = f"pid:{pid}"
    return out


@collector("cgroup.cpu", counter=True, multi=True,
           names=lambda t: list(target_cgroups(None, t)))
def cgroup_cpu(host: Host, scope: Scope) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, spec in target_cgroups(host, scope).items():
        try:
            path = cgroup_of_pid(host, int(spec[4:])) if spec.startswith("pid:") else spec
            out[name] = read_cpu_bandwidth(host, path)
        except (SourceError, ValueError) as exc:
            out[name] = Fact(missing=host.blame(exc))
    return out
