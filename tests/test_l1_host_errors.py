"""The host's own hardware errors: memory ECC from EDAC (l1.memory.ecc) and SMIs from
MSR_SMI_COUNT (l1.firmware.smi).

EDAC: a real ghes_edac sysfs (tests/fixtures/host/edac-ghes-sysfs-counts.txt, the counts
and DIMM labels of a 2-node server after corrected errors; its zero counters were dropped
by the capture's own `sed`, so they are written back as 0). SMIs: this kernel has no
/dev/cpu/N/msr (the msr module is not loaded and modules cannot be loaded here), so the
live test decides from what this host has; the count itself is read from a fixture root
whose dev/cpu/0/msr is a file holding the MSR's 8 bytes at offset 0x34."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tailgate.baseline import catalog, default_baseline
from tailgate.collect import Scope, collect
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.model import Fact, Snapshot, SourceError
from tailgate.sources import hwerrors, kernel_log

FIX = Path(__file__).parent / "fixtures" / "host"


def snap(facts: dict, before: dict | None = None, interval: float = 10.0) -> Snapshot:
    def wrap(d):
        return {k: v if isinstance(v, Fact) else Fact(value=v) for k, v in (d or {}).items()}
    return Snapshot(host={"hostname": "t"}, target={}, interval_s=interval, taken_at=1000.0,
                    facts=wrap(facts), before=wrap(before))


def judge(cid: str, s: Snapshot):
    return run_check(cid, checks()[cid], s, default_baseline().get(cid))


def edac_root(tmp: Path, bump: dict[str, int] | None = None) -> Path:
    lines = (FIX / "edac-ghes-sysfs-counts.txt").read_text().splitlines()[1:]
    files = dict(line.split(":", 1) for line in lines if line.startswith("/sys/"))
    for mc in ("mc0", "mc1"):  # the capture dropped the zero counters: they exist, as 0
        files.setdefault(f"/sys/devices/system/edac/mc/{mc}/ue_count", "0")
        for d in range(8):
            files.setdefault(f"/sys/devices/system/edac/mc/{mc}/dimm{d}/dimm_ce_count", "0")
            files.setdefault(f"/sys/devices/system/edac/mc/{mc}/dimm{d}/dimm_ue_count", "0")
    for path, n in (bump or {}).items():
        files[path] = str(int(files[path]) + n)
    for path, value in files.items():
        p = tmp / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(value + "\n")
    return tmp


def test_edac_real_ghes_sysfs_per_dimm_with_labels(tmp_path):
    v = hwerrors.read_edac(Host(str(edac_root(tmp_path))))
    assert {mc: (m["ce"], m["ue"]) for mc, m in v["mcs"].items()} == {"mc0": (5, 0),
                                                                     "mc1": (4, 0)}
    assert v["mcs"]["mc1"]["dimms"]["mc1/dimm6"] == {"label": "N1 DIMM_O0", "ce": 2, "ue": 0}
    assert sum(d["ce"] for d in v["mcs"]["mc0"]["dimms"].values()) == 5
    # the kernel log's line of the same error is a corrected EDAC event
    line = (FIX / "edac-ghes-sysfs-counts.txt").read_text().splitlines()[-1]
    [e] = kernel_log.parse_kernel_log(line)
    assert e["kind"] == "edac_ce"


def test_edac_uncorrectable_growth_fails_naming_the_dimm_and_a_ce_storm_warns(tmp_path):
    before = hwerrors.read_edac(Host(str(edac_root(tmp_path / "a"))))
    ue = hwerrors.read_edac(Host(str(edac_root(tmp_path / "b", {
        "/sys/devices/system/edac/mc/mc1/ue_count": 1,
        "/sys/devices/system/edac/mc/mc1/dimm3/dimm_ue_count": 1}))))
    by = {r.subject: r for r in judge("l1.memory.ecc", snap({"host.edac": ue},
                                                           {"host.edac": before}))}
    assert by["mc1 memory"].status == "fail" and "mc1/dimm3 (N1 DIMM_L0)" in by["mc1 memory"].reason
    assert by["mc0 memory"].status == "pass"
    storm = hwerrors.read_edac(Host(str(edac_root(tmp_path / "c", {
        "/sys/devices/system/edac/mc/mc0/ce_count": 20,
        "/sys/devices/system/edac/mc/mc0/dimm6/dimm_ce_count": 20}))))
    by = {r.subject: r for r in judge("l1.memory.ecc", snap({"host.edac": storm},
                                                           {"host.edac": before}))}
    r = by["mc0 memory"]  # 20 in 10 s = 7200/h
    assert r.status == "warn" and "7200/h" in r.reason and "N0 DIMM_G0" in r.reason
    # uncorrectable errors since the driver loaded, nothing new: warn, as without a window
    by = {r.subject: r for r in judge("l1.memory.ecc", snap({"host.edac": ue},
                                                           {"host.edac": ue}))}
    assert by["mc1 memory"].status == "warn" and "since the EDAC driver loaded" in \
        by["mc1 memory"].reason
    r = {r.subject: r for r in judge("l1.memory.ecc", snap({"host.edac": ue}))}["mc1 memory"]
    assert r.status == "warn"


def test_edac_and_smi_on_this_host_say_what_the_host_has():
    s = collect(Host("/"), Scope(), 0.0)
    edac, smi = s.facts["host.edac"], s.facts["cpu.smi"]
    if not os.path.isdir("/sys/devices/system/edac/mc"):
        assert not edac.ok and "/sys/devices/system/edac/mc: absent" in edac.missing
    else:
        assert edac.ok or "no memory controller" in edac.missing
    if not os.path.exists("/dev/cpu/0/msr"):
        assert not smi.ok and "modprobe msr" in smi.missing
        [r] = run_check("l1.firmware.smi", checks()["l1.firmware.smi"], s,
                        default_baseline().get("l1.firmware.smi"))
        assert r.status == "unknown" and "modprobe msr" in r.reason
    else:
        assert smi.ok and (smi.value["count"] is not None or "no MSR_SMI_COUNT"
                           in smi.value["no_msr"]), smi


def msr_root(tmp: Path, count: int) -> Host:
    d = tmp / "dev/cpu/0"
    d.mkdir(parents=True, exist_ok=True)
    data = bytearray(0x40)
    data[0x34:0x3C] = (count | 0xABCD << 32).to_bytes(8, "little")  # reserved bits 63:32
    (d / "msr").write_bytes(bytes(data))
    return Host(str(tmp))


def test_smi_count_growth_per_second(tmp_path):
    assert hwerrors.read_smi_count(msr_root(tmp_path / "a", 1234)) == 1234
    a = {"count": 1234, "cpu": 0}
    r = judge("l1.firmware.smi", snap({"cpu.smi": {"count": 1244, "cpu": 0}}, {"cpu.smi": a}))[0]
    assert (r.status, r.observed) == ("fail", 1.0) and "10 SMI(s)" in r.reason
    r = judge("l1.firmware.smi", snap({"cpu.smi": {"count": 1234, "cpu": 0}}, {"cpu.smi": a}))[0]
    assert r.status == "pass" and r.observed == 0
    r = judge("l1.firmware.smi", snap({"cpu.smi": a}))[0]
    assert r.status == "unknown" and "1234 SMIs since reset" in r.reason


def test_a_cpu_without_the_msr_is_a_skip_with_the_reason(tmp_path, monkeypatch):
    # rdmsr of an MSR the CPU lacks faults and the msr driver returns EIO: an AMD CPU or a
    # virtual one. No such CPU here, so the fault is raised where the read happens.
    host = msr_root(tmp_path, 0)

    def eio(fd, n, off):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(os, "pread", eio)
    v = hwerrors.cpu_smi(host, Scope())
    assert v["count"] is None and "no MSR_SMI_COUNT" in v["no_msr"]
    r = judge("l1.firmware.smi", snap({"cpu.smi": v}))[0]
    assert r.status == "skip" and "no MSR_SMI_COUNT" in r.reason
    monkeypatch.undo()
    short = tmp_path / "short/dev/cpu/0"
    short.mkdir(parents=True)
    (short / "msr").write_bytes(b"\0" * 8)
    with pytest.raises(SourceError, match="0 bytes at offset 0x34"):
        hwerrors.read_smi_count(Host(str(tmp_path / "short")))


def test_catalog_and_explain_cover_the_two_new_red_lines():
    import subprocess
    import sys

    for cid in ("l1.memory.ecc", "l1.firmware.smi"):
        e = catalog()[cid]
        assert e.layer == "L1" and e.rationale and e.remedy and e.measure
        out = subprocess.run([sys.executable, "-m", "tailgate", "explain", cid],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "how it is measured" in out.stdout
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert "| `l1.memory.ecc` | L1 |" in readme and "| `l1.firmware.smi` | L1 |" in readme


# -- the kernel log where sysfs has no counters ------------------------------------------------

def events_fact(log: str, uptime: float) -> dict:
    return {"source": "dmesg", "uptime_s": uptime, "boot_id": "b1",
            "events": [e for e in kernel_log.parse_kernel_log(log)
                       if e["kind"] in kernel_log.HOST_KINDS]}


def test_memory_errors_from_the_kernel_log_without_edac():
    log = (FIX / "edac-ghes-sysfs-counts.txt").read_text().splitlines()[-1]  # a real CE line
    ue = log.replace("1 CE ghes_mc", "1 UE ghes_mc")
    missing = Fact(missing="/sys/devices/system/edac/mc: absent")
    s = snap({"host.edac": missing, "kernel.events": events_fact(f"[  100.5] {ue}", 101.0)},
             {"host.edac": missing, "kernel.events": events_fact("", 91.0)})
    [r] = judge("l1.memory.ecc", s)
    assert r.status == "fail" and "uncorrectable memory error" in r.reason
    s = snap({"host.edac": missing, "kernel.events": events_fact(f"[  100.5] {log}", 101.0)},
             {"host.edac": missing, "kernel.events": events_fact("", 91.0)})
    [r] = judge("l1.memory.ecc", s)  # a corrected line only: the log cannot measure, unknown
    assert r.status == "unknown" and "not a measurement" in r.reason


def test_aer_from_the_kernel_log_where_sysfs_has_no_aer_files():
    # a kernel before 4.19 (no aer_dev_* files) still logs the error: the real ath10k capture
    log = (FIX / "aer-dmesg-uncorrected-nonfatal.txt").read_text().split("\n", 1)[1]
    devices = {"0000:01:00.0": {"kind": "nic", "driver": "ath10k_pci", "upstream": ["0000:00:00.0"]},
               "0000:00:00.0": {"kind": "upstream", "serves": ["0000:01:00.0"], "upstream": []}}
    aer = {"counters": {}, "errors": {}}
    s = snap({"pci.devices": devices, "pci.aer_uncorrectable": aer,
              "kernel.events": events_fact(log, 50.0)},
             {"kernel.events": events_fact("", 40.0)})
    r = {x.subject: x for x in judge("l1.pcie.aer_uncorrectable", s)}
    f = r["0000:01:00.0 nic ath10k_pci"]
    assert f.status == "fail" and "uncorrected AER error(s) in the kernel log" in f.reason
    # the same log before the window: nothing new, and no counters: unknown, never pass
    s = snap({"pci.devices": devices, "pci.aer_uncorrectable": aer,
              "kernel.events": events_fact(log, 60.0)},
             {"kernel.events": events_fact(log, 50.0)})
    [only] = judge("l1.pcie.aer_uncorrectable", s)
    assert only.status == "unknown"
