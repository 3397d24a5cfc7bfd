"""End to end from the CLI: `tailgate inspect --root FIXTURE --state DIR` twice, with counters
grown (or a module or key changed) between the runs; each change fails its own id only.

Fixture roots (tests/fixtures/roots/l1l3-*, see PROVENANCE.md there): `l1l3-clean` is a host
with an mlx5 NIC (eth2) behind a PCIe port, an NVIDIA and an AMD GPU behind theirs, PTP locked
at 3 ns; each other root holds only the files a scenario changes, copied over the clean one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.inspect import gate_code

ROOTS = Path(__file__).parent / "fixtures" / "roots"
OURS = ("l1.fec.uncorrectable", "l1.optics.rx_power", "l1.pcie.bad_tlp", "l1.pcie.link_recovery",
        "l1.pcie.link_downtrained", "l1.clock.ptp", "l3.rss.symmetric", "l3.xps.per_core_tx",
        "l3.queue.aqm")


def inspect(root: Path, state: Path, *extra: str) -> tuple[int, dict[str, list[dict]]]:
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--root", str(root),
                           "--state", str(state), "--interval", "0", "--json", "-", *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    rep = json.loads(proc.stdout)
    assert proc.returncode == gate_code(rep), proc.stderr  # the exit status the report decides
    by_id: dict[str, list[dict]] = {}
    for f in rep["findings"]:
        by_id.setdefault(f["id"], []).append(f)
    return proc.returncode, by_id


def statuses(found: dict[str, list[dict]], check_id: str) -> dict[str, str]:
    return {f["subject"]: f["status"] for f in found[check_id]}


@pytest.fixture
def host(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(ROOTS / "l1l3-clean", root, symlinks=True)
    return root, tmp_path / "state"


def second_run(root: Path, state: Path, scenario: str | None):
    inspect(root, state)
    time.sleep(0.6)  # the history window must be longer than history.MIN_WINDOW_S
    if scenario:
        shutil.copytree(ROOTS / f"l1l3-{scenario}", root, dirs_exist_ok=True)
    return inspect(root, state)


def test_clean_root_passes_on_the_second_run(host):
    root, state = host
    _, first = inspect(root, state)
    # First run, --interval 0, empty history: counters have no window yet. Unknown, not pass.
    assert statuses(first, "l1.fec.uncorrectable") == {"eth2": "unknown"}
    assert "no earlier run" in first["l1.fec.uncorrectable"][0]["reason"]
    assert set(statuses(first, "l1.pcie.bad_tlp").values()) == {"unknown"}
    time.sleep(0.6)
    _, found = inspect(root, state)
    for cid in OURS:
        assert set(statuses(found, cid).values()) == {"pass"}, (cid, found[cid])
    assert found["l1.cable.copper_in_rack"][0]["status"] == "skip"  # optics, not marked in-rack
    fec = found["l1.fec.uncorrectable"][0]
    assert fec["observed"] == 0.0 and fec["evidence"]["window"].endswith("since the last stored run")
    assert fec["evidence"]["window_s"] >= 0.5
    assert found["l1.pcie.bad_tlp"][0]["evidence"]["since_boot"]["BadTLP"] == 0
    assert found["l1.clock.ptp"][0]["observed"] == 3
    assert found["l3.queue.aqm"][0]["evidence"]["rings"]["current"]["TX"] == 1024
    stand_ins = {f["subject"]: f["evidence"]["stand_ins"] for f in found["l1.pcie.link_recovery"]}
    assert any("NVML" in s or "nvidia-smi" in s for s in stand_ins["0000:c1:00.0 gpu nvidia"])
    assert any("pcie_replay_count" in s for s in stand_ins["0000:e1:00.0 gpu amdgpu"])
    assert any("pci_signal_integrity" in s for s in stand_ins["0000:81:00.0 nic mlx5_core"])


def only_failures(found: dict[str, list[dict]]) -> dict[str, set[str]]:
    return {cid: {f["subject"] for f in found[cid] if f["status"] == "fail"}
            for cid in OURS if any(f["status"] == "fail" for f in found[cid])}


def test_fec_uncorrectable_growth_fails_and_escalates(host):
    rc, found = second_run(*host, "fec-grown")
    assert rc == 1 and only_failures(found) == {"l1.fec.uncorrectable": {"eth2"}}
    f = found["l1.fec.uncorrectable"][0]
    assert f["evidence"]["grown"] == 45 and f["evidence"]["total"] == 190
    assert f["observed"] > 10 and "Isolate the port" in f["remedy"]


def test_fec_counter_reset_starts_a_new_window_instead_of_failing(host):
    root, state = host
    _, found = second_run(root, state, "fec-reset")
    f = found["l1.fec.uncorrectable"][0]
    assert f["status"] == "unknown" and "went backwards" in f["reason"]
    time.sleep(0.6)
    _, found = inspect(root, state)
    assert found["l1.fec.uncorrectable"][0]["status"] == "pass"


def test_aer_bad_tlp_growth_fails_the_nic(host):
    rc, found = second_run(*host, "badtlp-grown")
    assert rc == 1 and only_failures(found) == {"l1.pcie.bad_tlp": {"0000:81:00.0 nic mlx5_core"}}
    f = [f for f in found["l1.pcie.bad_tlp"] if f["status"] == "fail"][0]
    assert f["observed"] == 2 and f["evidence"]["since_boot"]["BadTLP"] == 2


def test_replay_counters_growth_fails_link_recovery(host):
    rc, found = second_run(*host, "replay-grown")
    assert rc == 1 and only_failures(found) == {"l1.pcie.link_recovery": {
        "0000:c1:00.0 gpu nvidia", "0000:e1:00.0 gpu amdgpu", "0000:81:00.0 nic mlx5_core"}}
    observed = {f["subject"]: f["observed"] for f in found["l1.pcie.link_recovery"]}
    assert observed["0000:c1:00.0 gpu nvidia"] == 5
    assert observed["0000:e1:00.0 gpu amdgpu"] == 3
    assert observed["0000:81:00.0 nic mlx5_core"] == 7  # tx_pci_signal_integrity 2 -> 9


def test_downtrained_pcie_links(host):
    root, state = host
    _, found = inspect(root, state)
    links = {f["subject"]: f for f in found["l1.pcie.link_downtrained"]}
    assert {s: f["status"] for s, f in links.items()} == {
        "0000:81:00.0 nic": "pass", "0000:c1:00.0 gpu": "pass", "0000:e1:00.0 gpu": "pass"}
    # the V100 (Gen3) in a Gen4 slot is capped by itself, not downtrained
    assert links["0000:c1:00.0 gpu"]["evidence"]["capable"] == "8 GT/s x16"
    shutil.copytree(ROOTS / "l1l3-pcie-downtrained", root, dirs_exist_ok=True)
    rc, found = inspect(root, state)
    assert rc == 1 and only_failures(found) == {"l1.pcie.link_downtrained": {"0000:81:00.0 nic"}}
    links = {f["subject"]: f for f in found["l1.pcie.link_downtrained"]}
    nic = links["0000:81:00.0 nic"]
    assert nic["observed"] == "16 GT/s x8" and "capable of 16 GT/s x16" in nic["reason"]
    assert "2x fewer lanes" in nic["reason"]
    gpu = links["0000:e1:00.0 gpu"]  # a GPU slows its link when idle: recheck under load
    assert gpu["status"] == "warn" and "idle" in gpu["reason"] and gpu["observed"] == "2.5 GT/s x16"


def test_rx_power_below_minus_10_dbm_fails(host):
    rc, found = second_run(*host, "rx-low")
    assert rc == 1 and only_failures(found) == {"l1.optics.rx_power": {"eth2"}}
    f = found["l1.optics.rx_power"][0]
    assert f["observed"] == -12.5 and "lane 3" in f["reason"]


def test_asymmetric_rss_key_fails(host):
    rc, found = second_run(*host, "rss-asym")
    assert rc == 1 and only_failures(found) == {"l3.rss.symmetric": {"eth2"}}
    f = found["l3.rss.symmetric"][0]
    assert f["evidence"]["key"].startswith("60566639")
    ex = f["evidence"]["layouts"]["ipv4+ports"]["counterexample"]
    assert ex["hash"] != ex["reverse_hash"]


def test_in_rack_baseline_marks_the_optical_link(host, tmp_path):
    root, state = host
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text("l1.cable.copper_in_rack: {in_rack: [eth2]}\n")
    _, found = inspect(root, state, "--baseline", str(baseline))
    f = found["l1.cable.copper_in_rack"][0]
    assert f["status"] == "warn" and "marked in-rack" in f["reason"]


def _live_hardware() -> tuple[set[str], set[str], set[str]]:
    """What this host has, read from its own sysfs: the interfaces backed by a virtual NIC
    (no FEC, no module EEPROM), the PCI devices with AER, those with PCIe link files."""
    import glob

    virtual = set()
    for dev in glob.glob("/sys/class/net/*/device/driver"):
        if os.path.basename(os.path.realpath(dev)).startswith(("virtio", "vmxnet", "ena",
                                                                "hv_", "xen")):
            virtual.add(dev.split("/")[4])
    aer = {p.split("/")[-2] for p in glob.glob("/sys/bus/pci/devices/*/aer_dev_correctable")}
    link = {p.split("/")[-2] for p in glob.glob("/sys/bus/pci/devices/*/current_link_speed")}
    return virtual, aer, link


def test_this_host_never_passes_on_missing_hardware(tmp_path):
    # The live host as it is: on this VM, virtio eth0 has no FEC, no module EEPROM, no AER;
    # on bare metal the same rule holds for whatever it lacks.
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--state", str(tmp_path),
                           "--interval", "0", "--platform", "baremetal", "--json", "-"],
                          capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    assert proc.returncode == gate_code(report), proc.stderr  # what the host's state decides
    virtual, aer, link = _live_hardware()
    found = {}
    for f in report["findings"]:
        found.setdefault(f["id"], []).append(f)
    for cid in ("l1.fec.uncorrectable", "l1.optics.rx_power", "l1.cable.copper_in_rack"):
        for f in found[cid]:
            assert f["reason"], (cid, f)
            if (f["subject"] or "") in virtual:
                assert f["status"] in ("skip", "unknown"), (cid, f)
    for cid, has in (("l1.pcie.bad_tlp", aer), ("l1.pcie.link_recovery", aer | link),
                     ("l1.pcie.link_downtrained", link)):
        for f in found[cid]:
            bdf = (f["subject"] or "").split(" ")[0]
            assert f["reason"], (cid, f)
            if bdf not in has:
                assert f["status"] in ("skip", "unknown"), (cid, f)
