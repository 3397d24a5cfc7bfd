"""Per-process facts for --pid: allowed CPUs and memory nodes, schedstat, io_uring rings."""

from __future__ import annotations

from ..collect import Target, collector
from ..host import Host
from ..model import Fact, ParseError, SourceError


def parse_cpulist(text: str) -> list[int]:
    """Kernel cpulist format: ``0-3,8,10-11`` (also used for node lists). Empty -> []."""
    out: list[int] = []
    text = text.strip()
    if not text:
        return out
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError as exc:
            raise ParseError(f"malformed cpu list {text!r}") from exc
        if b < a or a < 0:
            raise ParseError(f"malformed cpu range {part!r}")
        out.extend(range(a, b + 1))
    return out


def parse_cpumask(text: str) -> list[int]:
    """Kernel hex bitmap (``00000000,0000000f``: 32-bit words, most significant first)."""
    cleaned = text.strip().replace(",", "")
    if not cleaned:
        return []
    try:
        bits = int(cleaned, 16)
    except ValueError as exc:
        raise ParseError(f"malformed cpu mask {text.strip()!r}") from exc
    return [i for i in range(bits.bit_length()) if bits >> i & 1]


def parse_status(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    if "Cpus_allowed_list" not in out:
        raise ParseError("no Cpus_allowed_list in status")
    return out


def parse_schedstat(text: str) -> dict[str, int]:
    """/proc/PID/schedstat: time on CPU (ns), time runnable waiting for a CPU (ns), timeslices."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    parts = lines[0].split() if lines else []
    if len(parts) != 3:
        raise ParseError(f"expected 3 fields, got {len(parts)}")
    try:
        run, wait, slices = (int(p) for p in parts)
    except ValueError as exc:
        raise ParseError(f"not integers: {lines[0]!r}") from exc
    return {"run_ns": run, "wait_ns": wait, "timeslices": slices}


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
        fields[current] = value.strip()
    if "SqMask" not in fields and "SqThread" not in fields:
        raise ParseError("not an io_uring fdinfo (no SqMask/SqThread)")

    def number(key: str) -> int | None:
        raw = fields.get(key, "")
        if raw == "":
            return listed.get(key) if key in fields else None
        try:
            return int(raw)
        except ValueError as exc:
            raise ParseError(f"{key}: not an integer: {raw!r}") from exc

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
    return int(number) * 1024 if number.isdigit() else None


def read_status(host: Host, pid: int) -> dict[str, str]:
    """/proc/PID/status of a live process; a zombie has exited and says so."""
    st = parse_status(host.read(f"/proc/{pid}/status"))
    if st.get("State", "").startswith(("Z", "X")):
        raise SourceError(f"pid {pid} has exited ({st['State']})")
    return st


@collector("proc.pid.status", multi=True)
def pid_status(host: Host, target: Target) -> dict[str, object]:
    out: dict[str, object] = {}
    for pid in target.pids:
        name = f"proc.{pid}.status"
        try:
            st = read_status(host, pid)
            out[name] = {"name": st.get("Name"), "cpus_allowed": parse_cpulist(st["Cpus_allowed_list"]),
                         "mems_allowed": parse_cpulist(st.get("Mems_allowed_list", "")),
                         "threads": int(st.get("Threads", "0") or 0),
                   "rss_bytes": _kib(st.get("VmRSS"))}
        except SourceError as exc:
            out[name] = Fact(missing=f"pid {pid}: {host.blame(exc)}"
                             + ("" if isinstance(exc, ParseError) else " (did the process exit?)"))
    return out


@collector("proc.pid.schedstat", counter=True, multi=True)
def pid_schedstat(host: Host, target: Target) -> dict[str, object]:
    out: dict[str, object] = {}
    for pid in target.pids:
        try:
            out[f"proc.{pid}.schedstat"] = parse_schedstat(host.read(f"/proc/{pid}/schedstat"))
        except SourceError as exc:
            out[f"proc.{pid}.schedstat"] = Fact(missing=f"pid {pid}: {host.blame(exc)}")
    return out


@collector("proc.pid.io_uring", multi=True)
def pid_io_uring(host: Host, target: Target) -> dict[str, object]:
    """Every io_uring fd of the process, found by its ``anon_inode:[io_uring]`` link."""
    out: dict[str, object] = {}
    for pid in target.pids:
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
