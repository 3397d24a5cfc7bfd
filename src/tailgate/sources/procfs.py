"""Host-wide /proc files: network counters, memory, pressure, interrupts, softirqs, CPU time.

Each file has a pure parser (text -> value, :class:`ParseError` on a malformed
known line; unknown lines ignored) and a collector that reads it through the Host.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from ..collect import Scope, collector
from ..host import Host
from ..model import ParseError
from .records import MAX_CPUS, is_uint, put

_UINT_RE = re.compile(r"[0-9]{1,20}")  # u64 at most; ASCII only (int() takes any digit)
_HEX_RE = re.compile(r"[0-9a-fA-F]{1,16}")
_SHARE_RE = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?")  # PSI prints "%lu.%02lu"


def _int(token: str, what: str, negative_ok: bool = False) -> int:
    """A counter: ASCII digits, never negative (a negative counter is not a count)."""
    body = token[1:] if negative_ok and token.startswith("-") else token
    if not _UINT_RE.fullmatch(body):
        if _UINT_RE.fullmatch(token.lstrip("-")):
            raise ParseError(f"{what}: negative counter: {token}")
        raise ParseError(f"{what}: not an integer: {token[:40]!r}")
    return int(token)


def _ncpus(n: int, what: str) -> None:
    if not 0 < n <= MAX_CPUS:
        raise ParseError(f"{what}: {n} CPU columns (expected 1 to {MAX_CPUS})")


def _lines(text: str) -> list[str]:
    """Non-empty lines, without a provenance comment (fixture files carry one)."""
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def parse_snmp(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/snmp and /proc/net/netstat: pairs of ``Proto: names`` / ``Proto: values`` lines."""
    out: dict[str, dict[str, int]] = {}
    lines = _lines(text)
    if len(lines) % 2:
        raise ParseError("odd number of lines: a header without its values")
    for head, vals in zip(lines[::2], lines[1::2], strict=True):
        proto, _, names = head.partition(":")
        proto2, _, values = vals.partition(":")
        if not proto or proto != proto2:
            raise ParseError(f"header {proto!r} followed by values of {proto2!r}")
        keys, nums = names.split(), values.split()
        if len(keys) != len(nums):
            raise ParseError(f"{proto}: {len(keys)} names but {len(nums)} values")
        # Tcp MaxConn is -1 ("no limit"), the one signed value; everything else counts.
        row: dict[str, int] = {}
        for k, v in zip(keys, nums, strict=True):
            put(row, k, _int(v, f"{proto}.{k}", negative_ok=(proto, k) == ("Tcp", "MaxConn")),
                proto)
        put(out, proto, row, "protocol")
    if not out:
        raise ParseError("no counters found")
    return out


SOFTNET_MIN_COLUMNS = 9


def parse_softnet(text: str) -> list[dict[str, int]]:
    """/proc/net/softnet_stat: one hex row per CPU; processed, dropped, time_squeeze first.

    Kernels since 4.x append cpu_collision, received_rps, flow_limit_count,
    backlog length and (5.10+) the CPU index; only the stable first three and
    the index (column 13, when present) are kept.
    """
    rows = []
    for i, line in enumerate(_lines(text)):
        cols = line.split()
        # net/core/net-procfs.c: 9 columns since 2.6 (processed, dropped, time_squeeze, five
        # zeros, cpu_collision), 10 with received_rps (2.6.35), 11 with flow_limit_count
        # (3.11), 13 with backlog length and CPU index (5.10); no kernel prints fewer than 9
        if len(cols) < SOFTNET_MIN_COLUMNS:
            raise ParseError(f"softnet_stat row {i}: {len(cols)} columns; every kernel prints "
                             f"at least {SOFTNET_MIN_COLUMNS}")

        if not all(_HEX_RE.fullmatch(c) for c in cols):
            raise ParseError(f"softnet_stat row {i}: not hexadecimal")
        vals = [int(c, 16) for c in cols]
        rows.append({"cpu": vals[12] if len(vals) >= 13 else i, "processed": vals[0],
                     "dropped": vals[1], "time_squeeze": vals[2]})
    if not rows:
        raise ParseError("softnet_stat is empty")
    _ncpus(len(rows), "softnet_stat")
    return rows


_NET_DEV_FIELDS = ("bytes", "packets", "errs", "drop", "fifo", "frame", "compressed", "multicast")
_NET_DEV_TX = ("bytes", "packets", "errs", "drop", "fifo", "colls", "carrier", "compressed")


