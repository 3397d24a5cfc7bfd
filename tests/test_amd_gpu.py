"""AMD Instinct GPUs in the l1.gpu.* ids: amdgpu's RAS files in sysfs and rocm-smi.

Real captures (tests/fixtures/gpu): `rocm-smi --showrasinfo` of an MI50 host (per-block
table) and of a single GPU (the compact table), `rocm-smi --showbus` of a Frontier MI250X
node. The sysfs files are written in amdgpu's own format (amdgpu_ras_sysfs_read: "ue: N" /
"ce: N", "de: N" on UMC since Linux 6.10; gpu_vram_bad_pages "0x%08x : 0x%08x : %1s") with
the block set and counts of that real MI50 table; no AMD GPU exists here."""

from __future__ import annotations

from pathlib import Path

from tailgate.baseline import default_baseline
from tailgate.collect import Scope, collect
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.sources import gpu

FIX = Path(__file__).parent / "fixtures" / "gpu"
GPU_IDS = ("l1.gpu.xid", "l1.gpu.ecc", "l1.gpu.memory_repair", "l1.gpu.nvlink",
           "l1.gpu.clock_events")
BDF = "0000:c1:00.0"


def text(name: str) -> str:
    return (FIX / name).read_text().split("\n", 1)[1]


def judge(cid: str, s):
    return {f.subject: f for f in run_check(cid, checks()[cid], s, default_baseline().get(cid))}


def test_rocm_smi_ras_tables_both_layouts():
    mi50 = gpu.parse_rocm_smi_ras(text("rocm-smi-showrasinfo-mi50.txt"))
    g = mi50["0"]
    assert set(g["blocks"]) == {"umc", "sdma", "gfx", "mmhub", "pcie_bif", "hdp"}
    assert g["blocks"]["umc"] == {"ce": 0, "ue": 0}
    assert "xgmi_wafl" in g["disabled"] and "athub" in g["enabled"]  # status only, no count
    short = gpu.parse_rocm_smi_ras(text("rocm-smi-showrasinfo-short.txt"))
    assert short == {"0": {"blocks": {"umc": {"ce": 0, "ue": 0}}, "enabled": ["umc", "df"],
                           "disabled": []}}
    bus = gpu.parse_rocm_smi_bus(text("rocm-smi-showbus-frontier-mi250x.txt"))
    assert bus["0"] == BDF and bus["7"] == "0000:de:00.0" and len(bus) == 8


def instinct_root(tmp: Path, ras: bool = True, umc_ue: int = 0, bad_pages: str = "",
                  metrics: bytes | None = None, device: str = "0x7408", bdf: str = BDF) -> Path:
    dev = tmp / "sys/devices/pci0000:c0" / bdf
    dev.mkdir(parents=True)
    (dev / "class").write_text("0x038000\n")  # MI250X: display controller, other
    (dev / "vendor").write_text("0x1002\n")
    (dev / "device").write_text(f"{device}\n")  # 0x7408: Aldebaran [Instinct MI250X]
    if metrics is not None:
        (dev / "gpu_metrics").write_bytes(metrics)
    (dev / "pcie_replay_count").write_text("0\n")
    (tmp / "sys/bus/pci/drivers/amdgpu").mkdir(parents=True)
    (dev / "driver").symlink_to("../../../bus/pci/drivers/amdgpu")
    (tmp / "sys/bus/pci/devices").mkdir(parents=True)
    (tmp / "sys/bus/pci/devices" / bdf).symlink_to(f"../../../devices/pci0000:c0/{bdf}")
    if ras:  # the MI50 table's blocks, in amdgpu's file format
        (dev / "ras").mkdir()
        for block in ("sdma", "gfx", "mmhub", "pcie_bif", "hdp"):
            (dev / "ras" / f"{block}_err_count").write_text("ue: 0\nce: 0\n")
        (dev / "ras" / "umc_err_count").write_text(f"ue: {umc_ue}\nce: 0\nde: 0\n")
        (dev / "ras" / "gpu_vram_bad_pages").write_text(bad_pages)
    (tmp / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp / "proc/uptime").write_text("5000.00 100.00\n")
    (tmp / "proc/sys/kernel/random/boot_id").write_text("b1\n")
    cmds = tmp / "commands"
    cmds.mkdir()
    (cmds / "dmesg").write_text("")
    return tmp


