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
