"""cgroup v2 on the real kernel: a cgroup2 mount of the test's own, a child cgroup with a real
process in it, and `tailgate inspect --cgroup` / `--pid` reading it; mount and child removed
after. What is asserted follows what the kernel offers there: with the cpu controller
available to v2 (a v2-only host) a quota and a busy loop must fail l2.cgroup.throttling from
cpu.max and throttled_usec; without it (this VM binds cpu to v1) the child has no cpu.max
and no bandwidth control is possible, which is a pass saying so, read from v2's cpu.stat."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def v2_child() -> Iterator[tuple[Path, Path, list[subprocess.Popen]]]:
    if os.geteuid() != 0:
        pytest.fail("needs root to mount a cgroup2 hierarchy (make test and CI run as root)")
    if "cgroup2" not in Path("/proc/filesystems").read_text():
        pytest.fail("this kernel has no cgroup2 file system")
    mnt = Path(tempfile.mkdtemp(prefix="tailgate-42-cg2-"))
    subprocess.run(["mount", "-t", "cgroup2", "none", str(mnt)], check=True, timeout=30)
    child = mnt / f"tailgate-test-42-{uuid.uuid4().hex[:8]}"
    procs: list[subprocess.Popen] = []
    enabled_cpu = False
    try:
        child.mkdir()
        controllers = (mnt / "cgroup.controllers").read_text().split()
        if "cpu" in controllers and "cpu" not in (mnt / "cgroup.subtree_control").read_text():
            (mnt / "cgroup.subtree_control").write_text("+cpu")
            enabled_cpu = True
        yield mnt, child, procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        with contextlib.suppress(OSError):
            for pid in (child / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (mnt / "cgroup.procs").write_text(pid)
        for _ in range(50):
            try:
                child.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        if enabled_cpu:
            with contextlib.suppress(OSError):
                (mnt / "cgroup.subtree_control").write_text("-cpu")
        subprocess.run(["umount", str(mnt)], check=False, timeout=30)
        mnt.rmdir()


def inspect(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--no-history",
                           "--json", "-", *args], capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def throttling(rep: dict) -> dict:
    (f,) = [f for f in rep["findings"] if f["id"] == "l2.cgroup.throttling"]
    return f


def test_cgroup_v2_read_live_from_a_hierarchy_of_our_own():
    with v2_child() as (mnt, child, procs):
        busy = subprocess.Popen(["sh", "-c", "end=$(($(date +%s)+60)); "
                                 "while [ $(date +%s) -lt $end ]; do :; done"])
        procs.append(busy)
        (child / "cgroup.procs").write_text(str(busy.pid))
        assert str(busy.pid) in (child / "cgroup.procs").read_text().split()
        has_cpu = (child / "cpu.max").exists()
        if has_cpu:
            (child / "cpu.max").write_text("10000 100000")  # 10 % of a CPU
        f = throttling(inspect("--cgroup", str(child), "--interval", "1"))
        assert f["subject"] == str(child) and f["evidence"]["cgroup_version"] == 2, f
        if has_cpu:
            assert f["status"] == "fail" and f["evidence"]["quota_us"] == 10000, f
        else:
            # the kernel keeps cpu on v1 here: v2's cpu.stat has usage only, no cpu.max
            assert "usage_usec" in f["evidence"]["cpu.stat"], f
            assert f["status"] == "pass" and "no cpu bandwidth controller" in f["reason"], f
        # from the process: where cpu is v2's, /proc/PID/cgroup's v2 line leads to the child;
        # on a hybrid host the process's bandwidth is its v1 cpu cgroup's, and that is read
        f = throttling(inspect("--pid", str(busy.pid), "--interval", "1"))
        if has_cpu:
            assert f["evidence"]["cgroup_version"] == 2 and f["subject"].endswith(child.name), f
        else:
            assert f["evidence"]["cgroup_version"] == 1 and "cfs" not in f["reason"], f
    assert not mnt.exists()