def test_instinct_sysfs_ras_is_judged_in_every_gpu_id(tmp_path):
    before = collect(Host(str(instinct_root(tmp_path / "a"))), Scope(), 0.0)
    g = before.facts["gpu.health"].value["gpus"][BDF]
    assert g["source"] == "amdgpu sysfs (ras/)" and g["ecc_mode"] == "Enabled"
    assert g["ecc"]["volatile"] == {"dram_uncorrectable": 0, "dram_correctable": 0,
                                    "sram_uncorrectable": 0, "sram_correctable": 0}
    after = collect(Host(str(instinct_root(tmp_path / "b", umc_ue=2,
                                           bad_pages="0x00000001 : 0x00001000 : R\n"
                                           "0x00000002 : 0x00001000 : P\n"))), Scope(), 0.0)
    from dataclasses import replace
    s = replace(after, before=before.facts, interval_s=5.0)
    got = {cid: judge(cid, s)[f"{BDF} gpu"] for cid in GPU_IDS}
    assert got["l1.gpu.ecc"].status == "fail" and got["l1.gpu.ecc"].observed == 2
    rep = got["l1.gpu.memory_repair"]
    assert rep.status == "fail" and "pending" in rep.reason  # a page retired, one pending
    nv = got["l1.gpu.nvlink"]
    assert nv.status == "skip" and "xGMI" in nv.reason  # no xgmi_wafl, not in a hive
    ce = got["l1.gpu.clock_events"]  # no gpu_metrics file, no amd-smi: said, not passed
    assert ce.status == "unknown" and "gpu_metrics: absent; amd-smi: " in ce.reason


def test_an_instinct_without_ras_files_reads_rocm_smi_or_says_why(tmp_path):
    root = instinct_root(tmp_path, ras=False)
    s = collect(Host(str(root)), Scope(), 0.0)
    r = judge("l1.gpu.ecc", s)[f"{BDF} gpu"]
    # an Instinct has ECC HBM: ras/ missing is never "unsupported"
    assert r.status == "unknown" and "Instinct" in r.reason
    (root / "commands/rocm-smi_--showrasinfo_all").write_text(
        (FIX / "rocm-smi-showrasinfo-mi50.txt").read_text())
    (root / "commands/rocm-smi_--showbus").write_text(
        (FIX / "rocm-smi-showbus-frontier-mi250x.txt").read_text())
    s = collect(Host(str(root)), Scope(), 0.0)
    g = s.facts["gpu.health"].value["gpus"][BDF]
    assert g["source"] == "rocm-smi --showrasinfo all" and g["nvlink_read"] is True
    assert judge("l1.gpu.nvlink", s)[f"{BDF} gpu"].status == "skip"  # XGMI_WAFL DISABLED
    assert judge("l1.gpu.ecc", s)[f"{BDF} gpu"].status == "unknown"  # one sample: no window


# -- gpu_metrics: the binary throttle status ----------------------------------------------------
#
# No raw gpu_metrics file of a real GPU is published (tools print it decoded). The tables
# below are packed here, field by field, from the kernel's structs in
# drivers/gpu/drm/amd/include/kgd_pp_interface.h, with explicit little-endian formats that
# are independent of the parser's ctypes layouts. Revision 1.3 carries the values a Navi 31
# (RX 7900, Linux 6.8-rc6) printed decoded in libdrm-amdgpu-sys-rs issue #7 (its
# structure_size, 120, is the size these formats give); its throttle bits are that issue's
# finding (TEMP_HOTSPOT set even at idle; ROCm/rocm-systems#11781 saw the same on Navi 48).
# Every other number (MI300 residencies, temperatures of a hot GPU) is our own.

import struct  # noqa: E402

from tailgate.sources import amd_metrics  # noqa: E402

NAVI31 = "0x744c"  # Navi 31 [Radeon RX 7900 XT/XTX]
TEMP_HOTSPOT, TEMP_MEM, PPT0 = 1 << 36, 1 << 34, 1 << 0


