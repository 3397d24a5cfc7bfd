"""amdgpu's binary ``gpu_metrics`` (``/sys/bus/pci/devices/BDF/gpu_metrics``): the SMU's
throttle status and throttle residency counters, read by the table's own header.

The file is one C struct, ``gpu_metrics_vF_C`` of drivers/gpu/drm/amd/include/
kgd_pp_interface.h, copied out as the kernel laid it out (little-endian, natural alignment:
the layouts below are ``ctypes`` structures so the compiler's padding is the same). Its
header says which: ``structure_size`` (u16), ``format_revision`` (1: dGPU, 2: APU, 3: new
APUs) and ``content_revision``. Fields are only ever appended to a revision (1.6 grew
partition stats at its end in later kernels), so each layout here stops at the last field
read, and a table shorter than that, or a file shorter than its own ``structure_size``,
is refused.

What each revision says about throttling:

* 1.0-1.2 and 2.0-2.1: ``throttle_status``, the ASIC's own bits (their meaning differs per
  ASIC): 0 is "no throttler active"; any bit is a throttler whose kind is not named.
* 1.3 (MI100/MI200, Navi) and 2.2-2.4: also ``indep_throttle_status``, the ASIC-independent
  bits of amdgpu_smu.h (SMU_THROTTLER_*_BIT): power (PPT/SPL), current (TDC/EDC),
  temperature (TEMP_*, VRHOT, PROCHOT) and reliability (PPM, FIT).
* 1.4-1.5 (MI300 before residency counters): the driver writes 0 ("throttle status is not
  reported through metrics"): no throttle state at all.
* 1.6-1.8 (MI300): the firmware's accumulated throttler residencies (PROCHOT, PPT, socket,
  VR and HBM thermal) beside ``accumulation_counter``: the share of a window spent
  throttled is (residency growth) / (accumulation growth), as amd-smi's violation status.
* 1.9 (attribute list) and 3.0 are not read (APU-only, or self-describing): unknown.
"""

from __future__ import annotations

import ctypes
from typing import Any

from ..model import ParseError

# -- the kernel's layouts (fields up to the last one read) --------------------------------------

_u8, _u16, _u32, _u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64


class _Header(ctypes.LittleEndianStructure):
    _fields_ = [("structure_size", _u16), ("format_revision", _u8),
                ("content_revision", _u8)]


_HDR = [("common_header", _Header)]
_CLK7 = [(f"{k}_{c}", _u16) for k in ("average", "current")
         for c in ("gfxclk", "socclk", "uclk", "vclk0", "dclk0", "vclk1", "dclk1")]
_TEMPS6 = [(f"temperature_{t}", _u16) for t in ("edge", "hotspot", "mem", "vrgfx",
                                                  "vrsoc", "vrmem")]
_ACT3 = [("average_gfx_activity", _u16), ("average_umc_activity", _u16),
         ("average_mm_activity", _u16)]


class _V1_0(ctypes.LittleEndianStructure):
    # not naturally aligned in the kernel either: the u64 after the header is padded to 8
    _fields_ = _HDR + [("system_clock_counter", _u64)] + _TEMPS6 + _ACT3 + [
        ("average_socket_power", _u16), ("energy_accumulator", _u32)] + _CLK7 + [
        ("throttle_status", _u32)]


class _V1_1(ctypes.LittleEndianStructure):  # 1.1 and 1.2 (1.2 appends firmware_timestamp)
    _fields_ = _HDR + _TEMPS6 + _ACT3 + [
        ("average_socket_power", _u16), ("energy_accumulator", _u64),
        ("system_clock_counter", _u64)] + _CLK7 + [("throttle_status", _u32)]


class _V1_3(ctypes.LittleEndianStructure):
    _fields_ = _V1_1._fields_ + [
        ("current_fan_speed", _u16), ("pcie_link_width", _u16), ("pcie_link_speed", _u16),
        ("padding", _u16), ("gfx_activity_acc", _u32), ("mem_activity_acc", _u32),
        ("temperature_hbm", _u16 * 4), ("firmware_timestamp", _u64),
        ("voltage_soc", _u16), ("voltage_gfx", _u16), ("voltage_mem", _u16),
        ("padding1", _u16), ("indep_throttle_status", _u64)]


_MI300_HEAD = _HDR + [("temperature_hotspot", _u16), ("temperature_mem", _u16),
                      ("temperature_vrsoc", _u16), ("curr_socket_power", _u16),
                      ("average_gfx_activity", _u16), ("average_umc_activity", _u16)]
_RESIDENCY = [("accumulation_counter", _u32), ("prochot_residency_acc", _u32),
              ("ppt_residency_acc", _u32), ("socket_thm_residency_acc", _u32),
              ("vr_thm_residency_acc", _u32), ("hbm_thm_residency_acc", _u32)]