def parse_net_dev(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/dev: per-interface rx_*/tx_* counters."""
    out: dict[str, dict[str, int]] = {}
    for line in _lines(text):
        if "|" in line:  # the two header lines
            continue
        name, sep, rest = line.partition(":")
        if not sep:
            raise ParseError(f"net/dev line without ':': {line!r}")
        cols = rest.split()
        if len(cols) != 16:
            raise ParseError(f"net/dev {name.strip()}: {len(cols)} columns, expected 16")
        vals = [_int(c, name.strip()) for c in cols]
        row = {f"rx_{k}": v for k, v in zip(_NET_DEV_FIELDS, vals[:8], strict=True)}
        row.update({f"tx_{k}": v for k, v in zip(_NET_DEV_TX, vals[8:], strict=True)})
        put(out, name.strip(), row, "interface")
    if not out:  # lo is always there: no interface at all is a broken file
        raise ParseError("net/dev lists no interface")
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes (the file says kB, meaning KiB)."""
    out = {}
    for line in _lines(text):
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            raise ParseError(f"meminfo {key}: no value")
        scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
        put(out, key.strip(), _int(parts[0], key) * scale, "meminfo")
    if "MemTotal" not in out:
        raise ParseError("meminfo has no MemTotal")
    if out["MemTotal"] <= 0:
        raise ParseError("meminfo: MemTotal is 0")
    return out


def parse_pressure(text: str) -> dict[str, dict[str, float]]:
    """/proc/pressure/{cpu,io,memory}: ``some``/``full`` lines of avg10/avg60/avg300/total."""
    out: dict[str, dict[str, float]] = {}
    for line in _lines(text):
        kind, *pairs = line.split()
        if kind not in ("some", "full"):
            continue
        row: dict[str, float] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                raise ParseError(f"pressure {kind}: malformed field {pair!r}")
            if key == "total":
                put(row, key, _int(value, f"pressure {kind}.total"), f"pressure {kind}")
                continue
            if not _SHARE_RE.fullmatch(value):  # float() also reads '１０' and ' 1_0'
                raise ParseError(f"pressure {kind}.{key}: not a number: {value[:40]!r}")
            share = float(value)
            # A share of wall time: a percentage. NaN, infinities and negatives are not one.
            if not (math.isfinite(share) and 0 <= share <= 100):
                raise ParseError(f"pressure {kind}.{key}: not a percentage: {value[:40]!r}")
            put(row, key, share, f"pressure {kind}")
        put(out, kind, row, "pressure")
    if "some" not in out:
        raise ParseError("no 'some' line")
    return out


# What kernel/irq/proc.c show_interrupts prints after the counts: the chip name; the hwirq
# where the IRQ has a domain (absent in 2.6-era x86: "XT-PIC  timer", "IO-APIC-edge");
# "Edge"/"Level" with CONFIG_GENERIC_IRQ_SHOW_LEVEL (arm64, some others); then "-name" of
# the flow handler ("5-edge" on x86, "Edge -virq" on Xen); then the action names, shared
# ones joined by ", " (a name may hold a space: "PCIe PME").
_IRQ_DESC = re.compile(r"^(?P<chip>\S+)(?:\s+\d+(?:-[a-z]+)?)?(?:\s+(?:Edge|Level))?"
                       r"(?:\s+-\S+)?(?:\s+(?P<names>.+))?$")


def parse_interrupts(text: str) -> dict[str, object]:
    """/proc/interrupts: per numbered IRQ its per-CPU counts, chip text and action name(s).

    Names are whatever the driver registered: ``virtio2-input.0``,
    ``mlx5_comp3@pci:0000:08:00.0``, ``eth0-TxRx-3``; shared IRQs list several,
    separated by ``, ``.
    """
    lines = _lines(text)
    if not lines or not lines[0].split() or not lines[0].split()[0].startswith("CPU"):
        raise ParseError("no CPU header line")
    _ncpus(len(lines[0].split()), "interrupts header")
    cpus = [_int(c[3:], "CPU header") for c in lines[0].split()]
    irqs: dict[str, dict[str, object]] = {}
    for line in lines[1:]:
        head, sep, rest = line.partition(":")
        if not sep:
            raise ParseError(f"interrupts line without ':': {line!r}")
        irq = head.strip()
        if not is_uint(irq):
            if not irq.isascii():  # '²' or '٣' is no IRQ number, nor an architecture counter
                raise ParseError(f"interrupts: not an IRQ: {irq[:20]!r}")
            continue  # NMI, LOC, ... (architecture counters)
        tokens = rest.split()
        counts = [_int(t, f"irq {irq}") for t in tokens[: len(cpus)]]
        if len(counts) != len(cpus):
            raise ParseError(f"irq {irq}: {len(counts)} counts for {len(cpus)} CPUs")
        desc = rest.split(None, len(cpus))[-1] if len(tokens) > len(cpus) else ""
        m = _IRQ_DESC.match(desc.strip())
        names_part = (m.group("names") or "") if m else desc
        names = [n.strip() for n in names_part.split(", ") if n.strip()]
        put(irqs, irq, {"counts": counts, "desc": desc.strip(), "names": names}, "irq")
    return {"cpus": cpus, "irqs": irqs}


def parse_softirqs(text: str) -> dict[str, list[int]]:
    """/proc/softirqs: per softirq kind (NET_RX, TIMER, ...) its per-CPU counts."""
    lines = _lines(text)
    if not lines:
        raise ParseError("softirqs is empty")
    ncpu = len(lines[0].split())
    _ncpus(ncpu, "softirqs header")
    out = {}
    for line in lines[1:]:
        name, _, rest = line.partition(":")
        vals = [_int(t, name.strip()) for t in rest.split()]
        if len(vals) != ncpu:
            raise ParseError(f"softirqs {name.strip()}: {len(vals)} counts for {ncpu} CPUs")
        put(out, name.strip(), vals, "softirq")
    return out


STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def parse_stat_cpus(text: str) -> dict[int, dict[str, int]]:
    """/proc/stat: per CPU (its ``cpuN`` line), the time in each state in clock ticks
    (USER_HZ). ``steal`` is the time a VM's vCPU was runnable but the hypervisor ran something
    else; kernels before 2.6.11 print no steal column (a short line is an error here)."""
    out: dict[int, dict[str, int]] = {}
    for line in _lines(text):
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if not _UINT_RE.fullmatch(name[3:]):
            raise ParseError(f"/proc/stat: not a CPU line: {name[:40]!r}")
        vals = rest.split()
        if len(vals) < len(STAT_FIELDS):
            raise ParseError(f"/proc/stat {name}: {len(vals)} columns (expected at least "
                             f"{len(STAT_FIELDS)}, steal among them)")
        put(out, int(name[3:]), {k: _int(v, f"/proc/stat {name} {k}")
                                 for k, v in zip(STAT_FIELDS, vals, strict=False)}, "CPU")
    if not out:
        raise ParseError("/proc/stat has no cpuN lines")
    return out


def _file_collector(name: str, path: str, parse: Callable[[str], object], counter: bool) -> None:
    def read(host: Host, scope: Scope) -> object:
        return parse(host.read(path))

    read.__doc__ = f"{path}, parsed by {parse.__name__}"
    collector(name, counter=counter)(read)


# fact name, file, parser, counter (sampled at both ends of the interval)
for _name, _path, _parse, _counter in (
    ("net.snmp", "/proc/net/snmp", parse_snmp, True),
    ("net.netstat", "/proc/net/netstat", parse_snmp, True),
    ("net.softnet", "/proc/net/softnet_stat", parse_softnet, True),
    ("net.dev", "/proc/net/dev", parse_net_dev, True),
    ("proc.softirqs", "/proc/softirqs", parse_softirqs, True),
    ("proc.interrupts", "/proc/interrupts", parse_interrupts, True),
    ("proc.meminfo", "/proc/meminfo", parse_meminfo, False),
):
    _file_collector(_name, _path, _parse, _counter)


@collector("pressure", multi=True,
           names=lambda t: [f"pressure.{res}" for res in ("cpu", "io", "memory")])
def pressure(host: Host, scope: Scope) -> dict:
    """PSI per resource; absent without CONFIG_PSI (or psi=0 on the kernel command line)."""
    from ..model import Fact, SourceError

    out: dict[str, object] = {}
    for res in ("cpu", "io", "memory"):
        try:
            out[f"pressure.{res}"] = parse_pressure(host.read(f"/proc/pressure/{res}"))
        except ParseError as exc:
            out[f"pressure.{res}"] = Fact(missing=f"/proc/pressure/{res}: {exc}")
        except SourceError as exc:
            hint = " (needs CONFIG_PSI)" if str(exc).endswith(": absent") else ""
            out[f"pressure.{res}"] = Fact(missing=f"{exc}{hint}")
    return out


def parse_uptime(text: str) -> float:
    """``/proc/uptime``: ``12345.67 54321.00`` -> 12345.67."""
    first = text.split()[0] if text.split() else ""
    if not re.fullmatch(r"\d+(?:\.\d+)?", first):
        raise ParseError(f"/proc/uptime: not an uptime: {text.strip()[:40]!r}")
    return float(first)
