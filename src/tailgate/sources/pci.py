"""PCIe health of NICs and GPUs: AER correctable-error counters and replay counters.

* ``/sys/bus/pci/devices/BDF/aer_dev_correctable`` (Linux >= 4.19): one
  ``name count`` line per correctable error. Current kernels print short names
  (``RxErr BadTLP BadDLLP Rollover Timeout NonFatalErr CorrIntErr HeaderOF``,
  drivers/pci/pcie/aer.c); the first version printed long ones (``Bad TLP``,
  ``RELAY_NUM Rollover`` with the kernel's typo, ``Replay Timer Timeout``). Both
  are read and normalised to the short names.
* Linux has no generic LTSSM-recovery counter. What stands in for it, per device:
  AER ``Rollover`` (REPLAY_NUM rollover: the link replayed a TLP 4 times and
  retrained) and ``Timeout`` (replay timer timeout); NVIDIA's PCIe replay counter
  (NVML ``nvmlDeviceGetPcieReplayCounter``, or ``Replays Since Reset`` in
  ``nvidia-smi -q``); amdgpu's ``pcie_replay_count``; and on mlx5 NICs the
  ``rx/tx_pci_signal_integrity`` counters of ``ethtool -S`` (read by sources.ethtool).

The devices judged are NICs (class 0x02), GPUs (0x03) and accelerators (0x12),
and every upstream port (bridge) between them and the root complex.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from ..collect import Scope, collector
from ..host import Host
from ..model import ParseError, SourceError
from .records import parse_cpulist, put

_BDF_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
KINDS = {"02": "nic", "03": "gpu", "12": "accelerator"}
NVIDIA = "0x10de"

# Long (v4.19) names -> the short names current kernels print.
_AER_LONG = {
    "Receiver Error": "RxErr",
    "Bad TLP": "BadTLP",
    "Bad DLLP": "BadDLLP",
    "RELAY_NUM Rollover": "Rollover",
    "REPLAY_NUM Rollover": "Rollover",
    "Replay Timer Timeout": "Timeout",
    "Advisory Non-Fatal": "NonFatalErr",
    "Corrected Internal Error": "CorrIntErr",
    "Header Log Overflow": "HeaderOF",
}
AER_CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr",
                   "CorrIntErr", "HeaderOF", "TOTAL_ERR_COR")
_AER_LINE_RE = re.compile(r"^(\S.*?)\s+(\S+)$")
# A set status bit the kernel has no name for is printed as ``<stats array>_bit[N] count``
# (aer_stats_dev_attr, Linux 4.19+; only when non-zero), e.g. ``dev_cor_errs_bit[11] 1``.
_AER_BIT_RE = re.compile(r"^dev_(?:cor|fatal|nonfatal)_errs_bit\[([0-9]+)\]$")


def parse_aer(text: str) -> dict[str, int]:
    """``aer_dev_correctable`` (either format) -> ``{short name: count}``; unnamed status
    bits become ``bitN``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _AER_LINE_RE.match(line.strip())
        if not m:
            continue
        bit = _AER_BIT_RE.match(m.group(1))
        if bit:
            put(out, f"bit{bit.group(1)}", parse_int_file(m.group(2), m.group(1)),
                "aer_dev_correctable")
            continue
        name = _AER_LONG.get(m.group(1), m.group(1))
        if not _count(m.group(2)):
            if name in AER_CORRECTABLE:
                raise ParseError(f"aer_dev_correctable: {name}: not a count: {m.group(2)!r}")
            continue
        if name in AER_CORRECTABLE or re.fullmatch(r"[A-Za-z_]+", name):
            put(out, name, int(m.group(2)), "aer_dev_correctable")
    if not any(k in out for k in AER_CORRECTABLE):
        raise ParseError("aer_dev_correctable: no known counter")
    return out


