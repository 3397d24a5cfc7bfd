"""Launching ``tailgate bench allreduce`` the way users do, for tests and benchmarks.

    proc = launch("mpi", 2, "--sizes", "1KB", "--json", path)     # mpirun -np 2 ...
    proc = launch("gloo", 2, ...)                                  # torchrun --nproc-per-node 2
    wait_for_line(proc, "measuring")                               # ranks are in the loop
    stall(rank_pid(proc, 1), 1.0, in_syscall=GAP_SLEEP)            # SIGSTOP rank 1 for 1 s,
                                                                   # while it sleeps in --gap
    out, err = proc.communicate(timeout=60)

``script=PATH`` runs a Python file under the launcher instead of ``-m tailgate``
(a fault-injection driver). Ranks are found among the launcher's descendants
by the rank their launcher gave them (``OMPI_COMM_WORLD_RANK`` / ``RANK``), so
another job on the machine is never touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
# x86-64 clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...): Python's time.sleep, i.e. a
# rank in its --gap. (An MPI library idling inside the call sleeps on other clocks.)
GAP_SLEEP = "230 0x1 0x1 "
_RANK_VARS = {"mpi": "OMPI_COMM_WORLD_RANK", "gloo": "RANK", "nccl": "RANK"}


def missing(backend: str) -> str | None:
    """Why `backend`'s launcher cannot run here (None: it can). Tests fail with it, never skip."""
    if backend == "mpi" and shutil.which("mpirun") is None:
        return "mpirun not found: apt-get install openmpi-bin libopenmpi-dev"
    mod, extra = ("mpi4py", "mpi") if backend == "mpi" else ("torch", "torch")
    try:
        __import__(mod)
    except ImportError:
        return f"{mod} not importable: pip install 'tailgate[{extra}]'"
    return None


def env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun would print a warning to set it
    # gloo finds its address from the host name, which need not resolve (a fresh root has no
    # /etc/hosts entry for it: "gai error: -2"); the ranks all run here, on loopback.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def command(backend: str, ranks: int, *args: str, script: str | None = None) -> list[str]:
    # -P: a script's own folder must not shadow the standard library (support/inspect.py)
    prog = [sys.executable, "-P", script] if script else [sys.executable, "-m", "tailgate"]
    prog += ["bench", "allreduce", "--backend", backend, *args]
    if backend == "mpi":
        launcher = ["mpirun", "--oversubscribe", "-np", str(ranks), "-x", "PYTHONPATH",
                    "-x", "OMP_NUM_THREADS"]
        if os.geteuid() == 0:
            launcher.insert(1, "--allow-run-as-root")
        return launcher + prog
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(ranks), "--no-python", *prog]


def launch(backend: str, ranks: int, *args: str, script: str | None = None) -> subprocess.Popen:
    return subprocess.Popen(command(backend, ranks, *args, script=script), env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def run(backend: str, ranks: int, *args: str, script: str | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = launch(backend, ranks, *args, script=script)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def kill(proc: subprocess.Popen) -> None:
    """End the launcher and every rank (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 60) -> list[str]:
    """Read stderr until a line containing ``text`` (returns the lines read)."""
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"launcher ended before {text!r}: {''.join(seen)}")
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"no {text!r} within {timeout} s: {''.join(seen)}")


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def rank_pid(proc: subprocess.Popen, rank: int, backend: str = "mpi") -> int:
    """The pid of ``rank`` among ``proc``'s descendants."""
    want = f"{_RANK_VARS[backend]}={rank}".encode()
    for pid in _descendants(proc.pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if want in env:
            return pid
    raise AssertionError(f"no rank {rank} under launcher {proc.pid}")


def stall(pid: int, seconds: float, in_syscall: str | None = None, timeout: float = 30) -> None:
    """Stop ``pid`` for ``seconds`` (SIGSTOP, then SIGCONT): a stall of known length.

    With ``in_syscall`` (the start of ``/proc/PID/syscall``, e.g. ``GAP_SLEEP``),
    wait until the process's main thread is in that system call first, so the
    stall lands where the caller wants it.
    """
    if in_syscall is not None:
        want = in_syscall
        deadline = time.monotonic() + timeout
        while True:
            with open(f"/proc/{pid}/syscall", encoding="ascii") as f:
                if f.read().startswith(want):
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"pid {pid} never entered system call {in_syscall}")
            time.sleep(0.0001)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
