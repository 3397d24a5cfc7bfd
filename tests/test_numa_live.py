"""`l2.numa.affinity` reads the memory policy in force from real processes started under
Debian's numactl on this kernel (/proc/PID/numa_maps), then judges it against a NIC on a
second NUMA node, which this one-node VM cannot have (so that part is constructed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.require import require
from tailgate.baseline import default_baseline
from tailgate.collect import Scope
from tailgate.host import Host
from tailgate.judge import judge
from tailgate.model import Fact, Snapshot
from tailgate.sources.process import gpus_held, pid_numa_maps, pid_status


@pytest.fixture
def under_numactl():
    """Start ``sleep`` under ``numactl ARGS`` (or plainly); yields the pid; always reaped."""
    require(None if shutil.which("numactl") else "numactl is not installed (Debian numactl)")
    procs = []

    def start(*args: str) -> int:
        argv = ["numactl", *args, "--", "sleep", "30"] if args else ["sleep", "30"]
        proc = subprocess.Popen(argv)
        procs.append(proc)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # numactl execs sleep: wait until it has
            try:
                if os.readlink(f"/proc/{proc.pid}/exe").endswith("/sleep"):
                    return proc.pid
            except OSError:
                pass
            time.sleep(0.01)
        pytest.fail(f"{argv} did not exec sleep within 5 s")

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=5)


def facts_of(pid: int) -> dict[str, Fact]:
    host, scope = Host("/"), Scope(pids=(pid,))
    return {k: v if isinstance(v, Fact) else Fact(value=v) for collector in (pid_status, pid_numa_maps)
            for k, v in collector(host, scope).items()}


def judged(pid: int, real: dict[str, Fact], nic_node: int) -> object:
    """The real process facts with a NIC on ``nic_node`` of a constructed 2-node host whose
    local CPUs are the process's own CPUs (so the CPUs are local: memory decides)."""
    cpus = real[f"proc.{pid}.status"].value["cpus_allowed"]
    nic = {"iface": "eth9", "virtual": False, "numa_node": nic_node, "local_cpus": cpus,
           "irqs": [], "irq_affinity": {}}
    status = dict(real[f"proc.{pid}.status"].value, mems_allowed=[0, 1])  # both nodes allowed
    snap = Snapshot(host={}, target={"pids": [pid]}, interval_s=0.0, taken_at=0.0, facts={
        **real, f"proc.{pid}.status": Fact(value=status), "nic": Fact(value=["eth9"]),
        "nic.eth9": Fact(value=nic), "numa.nodes": Fact(value=[0, 1])})
    (f,) = [f for f in judge(snap, default_baseline()) if f.id == "l2.numa.affinity"]
    return f


def test_membind_to_the_nics_node_passes_and_to_another_fails(under_numactl):
    pid = under_numactl("--membind=0")
    real = facts_of(pid)
    maps = real[f"proc.{pid}.numa_maps"].value
    assert set(maps["policies"]) == {"bind:0"}, maps["policies"]  # every mapping of the task
    assert set(maps["resident_bytes"]) == {"0"}
    f = judged(pid, real, nic_node=0)
    assert f.status == "pass" and "memory policy bind:0 allocates there" in f.reason
    f = judged(pid, real, nic_node=1)
    assert f.status == "fail" and "bind:0 may allocate on node(s) 0" in f.reason
    assert "numactl --membind=1" in f.remedy


def test_default_preferred_and_interleave_policies_as_the_kernel_prints_them(under_numactl):
    plain, preferred, interleaved = under_numactl(), under_numactl("--preferred=0"), \
        under_numactl("--interleave=all")
    assert set(facts_of(plain)[f"proc.{plain}.numa_maps"].value["policies"]) == {"default"}
    assert set(facts_of(preferred)[f"proc.{preferred}.numa_maps"].value["policies"]) == {"prefer:0"}
    assert set(facts_of(interleaved)[f"proc.{interleaved}.numa_maps"].value["policies"]) == \
        {"interleave:0"}
    # default: local allocation on CPUs that are local to the NIC
    assert judged(plain, facts_of(plain), nic_node=1).status == "pass"
    assert judged(preferred, facts_of(preferred), nic_node=1).status == "fail"