def v1_3(dep: int = 0, indep: int = 0, hotspot: int = 41, mem: int = 57) -> bytes:
    head = struct.pack("<HBB", 120, 1, 3)
    body = struct.pack(
        "<6H3HHQQ14HI", 38, hotspot, mem, 38, 39, 39,   # temperatures (C)
        0, 1, 0, 10,                                   # activity (%), socket power (W)
        0, 2748118101619,                              # energy, system_clock_counter (ns)
        5, 0xFFFF, 29, 25, 25, 25, 25,                 # average clocks (MHz)
        5, 0xFFFF, 96, 25, 25, 25, 25,                 # current clocks (MHz)
        dep)                                           # throttle_status (ASIC bits)
    tail = struct.pack("<HHHHII4HQ3HHQ", 0, 16, 160, 0, 0, 0, 0, 0, 0, 0, 0,
                       0, 0, 0, 0, indep)
    return head + body + tail


def v1_6(acc: int, prochot: int = 0, ppt: int = 0, socket: int = 0, vr: int = 0,
         hbm: int = 0) -> bytes:
    """An MI300X table of revision 1.6 (384 bytes: the layout before partition stats)."""
    head = struct.pack("<HBB", 384, 1, 6)
    body = struct.pack("<3HH2H4H32HQQ6I", 62, 55, 48, 710, 100, 40, *[0] * 4, *[0] * 32,
                       0, 5_000_000_000, acc, prochot, ppt, socket, vr, hbm)
    # the struct ends padded to its 8-byte alignment (4x)
    rest = struct.pack("<II4HII5QII16QQ8H4H4H4HHH4x", 0, 0, 16, 320, 16, 32, 0, 0,
                       *[0] * 5, 0, 0, *[0] * 16, 0, *[2100] * 8, *[0] * 12, 1300, 0)
    return head + body + rest


def test_gpu_metrics_layouts_match_the_kernel_sizes():
    # 1.3's 120 bytes is the real capture's structure_size; 1.6 is the kernel's sizeof
    assert len(v1_3()) == 120 and len(v1_6(0)) == 384
    m = amd_metrics.parse_gpu_metrics(v1_3(dep=0x2, indep=TEMP_HOTSPOT))
    assert m["revision"] == "1.3" and m["temperatures_c"] == {"edge": 38, "hotspot": 41,
                                                             "mem": 57}
    assert m["gfxclk_mhz"] == 5 and m["throttle_status"] == 2
    assert m["active"] == {"TEMP_HOTSPOT": "thermal"}
    r = amd_metrics.parse_gpu_metrics(v1_6(1000, hbm=7))["residency"]
    assert r == {"accumulation": 1000, "prochot": 0, "ppt": 0, "socket_thermal": 0,
                 "vr_thermal": 0, "hbm_thermal": 7}


def clock(tmp: Path, metrics: bytes, device: str = NAVI31):
    s = collect(Host(str(instinct_root(tmp, ras=False, metrics=metrics, device=device))),
                Scope(), 0.0)
    return judge("l1.gpu.clock_events", s)[f"{BDF} gpu"]


def test_navi31_hotspot_bit_alone_warns_naming_the_firmware_quirk(tmp_path):
    r = clock(tmp_path, v1_3(dep=0x2, indep=TEMP_HOTSPOT))
    assert r.status == "warn" and "hotspot of 41 C" in r.reason and "3251" in r.reason
    assert r.evidence["active"] == ["TEMP_HOTSPOT"]


def test_a_thermal_throttler_active_now_fails_and_a_power_limit_warns(tmp_path):
    hot = clock(tmp_path / "hot", v1_3(dep=0x6, indep=TEMP_HOTSPOT | TEMP_MEM, hotspot=104,
                                       mem=98))
    assert hot.status == "fail" and "TEMP_HOTSPOT, TEMP_MEM" in hot.reason
    assert "(edge 38 C, hotspot 104 C, mem 98 C)" in hot.reason
    cap = clock(tmp_path / "cap", v1_3(dep=0x4000, indep=PPT0))
    assert cap.status == "warn" and "PPT0" in cap.reason
    idle = clock(tmp_path / "idle", v1_3())
    assert idle.status == "pass" and "1.3" in idle.reason


def test_an_asic_bit_without_its_independent_name_warns(tmp_path):
    r = clock(tmp_path, v1_3(dep=0x10, indep=0), device="0x7408")
    assert r.status == "warn" and "throttle_status 0x10" in r.reason


