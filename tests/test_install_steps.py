"""The Makefile's install steps really run on a fresh machine (issue 9).

`dpkg` and `apt-get` shims first on PATH: the shim dpkg reports every package missing, the shim
apt-get records what it is asked for. A green CI on a machine where packages were installed by
hand can no longer hide a missing install step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# What each README command needs from Debian, and who needs it.
RUN_NEEDS = {
    "python3": "a minimal Debian has no Python (tests/test_fresh_root.py)",
    "python3-venv": "venv's pip bootstrap, which Debian splits out of python3",
    "python3-dev": "Python.h for the compiled hot path (bench/fastloop.c) with Debian's python3",
    "gcc": "builds the compiled hot path, which make run requires",
    "libc6-dev": "the C library's headers for that build",
    "ethtool": "NIC statistics, FEC, module EEPROM, RSS (sources/ethtool.py)",
    "iproute2": "ss, tc (sources/sockets.py, sources/qdisc.py)",
    "bpftrace": "the probes and inspect --probe-window (probes/driver.py)",
}
TEST_NEEDS = {
    **RUN_NEEDS,
    "nginx-light": "the real HTTP server of the bench tests (tests/support/nginx.py)",
    "wrk": "the closed-loop peer in benchmarks/bench_http.py",
    "prometheus-node-exporter": "the peer in benchmarks/bench_inspect.py",
    "debootstrap": "the fresh Debian 12 root of tests/test_fresh_root.py",
    "systemd": "systemd-analyze verify for the shipped unit (tests/test_fleet_serve_web.py)",
    "g++": "the llama-cpp-python source build",
    "cmake": "the llama-cpp-python source build",
    "liburing-dev": "tests/support/uring_ring.c (liburing.h)",
    "numactl": "the live l2.numa.affinity tests (tests/test_numa_live.py)",
    "prometheus": "promtool and the real Prometheus of tests/test_fleet_prometheus.py",
    "chromium": "the headless browser of tests/test_html_browser.py",
    "openmpi-bin": "mpirun for tailgate bench allreduce --backend mpi",
    "libopenmpi-dev": "mpicc and the headers mpi4py builds against",
    "dpdk-dev": "dpdk-testpmd for tests/test_dpdk_live.py",
    "musl-tools": "musl-gcc for the allocator tests (tests/test_alloc_live.py)",
    "libjemalloc-dev": "a jemalloc-linked workload (tests/test_alloc_live.py)",
    "libgoogle-perftools-dev": "a tcmalloc-linked workload (tests/test_alloc_live.py)",
    "libmimalloc-dev": "a mimalloc-linked workload (tests/test_alloc_live.py)",
    "golang-go": "a Go workload (runtime.mallocgc) for tests/test_alloc_live.py",
}


@pytest.fixture
def shims(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "calls.log"
    for name, body in {
        "dpkg": "exit 1",  # every package missing
        "apt-get": f'echo "apt-get $*" >> {log}',
        "mountpoint": "exit 1",  # tracefs not mounted, as on a fresh VM
        "mount": f'echo "mount $*" >> {log}',
    }.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    return env, log


def requested(log: Path) -> set[str]:
    installs = [line.split()[1:] for line in log.read_text().splitlines()
                if line.startswith("apt-get") and " install" in line]
    assert installs, "apt-get install was never called"
    return {w for args in installs for w in args if not w.startswith("-") and w != "install"}


@pytest.mark.parametrize(("target", "needs"), [("apt-run", RUN_NEEDS), ("apt-test", TEST_NEEDS)])
def test_install_target_requests_every_package(shims, target, needs):
    env, log = shims
    proc = subprocess.run(["make", "-C", str(REPO), "--no-print-directory", target], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    assert any(c.startswith("apt-get update") for c in calls), "apt-get update runs first"
    missing = set(needs) - requested(log)
    assert not missing, {p: needs[p] for p in missing}


def test_nothing_is_installed_when_everything_is_present(tmp_path):
    # The real dpkg: on this machine (CI installed it all) nothing is requested again.
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "apt-get").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/apt.log\n")
    (bin_ / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    proc = subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "apt-test"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "apt.log").exists(), proc.stdout


@pytest.mark.parametrize("target", ["run", "test"])
def test_readme_commands_mount_tracefs_and_install(shims, target, tmp_path):
    env, log = shims
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    dry = subprocess.run(["make", "-n", target], cwd=clone, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    # A fresh clone: the venv is made and the package installed, apt runs, tracefs is mounted.
    assert "-m venv .venv" in dry and "pip install" in dry
    # from Debian's own interpreter (what a Debian user runs), never the python3 PATH finds
    # first; PYTHON= chooses another
    assert "/usr/bin/python3 -m venv .venv" in dry, dry
    other = subprocess.run(["make", "-n", target, "PYTHON=/opt/py/bin/python3"], cwd=clone,
                           env=env, capture_output=True, text=True, timeout=60, check=False)
    assert "/opt/py/bin/python3 -m venv .venv" in other.stdout, other.stdout + other.stderr
    assert "apt-get update" in dry and "mount -t tracefs" in dry
    subprocess.run(["make", "--no-print-directory", "tracefs"], cwd=clone, env=env, check=True,
                   capture_output=True, timeout=60)
    assert "mount -t tracefs nodev /sys/kernel/tracing" in log.read_text()


def test_make_run_uses_a_probe_window_as_root_with_bpftrace(shims, tmp_path):
    env, _ = shims
    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        pytest.fail("needs root and bpftrace (make test installs bpftrace; CI runs as root)")
    # A stand-in venv whose `tailgate` records its arguments: what `make run` really runs.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name, body in {"python": "exit 0", "tailgate": f'echo "$*" > {tmp_path}/args; exit 1'}.items():
        (venv / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (venv / "bin" / name).chmod(0o755)
    (venv / ".installed-run").touch()
    proc = subprocess.run(["make", "--no-print-directory", "run", f"VENV={venv}"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, "exit 1 (a red line crossed) is a result: " + proc.stderr
    args = (tmp_path / "args").read_text().split()
    assert args[:3] == ["inspect", "--probe-window", "3"], args
    assert args[-2:] == ["--json", "report.json"]