def test_an_exited_process_is_unknown_with_the_reason(under_numactl):
    pid = under_numactl("--membind=0")
    real = facts_of(pid)
    os.kill(pid, 9)  # a zombie until the fixture reaps it: it has no mappings left
    deadline = time.monotonic() + 5
    gone = pid_numa_maps(Host("/"), Scope(pids=(pid,)))[f"proc.{pid}.numa_maps"]
    while not isinstance(gone, Fact) and time.monotonic() < deadline:
        time.sleep(0.01)
        gone = pid_numa_maps(Host("/"), Scope(pids=(pid,)))[f"proc.{pid}.numa_maps"]
    assert isinstance(gone, Fact) and not gone.ok and f"pid {pid}" in gone.missing, gone
    f = judged(pid, {**real, f"proc.{pid}.numa_maps": gone}, nic_node=0)
    assert f.status == "unknown" and "memory policy is unknown" in f.reason


def test_gpus_held_open_resolve_to_pci_addresses(tmp_path):
    # A host root: pid 7 holds /dev/nvidia0 and an amdgpu render node, as /proc/PID/fd links.
    fd = tmp_path / "proc/7/fd"
    fd.mkdir(parents=True)
    for n, dev in ((3, "/dev/nvidia0"), (4, "/dev/dri/renderD128"), (5, "/dev/nvidiactl"),
                   (6, "/dev/dri/renderD129")):
        os.symlink(dev, fd / str(n))
    info = tmp_path / "proc/driver/nvidia/gpus/0000:c1:00.0"
    info.mkdir(parents=True)
    # the NVIDIA driver's information file (tab-separated, as in driver 535)
    (info / "information").write_text(
        "Model: \t\t Tesla V100-SXM2-16GB\nIRQ:   \t\t 84\nBus Type: \t PCIe\n"
        "Bus Location: \t 0000:c1:00.0\nDevice Minor: \t 0\nGPU Excluded:\t No\n")
    drm = tmp_path / "sys/class/drm/renderD128"
    drm.mkdir(parents=True)
    os.symlink("../../../0000:e1:00.0", drm / "device")
    assert gpus_held(Host(tmp_path), 7) == {"gpus": ["0000:c1:00.0", "0000:e1:00.0"],
                                            "unresolved": ["/dev/dri/renderD129"]}


def test_nic_and_gpu_locality_end_to_end_on_a_host_root(tmp_path):
    """`inspect --root` on the l1l3 fixture host made two-node: the NIC on node 0, the V100 on
    node 1, a service bound to node 0 (numa_maps as numactl --membind=0 leaves it) holding
    /dev/nvidia0 open."""
    root = tmp_path / "root"
    shutil.copytree(Path(__file__).parent / "fixtures" / "roots" / "l1l3-clean", root,
                    symlinks=True)

    def w(rel: str, text: str) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)

    w("sys/devices/system/node/online", "0-1\n")
    nic = "sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"
    gpu = "sys/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0"
    for dev, node, cpus in ((nic, 0, "0-1"), (gpu, 1, "2-3")):
        w(f"{dev}/numa_node", f"{node}\n")
        w(f"{dev}/local_cpulist", f"{cpus}\n")
    w("proc/4242/status", "Name:\tsvc\nState:\tS (sleeping)\nThreads:\t4\n"
      "Cpus_allowed_list:\t0-1\nMems_allowed_list:\t0-1\n")
    w("proc/4242/numa_maps",
      "55e906e31000 bind:0 file=/usr/bin/svc mapped=2 mapmax=2 N0=2 kernelpagesize_kB=4\n"
      "7f00c0000000 bind:0 anon=512 dirty=512 N0=512 kernelpagesize_kB=4\n")
    (root / "proc/4242/fd").mkdir()
    os.symlink("/dev/nvidia0", root / "proc/4242/fd/7")
    w("proc/driver/nvidia/gpus/0000:c1:00.0/information",
      "Model: \t\t Tesla V100-SXM2-16GB\nBus Location: \t 0000:c1:00.0\nDevice Minor: \t 0\n")
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--root", str(root),
                           "--pid", "4242", "--interval", "0", "--no-history", "--json", "-"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    found = {f["subject"]: f for f in json.loads(proc.stdout)["findings"]
             if f["id"] == "l2.numa.affinity"}
    assert found["pid 4242 / eth2"]["status"] == "pass"
    assert "memory policy bind:0 allocates there" in found["pid 4242 / eth2"]["reason"]
    g = found["pid 4242 / GPU 0000:c1:00.0"]
    assert g["status"] == "fail" and g["observed"] == "0-1" and "GPU's node 1" in g["reason"]
