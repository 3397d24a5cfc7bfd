"""A cgroup v1 cpu child the test creates and always removes (MACHINE.md: the cpu controller
is at /sys/fs/cgroup/cpu here)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

CPU_V1 = Path("/sys/fs/cgroup/cpu")


@contextlib.contextmanager
def cpu_cgroup(quota_us: int | None = None, period_us: int = 100_000) -> Iterator[Path]:
    """A fresh child of the cpu hierarchy; its tasks go back to the root before it is removed."""
    if not CPU_V1.is_dir() or os.geteuid() != 0:
        pytest.fail("needs root and the cgroup v1 cpu controller at /sys/fs/cgroup/cpu "
                    "(MACHINE.md: present on our machines)")
    cg = CPU_V1 / f"tailgate-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        (cg / "cpu.cfs_period_us").write_text(str(period_us))
        if quota_us is not None:
            (cg / "cpu.cfs_quota_us").write_text(str(quota_us))
        yield cg
    finally:
        with contextlib.suppress(OSError):
            for pid in (cg / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (CPU_V1 / "cgroup.procs").write_text(pid)
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


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

    (cg / "cpu.cfs_quota_us").write_text(str(quota_us))
    p = subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c",
                          f"end=$(($(date +%s)+{seconds})); while [ $(date +%s) -lt $end ]; do :; done"])
    try:
        (cg / "cgroup.procs").write_text(str(p.pid))
        yield
    finally:
        p.kill()
        p.wait()
        (cg / "cpu.cfs_quota_us").write_text("-1")


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
