"""Ending: whatever ends tailgate (SIGTERM, SIGHUP, SIGINT, SIGKILL), every command it
started dies with it; none is left reparented to init. Real processes, real bpftrace."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support.signals import hangup_and_interrupt_default

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) of ``pid``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live descendant of ``root``."""
    kids: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[1] != "Z":
                kids.setdefault(st[0], []).append(int(entry))
                starts[int(entry)] = st[2]
    out, todo = {}, [root]
    while todo:
        for child in kids.get(todo.pop(), []):
            out[child] = starts[child]
            todo.append(child)
    return out


def alive(procs: dict[int, int]) -> list[int]:
    """The processes of ``procs`` still running (the same process: start time checked)."""
    out = []
    for pid, start in procs.items():
        st = _stat(pid)
        if st is not None and st[2] == start and st[1] != "Z":
            out.append(pid)
    return out


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def wait_for(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def end_and_check(proc: subprocess.Popen, sig: int, children: dict[int, int]) -> int:
    proc.send_signal(sig)
    rc = proc.wait(timeout=60)
    # Killed children are gone at once; give the kernel a bounded moment to deliver.
    deadline = time.monotonic() + 10
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive(children)
    for pid in left:  # do not leave them behind even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"children survived {signal.Signals(sig).name}: {left}"
    return rc


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig,rc", [(signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                    (signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_inspect_with_probes_takes_bpftrace_with_it(tmp_path, sig, rc):
    # a missing tool or privilege is a failure with its reason, never a skip (the suite's rule)
    if shutil.which("bpftrace") is None:
        pytest.fail("bpftrace is not installed (apt-get install bpftrace; make test installs it)")
    if os.geteuid() != 0:
        pytest.fail("bpftrace needs root: run the suite as root, as make test and CI do")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailgate", "inspect", "--probe-window", "60", "--interval", "0",
         "--no-history", "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC}, preexec_fn=hangup_and_interrupt_default)
    try:
        def bpftrace() -> dict[int, int]:
            kids = descendants(proc.pid)
            return kids if any(comm(p) == "bpftrace" for p in alive(kids)) else {}

        children = wait_for(bpftrace, 60, "bpftrace to start under tailgate")
        time.sleep(0.5)  # let it attach: the handlers must work mid-probe, not only at start
        children.update(descendants(proc.pid))
        got = end_and_check(proc, sig, children)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert got == rc, proc.stderr.read().decode()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_a_command_run_by_the_host_dies_with_tailgate(sig):
    # `tailgate inspect` runs its commands through Host.run; a command that hangs (a stuck
    # ethtool, pmc) is what a SIGTERM meets. The real CLI is run with a hung command.
    code = textwrap.dedent("""
        import sys
        from tailgate import cli
        from tailgate.host import Host

        class Args:
            command = "test"
            @staticmethod
            def func(args):
                print("started", flush=True)
                Host("/").run(["sleep", "300"], timeout_s=300)

        cli.build_parser = lambda: type("P", (), {"parse_args": lambda self, a: Args()})()
        sys.exit(cli.main([]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": SRC},
                            preexec_fn=hangup_and_interrupt_default)
    try:
        assert proc.stdout.readline() == b"started\n"

        def sleeping() -> dict[int, int]:
            kids = descendants(proc.pid)
            return kids if any(comm(p) == "sleep" for p in alive(kids)) else {}

        children = wait_for(sleeping, 30, "the command to start")
        rc = end_and_check(proc, sig, children)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == (-9 if sig == signal.SIGKILL else 128 + sig), proc.stderr.read().decode()
