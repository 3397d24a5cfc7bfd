"""`tailgate inspect` end to end from the CLI, on this host's real kernel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from support.cgroups import cpu_cgroup as make_cpu_cgroup
from support.cgroups import set_quota
from support.inspect import gate_code
from tailgate.baseline import catalog


def tailgate(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "tailgate", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def report(*args: str) -> tuple[int, dict]:
    proc = tailgate("inspect", *args, "--json", "-")
    assert proc.stdout, proc.stderr
    rep = json.loads(proc.stdout)
    assert proc.returncode == gate_code(rep), proc.stderr  # the exit status the report decides
    return proc.returncode, rep


def by_id(rep: dict, check_id: str) -> list[dict]:
    return [f for f in rep["findings"] if f["id"] == check_id]


def test_every_id_in_every_report_with_the_schema():
    rc, rep = report("--interval", "0")
    assert rep["tailgate"] and rep["host"]["kernel"] == os.uname().release
    assert set(rep["verdict"]) >= {"status", "first_failing_layer"}
    assert {f["id"] for f in rep["findings"]} == set(catalog())
    keys = {"id", "layer", "status", "subject", "observed", "limit", "unit", "reason",
            "evidence", "remedy"}
    for f in rep["findings"]:
        assert keys <= set(f)
        assert f["status"] in ("pass", "warn", "fail", "skip", "unknown")
        if f["status"] == "unknown":
            assert f["reason"], f"{f['id']} is unknown without a reason"
    layers = [f["layer"] for f in rep["findings"]]
    assert layers == sorted(layers), "findings are ordered bottom-up L1 -> L4"
    assert rc == (1 if rep["verdict"]["status"] == "fail" else 0)


def test_terminal_report_names_the_layer_to_fix_first():
    proc = tailgate("inspect", "--interval", "0", "--pid", "1")
    out = proc.stdout
    for layer in ("L1", "L2", "L3", "L4"):
        assert layer in out
    assert out.index("L1  physical") < out.index("L2  kernel") < out.index("L4  inference")
    if proc.returncode == 1:
        assert "fix L" in out and "first" in out
    else:
        assert "verdict:" in out


def test_save_then_from_judges_offline(tmp_path):
    saved = tmp_path / "snap.json"
    _, live = report("--interval", "0.6", "--pid", str(os.getpid()), "--save", str(saved))
    data = json.loads(saved.read_text())
    assert data["tailgate_snapshot"] == 1 and "net.snmp" in data["facts"]
    _, offline = report("--from", str(saved))
    strip = [(f["id"], f["status"], f["subject"], f["observed"]) for f in live["findings"]]
    again = [(f["id"], f["status"], f["subject"], f["observed"]) for f in offline["findings"]]
    assert strip == again
    # offline judging with a stricter baseline changes the verdict, not the facts
    base = tmp_path / "strict.yaml"
    base.write_text("l2.tcp.mem_sizing: {max_fraction: 0.0001}\n")
    _, strict = report("--from", str(saved), "--baseline", str(base))
    (mem,) = by_id(strict, "l2.tcp.mem_sizing")
    assert mem["status"] == "fail"


def test_junit_and_html(tmp_path):
    junit, page = tmp_path / "r.xml", tmp_path / "r.html"
    proc = tailgate("inspect", "--interval", "0", "--junit", str(junit), "--html", str(page),
                    "--json", str(tmp_path / "r.json"), "--quiet")
    rep = json.loads((tmp_path / "r.json").read_text())
    root = ET.parse(junit).getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == len(rep["findings"])
    fails = sum(1 for f in rep["findings"] if f["status"] == "fail")
    assert len(root.findall(".//failure")) == fails
    assert proc.returncode == (1 if fails else 0)
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "l2.tcp.mem_sizing" in text


def test_fail_on_warn_raises_the_bar(tmp_path):
    base = tmp_path / "b.yaml"
    base.write_text("l2.tcp.mem_sizing:\n  min_fraction: 0.99\n  max_fraction: 1.0\n")
    proc = tailgate("inspect", "--interval", "0", "--baseline", str(base), "--quiet",
                    "--json", str(tmp_path / "r.json"))
    rep = json.loads((tmp_path / "r.json").read_text())
    (mem,) = by_id(rep, "l2.tcp.mem_sizing")
    assert mem["status"] == "warn"
    warned = tailgate("inspect", "--interval", "0", "--baseline", str(base), "--quiet",
                      "--fail-on", "warn")
    assert warned.returncode == 1
    if rep["verdict"]["status"] != "fail":
        assert proc.returncode == 0


@pytest.mark.parametrize("content,expected", [
    ("l2.bogus.check: 1\n", ["b.yaml:1", "l2.bogus.check", "unknown check id"]),
    ("# comment\nl2.net.drop_rate: fast\n", ["b.yaml:2", "l2.net.drop_rate.limit", "expected float"]),
    ("l2.net.drop_rate:\n  limit: 0.1\n  speed: 3\n", ["b.yaml:3", "l2.net.drop_rate.speed",
                                                       "unknown parameter"]),
    ("l2.net.drop_rate: [1, 2\n", ["b.yaml:", "malformed YAML"]),
    ("- a list\n", ["b.yaml:1", "mapping"]),
])
def test_bad_baseline_exits_2_naming_file_line_key(tmp_path, content, expected):
    base = tmp_path / "b.yaml"
    base.write_text(content)
    proc = tailgate("inspect", "--interval", "0", "--baseline", str(base))
    assert proc.returncode == 2
    for part in expected:
        assert part in proc.stderr, proc.stderr


def test_baseline_override_changes_the_limit(tmp_path):
    base = tmp_path / "b.yaml"
    base.write_text("l2.net.drop_rate: 0.5\nl2.sched.runqlat: {limit: 250}\n")
    _, rep = report("--interval", "0", "--baseline", str(base))
    assert by_id(rep, "l2.net.drop_rate")[0]["limit"] == 0.5
    assert by_id(rep, "l2.sched.runqlat")[0]["limit"] == 250


def test_baseline_can_switch_a_check_off(tmp_path):
    base = tmp_path / "b.yaml"
    base.write_text("l2.tcp.mem_sizing: {enabled: false}\nl2.net.drop_rate: {enabled: true}\n")
    _, rep = report("--interval", "0", "--baseline", str(base))
    (mem,) = by_id(rep, "l2.tcp.mem_sizing")
    assert mem["status"] == "skip" and "disabled by the baseline" in mem["reason"]
    assert by_id(rep, "l2.net.drop_rate")[0]["status"] != "skip"
    base.write_text("l2.tcp.mem_sizing: {enabled: 0}\n")
    proc = tailgate("inspect", "--interval", "0", "--baseline", str(base))
    assert proc.returncode == 2 and "l2.tcp.mem_sizing.enabled" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["--pid", "999999999"], "kernel.pid_max"),
    (["--pid", "abc"], "invalid pid"),
    (["--cgroup", "/definitely/not/a/cgroup"], "no such cgroup"),
    (["--iface", "bad/name"], "invalid interface"),
    (["--from", "/nonexistent.json"], "cannot read"),
])
def test_bad_arguments_exit_2(args, message):
    proc = tailgate("inspect", "--interval", "0", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_from_a_file_that_is_not_a_snapshot(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    proc = tailgate("inspect", "--from", str(bad))
    assert proc.returncode == 2 and "not a tailgate snapshot" in proc.stderr


def test_checks_and_explain():
    listing = tailgate("checks").stdout.splitlines()
    assert len(listing) == len(catalog())
    assert any(line.startswith("L2  l2.tcp.mem_sizing") for line in listing)
    text = tailgate("explain", "l2.tcp.mem_sizing").stdout
    assert "tcp_mem[2]" in text and "25 %" in text and "remedy:" in text
    bad = tailgate("explain", "l2.nope")
    assert bad.returncode == 2 and "unknown check id" in bad.stderr


def test_a_pid_that_exits_mid_run_is_unknown_and_the_report_completes():
    victim = subprocess.Popen(["sleep", "0.3"])
    try:
        rc, rep = report("--interval", "1", "--pid", str(victim.pid))
    finally:
        victim.wait()
    assert {f["id"] for f in rep["findings"]} == set(catalog())
    (iou,) = by_id(rep, "l2.io.io_uring")
    assert iou["status"] == "unknown" and str(victim.pid) in iou["reason"]


def test_a_hung_command_is_killed_and_reported(tmp_path):
    # A real process that hangs, found on PATH in place of chronyc (run on every host).
    fake = tmp_path / "chronyc"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
           "TAILGATE_COMMAND_TIMEOUT": "0.5"}
    proc = tailgate("inspect", "--interval", "0", "--save", str(tmp_path / "s.json"), "--quiet",
                    "--json", str(tmp_path / "r.json"), env=env, timeout=60)
    assert proc.returncode == gate_code(json.loads((tmp_path / "r.json").read_text())), \
        proc.stderr
    facts = json.loads((tmp_path / "s.json").read_text())["facts"]
    assert "timed out after 0.5 s and was killed" in facts["chrony.tracking"]["missing"]
    leftovers = subprocess.run(["pgrep", "-f", f"{tmp_path}/chronyc"], capture_output=True)
    assert leftovers.returncode == 1, "the hung command was left running"


# -- cgroup CPU bandwidth throttling on the real kernel ---------------------------------------

@pytest.fixture
def cpu_cgroup():
    """A cpu cgroup of the test's own (support.cgroups: v1's cpu hierarchy where the host has
    one, else cgroup v2's), removed after; the busy loops put in it are killed first."""
    procs: list[subprocess.Popen] = []
    with make_cpu_cgroup() as path:
        try:
            yield path, procs
        finally:
            for p in procs:
                p.send_signal(signal.SIGKILL)
                p.wait()


