"""The PCI tree is the GPU inventory, and the kernel log is read beyond Xid lines.

Real published kernel logs (tests/fixtures/gpu, each naming its source on its first line):
a GPU that fell off the bus with no Xid (NVSentinel #155, 570.158.01), one the driver could
not initialise (RmInitAdapter failed), the old driver's "GPU at BDF has fallen off the bus",
a journal in the plain short format (no year), and this VM's own dmesg in both timestamp
formats. Every GPU of a fixture root is a subject of every l1.gpu.* id."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tailgate.baseline import default_baseline
from tailgate.collect import Scope, collect
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.sources import gpu, kernel_log

FIX = Path(__file__).parent / "fixtures"
GPU_IDS = ("l1.gpu.xid", "l1.gpu.ecc", "l1.gpu.memory_repair", "l1.gpu.nvlink",
           "l1.gpu.clock_events")


def text(rel: str) -> str:
    return (FIX / rel).read_text()


def judge(check_id: str, s):
    return run_check(check_id, checks()[check_id], s, default_baseline().get(check_id))


# -- the kernel log's message classes ------------------------------------------------------------

def test_fallen_off_the_bus_without_xid_joins_the_three_line_notice():
    ev = gpu.parse_xid(text("gpu/dmesg-nvrm-fallen-off-no-xid-570.158.01.txt"))
    assert [(e["kind"], e["bdf"], e["t_s"]) for e in ev] == [
        ("nvrm_fell_off_bus", "0000:b3:00.0", 1843.308145),
        ("nvrm_init_failed", None, 1843.439662)]  # "probe routine failed": names no GPU
    assert "fallen off the bus and is not responding" in ev[0]["text"]


def test_rminitadapter_failed_and_the_old_gpu_at_form():
    ev = gpu.parse_xid(text("gpu/dmesg-nvrm-rminitadapter-failed.txt"))
    # "osInitNvMapping failed, bailing out of RmInitAdapter" is the cause's detail, not one
    assert {(e["kind"], e["bdf"]) for e in ev} == {("nvrm_init_failed", "0000:01:00.0")}
    assert len([e for e in ev if e["bdf"]]) == 4  # two tries, two lines each
    old = gpu.parse_xid(text("gpu/dmesg-nvrm-gpu-at-fallen-off-old.txt"))
    assert [(e["kind"], e["bdf"]) for e in old] == [("nvrm_fell_off_bus", "0000:01:00.0")] * 2


def test_iso_stamps_become_seconds_since_boot_through_btime():
    btime = kernel_log.parse_btime(text("host/vm-proc-stat-btime.txt"))
    iso = kernel_log.records(text("host/vm-dmesg-iso.txt").split("\n", 1)[1], )
    mono = kernel_log.records(text("host/vm-dmesg-mono.txt").split("\n", 1)[1])
    assert len(iso) == len(mono) == 11
    for (_, epoch, msg_i), (t, _, msg_m) in zip(iso, mono, strict=True):
        assert msg_i == msg_m
        assert epoch is not None and t is not None
        assert abs((epoch - btime) - t) < 1.0  # btime is whole seconds
    # the same Xid line under an ISO stamp gets a time, under the journal's short one none
    line = "NVRM: Xid (PCI:0000:01:00): 79, pid=8828, GPU has fallen off the bus."
    stamp = text("host/vm-dmesg-iso.txt").splitlines()[-1].split(" ", 1)[0]
    [e] = gpu.parse_xid(f"{stamp} {line}", btime)
    assert e["t_s"] is not None and 0 <= e["t_s"] < 10
    [e] = gpu.parse_xid(f"{stamp} {line}")  # no btime: untimed, never a guess
    assert e["t_s"] is None


def test_journal_short_format_keeps_events_without_a_time():
    ev = gpu.parse_xid(text("gpu/journalctl-k-short-xid-nixos.txt"))
    assert [(e["code"], e["t_s"]) for e in ev] == [(16, None), (8, None), (32, None)]


def test_aer_and_machine_check_lines():
    ev = kernel_log.parse_kernel_log(text("host/aer-dmesg-correctable.txt"))
    assert ev and all(e["kind"] == "aer_corrected" for e in ev)
    assert ev[0]["bdf"] == "0000:00:01.0"
    # the detail line right after "error message received" is the same error, not another
    assert len(ev) == len([x for x in text("host/aer-dmesg-correctable.txt").splitlines()
                           if "error message received" in x]) == 3
    # CONFIG_PRINTK_CALLER stamps, as an igb report on linux-netdev prints them (index id
    # 19597195560): the caller alone has no time, after a time it is skipped
    line = ("[  T292] pcieport 0000:00:1c.5: AER: Uncorrected (Non-Fatal) error received: "
            "0000:09:00.0")
    [e] = kernel_log.parse_kernel_log(line)
    assert (e["kind"], e["bdf"], e["t_s"]) == ("aer_uncorrected", "0000:09:00.0", None)
    [e] = kernel_log.parse_kernel_log("[  200.105524]" + line)
    assert e["t_s"] == 200.105524 and e["text"].startswith("pcieport")


# -- a GPU on the bus that its driver does not answer for -----------------------------------------

def two_gpu_root(tmp: Path, dmesg: str, smi: str | None = None) -> Path:
    """A root with two NVIDIA GPUs bound to nvidia; nvidia-smi -q reports only the first."""
    for bdf in ("0000:19:00.0", "0000:b3:00.0"):
        dev = tmp / "sys/devices/pci0000:00" / bdf
        dev.mkdir(parents=True)
        (dev / "class").write_text("0x030200\n")
        (dev / "vendor").write_text("0x10de\n")
        (tmp / "sys/bus/pci/drivers/nvidia").mkdir(parents=True, exist_ok=True)
        (dev / "driver").symlink_to("../../../bus/pci/drivers/nvidia")
        (tmp / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
        (tmp / "sys/bus/pci/devices" / bdf).symlink_to(f"../../../devices/pci0000:00/{bdf}")
    (tmp / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp / "proc/uptime").write_text("1900.00 100.00\n")
    (tmp / "proc/sys/kernel/random/boot_id").write_text("b1\n")
    (tmp / "proc/sys/kernel/hostname").write_text("gpu-node\n")
    cmds = tmp / "commands"
    cmds.mkdir()
    (cmds / "nvidia-smi_-q").write_text(smi or text("gpu/nvidia-smi-q-545.23.08-h100.txt"))
    (cmds / "dmesg").write_text(dmesg)
    (cmds / "nvidia-smi_nvlink_-e").write_text("")  # real: nothing where no GPU has NVLink
    (cmds / "nvidia-smi_nvlink_-s").write_text("")
    return tmp


def test_gpu_fallen_off_without_xid_fails_xid_and_is_a_subject_of_every_id(tmp_path):
    root = two_gpu_root(tmp_path, text("gpu/dmesg-nvrm-fallen-off-no-xid-570.158.01.txt"))
    s = collect(Host(str(root)), Scope(), 0.6)
    by = {cid: {f.subject: f for f in judge(cid, s)} for cid in GPU_IDS}
    for cid in GPU_IDS:
        assert set(by[cid]) == {"0000:19:00.0 gpu", "0000:b3:00.0 gpu"}, (cid, by[cid])
    gone = by["l1.gpu.xid"]["0000:b3:00.0 gpu"]
    assert gone.status == "fail" and "on the bus but not answering its driver" in gone.reason
    assert "fell off the bus" in gone.reason and "nvidia-smi -q does not report it" in gone.reason
    assert by["l1.gpu.xid"]["0000:19:00.0 gpu"].status == "pass"
    for cid in GPU_IDS[1:]:
        f = by[cid]["0000:b3:00.0 gpu"]
        assert f.status == "unknown" and "does not report it" in f.reason, cid
    # empty `nvidia-smi nvlink -e`: no links, a known skip, not an unreadable source
    nv = by["l1.gpu.nvlink"]["0000:19:00.0 gpu"]
    assert nv.status == "skip" and "reports none" in nv.reason


def test_gpu_missing_with_a_quiet_log_is_unknown_never_pass(tmp_path):
    root = two_gpu_root(tmp_path, text("host/vm-dmesg-mono.txt"))
    s = collect(Host(str(root)), Scope(), 0.6)
    [f] = [f for f in judge("l1.gpu.xid", s) if f.subject == "0000:b3:00.0 gpu"]
    assert f.status == "unknown" and "says nothing of it" in f.reason


def test_init_failure_naming_no_gpu_is_the_one_gpu_missing(tmp_path):
    log = "[   21.5] NVRM: RmInitAdapter failed! (0x26:0xffff:1299)\n" + \
        text("gpu/dmesg-nvrm-rminitadapter-failed.txt").split("\n", 1)[1].replace(
            "NVRM: GPU 0000:01:00.0: ", "NVRM: ")
    root = two_gpu_root(tmp_path, log)
    s = collect(Host(str(root)), Scope(), 0.6)
    [f] = [f for f in judge("l1.gpu.xid", s) if f.subject == "0000:b3:00.0 gpu"]
    assert f.status == "fail" and "failed to initialise" in f.reason


def test_a_capture_that_ends_early_is_unknown_for_the_gpus_it_does_not_cover(tmp_path):
    # a real nvidia-smi -q excerpt: "Attached GPUs : 8", one GPU section
    smi = text("host/nvidia-smi-q-pcie.txt").replace("00000000:00:04.0", "00000000:19:00.0")
    root = two_gpu_root(tmp_path, text("host/vm-dmesg-mono.txt"), smi)
    s = collect(Host(str(root)), Scope(), 0.6)
    for cid in GPU_IDS[1:]:
        [f] = [f for f in judge(cid, s) if f.subject == "0000:b3:00.0 gpu"]
        assert f.status == "unknown" and "ends early" in f.reason and "8" in f.reason, cid


def test_kernel_log_from_the_journal_where_dmesg_is_refused(tmp_path):
    root = two_gpu_root(tmp_path, "")
    (root / "commands/dmesg").unlink()
    (root / "commands/journalctl_-k_-b_-o_short-monotonic_--no-pager_-q").write_text(
        text("gpu/dmesg-nvrm-fallen-off-no-xid-570.158.01.txt"))
    s = collect(Host(str(root)), Scope(), 0.6)
    assert s.facts["gpu.xid"].value["source"] == "journalctl -k"
    [f] = [f for f in judge("l1.gpu.xid", s) if f.subject == "0000:b3:00.0 gpu"]
    assert f.status == "fail" and "journalctl -k" in f.reason


# -- every fixture root: no PCI subject silently absent -------------------------------------------

def fixture_roots(tmp: Path) -> list[Path]:
    base = FIX / "roots"
    out = []
    for d in sorted(base.iterdir()):
        if not d.is_dir():
            continue
        if d.name.startswith("l1l3-") and d.name != "l1l3-clean":
            dest = tmp / d.name  # a scenario overlay over the clean root, as its tests use it
            shutil.copytree(base / "l1l3-clean", dest, symlinks=True)
            shutil.copytree(d, dest, symlinks=True, dirs_exist_ok=True)
            out.append(dest)
        else:
            out.append(d)
    return out


PCI_IDS = ("l1.pcie.bad_tlp", "l1.pcie.aer_uncorrectable", "l1.pcie.link_recovery",
           "l1.pcie.link_downtrained")


@pytest.mark.parametrize("name", [d.name for d in sorted((FIX / "roots").iterdir()) if d.is_dir()])
def test_no_pci_subject_is_missing_from_the_report(tmp_path, name):
    from tailgate.judge import judge as judge_all
    from tailgate.judge import resolve_platform
    from tailgate.sources.pci import pci_devices

    [root] = [r for r in fixture_roots(tmp_path) if r.name == name]
    host = Host(str(root))
    devices = pci_devices(host) if (root / "sys/bus/pci/devices").is_dir() else {}
    s = collect(host, Scope(), 0.0)
    found = judge_all(s, default_baseline(), resolve_platform(s, "baremetal"))
    said: dict[str, str] = {}
    for f in found:
        said[f.id] = said.get(f.id, "") + f" {f.subject or ''} {f.reason}"
    judged = {b: e for b, e in devices.items() if e.get("kind") in ("nic", "gpu", "accelerator")}
    for bdf, e in judged.items():
        for cid in PCI_IDS:
            assert bdf in said[cid], (name, cid, bdf, said[cid][:300])
        if e.get("vendor") in ("0x10de", "0x1002"):
            for cid in GPU_IDS:
                assert f"{bdf} gpu" in said[cid], (name, cid, bdf, said[cid][:300])
    assert not [f for f in found if f.status == "error"], name
    # no "None" ever printed where a value was missing
    assert not [(f.id, f.subject, f.reason) for f in found
                if "None" in f"{f.subject or ''} {f.reason or ''}"], name


# -- DCGM exporter: one bad sample, the rest read; reasons that name the source given ----------

def test_dcgm_one_bad_sample_is_refused_alone_and_named():
    real = text("gpu/dcgm-exporter-580.105.08-l4.prom")
    # an unrelated sample whose value is the exporter's own error text, as a scrape can carry
    bad = real + ('DCGM_FI_DEV_VGPU_LICENSE_STATUS{gpu="0",pci_bus_id="00000000:31:00.0"} '
                  "Error: field not supported\n")
    samples, refused = gpu.dcgm_samples(bad)
    assert len(refused) == 1 and "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in next(iter(refused))
    whole, _ = gpu.dcgm_samples(real)
    assert len(samples) == len(whole)  # every valid sample read
    assert gpu.parse_dcgm(samples) == gpu.parse_dcgm(whole)


def test_dcgm_reasons_name_the_url_given(tmp_path):
    import json
    import subprocess
    import sys

    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/hostname").write_text("dcgm-node\n")
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    scrape = tmp_path / "other.prom"  # a real scrape with no DCGM health field (vLLM's)
    scrape.write_text(text("llm/vllm_0.32.0_cpu_metrics_real.prom"))
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--root", str(tmp_path),
                           "--interval", "0", "--no-history", "--dcgm", str(scrape), "--json",
                           "-"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr  # unknowns, no failure: the gate passes
    got = {f["id"]: f for f in json.loads(proc.stdout)["findings"] if f["id"] in GPU_IDS}
    for cid in GPU_IDS[1:]:
        f = got[cid]
        assert f["status"] == "unknown" and f"--dcgm {scrape}" in f["reason"], (cid, f)
        assert "no --dcgm URL" not in f["reason"]
    # and a root with no PCI data at all prints no "None" in its header
    out = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--root", str(tmp_path),
                          "--interval", "0", "--no-history"], capture_output=True, text=True,
                         timeout=120).stdout
    assert "None" not in out and "kernel unknown (" in out
