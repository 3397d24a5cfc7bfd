"""`inspect --root` on a host root built from the VM captures: the L2 verdicts, diffed
against checked-in expectations (node_exporter's end-to-end style), then broken on purpose."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.inspect import gate_code

ROOT = Path(__file__).parent / "fixtures" / "roots" / "vm-l2"
EXPECTED = {  # id -> (status, subject); L2 only, the other layers belong to other tests
    "l2.sched.runqlat": ("unknown", "host"),
    "l2.cgroup.throttling": ("skip", "host"),
    "l2.numa.affinity": ("skip", "host"),
    "l2.irq.isolation": ("skip", "host"),
    # BBR built into this VM's kernel, no /lib/modules and no modinfo capture: which BBR
    # cannot be told, and only BBRv3 passes
    "l2.net.congestion_control": ("unknown", "default"),
    "l2.net.drop_rate": ("unknown", "host"),
    "l2.net.retransmit_rate": ("unknown", "host"),
    "l2.net.syscall_batching": ("unknown", "host"),
    "l2.io.io_uring": ("skip", "host"),
    "l2.tcp.moderate_rcvbuf": ("pass", "net.ipv4.tcp_moderate_rcvbuf"),
    "l2.tcp.rcvbuf_lock": ("unknown", "host"),
    "l2.tcp.mem_sizing": ("pass", "tcp_mem"),
}


def inspect_root(root: Path) -> dict[str, dict]:
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--root", str(root),
                           "--interval", "0", "--no-history", "--json", "-"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.stdout, proc.stderr
    rep = json.loads(proc.stdout)
    assert proc.returncode == gate_code(rep), proc.stderr  # the exit status the report decides
    return {f["id"]: f for f in rep["findings"] if f["layer"] == "L2"}


def test_vm_root_matches_expectations():
    got = inspect_root(ROOT)
    assert {k: (f["status"], f["subject"]) for k, f in got.items()} == EXPECTED
    assert got["l2.tcp.mem_sizing"]["observed"] == pytest.approx(100 * 575802 * 4096 / (24634428 * 1024),
                                                                 abs=0.01)
    assert "two samples" in got["l2.net.drop_rate"]["reason"]
    cc = got["l2.net.congestion_control"]["reason"]
    assert "which BBR is unknown" in cc and "modules.builtin.modinfo: absent" in cc


@pytest.fixture
def root(tmp_path) -> Path:
    dst = tmp_path / "root"
    shutil.copytree(ROOT, dst)
    return dst


def test_broken_knobs_fail_their_ids(root):
    sys_ipv4 = root / "proc" / "sys" / "net" / "ipv4"
    (sys_ipv4 / "tcp_congestion_control").write_text("cubic\n")
    (sys_ipv4 / "tcp_moderate_rcvbuf").write_text("0\n")
    (sys_ipv4 / "tcp_mem").write_text("3000000\t4000000\t4500000\n")  # ~17 GiB of 23.5
    got = inspect_root(root)
    assert got["l2.net.congestion_control"]["status"] == "fail"
    assert got["l2.net.congestion_control"]["observed"] == "cubic"
    assert got["l2.tcp.moderate_rcvbuf"]["status"] == "fail"
    assert got["l2.tcp.mem_sizing"]["status"] == "fail"


def test_unreadable_sources_are_unknown_never_pass(root):
    (root / "proc" / "sys" / "net" / "ipv4" / "tcp_mem").unlink()
    (root / "proc" / "sys" / "net" / "ipv4" / "tcp_congestion_control").write_text("")
    (root / "proc" / "net" / "snmp").write_text("Ip: Forwarding\nIp: x\n")
    got = inspect_root(root)
    assert got["l2.tcp.mem_sizing"]["status"] == "unknown"
    assert "tcp_mem: absent" in got["l2.tcp.mem_sizing"]["reason"]
    assert got["l2.net.retransmit_rate"]["status"] == "unknown"
    assert got["l2.net.congestion_control"]["status"] == "unknown"
