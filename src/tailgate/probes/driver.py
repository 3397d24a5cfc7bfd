"""Run bpftrace programs: check the host can, start them, wait, stop them for sure.

A program here is a ``*.bt`` file shipped as package data; everything a run
varies is passed as integer positional parameters (``$1`` duration in ms,
``$2`` mode, ``$3..$10`` process ids), never by editing the program text.
Each program ends itself (``interval:ms:$1 { exit(); }``), and the driver still
enforces a deadline: bpftrace 0.17 sometimes ignores the first SIGINT, so the
driver repeats it, then sends SIGTERM, then SIGKILL to bpftrace's own process
group. Closing bpftrace's file descriptors detaches its probes, so nothing stays
attached once the process is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .. import ending
from ..host import Host, valid_pid
from ..model import SourceError
from .output import BpftraceOutput, parse_output

MAX_PIDS = 8  # $3..$10 in every program
TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
START_TIMEOUT_S = 30.0  # compile + attach; slow on a loaded 2-core machine
DRAIN_TIMEOUT_S = 15.0  # after the window: printing the maps
STOP_STEPS = ((signal.SIGINT, 1.0), (signal.SIGINT, 1.0), (signal.SIGTERM, 1.0),
              (signal.SIGKILL, 2.0))
# Per-thread and per-bucket maps outgrow bpftrace's default of 4096 keys on a busy host.
MAP_KEYS_MAX = 65536
# Harmless on this kernel (memlock is not accounted that way since 5.11).
_NOISE = ("couldn't set RLIMIT_MEMLOCK",)

Progress = Callable[[str, float], None]  # (phase, seconds sampled so far)


def program_path(name: str) -> Path:
    path = resources.files("tailgate.probes").joinpath(f"{name}.bt")
    if not path.is_file():
        raise ValueError(f"no probe program {name}.bt")
    return Path(str(path))


def program_text(name: str) -> str:
    return program_path(name).read_text(encoding="utf-8")


def unavailable(host: Host | None = None, *, euid: int | None = None,
                which: Callable[[str], str | None] = shutil.which,
                tracefs_dirs: Sequence[str] = TRACEFS_DIRS) -> str | None:
    """Why probes cannot run on ``host`` (None when they can). Checks, in order:
    a live host, root, the bpftrace binary, a mounted tracefs."""
    host = host or Host("/")
    if not host.live:
        return f"eBPF probes run only on the live host, not on a host root ({host.root})"
    uid = os.geteuid() if euid is None else euid
    if uid != 0:
        return f"bpftrace needs root (running as uid {uid})"
    if which("bpftrace") is None:
        return "bpftrace is not installed (Debian: apt-get install bpftrace)"
    if not any(host.exists(f"{d}/events") for d in tracefs_dirs):
        return ("tracefs is not mounted, so tracepoints cannot be attached "
                "(mount -t tracefs nodev /sys/kernel/tracing)")
    return None


@dataclass(frozen=True)
class Run:
    """One bpftrace invocation: which program, for how long, in which mode, for whom."""

    program: str
    duration_s: float
    mode: int = 0
    pids: tuple[int, ...] = ()
    # A program generated from a fixed template (malloc: its uprobes depend on the
    # allocators found), run with -e instead of the shipped file.
    text: str | None = None
    # Integers after the pids ($11, $12, ...): diagnose's service port.
    extra: tuple[int, ...] = ()

    def params(self) -> list[str]:
        ms = int(round(self.duration_s * 1000))
        if not 1 <= ms <= 24 * 3600 * 1000:
            raise ValueError(f"probe duration must be between 1 ms and 24 h, not {self.duration_s!r}")
        if self.mode not in (0, 1, 2):
            raise ValueError(f"invalid probe mode {self.mode!r}")
        pids = [valid_pid(p) for p in self.pids]
        if len(pids) > MAX_PIDS:
            raise ValueError(f"at most {MAX_PIDS} process ids per probe, got {len(pids)}")
        # Unused slots repeat the first pid so that none matches pid 0 (the idle task).
        slots = (pids + [pids[0]] * MAX_PIDS)[:MAX_PIDS] if pids else [0] * MAX_PIDS
        for x in self.extra:
            if not (isinstance(x, int) and 0 <= x < 2**32):
                raise ValueError(f"invalid probe parameter {x!r}")
        return [str(ms), str(self.mode), *(str(p) for p in slots), *map(str, self.extra)]

    def argv(self) -> list[str]:
        program = ["-e", self.text] if self.text else [str(program_path(self.program))]
        return ["bpftrace", "-f", "json", *program, *self.params()]


@dataclass(frozen=True)
class Result:
    run: Run
    output: BpftraceOutput
    sampled_s: float  # from probes attached to bpftrace exiting
    startup_s: float  # from spawn to probes attached
    stopped: str | None  # how it was stopped, when it did not end by itself


def _stderr_reason(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines()
             if ln.strip() and not any(n in ln for n in _NOISE)]
    errors = [ln for ln in lines if "ERROR" in ln]
    return (errors or lines or ["no message"])[-1][:300]


class _Proc:
    """A running bpftrace with its output drained by threads (so a full pipe never blocks it)."""

    def __init__(self, run: Run, argv: list[str] | None = None):
        self.run = run
        self.spawned = time.monotonic()
        self.attached_at: float | None = None
        self.exited_at: float | None = None
        self.out: list[str] = []
        self.err: list[str] = []
        env = {**os.environ, "LC_ALL": "C", "BPFTRACE_MAP_KEYS_MAX": str(MAP_KEYS_MAX)}
        if run.mode == 2:  # a line per sample: a larger ring buffer so that none is lost
            env["BPFTRACE_PERF_RB_PAGES"] = "1024"
        try:
            self.proc = subprocess.Popen(
                argv or run.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                preexec_fn=ending.die_with_parent_fn())
        except OSError as exc:
            raise SourceError(f"cannot start bpftrace: {exc.strerror or exc}") from exc
        ending.track(self.proc.pid)
        self.threads = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out),
                                         daemon=True),
                        threading.Thread(target=self._read, args=(self.proc.stderr, self.err),
                                         daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self, stream, sink: list[str]) -> None:
        for line in stream:
            if self.attached_at is None and '"attached_probes"' in line:
                self.attached_at = time.monotonic()
            sink.append(line)
        stream.close()

    def stop(self) -> str | None:
        """End bpftrace for sure: SIGINT (twice: 0.17 may ignore one), SIGTERM, SIGKILL."""
        if self.proc.poll() is not None:
            return None
        for sig, wait_s in STOP_STEPS:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return signal.Signals(sig).name
            try:
                self.proc.wait(timeout=wait_s)
                return signal.Signals(sig).name
            except subprocess.TimeoutExpired:
                continue
        return "SIGKILL (still running)"  # pragma: no cover - a process that survives SIGKILL

    def finish(self) -> None:
        for t in self.threads:
            t.join(timeout=5)


def run_probes(runs: Sequence[Run], on_progress: Progress | None = None,
               poll_s: float = 0.1, cancelled: Callable[[], bool] | None = None
               ) -> list[Result | SourceError]:
    """Start every run at once, wait for all, and return a Result or the error per run.
    ``cancelled`` (polled): when it turns true (Ctrl-C in the main thread) every probe
    is stopped now and the call raises SourceError."""
    procs: list[_Proc | SourceError] = []
    try:
        for r in runs:
            try:
                procs.append(_Proc(r))
            except (SourceError, ValueError) as exc:
                procs.append(exc if isinstance(exc, SourceError) else SourceError(str(exc)))
        live = [p for p in procs if isinstance(p, _Proc)]
        window = max((p.run.duration_s for p in live), default=0.0)
        stopped: dict[int, str | None] = {}
        while live:
            if cancelled is not None and cancelled():
                raise SourceError("probes interrupted")
            now = time.monotonic()
            for p in list(live):
                if p.proc.poll() is not None:
                    p.exited_at = now
                    live.remove(p)
                    continue
                started = p.attached_at
                late = (started is None and now - p.spawned > START_TIMEOUT_S) or (
                    started is not None and now - started > p.run.duration_s + DRAIN_TIMEOUT_S)
                if late:
                    stopped[id(p)] = p.stop()
                    p.exited_at = time.monotonic()
                    live.remove(p)
            if on_progress is not None:
                attached = [p.attached_at for p in live if p.attached_at is not None]
                if live and len(attached) < len(live):
                    on_progress("attaching", 0.0)
                elif live:
                    sampled = now - min(attached)
                    # Past the window bpftrace is printing its maps.
                    on_progress("sampling" if sampled < window else "collecting",
                                min(window, sampled))
            if live:
                time.sleep(poll_s)
    finally:
        # Whatever happened (an exception, Ctrl-C), no bpftrace outlives this call.
        for p in procs:
            if isinstance(p, _Proc) and p.proc.poll() is None:
                p.stop()
            if isinstance(p, _Proc):
                ending.untrack(p.proc.pid)
    if on_progress is not None:
        on_progress("done", 0.0)
    return [p if isinstance(p, SourceError) else _result(p, stopped.get(id(p))) for p in procs]


def _result(p: _Proc, stopped: str | None) -> Result | SourceError:
    p.finish()
    end = p.exited_at or time.monotonic()
    stdout, stderr = "".join(p.out), "".join(p.err)
    rc = p.proc.returncode
    if p.attached_at is None:
        if stopped:
            return SourceError(f"bpftrace {p.run.program}.bt did not attach within "
                               f"{START_TIMEOUT_S:g} s and was stopped ({stopped})")
        return SourceError(f"bpftrace {p.run.program}.bt failed (exit {rc}): "
                           f"{_stderr_reason(stderr)}")
    if rc not in (0, None) and not stopped:
        return SourceError(f"bpftrace {p.run.program}.bt exited {rc}: {_stderr_reason(stderr)}")
    try:
        output = parse_output(stdout)
    except SourceError as exc:
        return exc
    return Result(run=p.run, output=output, sampled_s=round(end - p.attached_at, 3),
                  startup_s=round(p.attached_at - p.spawned, 3), stopped=stopped)


def run_probe(run: Run, on_progress: Progress | None = None) -> Result:
    """One run; raises SourceError with bpftrace's reason when it fails."""
    (res,) = run_probes([run], on_progress)
    if isinstance(res, SourceError):
        raise res
    return res


@contextlib.contextmanager
def attached(run: Run, argv: list[str] | None = None) -> Iterator[_Proc]:
    """Hold a probe attached for the body of a ``with`` (benchmarks: a workload runs under
    it); stopped for sure on exit. ``argv`` runs another bpftrace program (a peer tool)."""
    p = _Proc(run, argv)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while p.attached_at is None:
            if p.proc.poll() is not None or time.monotonic() > deadline:
                raise SourceError(f"bpftrace did not attach: {_stderr_reason(''.join(p.err))}")
            time.sleep(0.01)
        yield p
    finally:
        p.stop()
        ending.untrack(p.proc.pid)
        p.finish()
