"""GPU health: Xid events, ECC errors, retired pages and remapped rows, NVLink errors and
clock event reasons, per NVIDIA GPU (keyed by PCI address, ``0000:3b:00.0``).

Sources, in order (the first that answers is used, and named in the fact):

* NVML through the optional ``nvidia-ml-py`` extra (``pynvml``): the API
  ``nvidia-smi`` itself is built on. Its absence is a reason, never a crash.
* ``nvidia-smi -q`` text (every layout from driver 418 to 580: ``Single Bit`` /
  ``Double Bit`` ECC tables before Ampere, ``SRAM``/``DRAM`` counts after, the
  ``SRAM Uncorrectable Parity`` / ``SEC-DED`` split from 535.2xx, ``Clocks Throttle
  Reasons`` renamed ``Clocks Event Reasons`` in 535 and the cumulative ``Clocks Event
  Reasons Counters`` from 550), plus ``nvidia-smi nvlink -e`` (per-link Replay /
  Recovery / CRC error counters) and ``nvidia-smi nvlink -s`` (link state).
* DCGM exporter metrics (``--dcgm URL``): ``DCGM_FI_DEV_ECC_*``,
  ``DCGM_FI_DEV_*_REMAPPED_ROWS``, ``DCGM_FI_DEV_ROW_REMAP_*``,
  ``DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL``, ``DCGM_FI_DEV_*_VIOLATION`` (us) and
  ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` / ``CLOCKS_EVENT_REASONS`` (bit mask).

Xid events come from the kernel log (``dmesg``: ``[ 3947.590120] NVRM: Xid
(PCI:0000:61:00): 119, pid=..., ...``), with the boot's uptime read beside them so
the checks can keep the events of their window. The parsers are pure: text in, values
out; an absent or ``N/A`` value stays absent, never zero.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..collect import Scope, collector
from ..host import Host
from ..model import ParseError, SourceError
from .amd_metrics import MAX_SIZE, THROTTLERS, parse_gpu_metrics
from .amd_smi import parse_amd_smi_list, parse_amd_smi_metric, parse_amd_smi_static
from .kernel_log import bdf_of, parse_kernel_log, read_btime, read_log
from .pci import NVIDIA, UNREADABLE, _bdf, pci_devices
from .procfs import parse_uptime

# -- Xid: the kernel log ---------------------------------------------------------------------

# (meaning, class). Classes: "hardware" (the GPU, its memory or its links failed: a tail
# cause and a drain), "memory" (an ECC event the GPU handled, a reset is due), "application"
# (the program faulted: its job dies or hangs, the GPU is fine), "driver" (firmware or
# driver: GSP timeouts stall every client), "info". From NVIDIA's Xid catalog
# (docs.nvidia.com/deploy/xid-errors).
XID: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing (timeout)", "driver"),
    13: ("Graphics engine exception (an illegal instruction or address in a kernel)",
         "application"),
    31: ("GPU memory page fault (the application touched an unmapped address)", "application"),
    32: ("Invalid or corrupted push buffer stream (PCIe or system memory corruption)",
         "hardware"),
    38: ("Driver firmware error", "driver"),
    43: ("GPU stopped processing (a channel was reset: the application was killed or hung)",
         "application"),
    45: ("Preemptive cleanup after an earlier error", "info"),
    48: ("Double-bit ECC error (an uncorrectable memory error)", "hardware"),
    61: ("Internal micro-controller breakpoint/warning", "driver"),
    62: ("Internal micro-controller halt", "hardware"),
    63: ("ECC page retirement or row remapping recorded (a reset applies it)", "memory"),
    64: ("ECC page retirement or row remapping failed", "hardware"),
    68: ("Video decoder (NVDEC) exception", "application"),
    69: ("Graphics engine class error", "application"),
    74: ("NVLink error (a link failed or retrained)", "hardware"),
    79: ("GPU has fallen off the bus (not reachable over PCIe)", "hardware"),
    92: ("High single-bit ECC error rate", "hardware"),
    94: ("Contained ECC error (an uncorrectable error, the affected application killed)",
         "hardware"),
    95: ("Uncontained ECC error (an uncorrectable error, every application on the GPU "
         "killed)", "hardware"),
    109: ("Context switch timeout", "driver"),
    119: ("GSP RPC timeout (the GPU's system processor did not answer the driver)", "driver"),
    120: ("GSP error", "driver"),
    154: ("GPU recovery action changed (a reset or a reboot is required)", "hardware"),
}
TAIL_CLASSES = ("hardware", "driver", "memory")
MAX_EVENTS = 1000  # a GPU in a fault loop prints an Xid per second: the newest are kept

# Kernel-log events judged by l1.gpu.xid: the Xid lines and the messages of a GPU that
# failed at load or fell off the bus without one (sources.kernel_log.KINDS).
GPU_KINDS = ("xid", "nvrm_fell_off_bus", "nvrm_init_failed", "amdgpu_init_failed",
             "amdgpu_reset", "amdgpu_ring_timeout", "amdgpu_ras")
# The kinds that say a GPU is on the bus but does not answer its driver.
GONE_KINDS = ("nvrm_fell_off_bus", "nvrm_init_failed", "amdgpu_init_failed")
AMD = "0x1002"
VENDORS = {NVIDIA: "nvidia", AMD: "amd"}


def xid_bdf(pci: str) -> str:
    """``0000:61:00`` (the kernel log's domain:bus:device) -> ``0000:61:00.0``."""
    return bdf_of(pci)


def parse_xid(text: str, btime: float | None = None) -> list[dict[str, Any]]:
    """The GPU events of a kernel log (``dmesg``, ``journalctl -k``), oldest first:
    ``{"t_s": seconds since boot | None, "kind", "bdf", "code": Xid | None, "text"}``:
    Xid lines and the NVRM / amdgpu messages of a GPU that fell off the bus, failed to
    initialise, was reset or reported RAS errors. A line naming an Xid that does not
    parse is a :class:`ParseError`."""
    return [e for e in parse_kernel_log(text, btime) if e["kind"] in GPU_KINDS][-MAX_EVENTS:]


def gpus_on_bus(host: Host) -> dict[str, dict[str, Any]]:
    """The NVIDIA and AMD GPUs (and accelerators) of the PCI tree: ``{bdf: {"vendor":
    "nvidia" | "amd", "driver": bound driver | None}}``. None found while a PCI device could
    not be read: that device might be a GPU, so "no GPU here" (a skip) cannot be said: the
    source is refused."""
    devices = pci_devices(host)
    gpus = {b: {"vendor": VENDORS[e["vendor"]], "driver": e.get("driver")}
            for b, e in sorted(devices.items())
            if e.get("vendor") in VENDORS and e.get("kind") in ("gpu", "accelerator")}
    unreadable = [e["error"] for e in devices.values() if e.get("kind") == UNREADABLE]
    if not gpus and unreadable:
        raise SourceError(f"a PCI device could not be read (it may be a GPU): {unreadable[0]}")
    return gpus


def unreadable_pci(host: Host) -> dict[str, str]:
    """PCI devices whose class or vendor could not be read: each may be a GPU, so each is
    a subject whose findings are unknown with the reason (never silently absent)."""
    return {b: e["error"] for b, e in sorted(pci_devices(host).items())
            if e.get("kind") == UNREADABLE}


def nvidia_gpus(host: Host) -> list[str]:
    """The NVIDIA GPUs' addresses (see :func:`gpus_on_bus`)."""
    return [b for b, g in gpus_on_bus(host).items() if g["vendor"] == "nvidia"]


@collector("gpu.xid", counter=True)
def gpu_xid(host: Host, scope: Scope) -> dict[str, Any]:
    """``{"uptime_s", "boot_id", "events": [...], "gpus": [bdf, ...], "bus": {bdf: {vendor,
    driver}}, "source"}``: the kernel log's GPU events and the moment (seconds since boot)
    the log was read."""
    bus = gpus_on_bus(host)
    if not bus:
        return {"gpus": [], "events": [], "uptime_s": None, "boot_id": None}
    out: dict[str, Any] = {"gpus": sorted(bus), "bus": bus, "events": [], "uptime_s": None,
                           "boot_id": None}
    if (bad := unreadable_pci(host)):
        out["pci_unreadable"] = bad
    # Unreadable, every GPU is still a subject: the reason goes in the fact, not a refusal
    try:
        out["uptime_s"] = parse_uptime(host.read("/proc/uptime"))
        text, out["source"], _ = read_log(host)
        out["events"] = parse_xid(text, read_btime(host))
    except SourceError as exc:
        out["unreadable"] = host.blame(exc)
    try:
        out["boot_id"] = host.read("/proc/sys/kernel/random/boot_id").strip()
    except SourceError:
        pass
    return out


# -- nvidia-smi -q ----------------------------------------------------------------------------

_NA = ("N/A", "[N/A]", "Unknown Error", "[Not Supported]", "Not Supported", "[Unknown Error]")
# Old (<= 470) ECC tables name the memory; Device Memory is DRAM, the rest on-chip SRAM.
_OLD_SRAM = ("Register File", "L1 Cache", "L2 Cache", "Texture Memory", "Texture Shared", "CBU",
             "SRAM")
# Clocks Event Reasons (535+) / Clocks Throttle Reasons (older) -> one name each.
_REASONS = {"idle": "idle", "applications clocks setting": "applications_clocks",
            "sw power cap": "sw_power_cap", "hw slowdown": "hw_slowdown",
            "hw thermal slowdown": "hw_thermal", "hw power brake slowdown": "hw_power_brake",
            "sync boost": "sync_boost", "sw thermal slowdown": "sw_thermal",
            "display clock setting": "display_clock"}
# Clocks Event Reasons Counters (550+, microseconds since the driver loaded).
_COUNTERS = {"sw power capping": "sw_power_cap", "sync boost": "sync_boost",
             "sw thermal slowdown": "sw_thermal", "hw thermal slowdown": "hw_thermal",
             "hw power braking": "hw_power_brake"}


UNSUPPORTED = "Unsupported"
_UNSUPPORTED = ("N/A", "[N/A]", "[Not Supported]", "Not Supported")


def attached_gpus(text: str) -> int | None:
    """``Attached GPUs : 8`` of ``nvidia-smi -q`` (how many sections a whole capture has)."""
    m = re.search(r"^Attached GPUs\s*:\s*([0-9]{1,4})\s*$", text, re.M)
    return int(m.group(1)) if m else None


def _count(value: str, where: str) -> int | None:
    v = value.strip().replace(",", "")
    if v in _NA or v == "":
        return None
    if not re.fullmatch(r"[0-9]{1,20}", v):
        raise ParseError(f"nvidia-smi -q: {where}: not a count: {value.strip()[:40]!r}")
    return int(v)


def _yes_no(value: str, where: str) -> bool | None:
    v = value.strip()
    if v in _NA:
        return None
    if v not in ("Yes", "No"):
        raise ParseError(f"nvidia-smi -q: {where}: not Yes/No: {v[:40]!r}")
    return v == "Yes"


def _add(d: dict[str, int], key: str, n: int | None) -> None:
    if n is not None:
        d[key] = d.get(key, 0) + n


def parse_smi_health(text: str) -> dict[str, dict[str, Any]]:
    """``nvidia-smi -q`` -> per GPU (PCI address): ``ecc_mode``, ``ecc`` (``volatile`` and
    ``aggregate``: ``sram_correctable``, ``sram_uncorrectable``, ``dram_correctable``,
    ``dram_uncorrectable``, each only where printed as a number), ``retired_pages``,
    ``remapped_rows``, ``clock_events`` (active reasons) and ``clock_event_us`` (counters).
    """
    out: dict[str, dict[str, Any]] = {}
    gpu: dict[str, Any] | None = None
    path: list[tuple[int, str]] = []  # (indent, section) of the open sections
    for raw in text.splitlines():
        m = re.match(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", raw)
        if m:
            gpu = out.setdefault(_bdf(m.group(1)), {"ecc": {}, "clock_events": {}})
            path = []
            continue
        if gpu is None or not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        key, sep, value = raw.strip().partition(":")
        key = key.strip()
        while path and path[-1][0] >= indent:
            path.pop()
        if not sep or (not value.strip() and key):
            path.append((indent, key))
            continue
        names = [p[1] for p in path]
        where = "/".join([*names, key])
        top = names[0] if names else key
        if top in ("Ecc Mode", "ECC Mode") and key == "Current":
            v = value.strip()
            # N/A (GeForce, RTX workstation cards): the GPU has no ECC memory to switch on
            gpu["ecc_mode"] = UNSUPPORTED if v in _UNSUPPORTED else None if v in _NA else v
        elif top == "ECC Errors" and len(names) >= 2 and names[1] in ("Volatile", "Aggregate"):
            scope = gpu["ecc"].setdefault(names[1].lower(), {})
            if len(names) == 3:  # old layout: Single Bit / Double Bit tables
                kind = {"Single Bit": "correctable", "Double Bit": "uncorrectable"}.get(names[2])
                if kind and key != "Total":
                    mem = "dram" if key == "Device Memory" else "sram"
                    if key == "Device Memory" or key in _OLD_SRAM:
                        _add(scope, f"{mem}_{kind}", _count(value, where))
            elif key.startswith(("SRAM ", "DRAM ")) and "Threshold" not in key:
                mem, kind = key[:4].lower(), key[5:].split()[0].lower()
                if kind in ("correctable", "uncorrectable"):
                    _add(scope, f"{mem}_{kind}", _count(value, where))
        elif top == "Retired Pages":
            rp = gpu.setdefault("retired_pages", {})
            if key in ("Single Bit ECC", "Double Bit ECC"):
                n = _count(value, where)
                if n is not None:
                    rp["single_bit" if key.startswith("Single") else "double_bit"] = n
            elif key in ("Pending", "Pending Page Blacklist"):
                b = _yes_no(value, where)
                if b is not None:
                    rp["pending"] = b
            if not rp:
                gpu.pop("retired_pages")
        elif top == "Remapped Rows" and names:
            rr = gpu.setdefault("remapped_rows", {})
            if key in ("Correctable Error", "Uncorrectable Error"):
                n = _count(value, where)
                if n is not None:
                    rr["correctable" if key.startswith("Corr") else "uncorrectable"] = n
            elif key in ("Pending", "Remapping Failure Occurred"):
                b = _yes_no(value, where)
                if b is not None:
                    rr["pending" if key == "Pending" else "failure"] = b
        elif top in ("Clocks Event Reasons", "Clocks Throttle Reasons") and names:
            name = _REASONS.get(key.lower())
            v = value.strip()
            if name and v in ("Active", "Not Active"):
                gpu["clock_events"][name] = v == "Active"
            elif name and v not in _NA:
                raise ParseError(f"nvidia-smi -q: {where}: not Active/Not Active: {v[:40]!r}")
        elif top == "Clocks Event Reasons Counters" and names:
            name = _COUNTERS.get(key.lower())
            v = value.strip().removesuffix("us").removesuffix("µs").strip()
            if name:
                n = _count(v, where)
                if n is not None:
                    gpu.setdefault("clock_event_us", {})[name] = n
    if not out:
        raise ParseError("nvidia-smi -q: no 'GPU <bus id>' section")
    for g in out.values():
        g["ecc"] = {k: v for k, v in g["ecc"].items() if v}
    return out


# -- nvidia-smi nvlink -e / -s ------------------------------------------------------------------

_NVL_GPU_RE = re.compile(r"^GPU (\d+): (.*?) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")
_NVL_ERR_RE = re.compile(r"^\s*Link (\d+): ([A-Za-z0-9 ]+?) Errors: (\S+)\s*$")
_NVL_STATE_RE = re.compile(r"^\s*Link (\d+): (.+?)\s*$")
_NVL_NAMES = {"Replay": "replay", "Recovery": "recovery", "CRC": "crc", "CRC Flit": "crc_flit",
              "CRC Data": "crc_data", "ECC Data": "ecc_data"}


def parse_nvlink_errors(text: str) -> dict[str, dict[str, Any]]:
    """``nvidia-smi nvlink -e`` -> ``{gpu index: {"uuid", "links": {link: {counter: n}}}}``.
    Counter names: replay, recovery, crc (and crc_flit/crc_data/ecc_data where printed).
    Empty output is what nvidia-smi prints where no GPU has NVLink: ``{}``."""
    out: dict[str, dict[str, Any]] = {}
    if not text.strip():
        return out
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        m = _NVL_GPU_RE.match(line)
        if m:
            cur = out.setdefault(m.group(1), {"uuid": m.group(3), "name": m.group(2), "links": {}})
            continue
        e = _NVL_ERR_RE.match(line)
        if e and cur is not None:
            name = _NVL_NAMES.get(e.group(2).strip())
            if name is None:
                continue
            n = _count(e.group(3), f"nvlink -e link {e.group(1)} {e.group(2)}")
            if n is not None:
                cur["links"].setdefault(e.group(1), {})[name] = n
    if not out:
        raise ParseError("nvidia-smi nvlink -e: no 'GPU N: ... (UUID: ...)' line")
    return out


def parse_nvlink_status(text: str) -> dict[str, dict[str, str]]:
    """``nvidia-smi nvlink -s`` -> ``{gpu index: {link: "active" | "inactive"}}`` (``Link 0:
    26.562 GB/s`` is active, ``Link 0: <inactive>`` is not); empty output (no NVLink on any
    GPU) is ``{}``."""
    out: dict[str, dict[str, str]] = {}
    if not text.strip():
        return out
    cur: dict[str, str] | None = None
    for line in text.splitlines():
        m = _NVL_GPU_RE.match(line)
        if m:
            cur = out.setdefault(m.group(1), {})
            continue
        s = _NVL_STATE_RE.match(line)
        if s and cur is not None:
            v = s.group(2)
            if "inactive" in v.lower():
                cur[s.group(1)] = "inactive"
            elif re.match(r"^\d+(?:\.\d+)? [GM]B/s$", v):
                cur[s.group(1)] = "active"
    if not out:
        raise ParseError("nvidia-smi nvlink -s: no 'GPU N: ... (UUID: ...)' line")
    return out


def smi_index_to_bdf(text: str) -> dict[str, str]:
    """GPU index -> PCI address from ``nvidia-smi -q`` order (nvidia-smi numbers GPUs in
    PCI order, the order of its ``GPU <bus id>`` sections)."""
    bdfs = [_bdf(m.group(1)) for m in re.finditer(
        r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", text, re.M)]
    return {str(i): b for i, b in enumerate(bdfs)}


# -- DCGM exporter --------------------------------------------------------------------------

# DCGM field -> (section, key).
DCGM_FIELDS = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc.volatile", "correctable"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc.volatile", "uncorrectable"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc.aggregate", "correctable"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc.aggregate", "uncorrectable"),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_pages", "single_bit"),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_pages", "double_bit"),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pages", "pending"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows", "correctable"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows", "uncorrectable"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remapped_rows", "pending"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remapped_rows", "failure"),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("nvlink_total", "crc_flit"),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("nvlink_total", "crc_data"),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("nvlink_total", "replay"),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("nvlink_total", "recovery"),
    "DCGM_FI_DEV_POWER_VIOLATION": ("violation_us", "power"),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("violation_us", "thermal"),
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": ("violation_us", "sync_boost"),
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": ("violation_us", "board_limit"),
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": ("violation_us", "reliability"),
    "DCGM_FI_DEV_XID_ERRORS": ("xid", "last"),
}
_MASK_FIELDS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
# nvmlClocksEventReason* bits (nvml.h; pynvml's nvmlClocksEventReason... constants).
REASON_BITS = {0x1: "idle", 0x2: "applications_clocks", 0x4: "sw_power_cap",
               0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal",
               0x80: "hw_power_brake", 0x100: "display_clock"}


def reasons_from_mask(mask: int) -> dict[str, bool]:
    return {name: bool(mask & bit) for bit, name in REASON_BITS.items()}


def parse_dcgm(samples: list[list[Any]]) -> dict[str, dict[str, Any]]:
    """DCGM exporter samples (``[[name, labels, value], ...]``, engine.parse_exposition) ->
    per GPU (``pci_bus_id`` label, else ``gpu`` index as ``gpu<N>``) the health sections."""
    out: dict[str, dict[str, Any]] = {}
    for raw_name, labels, value in samples:
        # prometheus_client names a counter's samples NAME_total; DCGM's fields have no suffix
        name = raw_name.removesuffix("_total")
        if name not in DCGM_FIELDS and name not in _MASK_FIELDS:
            continue
        if labels.get("GPU_I_ID"):  # a MIG instance repeats its parent GPU's device fields
            continue
        key = _bdf(labels["pci_bus_id"]) if labels.get("pci_bus_id") else f"gpu{labels.get('gpu', '?')}"
        gpu = out.setdefault(key, {"ecc": {}, "clock_events": {}, "uuid": labels.get("UUID")})
        if name in _MASK_FIELDS:
            gpu["clock_events"] = reasons_from_mask(int(value))
            continue
        section, field = DCGM_FIELDS[name]
        if section == "xid":
            gpu["xid_last"] = int(value)
            continue
        target = gpu["ecc"].setdefault(section.split(".")[1], {}) if section.startswith("ecc.") \
            else gpu.setdefault(section, {})
        target[field] = bool(value) if field in ("pending", "failure") else int(value)
    if not out:
        raise ParseError("DCGM exporter metrics: no DCGM_FI_DEV_* health field")
    return out


# -- NVML (nvidia-ml-py) ----------------------------------------------------------------------

def nvml_health(pynvml: Any) -> dict[str, dict[str, Any]]:
    """Every GPU's health through NVML. ``pynvml`` is the module (``import pynvml`` from
    nvidia-ml-py); calls a GPU does not support (``NVMLError_NotSupported``) leave that
    section absent. NVML must be initialised by the caller."""
    nvml = pynvml
    not_supported = (nvml.NVMLError_NotSupported,)

    def opt(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except not_supported:
            return None

    out: dict[str, dict[str, Any]] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        bus = nvml.nvmlDeviceGetPciInfo(h).busId
        bdf = _bdf(bus.decode() if isinstance(bus, bytes) else bus)
        gpu: dict[str, Any] = {"ecc": {}, "clock_events": {}}
        mode = opt(nvml.nvmlDeviceGetEccMode, h)
        if mode is not None:
            gpu["ecc_mode"] = "Enabled" if mode[0] == nvml.NVML_FEATURE_ENABLED else "Disabled"
        else:  # NVML said NotSupported: a GPU without ECC memory
            gpu["ecc_mode"] = UNSUPPORTED
        if gpu.get("ecc_mode") == "Enabled":
            for counter, scope in ((nvml.NVML_VOLATILE_ECC, "volatile"),
                                   (nvml.NVML_AGGREGATE_ECC, "aggregate")):
                section: dict[str, int] = {}
                for err, kind in ((nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "correctable"),
                                  (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrectable")):
                    for loc, mem in ((nvml.NVML_MEMORY_LOCATION_DRAM, "dram"),
                                     (nvml.NVML_MEMORY_LOCATION_SRAM, "sram")):
                        n = opt(nvml.nvmlDeviceGetMemoryErrorCounter, h, err, counter, loc)
                        if n is not None:
                            section[f"{mem}_{kind}"] = int(n)
                    if not any(k.endswith(kind) for k in section):
                        total = opt(nvml.nvmlDeviceGetTotalEccErrors, h, err, counter)
                        if total is not None:
                            section[kind] = int(total)
                if section:
                    gpu["ecc"][scope] = section
        rows = opt(nvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failure = rows
            gpu["remapped_rows"] = {"correctable": int(corr), "uncorrectable": int(unc),
                                    "pending": bool(pending), "failure": bool(failure)}
        else:  # pre-Ampere: dynamic page retirement
            rp: dict[str, Any] = {}
            for cause, key in (
                    (nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, "single_bit"),
                    (nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, "double_bit")):
                pages = opt(nvml.nvmlDeviceGetRetiredPages, h, cause)
                if pages is not None:
                    rp[key] = len(pages)
            pend = opt(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
            if pend is not None:
                rp["pending"] = pend == nvml.NVML_FEATURE_ENABLED
            if rp:
                gpu["retired_pages"] = rp
        get_reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = opt(get_reasons, h)
        if mask is not None:
            gpu["clock_events"] = reasons_from_mask(int(mask))
        violations: dict[str, int] = {}
        for policy, key in ((nvml.NVML_PERF_POLICY_POWER, "power"),
                            (nvml.NVML_PERF_POLICY_THERMAL, "thermal"),
                            (nvml.NVML_PERF_POLICY_SYNC_BOOST, "sync_boost"),
                            (nvml.NVML_PERF_POLICY_BOARD_LIMIT, "board_limit"),
                            (nvml.NVML_PERF_POLICY_RELIABILITY, "reliability")):
            v = opt(nvml.nvmlDeviceGetViolationStatus, h, policy)
            if v is not None:
                violations[key] = int(v.violationTime) // 1000  # ns -> us
        if violations:
            gpu["violation_us"] = violations
        links: dict[str, dict[str, int]] = {}
        states: dict[str, str] = {}
        no_link = (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument)
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(h, link)
            except no_link:
                continue  # no such link on this GPU
            except nvml.NVMLError as exc:  # the link exists but did not answer
                gpu.setdefault("unreadable", {})["nvlink"] = f"NVML link {link}: {exc}"
                continue
            states[str(link)] = "active" if state == nvml.NVML_FEATURE_ENABLED else "inactive"
            counters: dict[str, int] = {}
            for c, key in ((nvml.NVML_NVLINK_ERROR_DL_REPLAY, "replay"),
                           (nvml.NVML_NVLINK_ERROR_DL_RECOVERY, "recovery"),
                           (nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, "crc_flit"),
                           (nvml.NVML_NVLINK_ERROR_DL_CRC_DATA, "crc_data")):
                n = opt(nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, c)
                if n is not None:
                    counters[key] = int(n)
            if counters:
                links[str(link)] = counters
        if states:
            gpu["nvlink_state"] = states
        if links:
            gpu["nvlink"] = links
        gpu["nvlink_read"] = True  # every link asked: none is an answer, not a gap
        gpu["ecc"] = {k: v for k, v in gpu["ecc"].items() if v}
        out[bdf] = gpu
    return out


def _nvml(bdfs: list[str]) -> dict[str, dict[str, Any]]:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError as exc:
        raise SourceError("nvidia-ml-py is not installed (pip install 'tailgate[nvidia]')") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise SourceError(f"NVML: {exc}") from exc
    try:
        got = nvml_health(pynvml)
    except pynvml.NVMLError as exc:
        raise SourceError(f"NVML: {exc}") from exc
    finally:
        pynvml.nvmlShutdown()
    return {b: g for b, g in got.items() if b in bdfs}


def _smi(host: Host, text: str) -> dict[str, dict[str, Any]]:
    gpus = parse_smi_health(text)
    index = smi_index_to_bdf(text)
    for argv, parse, field in ((["nvidia-smi", "nvlink", "-e"], parse_nvlink_errors, "nvlink"),
                               (["nvidia-smi", "nvlink", "-s"], parse_nvlink_status,
                                "nvlink_state")):
        try:
            parsed = parse(host.run(argv, timeout_s=20))
        except SourceError as exc:
            for g in gpus.values():
                g.setdefault("unreadable", {})[field] = host.blame(exc)
            continue
        for idx, v in parsed.items():
            bdf = index.get(idx)
            if bdf in gpus:
                gpus[bdf][field] = v["links"] if field == "nvlink" else v
        if field == "nvlink":  # read: a GPU it does not list has no NVLink
            for g in gpus.values():
                g["nvlink_read"] = True
    return gpus


# -- AMD: amdgpu's sysfs ----------------------------------------------------------------------

# amdgpu_ras.c amdgpu_ras_sysfs_read: "ue: %lu\nce: %lu\n" (Linux 5.x; "de: %lu" added by
# 6.10 for deferred errors). The UMC block is the HBM's memory controller (DRAM ECC); every
# other block (gfx, sdma, mmhub, hdp, ...) is on-chip SRAM; xgmi_wafl is the xGMI links.
_RAS_LINE = re.compile(r"^(ue|ce|de): ?([0-9]{1,20})$")


def parse_ras_count(text: str, what: str) -> dict[str, int]:
    """``ras/<block>_err_count`` -> ``{"ue": n, "ce": n[, "de": n]}``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _RAS_LINE.match(line.strip())
        if not m:
            raise ParseError(f"{what}: not a RAS count line: {line.strip()[:40]!r}")
        out[m.group(1)] = int(m.group(2))
    if "ue" not in out or "ce" not in out:
        raise ParseError(f"{what}: no ue/ce counts")
    return out


def parse_bad_pages(text: str) -> dict[str, Any]:
    """``ras/gpu_vram_bad_pages`` (``0x%08x : 0x%08x : %1s`` per page: R reserved, P
    pending, F failed to reserve) -> ``{"retired": n, "pending": bool, "failure": bool}``."""
    counts = {"R": 0, "P": 0, "F": 0}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = re.fullmatch(r"0x[0-9a-fA-F]+\s*:\s*0x[0-9a-fA-F]+\s*:\s*([RPF])", line.strip())
        if not m:
            raise ParseError(f"gpu_vram_bad_pages: not a page line: {line.strip()[:40]!r}")
        counts[m.group(1)] += 1
    return {"retired": counts["R"], "pending": bool(counts["P"]), "failure": bool(counts["F"])}


# PCI device ids of AMD Instinct GPUs: every one has ECC HBM and amdgpu RAS. pci.ids names
# 7388/738c/738e (Arcturus, MI100) and 7408/740c/740f (Aldebaran, MI250X/MI250/MI210); the
# MI300 family (Aqua Vanjaram: 74a0 MI300A, 74a1 MI300X, 74a2 MI308X, 74a5 MI325X, 74a9, 74b5
# and 74bd its other SKUs and VFs) is newer than Debian 12's pci.ids. An unlisted one with
# the processing-accelerator class (0x12) counts too.
INSTINCT_IDS = frozenset({"0x7388", "0x738c", "0x738e", "0x7408", "0x740c", "0x740f",
                          "0x74a0", "0x74a1", "0x74a2", "0x74a5", "0x74a9", "0x74b5",
                          "0x74bd"})


def _instinct(host: Host, base: str) -> bool:
    try:
        dev = host.read(f"{base}/device").strip().lower()
        cls = host.read(f"{base}/class").strip().lower()
    except SourceError:
        return True  # cannot tell: not "unsupported"
    return dev in INSTINCT_IDS or cls.startswith("0x12")


def amd_health(host: Host, bdf: str) -> dict[str, Any]:
    """One AMD GPU from amdgpu's sysfs: ECC/RAS counters per block, retired pages, xGMI
    link errors and the PCIe replay counter."""
    base = f"/sys/bus/pci/devices/{bdf}"
    gpu: dict[str, Any] = {"ecc": {}, "clock_events": {}, "source": "amdgpu sysfs (ras/)"}
    try:
        names = host.listdir(f"{base}/ras")
    except SourceError as exc:
        if not str(exc).endswith(": absent"):
            raise
        names = []
        # amdgpu makes ras/ only where RAS is supported and enabled (amdgpu.ras_enable). An
        # Instinct GPU has ECC HBM: its ras/ missing is RAS switched off or not captured.
        if _instinct(host, base):
            gpu["ecc_mode"] = None
            gpu.setdefault("unreadable", {})["ecc"] = (
                f"{base}/ras absent on an Instinct GPU (ECC HBM): RAS off (amdgpu.ras_enable=0) "
                "or not captured")
        else:
            gpu["ecc_mode"] = UNSUPPORTED
    blocks: dict[str, dict[str, int]] = {}
    for name in names:
        if name.endswith("_err_count"):
            path = f"{base}/ras/{name}"
            blocks[name.removesuffix("_err_count")] = parse_ras_count(host.read(path), path)
    if names:
        gpu["ecc_mode"] = "Enabled"
        _ras_sections(gpu, blocks)
        if "gpu_vram_bad_pages" in names:
            bad = parse_bad_pages(host.read(f"{base}/ras/gpu_vram_bad_pages"))
            gpu["retired_pages"] = {"retired": bad["retired"], "pending": bad["pending"]}
            gpu["remapped_rows"] = {"failure": bad["failure"]}
    if "xgmi_wafl" in blocks:
        pass  # _ras_sections read it
    elif not host.exists(f"{base}/xgmi_device_id") and not host.exists(f"{base}/xgmi_hive_info"):
        gpu["nvlink_read"] = True  # not in an xGMI hive: no GPU-to-GPU links
    _throttle(host, base, gpu)
    return gpu


def _throttle(host: Host, base: str, gpu: dict[str, Any]) -> None:
    """The clock-event fields of an AMD GPU from its binary gpu_metrics table."""
    path = f"{base}/gpu_metrics"
    try:
        m = parse_gpu_metrics(host.read_bytes(path, limit=MAX_SIZE + 1), path)
    except SourceError as exc:
        gpu.setdefault("unreadable", {})["clock_events"] = host.blame(exc)
        return
    gpu["gpu_metrics"] = {k: m[k] for k in ("revision", "size", "temperatures_c",
                                            "gfxclk_mhz", "throttle_status",
                                            "indep_throttle_status") if k in m}
    if m["throttle"] == "none":
        gpu.setdefault("unreadable", {})["clock_events"] = (
            f"{path}: revision {m['revision']} carries no throttle status (the driver writes "
            "0 there: MI300 firmware before the residency counters of revision 1.6)")
    elif m["throttle"] == "residency":
        gpu["throttle_residency"] = m["residency"]
    else:
        # Every known bit is read: a False is "not throttled by it", not "unread".
        events = {name: False for name, _ in THROTTLERS.values()} \
            if m["throttle"] == "independent" else {}
        kinds = dict(m.get("active") or {})
        if m["throttle_status"] and not kinds:  # ASIC bits only: a throttler, kind unnamed
            kinds["ASIC_THROTTLE"] = "unnamed"
        events.update({name: True for name in kinds})
        events.setdefault("ASIC_THROTTLE", False)
        gpu["clock_events"] = events
        gpu["clock_event_kinds"] = kinds


# rocm-smi --showrasinfo [all]: per GPU (``GPU[N]:  RAS INFO``; one GPU without that header
# in the compact layout) a Block / Status / Correctable / Uncorrectable table, read from the
# same amdgpu ras/ files; a block with a status only has no counters.
_ROCM_GPU = re.compile(r"^GPU\[(\d+)\]\s*:?\s*RAS INFO")
_ROCM_ROW = re.compile(r"^([A-Z][A-Z0-9_]*)\s+(ENABLED|DISABLED)(?:\s+([0-9]{1,20})\s+([0-9]{1,20}))?$")


def parse_rocm_smi_ras(text: str) -> dict[str, dict[str, Any]]:
    """``rocm-smi --showrasinfo`` -> ``{gpu index: {"blocks": {block: {"ce", "ue"}},
    "enabled": [...], "disabled": [...]}}`` (block names lower case, as amdgpu's files)."""
    out: dict[str, dict[str, Any]] = {}
    cur: dict[str, Any] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = _ROCM_GPU.match(line)
        if m:
            cur = out.setdefault(m.group(1), {"blocks": {}, "enabled": [], "disabled": []})
            continue
        r = _ROCM_ROW.match(line)
        if not r:
            continue
        if cur is None:  # the compact layout of one GPU
            cur = out.setdefault("0", {"blocks": {}, "enabled": [], "disabled": []})
        block = r.group(1).lower()
        cur["enabled" if r.group(2) == "ENABLED" else "disabled"].append(block)
        if r.group(3) is not None:
            cur["blocks"][block] = {"ce": int(r.group(3)), "ue": int(r.group(4))}
    if not out:
        raise ParseError("rocm-smi --showrasinfo: no RAS table")
    return out


def parse_rocm_smi_bus(text: str) -> dict[str, str]:
    """``rocm-smi --showbus``: ``GPU[0]  : PCI Bus: 0000:03:00.0`` -> ``{"0": bdf}``."""
    return {m.group(1): m.group(2).lower() for m in re.finditer(
        r"^GPU\[(\d+)\]\s*:\s*PCI Bus:\s*([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])",
        text, re.M)}


def _ras_sections(gpu: dict[str, Any], blocks: dict[str, dict[str, int]]) -> None:
    """ECC sections from per-block RAS counts (umc: the HBM; the rest on-chip SRAM)."""
    vol: dict[str, int] = {}
    for block, c in blocks.items():
        if block == "xgmi_wafl":
            continue
        mem = "dram" if block == "umc" else "sram"
        vol[f"{mem}_uncorrectable"] = vol.get(f"{mem}_uncorrectable", 0) + c["ue"]
        vol[f"{mem}_correctable"] = vol.get(f"{mem}_correctable", 0) + c["ce"]
    if vol:
        gpu["ecc"] = {"volatile": vol}
    gpu["ras_blocks"] = blocks
    if "xgmi_wafl" in blocks:
        gpu["xgmi"] = {"uncorrectable": blocks["xgmi_wafl"]["ue"],
                       "correctable": blocks["xgmi_wafl"]["ce"]}
        gpu["nvlink_read"] = True


def rocm_smi_health(host: Host) -> dict[str, dict[str, Any]]:
    """AMD GPUs' RAS counts from rocm-smi, keyed by PCI address (where amdgpu's ras/ files
    are not there to read: a root captured without them, a container without sysfs)."""
    ras = parse_rocm_smi_ras(host.run(["rocm-smi", "--showrasinfo", "all"], timeout_s=20))
    bus = parse_rocm_smi_bus(host.run(["rocm-smi", "--showbus"], timeout_s=20))
    out: dict[str, dict[str, Any]] = {}
    for idx, r in ras.items():
        if idx not in bus:
            continue
        gpu: dict[str, Any] = {"ecc": {}, "clock_events": {}, "ecc_mode": "Enabled",
                               "source": "rocm-smi --showrasinfo all"}
        _ras_sections(gpu, r["blocks"])
        if "xgmi_wafl" in r["disabled"]:
            gpu["nvlink_read"] = True  # the xGMI RAS block is off: no xGMI links
        out[bus[idx]] = gpu
    return out


def amd_smi_health(host: Host) -> dict[str, dict[str, Any]]:
    """AMD GPUs from ``amd-smi static/metric --json``, keyed by PCI address: the fields of
    :func:`amd_health` that amd-smi carries (ECC per RAS block, the xGMI block's state,
    the throttle status or MI300's residency counters). A GPU amd-smi gives no address
    for is under ``"gpuN"`` with only a ``why``."""
    static = parse_amd_smi_static(host.run(["amd-smi", "static", "--json"], timeout_s=30))
    metric = parse_amd_smi_metric(host.run(["amd-smi", "metric", "--json"], timeout_s=30))
    where = {i: st["bdf"] for i, st in static.items() if st["bdf"]}
    if len(where) < len(metric):  # some builds print no bus.bdf: amd-smi list has it
        try:
            where = {**parse_amd_smi_list(host.run(["amd-smi", "list", "--json"],
                                                   timeout_s=30)), **where}
        except SourceError:
            pass
    out: dict[str, dict[str, Any]] = {}
    for idx, m in metric.items():
        if idx not in where:
            out[f"gpu{idx}"] = {"why": f"amd-smi names no PCI address for GPU {idx} (static "
                                       "--json has no bus.bdf, and list --json none)"}
            continue
        gpu: dict[str, Any] = {"ecc": {}, "clock_events": {}, "source": "amd-smi metric --json"}
        ras = (static.get(idx) or {}).get("ras_blocks")
        if ras is None:  # amd-smi: ras N/A, no RAS block at all on this GPU
            gpu["ecc_mode"] = UNSUPPORTED
        else:
            gpu["ecc_mode"] = "Enabled"
            if m.get("ecc_blocks"):
                _ras_sections(gpu, m["ecc_blocks"])
            elif m.get("ecc_total"):
                gpu["ecc"] = {"volatile": {"total_uncorrectable": m["ecc_total"]["ue"],
                                           "total_correctable": m["ecc_total"]["ce"]}}
            if ras.get("xgmi_wafl") is False:
                gpu["nvlink_read"] = True  # the xGMI RAS block is off: no xGMI links
        if m.get("residency"):
            gpu["throttle_residency"] = m["residency"]
        elif "throttled" in m:
            gpu["clock_events"] = {"ASIC_THROTTLE": m["throttled"]}
            gpu["clock_event_kinds"] = {"ASIC_THROTTLE": "unnamed"} if m["throttled"] else {}
        out[where[idx]] = gpu
    return out


# What amd-smi fills of a GPU whose amdgpu sysfs file is missing: per unreadable field,
# whether amd-smi's reading has it, the keys it brings, and the key naming amd-smi as source.
_AMD_SMI_FILLS = (
    ("ecc", lambda smi: "ecc" in smi and bool(smi["ecc"] or smi.get("ecc_mode") == UNSUPPORTED),
     ("ecc", "ecc_mode", "ras_blocks", "xgmi", "nvlink_read"), "source"),
    ("clock_events", lambda smi: "clock_event_kinds" in smi or "throttle_residency" in smi,
     ("clock_events", "clock_event_kinds", "throttle_residency"), "clock_source"),
)


def _merge_amd_smi(got: dict[str, Any], smi: dict[str, Any]) -> dict[str, Any]:
    """amdgpu's sysfs reading of one GPU, its unreadable fields filled from amd-smi."""
    why = dict(got.get("unreadable") or {})
    out = dict(got)
    for field, has, keys, named in _AMD_SMI_FILLS:
        if field in why and has(smi):
            out.update({k: smi[k] for k in keys if k in smi})
            out[named] = smi["source"]
            del why[field]
    out["unreadable"] = why
    return out


def _asked_once(asked: dict[str, dict[str, dict[str, Any]]], tool: str,
                read: Callable[[Host], dict[str, dict[str, Any]]], host: Host,
                tried: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every GPU's reading from ``tool`` (amd-smi, rocm-smi), asked at most once per
    collection, when the first GPU needs it; a tool that fails reads as none, its reason
    in ``tried``."""
    if tool not in asked:
        try:
            asked[tool] = read(host)
        except SourceError as exc:
            asked[tool] = {}
            tried[tool] = host.blame(exc)
    return asked[tool]


# -- DCGM exporter: one bad sample is refused alone ------------------------------------------

def dcgm_samples(text: str) -> tuple[list[list[Any]], dict[str, str]]:
    """A DCGM exporter scrape -> (samples, {refused sample: why}). The scrape is parsed whole
    first; where that fails, line by line, so that one sample whose value is not a number
    (an exporter that printed its own error there) is refused by name and the others read."""
    from .engine import parse_exposition

    try:
        return parse_exposition(text), {}
    except ParseError:
        pass
    samples: list[list[Any]] = []
    refused: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        try:
            samples += parse_exposition(line + "\n")
        except ParseError as exc:
            refused[line.strip()[:120]] = str(exc).split(";")[0][:160]
    if not samples:
        raise ParseError("DCGM exporter metrics: no sample reads: "
                         + "; ".join(list(refused)[:3]))
    return samples, refused


# -- the collector ------------------------------------------------------------------------------

@collector("gpu.health", counter=True)
def gpu_health(host: Host, scope: Scope) -> dict[str, Any]:
    """``{"source": what answered for the NVIDIA GPUs, "gpus": {bdf | gpuN: {...}},
    "tried": {source: reason}, "bus": {bdf: {vendor, driver}}, "attached": n | None}``.
    Every NVIDIA and AMD GPU of the PCI tree is in ``bus``; one its source does not report
    is absent from ``gpus`` (the checks say why). No GPU and no --dcgm: ``{"gpus": {}}``."""
    from .engine import fetch

    bus = gpus_on_bus(host)
    bdfs = [b for b, g in bus.items() if g["vendor"] == "nvidia"]
    tried: dict[str, str] = {}
    out: dict[str, Any] = {"source": None, "gpus": {}, "tried": tried, "bus": bus}
    if bus and (bad := unreadable_pci(host)):
        out["pci_unreadable"] = bad
    if bdfs:
        if host.live:
            try:
                out.update(source="NVML (nvidia-ml-py)", gpus=_nvml(bdfs))
            except SourceError as exc:
                tried["nvml"] = str(exc)
        if out["source"] is None:
            try:
                text = host.run(["nvidia-smi", "-q"], timeout_s=20)
                out.update(source="nvidia-smi -q", gpus=_smi(host, text),
                           attached=attached_gpus(text))
            except SourceError as exc:
                tried["nvidia-smi"] = host.blame(exc)
    url = scope.options.get("dcgm")
    if url and out["source"] is None:
        try:
            samples, refused = dcgm_samples(fetch(str(url), host.timeout_s))
            out.update(source=f"DCGM exporter {url}", gpus=parse_dcgm(samples))
            if refused:
                out["refused"] = refused
        except SourceError as exc:
            tried["dcgm"] = f"--dcgm {url}: {exc}"
    asked: dict[str, dict[str, dict[str, Any]]] = {}  # per tool: its reading of every GPU
    for bdf, g in bus.items():
        if g["vendor"] != "amd":
            continue
        try:
            got = amd_health(host, bdf)
        except SourceError as exc:
            tried[f"amdgpu {bdf}"] = host.blame(exc)
            continue
        unread = got.get("unreadable") or {}
        if "ecc" in unread or "clock_events" in unread:  # sysfs files missing: amd-smi
            amdsmi = _asked_once(asked, "amd-smi", amd_smi_health, host, tried)
            if bdf in amdsmi:
                got = _merge_amd_smi(got, amdsmi[bdf])
            else:  # say why amd-smi did not fill them either
                note = tried.get("amd-smi") or next(
                    (v["why"] for k, v in amdsmi.items() if "why" in v),
                    "it does not list this GPU")
                got["unreadable"] = {k: f"{v}; amd-smi: {note}" for k, v in unread.items()}
        if "ecc" in (got.get("unreadable") or {}):  # an Instinct GPU without ras/: rocm-smi
            rocm = _asked_once(asked, "rocm-smi", rocm_smi_health, host, tried)
            if bdf in rocm:  # the RAS counts from rocm-smi; the rest stays amdgpu's
                keep = ("remapped_rows", "clock_events", "clock_event_kinds",
                        "throttle_residency", "gpu_metrics", "clock_source")
                why = {k: v for k, v in (got.get("unreadable") or {}).items() if k != "ecc"}
                got = {**rocm[bdf], **{k: got[k] for k in keep if k in got},
                       **({"unreadable": why} if why else {})}
        out["gpus"][bdf] = got
    return out