def test_mi300_residency_counters_are_judged_over_the_window(tmp_path):
    from dataclasses import replace

    def window(name: str, before: bytes, after: bytes):
        a = collect(Host(str(instinct_root(tmp_path / f"{name}a", metrics=before,
                                           device="0x74a1"))), Scope(), 0.0)
        b = collect(Host(str(instinct_root(tmp_path / f"{name}b", metrics=after,
                                           device="0x74a1"))), Scope(), 0.0)
        return judge("l1.gpu.clock_events", replace(b, before=a.facts, interval_s=5.0)), b

    got, one = window("hbm", v1_6(10_000, ppt=300, hbm=50), v1_6(11_000, ppt=300, hbm=100))
    r = got[f"{BDF} gpu"]  # 50 of 1000 firmware samples in HBM thermal throttling: 5 %
    assert r.status == "fail" and r.observed == 0.05 and "hbm_thermal 5.0%" in r.reason
    got, _ = window("ppt", v1_6(10_000, ppt=300), v1_6(11_000, ppt=400))
    assert got[f"{BDF} gpu"].status == "warn" and "10.0%" in got[f"{BDF} gpu"].reason
    got, _ = window("calm", v1_6(10_000, ppt=300), v1_6(11_000, ppt=310))
    assert got[f"{BDF} gpu"].status == "pass"  # 1 % in PPT: under power_cap_share (5 %)
    alone = judge("l1.gpu.clock_events", one)[f"{BDF} gpu"]
    assert alone.status == "unknown" and "no current state" in alone.reason


def test_a_cut_or_unknown_table_is_unknown_with_the_reason(tmp_path):
    cut = clock(tmp_path / "cut", v1_3()[:100])
    assert cut.status == "unknown" and "100 bytes, short of the 120" in cut.reason
    v19 = struct.pack("<HBB", 64, 1, 9) + bytes(60)  # the attribute-list revision
    new = clock(tmp_path / "v19", v19)
    assert new.status == "unknown" and "revision 1.9" in new.reason
    v14 = struct.pack("<HBB", 48, 1, 4) + bytes(44)  # MI300 before residency counters
    none = clock(tmp_path / "v14", v14, device="0x74a1")
    assert none.status == "unknown" and "carries no throttle status" in none.reason
    lying = struct.pack("<HBB", 16, 1, 3) + bytes(12)  # a 1.3 header that is 16 bytes
    r = clock(tmp_path / "lying", lying)
    assert r.status == "unknown" and "not a gpu_metrics table" in r.reason


# -- amd-smi: where amdgpu's sysfs files are missing ----------------------------------------
#
# Real captures (tests/fixtures/gpu, first line names the source): `amd-smi metric --json`
# and `amd-smi static --json` of a Navi 23 (RX 6600) on Proxmox (the older bare-list
# shape), and `amd-smi static --json` of an MI210 (the {"gpu_data": [...]} shape, its bus
# without bdf). No MI300 `metric --json` with throttle counters is published; its JSON below
# uses the key names amd-smi prints (the Navi capture's "throttle" keys) with the numbers
# of AMD's own `amd-smi metric --throttle` example (amdsmi CHANGELOG, ROCm 6.3: GPU 0,
# ACCUMULATION_COUNTER 1226415116, PPT_ACCUMULATED 12); the later reading is ours.

import json  # noqa: E402

from tailgate.sources import amd_smi  # noqa: E402

NAVI23 = "0000:0b:00.0"


def test_amd_smi_json_in_both_shapes():
    m = amd_smi.parse_amd_smi_metric(text("amd-smi-metric-navi23.json"))
    assert m == {"0": {"ecc_total": {"ce": 0, "ue": 0}, "throttled": False}}  # blocks N/A
    st = amd_smi.parse_amd_smi_static(text("amd-smi-static-navi23.json"))
    assert st == {"0": {"bdf": NAVI23, "ras_blocks": None}}  # ras N/A: no RAS on a Radeon
    mi210 = amd_smi.parse_amd_smi_static(text("amd-smi-static-mi210.json"))["0"]
    assert mi210["bdf"] is None and len(mi210["ras_blocks"]) == 19
    assert mi210["ras_blocks"]["umc"] is True and mi210["ras_blocks"]["xgmi_wafl"] is False


