"""The platform rule: what the host is (bare metal, VM, container), read through Host, and the
hardware checks of L1 skipped on a virtual machine unless --platform or the baseline says so.

Roots: tests/fixtures/roots/vm-kvm (this project's KVM guest, see its README) and l1l3-clean
(a bare-metal host: the same cpuinfo without the `hypervisor` flag, L1L3-PROVENANCE.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.inspect import gate_code
from tailgate.baseline import catalog
from tailgate.host import Host
from tailgate.judge import VM_SKIP
from tailgate.model import SourceError
from tailgate.sources.platform import cpu_flags, describe, detect

ROOTS = Path(__file__).parent / "fixtures" / "roots"
CPUINFO = Path(__file__).parent / "fixtures" / "host" / "vm-proc-cpuinfo.txt"
PHYSICAL = [cid for cid, e in catalog().items() if e.physical]


def inspect(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--interval", "0",
                           "--no-history", "--json", "-", *args],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.stdout, proc.stderr
    rep = json.loads(proc.stdout)
    assert proc.returncode == gate_code(rep), proc.stderr  # the exit status the report decides
    return proc, rep


def by_id(report: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in report["findings"]:
        out.setdefault(f["id"], []).append(f)
    return out


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


# -- detection -------------------------------------------------------------------------------

# L1 checks a guest judges itself: a GPU passed through to a VM reports its own Xid, ECC,
# NVLink and clock events to the guest's driver, and PFC counters exist only where the guest
# has the port (an SR-IOV function); each skips where its device is absent.
GUEST_SEES = {"l1.gpu.xid", "l1.gpu.ecc", "l1.gpu.memory_repair", "l1.gpu.nvlink",
              "l1.gpu.clock_events", "l1.pfc.pause_storm", "l1.pfc.config"}


def test_every_l1_hardware_check_is_marked_physical():
    l1 = {cid for cid, e in catalog().items() if e.layer == "L1"}
    assert GUEST_SEES <= l1
    assert set(PHYSICAL) == l1 - GUEST_SEES
    assert not [cid for cid, e in catalog().items() if e.physical and e.layer != "L1"]


def test_the_kvm_guest_root_is_a_vm():
    p = detect(Host(ROOTS / "vm-kvm"))
    assert p["kind"] == "vm" and p["hypervisor"] == "kvm" and p["container"] is None
    assert "/proc/cpuinfo: the CPU has the 'hypervisor' flag" in p["signs"]
    assert describe(p) == "virtual machine (kvm)"


def test_the_bare_metal_root_is_bare_metal():
    p = detect(Host(ROOTS / "l1l3-clean"))
    assert p["kind"] == "baremetal" and p["hypervisor"] is None
    assert p["read"] == ["/proc/cpuinfo"]


def test_cpu_flags_reads_the_first_cpu():
    flags = cpu_flags(CPUINFO.read_text())
    assert "hypervisor" in flags and "avx2" in flags
    assert cpu_flags("processor : 0\nFeatures : fp asimd evtstrm\n") == {"fp", "asimd", "evtstrm"}


@pytest.mark.parametrize(("files", "kind", "hypervisor", "container"), [
    ({"/sys/class/dmi/id/sys_vendor": "QEMU\n",
      "/sys/class/dmi/id/product_name": "Standard PC (Q35 + ICH9, 2009)\n"}, "vm", "qemu", None),
    ({"/sys/class/dmi/id/sys_vendor": "Amazon EC2\n",
      "/sys/class/dmi/id/product_name": "m5.large\n"}, "vm", "amazon", None),
    ({"/sys/class/dmi/id/sys_vendor": "Amazon EC2\n",
      "/sys/class/dmi/id/product_name": "m5.metal\n"}, "baremetal", None, None),
    ({"/sys/class/dmi/id/sys_vendor": "Microsoft Corporation\n",
      "/sys/class/dmi/id/product_name": "Virtual Machine\n"}, "vm", "microsoft", None),
    ({"/sys/class/dmi/id/sys_vendor": "Dell Inc.\n",
      "/sys/class/dmi/id/product_name": "PowerEdge R750\n"}, "baremetal", None, None),
    ({"/sys/hypervisor/type": "xen\n"}, "vm", "xen", None),
    ({"/.dockerenv": ""}, "container", None, "docker"),
    ({"/run/.containerenv": ""}, "container", None, "podman"),
    ({"/run/systemd/container": "systemd-nspawn\n"}, "container", None, "systemd-nspawn"),
    ({"/proc/1/cgroup": "0::/kubepods/burstable/pod1234/abcd\n"}, "container", None, "kubernetes"),
])
def test_signs(tmp_path, files, kind, hypervisor, container):
    for rel, text in files.items():
        write(tmp_path, rel, text)
    p = detect(Host(tmp_path))
    assert (p["kind"], p["hypervisor"], p["container"]) == (kind, hypervisor, container), p


def test_a_container_in_a_vm_is_a_vm(tmp_path):
    write(tmp_path, "/proc/cpuinfo", CPUINFO.read_text())
    write(tmp_path, "/.dockerenv", "")
    p = detect(Host(tmp_path))
    assert (p["kind"], p["container"]) == ("vm", "docker")
    assert describe(p) == "virtual machine, in a container (docker)"


def test_nothing_readable_is_a_missing_fact_not_bare_metal(tmp_path):
    with pytest.raises(SourceError, match="cannot tell the platform"):
        detect(Host(tmp_path))


# -- the rule, end to end --------------------------------------------------------------------

def test_on_the_vm_root_every_hardware_check_is_skipped_with_the_reason():
    proc, rep = inspect("--root", str(ROOTS / "vm-kvm"))
    assert rep["platform"]["kind"] == "vm" and rep["platform"]["setting"] == "auto"
    assert rep["platform"]["detected"]["hypervisor"] == "kvm"
    found = by_id(rep)
    for cid in PHYSICAL:
        (f,) = found[cid]
        assert f["status"] == "skip" and f["reason"].startswith(VM_SKIP), f
    # what the check would say on bare metal stays in the evidence
    (ptp,) = found["l1.clock.ptp"]
    (would,) = ptp["evidence"]["on_bare_metal_this_check_says"]
    assert would["status"] == "fail" and "no interface timestamps in hardware" in would["reason"]
    assert rep["verdict"]["first_failing_layer"] != "L1"


def test_the_terminal_names_the_platform_and_never_says_fix_l1_on_the_vm_root():
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--root",
                           str(ROOTS / "vm-kvm"), "--interval", "0", "--no-history"],
                          capture_output=True, text=True, timeout=120)
    # the vm-kvm root fails at L2 (its io_uring and run-queue findings), never at L1
    assert proc.returncode == 1, proc.stderr
    assert "platform: virtual machine (kvm) (detected)" in proc.stdout
    assert "fix L1" not in proc.stdout


@pytest.mark.parametrize("how", ["flag", "baseline"])
def test_baremetal_setting_judges_the_hardware_checks_on_a_vm(tmp_path, how):
    if how == "flag":
        args = ["--platform", "baremetal"]
    else:
        (tmp_path / "b.yaml").write_text("platform: baremetal\n")
        args = ["--baseline", str(tmp_path / "b.yaml")]
    proc, rep = inspect("--root", str(ROOTS / "vm-kvm"), *args)
    assert rep["platform"]["kind"] == "baremetal" and rep["platform"]["setting"] == "baremetal"
    (ptp,) = by_id(rep)["l1.clock.ptp"]
    assert ptp["status"] == "fail" and proc.returncode == 1
    assert rep["verdict"]["first_failing_layer"] == "L1"


def test_bare_metal_root_keeps_failing_its_hardware_checks(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(ROOTS / "l1l3-clean", root, symlinks=True)
    shutil.copytree(ROOTS / "l1l3-pcie-downtrained", root, dirs_exist_ok=True)
    proc, rep = inspect("--root", str(root))
    assert rep["platform"]["kind"] == "baremetal"
    assert "fail" in {f["status"] for f in by_id(rep)["l1.pcie.link_downtrained"]}
    assert rep["verdict"]["first_failing_layer"] == "L1" and proc.returncode == 1
    # ... and --platform vm skips them there (what the user says the host is wins)
    proc, rep = inspect("--root", str(root), "--platform", "vm")
    assert [f["status"] for f in by_id(rep)["l1.pcie.link_downtrained"]] == ["skip"]
    assert rep["verdict"]["first_failing_layer"] != "L1"


def test_a_bad_platform_in_the_baseline_is_refused_with_file_line_and_key(tmp_path):
    (tmp_path / "b.yaml").write_text("l2.sched.runqlat: 300\nplatform: cloud\n")
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--baseline",
                           str(tmp_path / "b.yaml"), "--root", str(ROOTS / "vm-kvm")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"{tmp_path / 'b.yaml'}:2: key platform: expected one of auto, baremetal, vm, " \
           "container, got 'cloud'" in proc.stderr


def test_this_vm_live_does_not_send_the_user_to_l1():
    """This machine is a KVM guest: L1 is the hypervisor's, so the verdict must name a layer
    the user can act on (or none)."""
    proc, rep = inspect()
    if rep["platform"]["detected"]["kind"] != "vm":
        pytest.skip("not running on a virtual machine: "
                    + "; ".join(rep["platform"]["detected"]["signs"]))
    assert rep["verdict"]["first_failing_layer"] != "L1"
    assert {f["status"] for f in rep["findings"] if f["id"] in PHYSICAL} <= {"skip", "error"}