class _V1_4(ctypes.LittleEndianStructure):
    _fields_ = _MI300_HEAD + [("vcn_activity", _u16 * 4), ("energy_accumulator", _u64),
                              ("system_clock_counter", _u64), ("throttle_status", _u32)]


class _V1_5(ctypes.LittleEndianStructure):
    _fields_ = _MI300_HEAD + [("vcn_activity", _u16 * 4), ("jpeg_activity", _u16 * 32),
                              ("energy_accumulator", _u64), ("system_clock_counter", _u64),
                              ("throttle_status", _u32)]


class _V1_6(ctypes.LittleEndianStructure):
    _fields_ = _MI300_HEAD + [("vcn_activity", _u16 * 4), ("jpeg_activity", _u16 * 32),
                              ("energy_accumulator", _u64), ("system_clock_counter", _u64)
                              ] + _RESIDENCY


class _V1_7(ctypes.LittleEndianStructure):  # 1.7 and 1.8 (they differ after the residencies)
    _fields_ = _MI300_HEAD + [("mem_max_bandwidth", _u64), ("energy_accumulator", _u64),
                              ("system_clock_counter", _u64)] + _RESIDENCY


_APU_TEMPS = [("temperature_gfx", _u16), ("temperature_soc", _u16),
              ("temperature_core", _u16 * 8), ("temperature_l3", _u16 * 2),
              ("average_gfx_activity", _u16), ("average_mm_activity", _u16)]
_APU_POWER_CLOCKS = [("average_socket_power", _u16), ("average_cpu_power", _u16),
                     ("average_soc_power", _u16), ("average_gfx_power", _u16),
                     ("average_core_power", _u16 * 8)] + [
    (f"average_{c}_frequency", _u16) for c in ("gfxclk", "socclk", "uclk", "fclk", "vclk",
                                               "dclk")] + [
    (f"current_{c}", _u16) for c in ("gfxclk", "socclk", "uclk", "fclk", "vclk", "dclk")] + [
    ("current_coreclk", _u16 * 8), ("current_l3clk", _u16 * 2), ("throttle_status", _u32)]


class _V2_0(ctypes.LittleEndianStructure):
    _fields_ = _HDR + [("system_clock_counter", _u64)] + _APU_TEMPS + _APU_POWER_CLOCKS


class _V2_1(ctypes.LittleEndianStructure):
    _fields_ = _HDR + _APU_TEMPS + [("system_clock_counter", _u64)] + _APU_POWER_CLOCKS


class _V2_2(ctypes.LittleEndianStructure):  # 2.2 to 2.4
    _fields_ = _V2_1._fields_ + [("fan_pwm", _u16), ("padding", _u16 * 3),
                                 ("indep_throttle_status", _u64)]


# (format, content) -> (layout, what the revision says about throttling)
_LAYOUTS: dict[tuple[int, int], tuple[type[ctypes.Structure], str]] = {
    (1, 0): (_V1_0, "dependent"), (1, 1): (_V1_1, "dependent"), (1, 2): (_V1_1, "dependent"),
    (1, 3): (_V1_3, "independent"), (1, 4): (_V1_4, "none"), (1, 5): (_V1_5, "none"),
    (1, 6): (_V1_6, "residency"), (1, 7): (_V1_7, "residency"), (1, 8): (_V1_7, "residency"),
    (2, 0): (_V2_0, "dependent"), (2, 1): (_V2_1, "dependent"), (2, 2): (_V2_2, "independent"),
    (2, 3): (_V2_2, "independent"), (2, 4): (_V2_2, "independent"),
}
# The kernel caps a sysfs read at one page; a header claiming more is not this file.
MAX_SIZE = 4096

# -- the ASIC-independent throttler bits (amdgpu_smu.h SMU_THROTTLER_*_BIT) --------------------

