"""The kernel log: hardware events of GPUs, PCIe links and the CPUs' machine checks.

Read from ``dmesg`` and, where it is refused (``kernel.dmesg_restrict=1`` for a user
without CAP_SYSLOG, or no dmesg in a container), from ``journalctl -k -b -o
short-monotonic`` (the journal's copy of this boot's kernel messages, readable by the
``adm`` and ``systemd-journal`` groups). The parser is pure: text in, events out.

Line layouts read (every one real: dmesg, ``dmesg --time-format=iso``, the journal's
``short-monotonic``, ``short-iso``, ``short-precise`` and plain ``short``):

* ``[ 3947.590120] NVRM: ...`` (seconds since boot);
* ``2024-05-01T10:23:45,123456+02:00 NVRM: ...`` (dmesg ISO: wall clock, converted to
  seconds since boot with the boot time ``btime`` of ``/proc/stat``);
* ``[ 1843.308145] host kernel: NVRM: ...`` (journal, monotonic);
* ``2024-05-01T10:23:45+0200 host kernel: ...`` (journal, ISO);
* ``Apr 29 19:24:11 host kernel: ...`` (journal without a year: no usable time);
* no prefix at all (``printk.time=0``): no time.

A message printed with embedded newlines (the NVIDIA driver's "fallen off the bus"
notice spans three) continues on lines that start with white space and carry no stamp:
they are joined to the message they continue.

Message classes (``KINDS``: meaning, class, layer) are kept beside NVIDIA's Xid table.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from ..collect import collector
from ..model import ParseError
from .procfs import parse_uptime

# kind -> (meaning, class, layer). Classes as in sources.gpu.XID: "hardware", "driver",
# "memory", "application", "info".
KINDS: dict[str, tuple[str, str, str]] = {
    "nvrm_fell_off_bus": ("the GPU fell off the bus (it stopped answering over PCIe)",
                          "hardware", "L1"),
    "nvrm_init_failed": ("the NVIDIA driver failed to initialise the GPU (RmInitAdapter / "
                         "probe failed: the GPU does not answer its driver)", "hardware", "L1"),
    "amdgpu_init_failed": ("amdgpu failed to initialise the GPU", "hardware", "L1"),
    "amdgpu_reset": ("amdgpu reset the GPU (every job on it was lost)", "hardware", "L1"),
    "amdgpu_ring_timeout": ("an amdgpu ring timed out (a hung job; the driver resets the GPU)",
                            "driver", "L1"),
    "amdgpu_ras": ("amdgpu RAS: hardware errors detected", "hardware", "L1"),
    "aer_uncorrected": ("PCIe AER: an uncorrected error (a lost transaction or a reset link)",
                        "hardware", "L1"),
    "aer_corrected": ("PCIe AER: a corrected error (replayed; marginal signal integrity)",
                      "info", "L1"),
    "mce": ("a machine check (a CPU, cache or memory hardware error)", "hardware", "L1"),
    "edac_ue": ("EDAC: an uncorrectable memory error", "hardware", "L1"),
    "edac_ce": ("EDAC: a corrected memory error", "memory", "L1"),
}

_BDF = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
# CONFIG_PRINTK_CALLER adds the caller after the time ("[   30.1][  T292] ...") or alone
_MONO = re.compile(r"^\[\s*(?P<t>\d+\.\d+)\](?:\[\s*[TC]\d+\])?\s?")
_CALLER = re.compile(r"^\[\s*[TC]\d+\]\s?")
# dmesg --time-format=iso: 2024-05-01T10:23:45,123456+02:00; journal short-iso: +0200
_ISO = re.compile(r"^(?P<iso>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[,.]\d+)?"
                  r"(?:Z|[+-]\d{2}:?\d{2}))\s")
_SHORT = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}(?:\.\d+)?\s")
_JOURNAL_HOST = re.compile(r"^\S+ kernel: ?")

_XID_RE = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
    r"(?P<code>\d+), ?(?P<text>.*)$")
# NVRM lines naming a device: "GPU 0000:01:00.0:", "GPU at 0000:01:00.0", "GPU at PCI:0000:01:00",
# "The NVIDIA GPU 0000:b3:00.0", "(PCI:0000:0a:00.0)".
_NVRM_BDF = re.compile(r"(?:GPU(?: at)?(?: PCI:)? |NVIDIA GPU |\(PCI:)(?P<pci>[0-9A-Fa-f]{4,8}:"
                       r"[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)")
_NVRM_FELL = re.compile(r"fallen off the bus", re.I)
_NVRM_INIT = re.compile(r"RmInitAdapter failed|rm_init_adapter failed|probe routine failed|"
                        r"failed to (?:initialize|initialise|allocate) .*GPU|"
                        r"GPU does not have the necessary power cables", re.I)
# "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!" (the device prefix names the GPU)
_DEV_PREFIX = re.compile(rf"^(?P<drv>[\w-]+) (?P<bdf>{_BDF}): ")
_AMD_INIT = re.compile(r"Fatal error during GPU init|amdgpu_device_ip_init failed|"
                       r"amdgpu: probe of .* failed", re.I)
_AMD_RESET = re.compile(r"GPU reset begin|GPU reset\(\d+\) (?:failed|succeeded)|"
                        r"GPU reset succeeded", re.I)
_AMD_RING = re.compile(r"ring \S+ timeout", re.I)
_AMD_RAS = re.compile(r"(?:un)?correctable hardware errors? detected|"
                      r"uncorrectable error|RAS: .*error", re.I)
# AER: "pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:41:00.0",
# "AER: Corrected error message received from 0000:00:01.0", "PCIe Bus Error:
# severity=Uncorrected (Non-Fatal)" / "severity=Correctable" / "severity=Corrected".
_AER_RECV = re.compile(rf"AER: (?:Multiple )?(?P<sev>Uncorrect(?:ed|able) \((?:Non-)?Fatal\)|"
                       rf"Correct(?:ed|able)) error (?:message )?received(?: from|:) "
                       rf"(?P<src>{_BDF})", re.I)
_AER_BUS = re.compile(r"PCIe Bus Error: severity=(?P<sev>[^,]+)", re.I)
_MCE = re.compile(r"\[Hardware Error\]|Machine check events logged|"
                  r"Machine Check Exception|mce: .*(?:CPU \d+|Bank \d+)", re.I)
_EDAC = re.compile(r"EDAC (?:MC\d+|[A-Za-z0-9_]+): (?:\d+ )?(?P<k>CE|UE)\b")

MAX_EVENTS = 2000  # a device in a fault loop prints a line a second: the newest are kept


def bdf_of(pci: str) -> str:
    """``0000:61:00`` or ``00000000:61:00.0`` -> ``0000:61:00.0``."""
    dom, bus, rest = pci.lower().split(":", 2)
    dev = rest if "." in rest else f"{rest}.0"
    return f"{dom[-4:]}:{bus}:{dev}"


def _iso_epoch(stamp: str) -> float | None:
    s = stamp.replace(",", ".")
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    elif re.search(r"[+-]\d{4}$", s):
        s = s[:-2] + ":" + s[-2:]
    try:
        return dt.datetime.fromisoformat(s).timestamp()
    except ValueError:
        return None


def records(text: str) -> list[tuple[float | None, float | None, str]]:
    """Kernel log text -> ``(seconds since boot | None, epoch | None, message)`` per
    message, continuation lines joined (their ``NVRM:`` prefixes dropped)."""
    out: list[tuple[float | None, float | None, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        mono: float | None = None
        epoch: float | None = None
        rest = line
        stamped = True
        if m := _MONO.match(rest):
            mono, rest = float(m.group("t")), rest[m.end():]
        elif m := _ISO.match(rest):
            epoch, rest = _iso_epoch(m.group("iso")), rest[m.end():]
        elif m := _SHORT.match(rest):
            rest = rest[m.end():]
        elif m := _CALLER.match(rest):
            rest = rest[m.end():]
        else:
            stamped = False
        if stamped and (j := _JOURNAL_HOST.match(rest)):
            rest = rest[j.end():]
        if not stamped and line[:1].isspace() and out:
            t, e, msg = out[-1]
            out[-1] = (t, e, f"{msg} {line.strip().removeprefix('NVRM:').strip()}")
            continue
        out.append((mono, epoch, rest.strip()))
    return out


def classify(msg: str) -> tuple[str, str | None, int | None, str] | None:
    """One message -> ``(kind, bdf | None, Xid code | None, text)``, or None when it is
    not a hardware event tailgate reads. A line naming an Xid that does not parse is a
    :class:`ParseError`."""
    if "NVRM: Xid" in msg:
        m = _XID_RE.search(msg)
        if not m:
            raise ParseError(f"kernel log: an Xid line that does not parse: {msg[:80]!r}")
        return "xid", bdf_of(m.group("pci")), int(m.group("code")), m.group("text").strip()
    if "NVRM:" in msg:
        kind = "nvrm_fell_off_bus" if _NVRM_FELL.search(msg) else \
            "nvrm_init_failed" if _NVRM_INIT.search(msg) else None
        if kind is None:
            return None
        b = _NVRM_BDF.search(msg)
        return kind, bdf_of(b.group("pci")) if b else None, None, msg
    dev = _DEV_PREFIX.match(msg)
    if dev and dev.group("drv") == "amdgpu" or msg.startswith(("amdgpu:", "[drm:amdgpu")):
        bdf = dev.group("bdf").lower() if dev else None
        for kind, rx in (("amdgpu_init_failed", _AMD_INIT), ("amdgpu_reset", _AMD_RESET),
                         ("amdgpu_ring_timeout", _AMD_RING), ("amdgpu_ras", _AMD_RAS)):
            if rx.search(msg):
                return kind, bdf, None, msg
        return None
    if m := _AER_RECV.search(msg):
        kind = "aer_corrected" if m.group("sev").lower().startswith("correct") \
            else "aer_uncorrected"
        return kind, m.group("src").lower(), None, msg
    if m := _AER_BUS.search(msg):
        kind = "aer_corrected" if m.group("sev").lower().startswith("correct") \
            else "aer_uncorrected"
        return kind, dev.group("bdf").lower() if dev else None, None, msg
    if m := _EDAC.search(msg):
        return ("edac_ue" if m.group("k") == "UE" else "edac_ce"), None, None, msg
    if _MCE.search(msg):
        return "mce", None, None, msg
    return None


def parse_kernel_log(text: str, btime: float | None = None) -> list[dict[str, Any]]:
    """Kernel log text -> hardware events, oldest first: ``{"t_s": seconds since boot |
    None, "kind", "bdf": PCI address | None, "code": Xid | None, "text"}``. ISO stamps
    become seconds since boot through ``btime`` (epoch of the boot, /proc/stat); without
    it they have no time."""
    events: list[dict[str, Any]] = []
    for mono, epoch, msg in records(text):
        c = classify(msg)
        if c is None:
            continue
        kind, bdf, code, what = c
        t = mono
        if t is None and epoch is not None and btime is not None and epoch >= btime:
            t = round(epoch - btime, 6)
        if kind.startswith("aer_") and "PCIe Bus Error" in what and events \
                and events[-1]["kind"] == kind and "received" in events[-1]["text"]:
            continue  # the detail line of the "error received" line just read
        events.append({"t_s": t, "kind": kind, "bdf": bdf, "code": code, "text": what[:200]})
    return events[-MAX_EVENTS:]


def parse_btime(stat: str) -> float:
    """``/proc/stat``'s ``btime 1700000000`` (the boot, seconds since the epoch)."""
    m = re.search(r"^btime (\d{1,12})$", stat, re.M)
    if not m:
        raise ParseError("/proc/stat: no btime line")
    return float(m.group(1))