# aer_dev_fatal / aer_dev_nonfatal (Linux >= 4.19): one ``name count`` line per uncorrectable
# error, then TOTAL_ERR_FATAL or TOTAL_ERR_NONFATAL. Current kernels print short names
# (aer_uncorrectable_error_string, drivers/pci/pcie/aer.c); 4.19 printed long ones.
_AER_UNCOR_LONG = {  # the kernel's long strings (include/ras/ras_event.h aer_uncorrectable_errors)
    "Data Link Protocol Error": "DLP", "Surprise Down Error": "SDES", "Poisoned TLP": "TLP",
    "Flow Control Protocol Error": "FCP", "Completion Timeout": "CmpltTO",
    "Completer Abort": "CmpltAbrt", "Unexpected Completion": "UnxCmplt",
    "Receiver Overflow": "RxOF", "Malformed TLP": "MalfTLP", "ECRC Error": "ECRC",
    "Unsupported Request Error": "UnsupReq", "ACS Violation": "ACSViol",
    "Uncorrectable Internal Error": "UncorrIntErr", "MC Blocked TLP": "BlockedTLP",
    "AtomicOp Egress Blocked": "AtomicOpBlocked", "TLP Prefix Blocked Error": "TLPBlockedErr",
}
AER_UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt",
                     "UnxCmplt", "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol",
                     "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                     "PoisonTLPBlocked", "TOTAL_ERR_FATAL", "TOTAL_ERR_NONFATAL")