# bit -> (name, kind). Kinds: "power" (package power tracking: the power limit doing its
# job), "current" (TDC/EDC: the board's current limit), "thermal" (a temperature, VR-hot
# or PROCHOT limit: the cooling), "reliability" (PPM/FIT: the silicon's lifetime limit).
THROTTLERS: dict[int, tuple[str, str]] = {
    0: ("PPT0", "power"), 1: ("PPT1", "power"), 2: ("PPT2", "power"), 3: ("PPT3", "power"),
    4: ("SPL", "power"), 5: ("FPPT", "power"), 6: ("SPPT", "power"), 7: ("SPPT_APU", "power"),
    16: ("TDC_GFX", "current"), 17: ("TDC_SOC", "current"), 18: ("TDC_MEM", "current"),
    19: ("TDC_VDD", "current"), 20: ("TDC_CVIP", "current"), 21: ("EDC_CPU", "current"),
    22: ("EDC_GFX", "current"), 23: ("APCC", "current"),
    32: ("TEMP_GPU", "thermal"), 33: ("TEMP_CORE", "thermal"), 34: ("TEMP_MEM", "thermal"),
    35: ("TEMP_EDGE", "thermal"), 36: ("TEMP_HOTSPOT", "thermal"), 37: ("TEMP_SOC", "thermal"),
    38: ("TEMP_VR_GFX", "thermal"), 39: ("TEMP_VR_SOC", "thermal"),
    40: ("TEMP_VR_MEM0", "thermal"), 41: ("TEMP_VR_MEM1", "thermal"),
    42: ("TEMP_LIQUID0", "thermal"), 43: ("TEMP_LIQUID1", "thermal"),
    44: ("VRHOT0", "thermal"), 45: ("VRHOT1", "thermal"),
    46: ("PROCHOT_CPU", "thermal"), 47: ("PROCHOT_GFX", "thermal"),
    56: ("PPM", "reliability"), 57: ("FIT", "reliability"),
}
# 1.6+ residency counters -> kind, as the bits above.
RESIDENCIES = {"prochot": "thermal", "ppt": "power", "socket_thermal": "thermal",
               "vr_thermal": "thermal", "hbm_thermal": "thermal"}
_NA16 = 0xFFFF  # the firmware's "not available" for a u16 field


def _temps(t: Any, rev: tuple[int, int]) -> dict[str, float]:
    names = ("edge", "hotspot", "mem") if rev[0] == 1 else ("gfx", "soc")
    out: dict[str, float] = {}
    for n in names:
        v = getattr(t, f"temperature_{n}", None)
        if v is None or v == _NA16:
            continue
        out[n] = v / 100.0 if rev == (2, 4) else float(v)  # 2.4 is in centi-Celsius
    return out


def parse_gpu_metrics(data: bytes, what: str = "gpu_metrics") -> dict[str, Any]:
    """``gpu_metrics`` bytes -> ``{"revision": "F.C", "size": n, "throttle": kind,
    "temperatures_c": {...}, ...}`` where kind is "dependent" (``throttle_status``),
    "independent" (also ``indep_throttle_status``: ``"active"`` names its set bits),
    "residency" (``residency``: the accumulated counters) or "none". A short file, an
    unknown revision or a header that does not fit the file is a :class:`ParseError`."""
    if len(data) < ctypes.sizeof(_Header):
        raise ParseError(f"{what}: {len(data)} bytes, shorter than the 4-byte table header")
    hdr = _Header.from_buffer_copy(data)
    rev = (hdr.format_revision, hdr.content_revision)
    name = f"{rev[0]}.{rev[1]}"
    if rev not in _LAYOUTS:
        raise ParseError(f"{what}: table revision {name} ({hdr.structure_size} bytes) is not "
                         "one tailgate reads (1.0-1.8, 2.0-2.4)")
    layout, kind = _LAYOUTS[rev]
    need = ctypes.sizeof(layout)
    if not need <= hdr.structure_size <= MAX_SIZE:
        raise ParseError(f"{what}: revision {name} says {hdr.structure_size} bytes; the "
                         f"kernel's layout of it has at least {need}: not a gpu_metrics table")
    if len(data) < hdr.structure_size:
        raise ParseError(f"{what}: {len(data)} bytes, short of the {hdr.structure_size} its "
                         f"header (revision {name}) says: a cut read")
    t = layout.from_buffer_copy(data)
    out: dict[str, Any] = {"revision": name, "size": hdr.structure_size, "throttle": kind,
                           "temperatures_c": _temps(t, rev)}
    gfx = getattr(t, "current_gfxclk", None)
    if isinstance(gfx, int) and gfx != _NA16:
        out["gfxclk_mhz"] = gfx
    if kind in ("dependent", "independent", "none") and hasattr(t, "throttle_status"):
        out["throttle_status"] = int(t.throttle_status)
    if kind == "independent":
        indep = int(t.indep_throttle_status)
        out["indep_throttle_status"] = indep
        out["active"] = {THROTTLERS.get(b, (f"bit{b}", "unknown"))[0]:
                         THROTTLERS.get(b, (f"bit{b}", "unknown"))[1]
                         for b in range(64) if indep >> b & 1}
    if kind == "residency":
        out["residency"] = {
            "accumulation": int(t.accumulation_counter),
            "prochot": int(t.prochot_residency_acc), "ppt": int(t.ppt_residency_acc),
            "socket_thermal": int(t.socket_thm_residency_acc),
            "vr_thermal": int(t.vr_thm_residency_acc),
            "hbm_thermal": int(t.hbm_thm_residency_acc)}
    return out