def test_a_radeon_without_its_sysfs_files_is_read_from_amd_smi(tmp_path):
    root = instinct_root(tmp_path, ras=False, device="0x73ff", bdf=NAVI23)
    s = collect(Host(str(root)), Scope(), 0.0)
    r = judge("l1.gpu.clock_events", s)[f"{NAVI23} gpu"]
    assert r.status == "unknown" and "gpu_metrics: absent; amd-smi: " in r.reason
    for cmd in ("metric", "static"):
        (root / f"commands/amd-smi_{cmd}_--json").write_text(
            text(f"amd-smi-{cmd}-navi23.json"))
    s = collect(Host(str(root)), Scope(), 0.0)
    r = judge("l1.gpu.clock_events", s)[f"{NAVI23} gpu"]
    assert r.status == "pass" and "amd-smi metric --json" in r.reason  # UNTHROTTLED
    ecc = judge("l1.gpu.ecc", s)[f"{NAVI23} gpu"]
    # amd-smi prints 0 ECC errors on this GDDR6 card too: RAS N/A says it has none to count
    assert ecc.status == "skip"


def mi300_json(acc: int, ppt: int, umc_ue: int) -> tuple[str, str]:
    throttle = {"accumulation_counter": acc, "prochot_accumulated": 0, "ppt_accumulated": ppt,
                "socket_thermal_accumulated": 0, "vr_thermal_accumulated": 0,
                "hbm_thermal_accumulated": 0}
    blocks = {b: {"correctable_count": 0, "uncorrectable_count": umc_ue if b == "UMC" else 0,
                  "deferred_count": 0} for b in ("UMC", "SDMA", "GFX", "MMHUB")}
    metric = {"gpu_data": [{"gpu": 0, "ecc": {"total_correctable_count": 0,
                                              "total_uncorrectable_count": umc_ue},
                            "ecc_blocks": blocks,
                            "power": {"throttle_status": "N/A"}, "throttle": throttle}]}
    static = {"gpu_data": [{"gpu": 0, "bus": {"bdf": BDF.upper()}, "ras": {
        "ecc_block_state": {"UMC": "ENABLED", "XGMI_WAFL": "ENABLED"}}}]}
    return json.dumps(metric), json.dumps(static)


def test_mi300_ecc_and_throttle_counters_from_amd_smi(tmp_path):
    from dataclasses import replace

    def reading(name: str, acc: int, ppt: int, umc_ue: int):
        root = instinct_root(tmp_path / name, ras=False, device="0x74a1")
        metric, static = mi300_json(acc, ppt, umc_ue)
        (root / "commands/amd-smi_metric_--json").write_text(metric)
        (root / "commands/amd-smi_static_--json").write_text(static)
        return collect(Host(str(root)), Scope(), 0.0)

    a = reading("a", 1226415116, 12, 0)
    g = a.facts["gpu.health"].value["gpus"][BDF]
    assert g["source"] == "amd-smi metric --json" and g["ecc_mode"] == "Enabled"
    assert g["throttle_residency"]["accumulation"] == 1226415116
    b = reading("b", 1226416116, 212, 1)  # 1000 samples later: 200 in PPT, one UMC UE
    s = replace(b, before=a.facts, interval_s=5.0)
    ecc = judge("l1.gpu.ecc", s)[f"{BDF} gpu"]
    assert ecc.status == "fail" and ecc.observed == 1
    ce = judge("l1.gpu.clock_events", s)[f"{BDF} gpu"]
    assert ce.status == "warn" and "20.0%" in ce.reason  # PPT over power_cap_share


def test_a_gpu_metrics_that_is_a_fifo_or_too_big_is_refused_not_read(tmp_path):
    import os

    root = instinct_root(tmp_path / "fifo")
    os.mkfifo(root / "sys/devices/pci0000:c0" / BDF / "gpu_metrics")
    s = collect(Host(str(root)), Scope(), 0.0)  # a FIFO would block a plain open: never opened
    r = judge("l1.gpu.clock_events", s)[f"{BDF} gpu"]
    assert r.status == "unknown" and "not a regular file" in r.reason
    big = clock(tmp_path / "big", v1_3() + bytes(amd_metrics.MAX_SIZE))
    assert big.status == "unknown" and "cap" in big.reason