def _busy_in(path: Path, procs: list) -> int:
    busy = subprocess.Popen(["sh", "-c", "end=$(($(date +%s)+60)); "
                             "while [ $(date +%s) -lt $end ]; do :; done"])
    procs.append(busy)
    (path / "cgroup.procs").write_text(str(busy.pid))
    return busy.pid


def test_quota_and_busy_loop_fails_throttling(cpu_cgroup):
    path, procs = cpu_cgroup
    set_quota(path, 10000, 100_000)  # 10 % of a CPU, in whichever cgroup version it is
    pid = _busy_in(path, procs)
    rc, rep = report("--cgroup", str(path), "--interval", "1")
    (f,) = by_id(rep, "l2.cgroup.throttling")
    assert f["status"] == "fail", f
    assert f["observed"] > 0 and f["evidence"]["quota_us"] == 10000
    # L2 fails here; L1 comes first where this host's own L1 findings fail
    l1_fails = any(x["layer"] == "L1" and x["status"] == "fail" for x in rep["findings"])
    assert rc == 1 and rep["verdict"]["first_failing_layer"] == ("L1" if l1_fails else "L2")
    # found from the pid as well, by the cgroup-relative name
    _, by_pid = report("--pid", str(pid), "--interval", "1")
    assert [x["status"] for x in by_id(by_pid, "l2.cgroup.throttling")] == ["fail"]
    _, relative = report("--cgroup", path.name, "--interval", "1")
    assert by_id(relative, "l2.cgroup.throttling")[0]["subject"] == str(path)


def test_no_quota_passes(cpu_cgroup):
    path, procs = cpu_cgroup
    _busy_in(path, procs)
    _, rep = report("--cgroup", str(path), "--interval", "1")
    (f,) = by_id(rep, "l2.cgroup.throttling")
    assert f["status"] == "pass" and f["observed"] == 0


def test_an_unwritable_output_is_refused_before_collecting(tmp_path):
    proc = tailgate("inspect", "--interval", "30", "--json", str(tmp_path / "no" / "such" / "r.json"))
    assert proc.returncode == 2 and "cannot write" in proc.stderr
