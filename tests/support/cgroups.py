"""A cpu cgroup child the test creates and always removes: in the cgroup v1 cpu hierarchy
where the host has one (MACHINE.md: /sys/fs/cgroup/cpu on our machines), else in the cgroup
v2 hierarchy with the cpu controller enabled (a v2-only host). `set_quota` writes the quota
in either (cpu.cfs_quota_us / cpu.max)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

CPU_V1 = Path("/sys/fs/cgroup/cpu")


def _cpu_root() -> Path:
    """The root of the hierarchy that holds the cpu controller: v1's, else v2's."""
    if CPU_V1.is_dir():
        return CPU_V1
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            root = Path(parts[1])
            if "cpu" in (root / "cgroup.controllers").read_text().split():
                if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
                    (root / "cgroup.subtree_control").write_text("+cpu")
                return root
    pytest.fail("no cpu controller: neither cgroup v1's /sys/fs/cgroup/cpu nor a cgroup2 mount "
                "offering cpu (MACHINE.md: v1 cpu is present on our machines)")


def set_quota(cg: Path, quota_us: int | None, period_us: int = 100_000) -> None:
    """The CPU quota of ``cg`` (None: no limit) in whichever cgroup version it is."""
    if (cg / "cpu.cfs_quota_us").exists():
        (cg / "cpu.cfs_period_us").write_text(str(period_us))
        (cg / "cpu.cfs_quota_us").write_text(str(-1 if quota_us is None else quota_us))
    else:
        (cg / "cpu.max").write_text(f"{'max' if quota_us is None else quota_us} {period_us}")


@contextlib.contextmanager
def cpu_cgroup(quota_us: int | None = None, period_us: int = 100_000) -> Iterator[Path]:
    """A fresh child of the cpu hierarchy; its tasks go back to the root before it is removed."""
    if os.geteuid() != 0:
        pytest.fail("needs root to make a cpu cgroup (make test and CI run as root)")
    root = _cpu_root()
    cg = root / f"tailgate-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        set_quota(cg, quota_us, period_us)
        yield cg
    finally:
        with contextlib.suppress(OSError):
            for pid in (cg / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (root / "cgroup.procs").write_text(pid)
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _period_us(cg: Path) -> int:
    v1 = cg / "cpu.cfs_period_us"
    return int(v1.read_text()) if v1.exists() else int((cg / "cpu.max").read_text().split()[1])


HALF_PERIOD_US = 500_000  # the period of `spent_quota`; its quota is half of it


@contextlib.contextmanager
def spent_quota(cg: Path, cpu: int = 1, seconds: int = 90,
                quota_us: int = HALF_PERIOD_US // 2) -> Iterator[None]:
    """A quota of half of each 500 ms period on ``cg`` (made with ``period_us=HALF_PERIOD_US``)
    and a busy loop on ``cpu`` inside it that spends it in the first half, so the whole cgroup
    is throttled for the second. A request to a service in ``cg`` that lands in a throttled half
    waits for the next period, up to 250 ms: P99 about 245 ms on any machine, with no
    calibration of the service's CPU per request (one that a VM's steal time skewed in CI left
    the service unthrottled). The service's own demand is a few per cent of its share, so
    nothing queues beyond that. The quota and the loop go on leaving (the loop ends by itself
    after ``seconds``). A cgroup made with another period gives half of it as ``quota_us``."""
    import subprocess

    set_quota(cg, quota_us, _period_us(cg))  # the period the cgroup was made with
    p = subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c",
                          f"end=$(($(date +%s)+{seconds})); while [ $(date +%s) -lt $end ]; do :; done"])
    try:
        (cg / "cgroup.procs").write_text(str(p.pid))
        yield
    finally:
        p.kill()
        p.wait()
        set_quota(cg, None, HALF_PERIOD_US)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throttling_load(pid: int, url: str, share: float = 0.7, period_us: int = 100_000,
                    seconds: float = 2.0) -> tuple[int, int]:
    """``(rate, quota_us)`` at which the service ``pid`` behind ``url`` needs about
    1/``share`` of its CPU quota per period: throttled, and at the default share usually
    saturated (the diagnose scenarios need throttling, not a bound on it). A calibration that
    steal time skews can leave the service unthrottled; a test that needs a sure SLO miss uses
    `spent_quota` instead.

    Calibrated on this machine: a short unthrottled run measures the service's CPU time per
    request (it varies with the machine), then the rate is raised until the demand per period
    clears cgroup v1's smallest quota (1 ms) with room to spare."""
    import subprocess
    import sys

    rate = 2000
    before = cpu_seconds(pid)
    subprocess.run([sys.executable, "-m", "tailgate", "bench", url, "--rate", str(rate),
                    "--duration", f"{seconds}s", "--workers", "1", "--quiet"],
                   capture_output=True, timeout=120, check=True)
    per_request = max((cpu_seconds(pid) - before) / (rate * seconds), 2e-6)
    rate = min(8000, max(1000, int(1.6e-3 / (per_request * period_us / 1e6 * share)) + 1))
    demand_us = rate * per_request * period_us
    return rate, max(1000, int(share * demand_us))
