"""Small real programs for the probe tests, each ending by itself (a minute at most).

C programs are compiled here with gcc (``-g`` so the malloc probe's stacks name
their functions); :func:`start` runs one, waits for its ``ready`` line, and
:func:`stopped` kills whatever is left when the test ends, so a failing test
leaves no process behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).parent
# Frame pointers, so that bpftrace's ustack() can walk the workloads' stacks.
CFLAGS = ("-O1", "-g", "-fno-omit-frame-pointer", "-pthread")
_BUILD = (Path(tempfile.gettempdir())
          / f"tailgate-workloads-{os.getuid()}-{zlib.crc32(' '.join(CFLAGS).encode()):08x}")


def build(name: str) -> Path:
    """Compile ``NAME.c`` once per version of its source and return the binary."""
    src = HERE / f"{name}.c"
    # keyed on the source's content: checkouts with different versions of a program (git
    # worktrees side by side) never run each other's binary; the file keeps the program's name
    # (its comm, which tests check)
    out = _BUILD / f"{zlib.crc32(src.read_bytes()):08x}" / name
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([shutil.which("gcc") or "gcc", *CFLAGS, "-o", str(tmp), str(src)],
                       check=True, capture_output=True, timeout=120)
        tmp.replace(out)
    return out


def argv_for(name: str, *args: object) -> list[str]:
    if (HERE / f"{name}.py").exists():
        return [sys.executable, str(HERE / f"{name}.py"), *map(str, args)]
    return [str(build(name)), *map(str, args)]


def start(name: str, *args: object) -> subprocess.Popen:
    """Start a workload and wait until it says ``ready`` (it is then in its loop)."""
    proc = subprocess.Popen(argv_for(name, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"workload {name} did not start: {line!r} {proc.stderr.read()!r}")
    return proc


def finish(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


@contextlib.contextmanager
def running(*specs: tuple) -> Iterator[list[subprocess.Popen]]:
    """``with running(("spin", 3), ("spin", 3)) as procs:`` — all killed on exit."""
    procs: list[subprocess.Popen] = []
    try:
        for spec in specs:
            procs.append(start(*spec))
        yield procs
    finally:
        for p in procs:
            finish(p)


def tracefs_mounted() -> Iterator[None]:
    """A fixture body: mount tracefs where it is absent (MACHINE.md: a fresh VM boots
    without it), and unmount it afterwards if this mounted it."""
    events = Path("/sys/kernel/tracing/events")
    mounted = False
    if not events.exists() and not Path("/sys/kernel/debug/tracing/events").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=True,
                       capture_output=True, timeout=30)
        mounted = True
    try:
        yield
    finally:
        if mounted:
            subprocess.run(["umount", "/sys/kernel/tracing"], check=False, capture_output=True,
                           timeout=30)


SPIN_FOR_S = ("import sys, time\nend = time.monotonic() + float(sys.argv[1])\n"
              "while time.monotonic() < end: pass")


@contextlib.contextmanager
def busy_cpus(seconds: float = 900) -> Iterator[None]:
    """A normal-priority busy loop on each of our CPUs: the ordinary work of a shared CI
    host, which a timing-sensitive test must hold against."""
    with spawned([["taskset", "-c", str(cpu), sys.executable, "-c", SPIN_FOR_S, str(seconds)]
                  for cpu in sorted(os.sched_getaffinity(0))]):
        yield


@contextlib.contextmanager
def spawned(argvs: list[list[str]]) -> Iterator[list[subprocess.Popen]]:
    """Each argv started (no ``ready`` line awaited, unlike :func:`running`); all killed on
    exit. Wrappers that exec (chrt, taskset) leave kill() reaching the program itself."""
    procs = [subprocess.Popen(argv) for argv in argvs]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _ppid(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def realtime(pid: int, prio: int, cpu: int | None = None) -> None:
    """Every thread of ``pid`` and of its children SCHED_FIFO at ``prio`` (threads made
    later inherit it), and pinned to ``cpu`` when given: ordinary work cannot delay them."""
    children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == pid]
    for proc in (pid, *children):
        for tid in os.listdir(f"/proc/{proc}/task"):
            if cpu is not None:
                os.sched_setaffinity(int(tid), {cpu})
            os.sched_setscheduler(int(tid), os.SCHED_FIFO, os.sched_param(prio))
