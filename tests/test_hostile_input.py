"""Hostile input that is not a host root (issue 18): the safe reader itself, commands,
Ctrl-C, arguments, and the --from and baseline loaders (fuzzed with hypothesis)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.inspect import gate_code
from support.signals import sigint_default
from tailgate.cli import main
from tailgate.host import Host, Refused, TooLarge, valid_iface, valid_pid
from tailgate.model import ParseError, SourceError
from tailgate.sources.cgroup import resolve_cgroup

VM_L2 = Path(__file__).parent / "fixtures" / "roots" / "vm-l2"


def tailgate(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "tailgate", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


# -- the reader ----------------------------------------------------------------------------

def test_devices_and_fifos_are_refused_before_a_byte_is_read(tmp_path):
    live = Host("/")
    with pytest.raises(Refused, match="character device"):
        live.read("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open or read would hang here forever
    with pytest.raises(Refused, match="FIFO"):
        live.read(str(fifo))
    with pytest.raises(Refused, match="FIFO"):
        Host(tmp_path).read("/fifo")


def test_size_caps_hold_for_files_that_report_no_size(tmp_path):
    assert os.stat("/proc/self/status").st_size == 0  # procfs: only a read tells
    with pytest.raises(TooLarge, match="cap"):
        Host("/", max_read=64).read("/proc/self/status")
    (tmp_path / "big").write_text("x" * 100)
    with pytest.raises(TooLarge, match="100 bytes"):
        Host(tmp_path, max_read=99).read("/big")
    assert Host(tmp_path, max_read=100).read("/big") == "x" * 100


def test_nul_bytes_are_binary_not_text(tmp_path):
    (tmp_path / "bin").write_bytes(b"12\x0034\n")
    with pytest.raises(ParseError, match="binary"):
        Host(tmp_path).read("/bin")


def test_links_that_leave_the_root_are_refused_with_the_reason(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "proc").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("987654321\n")
    os.symlink(outside / "secret", root / "proc" / "abs")
    os.symlink("../../outside/secret", root / "proc" / "rel")
    os.symlink(outside, root / "dir")
    host = Host(root)
    for path in ("/proc/abs", "/proc/rel", "/dir/secret", "/../outside/secret"):
        with pytest.raises(SourceError) as err:
            host.read(path)
        assert "987654321" not in str(err.value)
    with pytest.raises(Refused, match="outside the root"):
        host.exists("/dir/secret")
    with pytest.raises(Refused, match="outside the root"):
        host.listdir("/dir")
    # ".." in a path is resolved inside the root, like a chroot's
    (root / "proc" / "ok").write_text("1\n")
    assert host.read("/../../proc/ok") == "1\n"
    os.symlink("loop", root / "proc" / "loop")
    with pytest.raises(SourceError, match="symlink loop"):
        host.read("/proc/loop")
    assert host.exists("/proc/loop")  # present, unreadable: a reason, never "absent"


def test_command_output_cap_and_time_out_kill_the_command():
    host = Host("/", max_output=1 << 20)
    with pytest.raises(TooLarge, match="cap: killed"):
        host.run(["yes"])  # endless output
    t0 = time.monotonic()
    with pytest.raises(SourceError, match="timed out"):
        host.run(["sh", "-c", "sleep 30 & sleep 30"], timeout_s=0.5)
    assert time.monotonic() - t0 < 20  # the group is killed: no grandchild keeps the pipe


def test_cancel_kills_running_commands():
    host = Host("/")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            host.run(["sleep", "30"], timeout_s=60)
        except SourceError as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    host.cancel()
    t.join(timeout=20)
    assert not t.is_alive() and errors and "interrupted" in str(errors[0])
    with pytest.raises(SourceError, match="not run"):
        host.run(["true"])


def test_a_root_never_runs_a_command(tmp_path):
    """Neither a fixture root nor a link to / : the captured outputs, or nothing."""
    bin_dir, marker = tmp_path / "bin", tmp_path / "ran"
    bin_dir.mkdir()
    for tool in ("ethtool", "pmc", "chronyc", "tc", "ss", "getconf", "nvidia-smi", "modinfo",
                 "journalctl", "dmesg", "dcb"):
        script = bin_dir / tool
        script.write_text(f"#!/bin/sh\necho {tool} >> {marker}\n")
        script.chmod(0o755)
    os.symlink("/", tmp_path / "slash")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for root in (VM_L2, tmp_path / "slash"):
        report = tmp_path / "r.json"
        proc = tailgate("inspect", "--root", str(root), "--interval", "0", "--no-history",
                        "--quiet", "--iface", "eth0", "--json", str(report), env=env)
        if root == VM_L2:  # the vm-l2 root: nothing fails; "/" behind a link is this host
            assert proc.returncode == 0, proc.stderr
        else:  # this host, read as a root: what its report decides
            assert proc.returncode == gate_code(json.loads(report.read_text())), proc.stderr
    assert not marker.exists(), marker.read_text()
    assert Host(tmp_path / "slash").live is False and Host("/").live is True


def test_ctrl_c_ends_the_run_cleanly_and_writes_nothing(tmp_path):
    out, saved = tmp_path / "r.json", tmp_path / "s.json"
    proc = subprocess.Popen([sys.executable, "-m", "tailgate", "inspect", "--interval", "30",
                             "--no-history", "--json", str(out), "--save", str(saved)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    time.sleep(3)  # past start-up: inside the first sample or the interval
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("inspect did not end on Ctrl-C")
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["tailgate: interrupted"], err
    assert not out.exists() and not saved.exists()


# -- arguments -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["eth2\n", "", ".", "..", "a/b", "eth0:1", "a b", "a\tb",
                                  "x" * 16, "é" * 8, "a\xa0b", "a\0b"])
def test_interface_names_the_kernel_refuses(name):
    with pytest.raises(ValueError, match="invalid interface name"):
        valid_iface(name)


@pytest.mark.parametrize("name", ["eth0", "x" * 15, "br-lan.10", "wlp0s20f3", "é" * 7,
                                  "\x1b]0;t\x07", "veth@1"])
def test_interface_names_the_kernel_accepts(name):
    assert valid_iface(name) == name


@pytest.mark.parametrize("value", ["٣", "²", "1" * 300, "0", "-1", "+5", " 5", "1_0", "",
                                   "4194304"])
def test_pids_are_ascii_digits_within_pid_max(value):
    with pytest.raises(ValueError, match="invalid pid"):
        valid_pid(value)
    assert valid_pid("4194303") == 4194303
    with pytest.raises(ValueError, match="pid_max"):
        valid_pid("40000", pid_max=32768)


@pytest.mark.parametrize("args,message", [
    (["--iface", "eth2\n"], "invalid interface name"),
    (["--pid", "1" * 300], "invalid pid"),
    (["--pid", "٣"], "ASCII digits"),
    (["--cgroup", "x" * 5000], "1 to 4095 bytes"),
    (["--cgroup", "/" + "y" * 300], "255 bytes"),
])
def test_bad_arguments_exit_2_with_one_short_line(args, message):
    proc = tailgate("inspect", "--interval", "0", "--no-history", *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert len(lines[0]) <= 500 and "Traceback" not in proc.stderr


def test_cgroup_paths_stay_under_their_mount(tmp_path):
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "mounts").write_text("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    for d in ("sys/fs/cgroup/svc", "sys/fs/x", "sys/fs/cgroup/x"):
        (root / d).mkdir(parents=True)
        (root / d / "cgroup.procs").write_text("1\n")
    host = Host(root)
    assert resolve_cgroup(host, "/../x") == "/sys/fs/cgroup/x"
    assert resolve_cgroup(host, "../../x") == "/sys/fs/cgroup/x"
    assert resolve_cgroup(host, "/sys/fs/cgroup/../x") is None  # that is /sys/fs/x: refused
    assert resolve_cgroup(host, "/sys/fs/x") is None  # a cgroup.procs outside the mount
    assert resolve_cgroup(host, "svc") == "/sys/fs/cgroup/svc"


def test_control_characters_never_reach_the_terminal_or_junit(tmp_path):
    """An interface name with escape sequences (legal on Linux) through every output."""
    name = "\x1b]0;t\x07\x1b[2J"
    junit, html = tmp_path / "r.xml", tmp_path / "r.html"
    proc = tailgate("inspect", "--root", str(VM_L2), "--interval", "0", "--no-history",
                    "--iface", name, "--junit", str(junit), "--html", str(html))
    assert proc.returncode == 0, proc.stderr  # the vm-l2 root: nothing fails
    assert "\x1b" not in proc.stdout + proc.stderr and "\\x1b]0;t\\x07" in proc.stdout
    ET.parse(junit)  # an XML parser accepts it
    assert "\x1b" not in junit.read_text() + html.read_text()


# -- the --from and baseline loaders -------------------------------------------------------

@pytest.fixture(scope="module")
def saved_snapshot(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("snap") / "snap.json"
    proc = tailgate("inspect", "--root", str(VM_L2), "--interval", "0", "--no-history",
                    "--quiet", "--save", str(path))
    assert proc.returncode == 0, proc.stderr  # the vm-l2 root: nothing fails
    return path


def run_main(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["inspect", "--quiet", *args])
    return rc, err.getvalue()


def assert_one_line_naming(rc: int, err: str, path: Path) -> None:
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1, (rc, err[:2000])
    assert lines[0].startswith("tailgate inspect: error: ") and str(path) in lines[0], lines
    assert len(lines[0]) <= 600 + len(str(path))


BOMBS_JSON = [
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 50_000 + "1" + "}" * 50_000,
    '{"tailgate_snapshot": 1, "interval_s": NaN}',
    '{"tailgate_snapshot": 1, "taken_at": Infinity}',
    '{"tailgate_snapshot": 1, "interval_s": 1e999}',
    '{"tailgate_snapshot": 1, "interval_s": ' + "9" * 5000 + "}",
    '{"tailgate_snapshot": 1, "facts": {"x": 5}}',
    '{"tailgate_snapshot": 1, "facts": []}',
    '{"tailgate_snapshot": 1, "target": {"pids": ["1; rm -rf /"]}}',
    '{"tailgate_snapshot": 1, "target": {"pids": [' + "9" * 40 + "]}}",
    '{"tailgate_snapshot": 1, "facts": {"a": {"value": ' + "[" * 70 + "]" * 70 + "}}}",
    "\udcff".encode("utf-8", "surrogatepass").decode("latin-1"),
    "",
    "null",
]


@pytest.mark.parametrize("text", BOMBS_JSON, ids=range(len(BOMBS_JSON)))
def test_from_refuses_bombs_and_malformed_snapshots(text, tmp_path):
    path = tmp_path / "bad\nname.json"
    path.write_text(text)
    rc, err = run_main("--from", str(path))
    assert rc == 2 and len(err.splitlines()) == 1, err[:2000]
    assert "bad\\x0aname.json" in err  # the file named, its newline escaped


def test_from_refuses_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path / "absent.json"):
        assert_one_line_naming(*run_main("--from", str(path)), path)
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(64 * 2**20 + 1)
    assert_one_line_naming(*run_main("--from", str(big)), big)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=20)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(part=st.sampled_from(["host", "target", "facts", "before", "earlier", "interval_s",
                             "taken_at", "earlier_at", "version"]), value=JSON)
def test_from_fuzzed_snapshots_judge_or_exit_2(saved_snapshot, tmp_path_factory, part, value):
    """A valid snapshot with one part replaced by anything: judged (0/1), or exit 2 with one
    line naming the file. Never a traceback."""
    data = json.loads(saved_snapshot.read_text())
    data[part] = value
    path = tmp_path_factory.mktemp("fuzz") / "snap.json"
    path.write_text(json.dumps(data))  # NaN literals included: json.dumps writes them
    report = path.with_name("report.json")
    rc, err = run_main("--from", str(path), "--json", str(report))
    if rc == 2:
        assert_one_line_naming(rc, err, path)
    else:
        assert rc == gate_code(json.loads(report.read_text())) and err == "", err


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_from_random_bytes_exit_2(saved_snapshot, tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("fuzz") / "snap.json"
    path.write_bytes(raw)
    assert_one_line_naming(*run_main("--from", str(path)), path)


LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
BOMBS_YAML = [
    LAUGHS,
    "l1.cable.copper_in_rack: {in_rack: " + LAUGHS.replace("\n", " ") + "}",
    "[" * 10_000 + "]" * 10_000,
    "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 200)),
    "l1.cable.copper_in_rack: {in_rack: &x [*x]}\n",
    "l2.net.drop_rate: !!python/object/apply:os.system ['echo owned']\n",
    "l2.net.drop_rate: !!python/name:os.system\n",
    "? [l2.net.drop_rate]\n: 1\n",
    "l2.net.drop_rate: {? {a: 1} : 2}\n",
    "l2.net.drop_rate: .nan\n",
    "l2.net.drop_rate: .inf\n",
    "l1.cable.copper_in_rack: {in_rack: [eth0, .nan]}\n",
    "l2.net.drop_rate: " + "9" * 5000 + "\n",
    "l2.net.drop_rate: 'x\x1b[2J'\n",
    "l2.net.drop_rate: 0.01\nl2.net.drop_rate\n",
    "- a\n- b\n",
]


@pytest.mark.parametrize("text", BOMBS_YAML, ids=range(len(BOMBS_YAML)))
def test_baseline_refuses_bombs_tags_and_non_values(text, saved_snapshot, tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(text)
    t0 = time.process_time()
    rc, err = run_main("--from", str(saved_snapshot), "--baseline", str(path))
    assert_one_line_naming(rc, err, path)
    assert "\x1b" not in err
    assert time.process_time() - t0 < 30  # CPU seconds, not wall time: a bomb expands nothing


def test_baseline_latin1_fifo_and_size(saved_snapshot, tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"l2.net.drop_rate: 0.01 # caf\xe9\n")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    big.write_text("#" * (2**20 + 1))
    for path in (latin, fifo, big, Path("/dev/zero")):
        assert_one_line_naming(*run_main("--from", str(saved_snapshot), "--baseline",
                                         str(path)), path)
    assert "not UTF-8" in run_main("--from", str(saved_snapshot), "--baseline", str(latin))[1]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(st.characters(codec="utf-8"), max_size=200)
       | st.lists(st.sampled_from(["l2.net.drop_rate", ":", " ", "\n", "&a", "*a", "[", "]",
                                   "{", "}", ",", "-", "!!python/object", "? ", ".nan", "1",
                                   "limit", "enabled", "true", "'", '"', "#", "<<: *a"]),
                  max_size=60).map("".join))
def test_baseline_fuzzed_loads_or_exits_2(saved_snapshot, tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "b.yaml"
    path.write_text(text)
    report = path.with_name("report.json")
    rc, err = run_main("--from", str(saved_snapshot), "--baseline", str(path), "--json",
                       str(report))
    if rc == 2:
        assert_one_line_naming(rc, err, path)
    else:
        assert rc == gate_code(json.loads(report.read_text())) and err == "", err


def test_a_fifo_as_the_history_database_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "history.sqlite")
    proc = tailgate("inspect", "--root", str(VM_L2), "--interval", "0", "--quiet",
                    "--state", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr


def test_a_pid_within_pid_max_that_does_not_exist():
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    free = next(p for p in range(pid_max - 1, 1, -1) if not os.path.exists(f"/proc/{p}"))
    proc = tailgate("inspect", "--interval", "0", "--no-history", "--pid", str(free))
    assert proc.returncode == 2 and "no such process" in proc.stderr, proc.stderr


def test_an_engine_restart_between_scrapes_is_a_reset_not_a_rate():
    from tailgate.baseline import default_baseline
    from tailgate.judge import judge
    from tailgate.model import Fact, Snapshot
    from tailgate.sources.engine import engine_samples, parse_exposition

    prom = Path(__file__).parent / "fixtures" / "llm" / "vllm_0.32.0_cpu_metrics_real.prom"
    after = engine_samples(parse_exposition(prom.read_text()))
    before = [[n, lab, v + 1000 if n.startswith("vllm:prefix_cache_") else v]
              for n, lab, v in after]
    url = "http://127.0.0.1:8000/metrics"
    snap = Snapshot(host={}, target={"engine": url}, interval_s=5.0, taken_at=0.0,
                    facts={"engine.metrics": Fact(value={"url": url, "samples": after})},
                    before={"engine.metrics": Fact(value={"url": url, "samples": before})})
    (f,) = [f for f in judge(snap, default_baseline()) if f.id == "l4.prefix_cache.hit_rate"]
    assert f.status == "unknown" and "counter reset" in f.reason, f
    assert "vllm:prefix_cache_" in f.reason


def test_a_cpu_max_symlink_loop_is_not_no_quota(tmp_path):
    from tailgate.sources.cgroup import read_cpu_bandwidth

    cg = tmp_path / "sys/fs/cgroup/svc"
    cg.mkdir(parents=True)
    (cg / "cpu.stat").write_text("usage_usec 10\nnr_periods 0\nnr_throttled 0\n"
                                 "throttled_usec 0\n")
    os.symlink("cpu.max", cg / "cpu.max")
    with pytest.raises(SourceError, match="symlink loop"):
        read_cpu_bandwidth(Host(tmp_path), "/sys/fs/cgroup/svc")


def test_strict_json_has_no_nan_literals():
    from tailgate.safe import strict_json

    text = strict_json({"a": float("nan"), "b": [float("inf"), -float("inf")], "c": 1.5})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {
        "a": "nan", "b": ["inf", "-inf"], "c": 1.5}


def test_a_sysctl_value_of_megabytes_is_refused(tmp_path):
    from tailgate.sources.sysctl import read_knob

    knob = tmp_path / "proc/sys/net/ipv4/tcp_congestion_control"
    knob.parent.mkdir(parents=True)
    knob.write_text("bbr" * 100_000)
    with pytest.raises(TooLarge, match="tcp_congestion_control"):
        read_knob(Host(tmp_path), "net/ipv4/tcp_congestion_control")


def test_a_snapshot_holding_surrogates_and_escapes_renders_valid_outputs(saved_snapshot, tmp_path):
    data = json.loads(saved_snapshot.read_text())
    evil = "\ud800\x1b[2J\x07\u202e\ufffe"
    data["host"]["hostname"] = evil
    data["facts"]["sysctl.net.ipv4.tcp_congestion_control"] = {"value": "cubic" + evil}
    src = tmp_path / "s.json"
    src.write_text(json.dumps(data))  # ASCII escapes: the file is valid UTF-8 JSON
    outs = {k: tmp_path / f"r.{k}" for k in ("json", "junit", "html")}
    proc = tailgate("inspect", "--from", str(src), "--json", str(outs["json"]),
                    "--junit", str(outs["junit"]), "--html", str(outs["html"]))
    assert proc.returncode == 1, proc.stderr  # cubic: a red line, judged and reported
    assert not any(c in proc.stdout for c in "\x1b\x07\u202e"), proc.stdout[:500]
    ET.parse(outs["junit"])
    assert "\x1b" not in outs["html"].read_text()
    json.loads(outs["json"].read_text())


def test_ctrl_c_during_a_probe_window_stops_the_probes_now(tmp_path):
    """The probes run in a collector thread: Ctrl-C must stop them, not wait out the window."""
    from tailgate.probes.driver import unavailable

    reason = unavailable()
    assert reason is None, f"this test needs the eBPF probes (root, bpftrace, tracefs): {reason}"
    out = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "tailgate", "inspect", "--interval", "0",
                             "--no-history", "--probe-window", "120", "--json", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    time.sleep(5)  # inside the window (or still attaching)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)  # far less than the 120 s window
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("inspect waited out the probe window after Ctrl-C")
    assert proc.returncode == 130, err
    assert not out.exists()
    from tailgate.probes.driver import program_path

    ours = re.escape(str(program_path("runqlat").parent)) + "/.*\\.bt"  # this tree's programs
    left = subprocess.run(["pgrep", "-f", ours], capture_output=True, text=True,
                          check=False).stdout.split()
    assert not left, f"bpftrace still running: {left}"


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_memory_stats_that_never_end_are_unknown(kind, tmp_path):
    path = tmp_path / "stats.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)
    proc = tailgate("inspect", "--root", str(VM_L2), "--interval", "0", "--no-history",
                    "--memory-stats", str(path), "--json", "-", timeout=60)
    assert proc.returncode == 0, proc.stderr  # the vm-l2 root and an unknown: nothing fails
    (f,) = [f for f in json.loads(proc.stdout)["findings"]
            if f["id"] == "l4.memory.fragmentation"]
    assert f["status"] == "unknown" and "stats.json" in f["reason"], f
    assert "not a regular file" in f["reason"]


def test_the_opened_descriptor_itself_must_lie_inside_the_root(tmp_path):
    """The last check, on /proc/self/fd: whatever path reached it, a file opened outside
    the root (a component swapped for a symlink after the path was checked) is refused."""
    from tailgate.host import read_regular

    outside = tmp_path / "outside"
    outside.write_text("987654321\n")
    (tmp_path / "root").mkdir()
    with pytest.raises(Refused, match="opened outside the root"):
        read_regular(str(outside), 1024, inside=str(tmp_path / "root"))
    assert read_regular(str(outside), 1024, inside=str(tmp_path)) == b"987654321\n"


@pytest.mark.parametrize("pid_max", ["100", "0", "300"])
def test_a_pid_max_below_the_kernels_floor_is_not_trusted(tmp_path, pid_max):
    # kernel/pid.c refuses pid_max < 301 (RESERVED_PIDS + 1): a root that says so is not a
    # real host's, and the kernel's own ceiling decides which PIDs are valid
    from tailgate.host import Host
    from tailgate.service import existing_pids

    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/pid_max").write_text(pid_max + "\n")
    (tmp_path / "proc/5000").mkdir()
    assert existing_pids(Host(str(tmp_path)), ["5000"]) == (5000,)
    (tmp_path / "proc/sys/kernel/pid_max").write_text("4096\n")  # plausible: trusted
    with pytest.raises(Exception, match="pid_max"):
        existing_pids(Host(str(tmp_path)), ["5000"])