def parse_aer_uncorrectable(text: str, what: str) -> dict[str, int]:
    """``aer_dev_fatal`` or ``aer_dev_nonfatal`` (either format) -> ``{short name: count}``;
    repeated names (``Undefined`` for the reserved bits) are summed, unnamed bits are
    ``bitN``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _AER_LINE_RE.match(line.strip())
        if not m:
            continue
        bit = _AER_BIT_RE.match(m.group(1))
        name = f"bit{bit.group(1)}" if bit else _AER_UNCOR_LONG.get(m.group(1), m.group(1))
        if name not in AER_UNCORRECTABLE and not bit:
            continue
        if not _count(m.group(2)):
            raise ParseError(f"{what}: {name}: not a count: {m.group(2)!r}")
        out[name] = out.get(name, 0) + int(m.group(2))
    if not any(k in out for k in AER_UNCORRECTABLE):
        raise ParseError(f"{what}: no known counter")
    return out


def _count(text: str) -> bool:
    """ASCII digits of a u64 (str.isdigit() also takes '²' and other scripts' digits)."""
    return re.fullmatch(r"[0-9]{1,20}", text) is not None


def parse_int_file(text: str, what: str) -> int:
    s = text.strip()
    if not _count(s):
        raise ParseError(f"{what}: not a count: {s[:40]!r}")
    return int(s)


def _bdf(nvidia_bus_id: str) -> str:
    """``00000000:00:04.0`` (nvidia-smi, 8-digit domain) -> ``0000:00:04.0``."""
    dom, _, rest = nvidia_bus_id.strip().partition(":")
    return f"{dom[-4:]}:{rest}".lower()


def parse_nvidia_smi(text: str) -> dict[str, dict[str, int]]:
    """``nvidia-smi -q``: per GPU, ``Replays Since Reset`` (older drivers: ``Replays since
    reset``) and ``Replay Number Rollovers`` where printed."""
    out: dict[str, dict[str, int]] = {}
    gpu: str | None = None
    for line in text.splitlines():
        m = re.match(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", line)
        if m:
            gpu = _bdf(m.group(1))
            if gpu in out:
                raise ParseError(f"nvidia-smi -q: GPU {gpu} appears twice: a broken source")
            out[gpu] = {}
            continue
        key, sep, value = line.partition(":")
        k, v = key.strip().lower(), value.strip()
        if not sep or gpu is None:
            continue
        name = {"replays since reset": "replays",
                "replay number rollovers": "replay_rollovers"}.get(k)
        if name:
            if _count(v):
                put(out[gpu], name, int(v), f"nvidia-smi -q GPU {gpu}")
            elif v not in ("N/A", "[N/A]", "Unknown Error", "[Not Supported]"):
                raise ParseError(f"nvidia-smi -q: {key.strip()}: not a count: {v!r}")
    if not out:
        raise ParseError("nvidia-smi -q: no 'GPU <bus id>' section")
    return out


def _read(host: Host, path: str) -> str | None:
    try:
        return host.read(path).strip()
    except SourceError:
        return None


def _hex_file(host: Host, path: str, digits: int) -> str:
    """A sysfs ID file (``0x020000`` class, ``0x15b3`` vendor)."""
    text = host.read(path).strip()
    if not re.fullmatch(rf"0x[0-9a-fA-F]{{{digits}}}", text):
        raise ParseError(f"{path}: not a PCI id: {text[:20]!r}")
    return text


def device_path(host: Host, bdf: str) -> list[str]:
    """BDFs from the root port down to ``bdf``, from the sysfs link's target."""
    try:
        link = host.readlink(f"/sys/bus/pci/devices/{bdf}")
    except SourceError:
        return [bdf]
    parts = [p for p in posixpath.normpath(link).split("/") if _BDF_RE.match(p)]
    return parts if parts and parts[-1] == bdf else [bdf]


def _present(host: Host, path: str) -> bool:
    """Whether ``path`` exists; one that cannot be told (a link out of the root) counts as
    present, so that reading it says why."""
    try:
        return host.exists(path)
    except SourceError:
        return True


UNREADABLE = "unreadable"


def pci_devices(host: Host) -> dict[str, dict[str, Any]]:
    """The judged devices (NICs, GPUs, accelerators) and their upstream ports.

    A device whose class or vendor cannot be read might be the NIC or GPU to judge, so it
    is never "not one of ours": it is kept as ``{"kind": "unreadable", "error": reason}``,
    and only its own findings are unknown (the other devices are judged)."""
    out: dict[str, dict[str, Any]] = {}
    for bdf in host.listdir("/sys/bus/pci/devices"):
        try:
            cls = _hex_file(host, f"/sys/bus/pci/devices/{bdf}/class", 6)
            kind = KINDS.get(cls[2:4].lower())
            if kind is None:
                continue
            vendor = _hex_file(host, f"/sys/bus/pci/devices/{bdf}/vendor", 4)
        except SourceError as exc:
            out[bdf] = {"kind": UNREADABLE, "upstream": [], "driver": None, "aer": False,
                        "amdgpu_replay": False, "error": host.blame(exc)}
            continue
        chain = device_path(host, bdf)
        out.setdefault(bdf, {}).update({
            "kind": kind, "class": cls, "vendor": vendor, "upstream": chain[:-1],
        })
        for up in chain[:-1]:
            entry = out.setdefault(up, {"kind": "upstream", "upstream": []})
            entry.setdefault("serves", []).append(bdf)
    for bdf, entry in out.items():
        if entry["kind"] == UNREADABLE:
            continue
        base = f"/sys/bus/pci/devices/{bdf}"
        try:
            entry["driver"] = posixpath.basename(host.readlink(f"{base}/driver"))
        except SourceError:
            entry["driver"] = None
        entry["aer"] = _present(host, f"{base}/aer_dev_correctable")
        if entry["kind"] != "upstream":  # for GPU locality (l2.numa.affinity)
            node = _read(host, f"{base}/numa_node")
            # "-1": no NUMA locality; anything but ASCII digits is no node either
            ok = node is not None and (node == "-1" or (_count(node) and len(node) <= 5))
            entry["numa_node"] = int(node) if ok else None
            cpus = _read(host, f"{base}/local_cpulist")
            try:
                entry["local_cpus"] = parse_cpulist(cpus) if cpus is not None else None
            except ParseError:
                entry["local_cpus"] = None
        entry["amdgpu_replay"] = _present(host, f"{base}/pcie_replay_count")
    return out


@collector("pci.devices")
def pci_devices_fact(host: Host, scope: Scope) -> dict[str, dict[str, Any]]:
    return pci_devices(host)


@collector("pci.aer", counter=True)
def pci_aer(host: Host, scope: Scope) -> dict[str, Any]:
    """``{"counters": {bdf: {name: n}}, "errors": {bdf: reason}}`` for devices with AER."""
    counters: dict[str, dict[str, int]] = {}
    errors: dict[str, str] = {}
    for bdf, entry in pci_devices(host).items():
        if entry["kind"] == UNREADABLE:
            errors[bdf] = entry["error"]
            continue
        if not entry["aer"]:
            continue
        try:
            counters[bdf] = parse_aer(host.read(f"/sys/bus/pci/devices/{bdf}/aer_dev_correctable"))
        except SourceError as exc:
            errors[bdf] = host.blame(exc)
    return {"counters": counters, "errors": errors}


@collector("pci.aer_uncorrectable", counter=True)
def pci_aer_uncorrectable(host: Host, scope: Scope) -> dict[str, Any]:
    """``{"counters": {bdf: {"fatal": {...}, "nonfatal": {...}}}, "errors": {bdf: reason}}``
    for the judged devices and upstream ports that have AER."""
    counters: dict[str, dict[str, dict[str, int]]] = {}
    errors: dict[str, str] = {}
    for bdf, entry in pci_devices(host).items():
        if entry["kind"] == UNREADABLE:
            errors[bdf] = entry["error"]
            continue
        if not entry["aer"]:
            continue
        try:
            counters[bdf] = {kind: parse_aer_uncorrectable(
                host.read(f"/sys/bus/pci/devices/{bdf}/aer_dev_{kind}"), f"aer_dev_{kind}")
                for kind in ("fatal", "nonfatal")}
        except SourceError as exc:
            errors[bdf] = host.blame(exc)
    return {"counters": counters, "errors": errors}


def _nvml_replays(bdfs: list[str]) -> dict[str, dict[str, int]]:
    """Replay counters through NVML (the optional ``nvidia-ml-py`` extra)."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError as exc:
        raise SourceError("nvidia-ml-py is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise SourceError(f"NVML: {exc}") from exc
    out: dict[str, dict[str, int]] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bdf = _bdf(bus.decode() if isinstance(bus, bytes) else bus)
            if bdf in bdfs:
                out[bdf] = {"replays": int(pynvml.nvmlDeviceGetPcieReplayCounter(h))}
    except pynvml.NVMLError as exc:
        raise SourceError(f"NVML: {exc}") from exc
    finally:
        pynvml.nvmlShutdown()
    return out


@collector("pci.replay", counter=True)
def pci_replay(host: Host, scope: Scope) -> dict[str, Any]:
    """Vendor replay counters: ``{"counters": {bdf: {...}}, "sources": {bdf: what},
    "errors": {bdf or tool: reason}}``."""
    devices = pci_devices(host)
    counters: dict[str, dict[str, int]] = {}
    sources: dict[str, str] = {}
    errors: dict[str, str] = {}
    for bdf, entry in devices.items():
        if entry["kind"] == UNREADABLE:
            errors[bdf] = entry["error"]
        elif entry["amdgpu_replay"]:
            try:
                n = parse_int_file(host.read(f"/sys/bus/pci/devices/{bdf}/pcie_replay_count"),
                                   "pcie_replay_count")
                counters[bdf] = {"pcie_replay_count": n}
                sources[bdf] = "amdgpu pcie_replay_count"
            except SourceError as exc:
                errors[bdf] = host.blame(exc)
    gpus = [b for b, e in devices.items() if e.get("vendor") == NVIDIA and e["kind"] == "gpu"]
    if gpus:
        got: dict[str, dict[str, int]] = {}
        how = "nvidia-smi -q (Replays Since Reset)"
        if host.live:
            try:
                got, how = _nvml_replays(gpus), "NVML nvmlDeviceGetPcieReplayCounter"
            except SourceError as exc:
                errors["nvml"] = str(exc)
        if not got:
            try:
                got = parse_nvidia_smi(host.run(["nvidia-smi", "-q"], timeout_s=20))
            except SourceError as exc:
                errors["nvidia-smi"] = host.blame(exc)
        for bdf in gpus:
            if got.get(bdf):
                counters[bdf] = got[bdf]
                sources[bdf] = how
            else:  # a GPU whose counter could not be read is unknown, not silently dropped
                errors[bdf] = errors.get("nvidia-smi") or f"nvidia-smi -q: no replay counter for {bdf}"
    return {"counters": counters, "sources": sources, "errors": errors}


# -- link training: negotiated vs capable speed and width -----------------------------------

# drivers/pci/pci-sysfs.c prints a speed as "16.0 GT/s PCIe" (PCIE_SPEED2STR, Linux >= 4.17),
# before that as "8 GT/s" / "5 GT/s" / "2.5 GT/s"; a link without a negotiated speed (down,
# or in a low-power state) prints "Unknown" (older: "Unknown speed"). Widths are "%u": 0 when
# the link is down. The files exist only for PCIe devices (conventional PCI has no link).
_SPEED_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?) GT/s(?: PCIe)?$")
LINK_FILES = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")


def parse_link_speed(text: str) -> float | None:
    """``16.0 GT/s PCIe`` or ``8 GT/s`` -> GT/s; ``Unknown`` (no negotiated speed) -> None."""
    s = text.strip()
    if s in ("Unknown", "Unknown speed"):
        return None
    m = _SPEED_RE.match(s)
    if not m:
        raise ParseError(f"not a PCIe link speed: {s[:40]!r}")
    return float(m.group(1))


def parse_link_width(text: str) -> int:
    s = text.strip().removeprefix("x")
    if not _count(s) or len(s) > 2:  # x1 .. x32
        raise ParseError(f"not a PCIe link width: {text.strip()[:40]!r}")
    return int(s)


def read_link(host: Host, bdf: str) -> dict[str, Any] | None:
    """The link attributes of ``bdf``, parsed; None when it has none (not a PCIe device)."""
    base = f"/sys/bus/pci/devices/{bdf}"
    raw: dict[str, str | None] = {}
    why: dict[str, str] = {}
    for name in LINK_FILES:
        try:
            raw[name] = host.read(f"{base}/{name}").strip()
        except SourceError as exc:
            raw[name], why[name] = None, str(exc)
    # No link file at all: not a PCIe device. Files that are there but unreadable (a FIFO,
    # a link out of the root) are a reason, never "no link".
    if len(why) == len(LINK_FILES) and all(w.endswith(": absent") for w in why.values()):
        return None
    if why:
        raise SourceError("; ".join(why.values()))

    def parsed(name: str, parse: Any) -> Any:
        try:
            return parse(raw[name])
        except ParseError as exc:
            raise ParseError(f"{base}/{name}: {exc}") from exc

    return {"current_gts": parsed("current_link_speed", parse_link_speed),
            "current_width": parsed("current_link_width", parse_link_width),
            "max_gts": parsed("max_link_speed", parse_link_speed),
            "max_width": parsed("max_link_width", parse_link_width),
            "raw": raw}


@collector("pci.links")
def pci_links(host: Host, scope: Scope) -> dict[str, Any]:
    """Per judged device (NIC, GPU, accelerator): its chain of ports from the root port down,
    and the link attributes of every device in it. ``{"chains": {bdf: [bdf, ...]}, "links":
    {bdf: {...} | None}, "errors": {bdf: reason}}``."""
    chains: dict[str, list[str]] = {}
    links: dict[str, dict[str, Any] | None] = {}
    errors: dict[str, str] = {}
    for bdf, entry in pci_devices(host).items():
        if entry["kind"] == "upstream":
            continue
        chains[bdf] = [*entry["upstream"], bdf]
        if entry["kind"] == UNREADABLE:
            errors[bdf] = entry["error"]
            continue
        for dev in chains[bdf]:
            if dev in links or dev in errors:
                continue
            try:
                links[dev] = read_link(host, dev)
            except SourceError as exc:
                errors[dev] = str(exc)
    return {"chains": chains, "links": links, "errors": errors}
