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


def instinct_root(tmp: Path, ras: bool = True, umc_ue: int = 0, bad_pages: str = "") -> Path:
    dev = tmp / "sys/devices/pci0000:c0" / BDF
    dev.mkdir(parents=True)
    (dev / "class").write_text("0x038000\n")  # MI250X: display controller, other
    (dev / "vendor").write_text("0x1002\n")
    (dev / "device").write_text("0x7408\n")  # Aldebaran [Instinct MI250X]
    (dev / "pcie_replay_count").write_text("0\n")
    (tmp / "sys/bus/pci/drivers/amdgpu").mkdir(parents=True)
    (dev / "driver").symlink_to("../../../bus/pci/drivers/amdgpu")
    (tmp / "sys/bus/pci/devices").mkdir(parents=True)
    (tmp / "sys/bus/pci/devices" / BDF).symlink_to(f"../../../devices/pci0000:c0/{BDF}")
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
    ce = got["l1.gpu.clock_events"]
    assert ce.status == "unknown" and "gpu_metrics" in ce.reason


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
