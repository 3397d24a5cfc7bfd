"""`l1.pcie.link_downtrained` on host roots laid out as sysfs lays out PCIe: devices under
/sys/devices/pciDDDD:BB/<root port>/<switch up>/<switch down>/<device>, each linked from
/sys/bus/pci/devices/BDF, with the link attributes of drivers/pci/pci-sysfs.c."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tailgate.baseline import default_baseline
from tailgate.collect import Scope
from tailgate.host import Host
from tailgate.judge import judge
from tailgate.model import Fact, ParseError, Snapshot
from tailgate.sources.pci import parse_link_speed, parse_link_width, pci_devices, pci_links

# Linux >= 4.17 (PCIE_SPEED2STR) and before it (e.g. 4.9: "8 GT/s", "Unknown speed").
NEW = {"2.5": "2.5 GT/s PCIe", "8": "8.0 GT/s PCIe", "16": "16.0 GT/s PCIe",
       "32": "32.0 GT/s PCIe", "?": "Unknown"}
OLD = {"2.5": "2.5 GT/s", "8": "8 GT/s", "16": "16 GT/s", "?": "Unknown speed"}


@pytest.mark.parametrize(("text", "gts"), [
    ("32.0 GT/s PCIe\n", 32.0), ("16.0 GT/s PCIe", 16.0), ("2.5 GT/s PCIe", 2.5),
    ("64.0 GT/s PCIe", 64.0), ("8 GT/s\n", 8.0), ("5 GT/s", 5.0), ("Unknown", None),
    ("Unknown speed\n", None)])
def test_link_speed_formats(text, gts):
    assert parse_link_speed(text) == gts


def test_malformed_link_attributes_are_parse_errors():
    for bad in ("fast", "16.0 Gb/s", ""):
        with pytest.raises(ParseError, match="not a PCIe link speed"):
            parse_link_speed(bad)
    assert parse_link_width("16\n") == 16 and parse_link_width("0") == 0
    with pytest.raises(ParseError, match="not a PCIe link width"):
        parse_link_width("sixteen")


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def device(root: Path, path: str, cls: str, link: tuple | None, fmt=NEW, vendor="0x15b3") -> None:
    """One PCI device at sys/devices/<path>; link = (cur speed, cur width, max speed, max width)."""
    d = f"sys/devices/{path}"
    bdf = path.rsplit("/", 1)[1]
    _write(root, f"{d}/class", cls + "\n")
    _write(root, f"{d}/vendor", vendor + "\n")
    if link is not None:
        cs, cw, ms, mw = link
        for name, value in (("current_link_speed", fmt[cs]), ("current_link_width", cw),
                            ("max_link_speed", fmt[ms]), ("max_link_width", mw)):
            _write(root, f"{d}/{name}", f"{value}\n")
    target = root / "sys/bus/pci/devices" / bdf
    target.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../../devices/{path}", target)


RP = "pci0000:00/0000:00:01.0"
USP = f"{RP}/0000:01:00.0"
DSP1, DSP2 = f"{USP}/0000:02:08.0", f"{USP}/0000:02:10.0"
GPU, NIC = f"{DSP1}/0000:03:00.0", f"{DSP2}/0000:04:00.0"


def switch_host(root: Path, *, usp_now=("16", 16), nic_now=("16", 16), gpu_now=("16", 16),
                fmt=NEW) -> Host:
    """A Gen4 root port, a switch (upstream port, two downstream ports), a GPU and a NIC."""
    device(root, RP, "0x060400", (usp_now[0], usp_now[1], "16", 16), fmt)
    device(root, USP, "0x060400", (usp_now[0], usp_now[1], "16", 16), fmt)
    device(root, DSP1, "0x060400", (gpu_now[0], gpu_now[1], "16", 16), fmt)
    device(root, DSP2, "0x060400", (nic_now[0], nic_now[1], "16", 16), fmt)
    device(root, GPU, "0x030200", (gpu_now[0], gpu_now[1], "16", 16), fmt, vendor="0x10de")
    device(root, NIC, "0x020000", (nic_now[0], nic_now[1], "16", 16), fmt)
    return Host(root)


def findings(host: Host) -> dict[str, object]:
    scope = Scope()
    snap = Snapshot(host={}, target={}, interval_s=0.0, taken_at=0.0, facts={
        "pci.devices": Fact(value=pci_devices(host)), "pci.links": Fact(value=pci_links(host, scope))})
    return {f.subject: f for f in judge(snap, default_baseline()) if f.id == "l1.pcie.link_downtrained"}


@pytest.mark.parametrize("fmt", [NEW, OLD], ids=["linux>=4.17", "linux<4.17"])
def test_healthy_links_behind_a_switch_pass_and_the_shared_link_is_judged_once(tmp_path, fmt):
    found = findings(switch_host(tmp_path, fmt=fmt))
    assert {s: f.status for s, f in found.items()} == {
        "0000:03:00.0 gpu": "pass", "0000:01:00.0 port": "pass", "0000:04:00.0 nic": "pass"}
    assert found["0000:01:00.0 port"].evidence["link"] == "0000:00:01.0 -> 0000:01:00.0"


def test_a_downtrained_switch_uplink_fails_for_everything_behind_it(tmp_path):
    found = findings(switch_host(tmp_path, usp_now=("8", 16)))
    f = found["0000:01:00.0 port"]
    assert f.status == "fail" and f.observed == "8 GT/s x16"
    assert "capable of 16 GT/s x16" in f.reason and "upstream of 0000:03:00.0" in f.reason
    assert found["0000:04:00.0 nic"].status == "pass"


def test_fewer_lanes_fail_a_gpu_and_a_slow_idle_gpu_only_warns(tmp_path):
    found = findings(switch_host(tmp_path, gpu_now=("16", 8), nic_now=("8", 16)))
    assert found["0000:03:00.0 gpu"].status == "fail" and "fewer lanes" in found["0000:03:00.0 gpu"].reason
    assert found["0000:04:00.0 nic"].status == "fail"  # a NIC does not slow down by itself
    found = findings(switch_host(tmp_path / "b", gpu_now=("2.5", 16)))
    assert found["0000:03:00.0 gpu"].status == "warn" and "idle" in found["0000:03:00.0 gpu"].reason


def test_a_card_capped_by_its_slot_is_not_downtrained(tmp_path):
    device(tmp_path, RP, "0x060400", ("8", 16, "8", 16))  # a Gen3 slot
    device(tmp_path, f"{RP}/0000:05:00.0", "0x020000", ("8", 16, "16", 16))  # a Gen4 NIC in it
    (f,) = findings(Host(tmp_path)).values()
    assert f.status == "pass" and f.evidence["capable"] == "8 GT/s x16"


def test_a_link_without_speed_or_unparsable_is_unknown_never_pass(tmp_path):
    host = switch_host(tmp_path, nic_now=("?", 0))
    f = findings(host)["0000:04:00.0 nic"]
    assert f.status == "unknown" and "no negotiated speed" in f.reason
    (tmp_path / "sys/devices" / GPU / "max_link_speed").write_text("sixteen\n")
    found = findings(host)
    assert found["0000:03:00.0 gpu"].status == "unknown"
    assert "not a PCIe link speed: 'sixteen'" in found["0000:03:00.0 gpu"].reason


def test_conventional_pci_devices_are_skipped(tmp_path):
    device(tmp_path, "pci0000:00/0000:00:03.0", "0x020000", None, vendor="0x1af4")  # virtio
    (f,) = findings(Host(tmp_path)).values()
    assert f.status == "skip" and "no link attributes" in f.reason


def test_without_an_upper_end_full_own_maximum_passes_and_below_it_is_unknown(tmp_path):
    # two devices directly under the host bridge: no port above either in sysfs
    device(tmp_path, "pci0000:00/0000:00:02.0", "0x020000", ("16", 16, "16", 16))
    device(tmp_path, "pci0000:00/0000:00:03.0", "0x030200", ("8", 8, "16", 16), vendor="0x10de")
    found = findings(Host(tmp_path))
    nic, gpu = found["0000:00:02.0 nic"], found["0000:00:03.0 gpu"]
    # a link cannot train above its own device's maximum: at it, nothing is lost
    assert nic.status == "pass" and "no port above it" in nic.reason
    # below it, a narrower slot cannot be told from a downtrained link: never pass or fail
    assert gpu.status == "unknown" and "capping slot" in gpu.reason
