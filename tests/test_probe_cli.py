"""`tailgate probe` and `inspect --probe-window` from the command line, on the real kernel;
and what a user without root gets (a child process that drops to uid 65534)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import tailgate.probes.driver  # noqa: F401 - loaded before a child drops root (see below)
from support import workloads
from support.inspect import gate_code
from support.workloads import running
from tailgate.cli import build_parser, main
from tailgate.collect import Scope
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.model import Snapshot
from tailgate.sources.probes import probe_facts

KEYS = {"probe", "unit", "count", "p50", "p90", "p99", "p999", "max", "buckets"}


@pytest.fixture(scope="module", autouse=True)
def _tracefs():
    yield from workloads.tracefs_mounted()


def tailgate(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailgate", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_probe_runqlat_json_to_stdout():
    proc = tailgate("probe", "runqlat", "--duration", "0.5", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert KEYS <= s.keys() and s["probe"] == "runqlat" and s["unit"] == "us"
    assert s["count"] == sum(b["count"] for b in s["buckets"])


def test_probe_per_pid_json_file_and_summary(tmp_path):
    out = tmp_path / "futex.json"
    with running(("futex_contend", 3, 8)) as (proc,):
        res = tailgate("probe", "futex", "--duration", "1", "--pid", str(proc.pid),
                       "--json", str(out))
    assert res.returncode == 0, res.stderr
    s = json.loads(out.read_text())
    assert KEYS <= s.keys() and list(s["processes"]) == [str(proc.pid)]
    assert KEYS - {"probe"} <= s["processes"][str(proc.pid)].keys()
    assert "futex waits" in res.stdout and f"pid {proc.pid}" in res.stdout


def test_probe_cgroup(tmp_path):
    base = Path("/sys/fs/cgroup/cpu")
    assert (base / "cgroup.procs").exists(), "MACHINE.md: cgroup v1 cpu controller"
    group = base / f"tailgate-probe-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        with running(("spin", 8), ("spin", 8)) as (inside, outside):
            (group / "cgroup.procs").write_text(str(inside.pid))
            res = tailgate("probe", "switches", "--duration", "1", "--cgroup", str(group),
                           "--json", "-")
        assert res.returncode == 0, res.stderr
        procs = json.loads(res.stdout)["processes"]
        assert str(inside.pid) in procs and str(outside.pid) not in procs
    finally:
        # The workloads are dead and reaped by now, so the group is empty.
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_print_program():
    res = tailgate("probe", "mmsg", "--pid", str(os.getpid()), "--print-program")
    assert res.returncode == 0
    first, *rest = res.stdout.splitlines()
    assert first.startswith("# bpftrace -f json ") and first.endswith(f" {os.getpid()}" * 8)
    assert rest[1].startswith(" * mmsg.bt - ")


@pytest.mark.parametrize("args, message", [
    (["malloc"], "needs --pid"),
    (["runqlat", "--pid", "12; reboot"], "invalid pid"),
    (["runqlat", "--pid", "0"], "invalid pid"),
    (["runqlat", "--pid", "2147483647"], "kernel.pid_max"),
    (["runqlat", "--duration", "0"], "--duration"),
    (["softirq", "--pid", "1"], "no --pid"),
    (["runqlat", "--pid", "1", "--cgroup", "/"], "not both"),
    (["runqlat", "--cgroup", "/no/such/group"], "no such cgroup"),
])
def test_usage_errors_exit_2(args, message):
    res = tailgate("probe", *args)
    assert res.returncode == 2 and message in res.stderr, res.stderr


def _as_nobody(fn):
    """Run ``fn`` in a child that dropped root; return what it returned (via a pipe).

    Modules are imported first: the interpreter's own files may not be readable by nobody.
    """
    build_parser()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, json.dumps(fn()).encode())
        except BaseException as exc:  # noqa: BLE001
            os.write(w, json.dumps({"child_error": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def test_not_root_probe_exits_2_with_a_clear_message(capsys):
    def run():
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(["probe", "runqlat", "--duration", "1"])
        return {"rc": rc, "err": err.getvalue()}

    out = _as_nobody(run)
    assert out.get("rc") == 2, out
    assert "bpftrace needs root (running as uid 65534)" in out["err"]


def test_not_root_inspect_reports_unknown_with_the_reason():
    def facts():
        got = probe_facts(Host("/"), Scope(options={"probe_window": 1.0}))
        return {k: v.to_json() for k, v in got.items()}

    got = _as_nobody(facts)
    assert set(got) == {"probe.runqlat", "probe.sockopt", "probe.mmsg", "probe.malloc",
                        "probe.softirq"}, got
    assert all("needs root" in v["missing"] for v in got.values())
    snap = Snapshot.from_json({"tailgate_snapshot": 1, "interval_s": 1.0, "facts": got,
                               "target": {"pids": []}})
    for check_id in ("l2.sched.runqlat", "l2.tcp.rcvbuf_lock", "l2.net.syscall_batching",
                     "l3.alloc.hot_path"):
        (f,) = run_check(check_id, checks()[check_id], snap, {"limit": 0})
        assert f.status == "unknown" and "needs root" in f.reason, (check_id, f)


def test_inspect_without_window_leaves_runqlat_unknown_with_context(tmp_path):
    env = {"XDG_STATE_HOME": str(tmp_path), "HOME": str(tmp_path)}
    res = tailgate("inspect", "--interval", "0.5", "--pid", str(os.getpid()), "--json", "-",
                   env=env)
    report = json.loads(res.stdout)
    assert res.returncode == gate_code(report), res.stderr  # the status the report decides
    (f,) = [f for f in report["findings"] if f["id"] == "l2.sched.runqlat"]
    assert f["status"] == "unknown" and f["observed"] is None
    assert "no probe window" in f["reason"]
    assert f"pid {os.getpid()}" in f["evidence"]


def test_inspect_probe_window_with_pid_judges_allocations(tmp_path):
    env = {"XDG_STATE_HOME": str(tmp_path), "HOME": str(tmp_path)}
    with running(("alloc", "alloc", 20)) as (proc,):
        res = tailgate("inspect", "--interval", "0", "--probe-window", "1", "--pid",
                       str(proc.pid), "--json", "-", env=env)
    assert res.returncode == 1, res.stderr
    found = {f["id"]: f for f in json.loads(res.stdout)["findings"]}
    alloc = found["l3.alloc.hot_path"]
    assert alloc["status"] == "fail" and alloc["subject"] == f"pid {proc.pid}"
    assert "handle_request_alloc" in alloc["reason"] and alloc["observed"] > 0
    assert found["l2.sched.runqlat"]["subject"] == f"pid {proc.pid}"
    assert found["l2.sched.runqlat"]["status"] in ("pass", "fail", "unknown")