def meaning(event: dict[str, Any]) -> tuple[str, str]:
    """(meaning, class) of a non-Xid event."""
    m, cls, _ = KINDS.get(event["kind"], (event["kind"], "unlisted", "L1"))
    return m, cls


def read_log(host: Any) -> tuple[str, str, dict[str, str]]:
    """(text, the source that answered, {source tried: why it did not}). ``dmesg`` first;
    where it is refused, this boot's kernel messages from the journal."""
    from ..model import SourceError

    tried: dict[str, str] = {}
    for argv, name in ((["dmesg"], "dmesg"),
                       (["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"],
                        "journalctl -k")):
        try:
            return host.run(argv, timeout_s=10), name, tried
        except SourceError as exc:
            tried[name] = host.blame(exc)
    raise SourceError("kernel log unreadable: " + "; ".join(f"{k}: {v}" for k, v in tried.items()))


def read_btime(host: Any) -> float | None:
    """The boot's epoch from /proc/stat, or None (ISO stamps then stay untimed)."""
    from ..model import SourceError

    try:
        return parse_btime(host.read("/proc/stat"))
    except SourceError:
        return None


HOST_KINDS = ("aer_uncorrected", "aer_corrected", "mce", "edac_ue", "edac_ce")


def _collect_events(host: Any) -> dict[str, Any]:
    from ..model import SourceError

    text, source, _ = read_log(host)
    out: dict[str, Any] = {"source": source, "uptime_s": parse_uptime(host.read("/proc/uptime")),
                           "boot_id": None,
                           "events": [e for e in parse_kernel_log(text, read_btime(host))
                                      if e["kind"] in HOST_KINDS]}
    try:
        out["boot_id"] = host.read("/proc/sys/kernel/random/boot_id").strip()
    except SourceError:
        pass
    return out


@collector("kernel.events", counter=True)
def kernel_events(host: Any, scope: Any) -> dict[str, Any]:
    """The kernel log's host hardware events (AER, machine checks, EDAC), with the kernel
    clock read beside them for the window."""
    return _collect_events(host)
