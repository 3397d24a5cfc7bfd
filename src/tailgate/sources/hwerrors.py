"""The host's own hardware errors: memory ECC (EDAC) and firmware interrupts (SMIs).

* EDAC (drivers/edac/edac_mc_sysfs.c): ``/sys/devices/system/edac/mc/mcN/{ce,ue}_count``
  per memory controller, ``mcN/dimmM/{dimm_ce_count,dimm_ue_count,dimm_label}`` per DIMM
  (Linux >= 3.x with the per-DIMM API), and the older per chip-select rows
  ``mcN/csrowK/{ce_count,ue_count,chJ_ce_count,chJ_dimm_label}``. Counts since the driver
  loaded (or since ``reset_counters``). A host without an EDAC driver has no ``mc``.
* SMIs: Intel's ``MSR_SMI_COUNT`` (0x34, Nehalem and later), read from
  ``/dev/cpu/0/msr`` at offset 0x34 (8 bytes, little-endian; the msr module and root). An
  SMI stops every CPU at once, so CPU 0's count is the host's. AMD CPUs have no such MSR
  (the read fails with EIO), nor do most hypervisors' virtual CPUs.
"""

from __future__ import annotations

import errno
import re
from typing import Any

from ..collect import Scope, collector
from ..host import Host
from ..model import ParseError, SourceError

EDAC = "/sys/devices/system/edac/mc"
MSR_SMI_COUNT = 0x34
_COUNT = re.compile(r"^[0-9]{1,20}$")


def parse_count(text: str, what: str) -> int:
    s = text.strip()
    if not _COUNT.match(s):
        raise ParseError(f"{what}: not a count: {s[:40]!r}")
    return int(s)


def _opt_count(host: Host, path: str) -> int | None:
    try:
        text = host.read(path)
    except SourceError as exc:
        if str(exc).endswith(": absent"):
            return None
        raise
    return parse_count(text, path)


def _label(host: Host, path: str) -> str | None:
    try:
        return host.read(path).strip()[:64] or None
    except SourceError:
        return None


def read_edac(host: Host) -> dict[str, Any]:
    """``{"mcs": {"mc0": {"ce": n, "ue": n, "dimms": {"mc0/dimm3": {"label", "ce", "ue"}}}}}``;
    per DIMM from ``dimm*`` where the kernel has them, else from ``csrow*/ch*``."""
    try:
        names = [n for n in host.listdir(EDAC) if re.fullmatch(r"mc[0-9]+", n)]
    except SourceError as exc:
        if str(exc).endswith(": absent"):
            raise SourceError(f"{exc} (no EDAC driver loaded: a VM, memory without ECC, or "
                              "the platform's module - skx_edac, i10nm_edac, amd64_edac, "
                              "ghes_edac - not loaded)") from exc
        raise
    if not names:
        raise SourceError(f"{EDAC}: no memory controller (no EDAC driver bound)")
    mcs: dict[str, Any] = {}
    for mc in sorted(names, key=lambda n: int(n[2:])):
        base = f"{EDAC}/{mc}"
        entry: dict[str, Any] = {"ce": parse_count(host.read(f"{base}/ce_count"), f"{base}/ce_count"),
                                 "ue": parse_count(host.read(f"{base}/ue_count"), f"{base}/ue_count"),
                                 "dimms": {}}
        subs = host.listdir(base)
        for d in sorted(n for n in subs if re.fullmatch(r"dimm[0-9]+", n)):
            ce = _opt_count(host, f"{base}/{d}/dimm_ce_count")
            ue = _opt_count(host, f"{base}/{d}/dimm_ue_count")
            if ce is None and ue is None:
                continue
            entry["dimms"][f"{mc}/{d}"] = {"label": _label(host, f"{base}/{d}/dimm_label"),
                                           "ce": ce or 0, "ue": ue or 0}
        if not entry["dimms"]:  # the older layout: chip-select rows and their channels
            for row in sorted(n for n in subs if re.fullmatch(r"csrow[0-9]+", n)):
                ue = _opt_count(host, f"{base}/{row}/ue_count")
                for ch in sorted(n for n in host.listdir(f"{base}/{row}")
                                 if re.fullmatch(r"ch[0-9]+_ce_count", n)):
                    c = ch.removesuffix("_ce_count")
                    entry["dimms"][f"{mc}/{row}/{c}"] = {
                        "label": _label(host, f"{base}/{row}/{c}_dimm_label"),
                        "ce": parse_count(host.read(f"{base}/{row}/{ch}"), ch),
                        "ue": 0}
                if ue:  # uncorrectable errors are counted per row, not per channel
                    entry["dimms"].setdefault(f"{mc}/{row}", {"label": None, "ce": 0, "ue": 0})[
                        "ue"] = ue
        mcs[mc] = entry
    return {"mcs": mcs}


@collector("host.edac", counter=True)
def host_edac(host: Host, scope: Scope) -> dict[str, Any]:
    return read_edac(host)


def read_smi_count(host: Host, cpu: int = 0) -> int:
    """MSR_SMI_COUNT of ``cpu``; a SourceError that says why it cannot be read."""
    path = f"/dev/cpu/{cpu}/msr"
    try:
        data = host.read_at(path, MSR_SMI_COUNT, 8)
    except SourceError as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno == errno.EIO:
            # rdmsr faulted: the CPU (AMD, pre-Nehalem Intel) or the hypervisor has no
            # such MSR
            raise SourceError(f"{path}: this CPU has no MSR_SMI_COUNT (0x34): the read "
                              "faults (an AMD CPU, a pre-Nehalem Intel one, or a virtual CPU)"
                              ) from exc
        if str(exc).endswith(": absent"):
            raise SourceError(f"{path}: absent (the msr module is not loaded: modprobe msr)"
                              ) from exc
        raise
    # bits 31:0 count SMIs since reset (Intel SDM vol. 4, MSR_SMI_COUNT); 63:32 reserved
    return int.from_bytes(data, "little") & 0xFFFFFFFF


@collector("cpu.smi", counter=True)
def cpu_smi(host: Host, scope: Scope) -> dict[str, Any]:
    """``{"count": SMIs since reset, "cpu": 0, "no_msr": reason}``: no_msr set (and count
    None) when the CPU has no SMI counter, which is an answer, not a failure."""
    try:
        return {"count": read_smi_count(host), "cpu": 0}
    except SourceError as exc:
        if "has no MSR_SMI_COUNT" in str(exc):
            return {"count": None, "cpu": 0, "no_msr": str(exc)}
        raise
