"""Progress on long work: inspect says what it is doing on a terminal's stderr (rich), and
nothing when stderr is not a terminal or with --quiet (issue 25)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from support.inspect import diagnose_code, gate_code

ROOT = Path(__file__).parent / "fixtures" / "roots" / "vm-kvm"
INSPECT = [sys.executable, "-m", "tailgate", "inspect", "--root", str(ROOT), "--interval", "1",
           "--no-history"]


def run_with_tty_stderr(*extra: str, argv: list[str] = INSPECT) -> tuple[int, str, str]:
    master, slave = os.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the slave side closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    proc = subprocess.run([*argv, *extra], stdout=subprocess.PIPE, stderr=slave, text=True,
                          timeout=120, env=env)
    os.close(slave)
    reader.join(10)
    os.close(master)
    return proc.returncode, proc.stdout, b"".join(chunks).decode("utf-8", "replace")


def decided(report: Path) -> int:
    """The exit status the fixture root's JSON report decides."""
    return gate_code(json.loads(report.read_text()))


def test_inspect_shows_its_phases_on_a_terminal(tmp_path):
    rc, out, err = run_with_tty_stderr("--json", str(tmp_path / "r.json"))
    assert rc == decided(tmp_path / "r.json")
    assert "tailgate inspect: waiting the 1 s interval" in err
    assert "tailgate inspect: sampling" in err and "sources (t1)" in err
    assert "verdict:" in out and "tailgate inspect:" not in out  # the report stays on stdout


def test_no_progress_with_quiet_on_a_terminal_or_without_a_terminal(tmp_path):
    rc, out, err = run_with_tty_stderr("--quiet", "--json", str(tmp_path / "q.json"))
    assert rc == decided(tmp_path / "q.json") and "tailgate inspect:" not in err
    proc = subprocess.run([*INSPECT, "--json", str(tmp_path / "p.json")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == decided(tmp_path / "p.json") and proc.stderr == ""


def test_diagnose_says_what_it_is_doing_on_a_terminal(tmp_path):
    """Passive diagnose of a sleeping process for 1 s (root, bpftrace: the probes attach)."""
    from support.require import require
    from tailgate.probes.driver import unavailable

    require(unavailable())
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        master, slave = os.openpty()
        chunks: list[bytes] = []

        def drain() -> None:
            while True:
                try:
                    data = os.read(master, 4096)
                except OSError:
                    return
                if not data:
                    return
                chunks.append(data)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        proc = subprocess.run([sys.executable, "-m", "tailgate", "diagnose", "--pid",
                               str(sleeper.pid), "--duration", "1s", "--json",
                               str(tmp_path / "d.json")], stdout=subprocess.PIPE, stderr=slave,
                              text=True, timeout=180, env={**os.environ, "TERM": "xterm"})
        os.close(slave)
        reader.join(10)
        os.close(master)
    finally:
        sleeper.kill()
        sleeper.wait()
    err = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == diagnose_code(json.loads((tmp_path / "d.json").read_text())), err
    assert "tailgate diagnose: compiling and attaching the eBPF probes" in err
    assert "tailgate diagnose: watching the service for 1 s" in err


def test_plan_prefix_cache_says_what_it_is_doing_on_a_terminal():
    trace = Path(__file__).parent / "fixtures" / "llm" / "mooncake_synthetic_trace.jsonl.gz"
    argv = [sys.executable, "-m", "tailgate", "plan", "prefix-cache", str(trace), "--curve", "3"]
    rc, out, err = run_with_tty_stderr(argv=argv)
    assert rc == 0, err
    assert "tailgate plan prefix-cache: replaying" in err and "unlimited" in out
    quiet = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == out.replace("\r\n", "\n")


def test_serve_once_says_what_it_is_doing_on_a_terminal():
    from support.require import require
    from tailgate.probes.driver import unavailable

    require(unavailable())
    argv = [sys.executable, "-m", "tailgate", "serve", "--once", "--interval", "0.5",
            "--probe-window", "1"]
    rc, out, err = run_with_tty_stderr(argv=argv)
    assert rc == 0, err
    assert "tailgate serve --once: running the runqlat probe for 1 s" in err
    assert "tailgate serve --once: inspecting (two samples 0.5 s apart)" in err
    assert "tailgate_" in out and "tailgate serve" not in out  # the metrics stay clean
