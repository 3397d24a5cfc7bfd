"""N engine processes for one run, started together and merged exactly.

Each worker gets its share of the schedule (:func:`.schedule.arrival_times`
with ``worker=k``), of the initial and maximum connections, and its own event
loop (uvloop when available). The parent forks them, waits until each has
opened its initial connections, then sends one common start time on
CLOCK_MONOTONIC (system-wide, so every worker's schedule lines up). Workers
send progress a few times a second and one :class:`.engine.WorkerResult` at
the end; the parent sends SIGUSR1 (stop) on Ctrl-C (workers ignore SIGINT themselves
so the stop is orderly), and SIGUSR2 (:meth:`.engine.Engine.end_schedule`: dispatch
nothing more, finish what was sent) when ``end_when`` says the run has measured
enough (``--confidence``).

:func:`run_here` runs one engine in the calling process instead (library use).

Each config's ``engine`` picks the engine (:func:`.fastpath.choose`): the compiled
fast path for http(s)://, tcp:// and openai+http(s):// when it is built, else the Python
reference.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import resource
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from .. import ending
from .engine import PythonEngine
from .engine_types import EngineConfig, WorkerResult
from .fastpath import FastEngine, choose, url_scheme
from .recording import LoadEngine
from .result import RunInfo
from .schedule import Ramp, arrival_times
from .target import Target

START_LEAD_S = 0.1  # between "go" and the first intended start: every worker is listening


def default_workers() -> int:
    """One per CPU this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:
        return os.cpu_count() or 1


def _share(total: int, k: int, n: int) -> int:
    return total // n + (1 if k < total % n else 0)


def global_schedule(rate: float, duration_s: float | None, arrival: str,
                    requests: int | None, seed: int | None, *, burstiness: float = 1.0,
                    ramp: Ramp | None = None) -> np.ndarray:
    """One process's view of the whole schedule: offsets within ``duration_s``, the first
    ``requests`` of them (with no duration: the first ``requests`` arrivals)."""
    kw = {"seed": seed, "burstiness": burstiness, "ramp": ramp}
    if duration_s is not None:
        times = arrival_times(rate, duration_s, arrival, **kw)  # type: ignore[arg-type]
        return times[:requests] if requests is not None else times
    if requests is None:
        raise ValueError("a schedule needs a duration or a request count")
    horizon = (requests + 6 * (requests / min(burstiness, 1.0)) ** 0.5 + 16) / rate
    times = arrival_times(rate, horizon, arrival, **kw)  # type: ignore[arg-type]
    while times.size < requests:
        horizon *= 2
        times = arrival_times(rate, horizon, arrival, **kw)  # type: ignore[arg-type]
    return times[:requests]


def plan(info: RunInfo, target: Target, log_parts: list[str] | None = None,
         progress_s: float = 0.25, schedule: np.ndarray | None = None,
         requests: list[bytes] | None = None, nominal: np.ndarray | None = None,
         **extra: Any) -> list[EngineConfig]:
    """One :class:`EngineConfig` per worker; together they are exactly the run asked for.

    With a global ``schedule`` (sorted offsets: ``--requests``, a trace) worker *k*
    takes every *N*-th request of it; ``requests`` (per request of the schedule: its
    bytes) and ``nominal`` (its input length) go with them. ``extra`` are further
    :class:`EngineConfig` fields, the same for every worker."""
    n = info.workers
    cfgs = []
    for k in range(n):
        mine: dict[str, Any] = {}
        if schedule is not None:
            times = np.asarray(schedule[k::n], dtype=np.float64)
            if requests is not None:
                mine["requests"] = tuple(requests[k::n])
            if nominal is not None:
                mine["nominal_input"] = np.asarray(nominal[k::n], dtype=np.int64)
        else:
            times = arrival_times(info.rate, info.warmup_s + info.duration_s, info.arrival,  # type: ignore[arg-type]
                                  worker=k, workers=n, seed=info.seed,
                                  burstiness=info.burstiness, ramp=info.ramp)
        cfgs.append(EngineConfig(
            target=target, times=times, warmup_s=info.warmup_s,
            connections=_share(info.connections, k, n),
            max_connections=max(_share(info.max_connections, k, n), 1),
            timeout_s=info.timeout_s,
            log_path=log_parts[k] if log_parts else None,
            hdr_interval_s=info.hdr_interval_s, progress_s=progress_s, worker=k,
            spec=info.spec, limits=info.limits, retry_stale=info.retry_stale,
            coalesce_s=info.coalesce_s, engine=info.engine, **mine, **extra))
    return cfgs


def _raise_nofile(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def make_engine(cfg: EngineConfig,
                on_progress: Callable[[dict[str, Any]], None] | None = None) -> LoadEngine:
    """The engine ``cfg.engine`` asks for (:func:`.fastpath.choose`): compiled or Python."""
    _raise_nofile(cfg.max_connections + 256)
    if choose(cfg.engine, url_scheme(cfg.target)) == "fast":
        return FastEngine(cfg, on_progress)
    return PythonEngine(cfg, on_progress)


def run_here(cfg: EngineConfig, on_progress: Callable[[dict[str, Any]], None] | None = None,
             lead_s: float = START_LEAD_S) -> WorkerResult:
    """Run one engine in this process, start ``lead_s`` from now."""
    engine = make_engine(cfg, on_progress)
    try:
        engine.prepare()
        return engine.run(time.monotonic() + lead_s)
    finally:
        engine.close()


def _child(pipe: Pipe, cfg: EngineConfig) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    engine = make_engine(cfg, lambda d: pipe.send(("progress", cfg.worker, d)))
    engine.on_signal(signal.SIGUSR1, engine.stop)
    engine.on_signal(signal.SIGUSR2, engine.end_schedule)
    engine.prepare()
    pipe.send(("ready", cfg.worker, None))
    msg = pipe.recv()
    result = engine.run(msg[1] if msg[0] == "start" else time.monotonic())
    engine.close()
    pipe.send(("done", cfg.worker, result))
    pipe.close()


class WorkerFailure(RuntimeError):
    """A worker could not start (the message says which and why)."""


def run_workers(cfgs: list[EngineConfig],
                on_progress: Callable[[int, dict[str, Any]], None] | None = None,
                on_start: Callable[[float], None] | None = None,
                ready_timeout_s: float = 30.0,
                end_when: Callable[[], bool] | None = None,
                ) -> tuple[list[WorkerResult], bool, list[int]]:
    """Run every config in its own process. Returns (results, interrupted, missing workers).

    ``end_when`` is asked after every progress message; once it returns true every
    worker ends its schedule (SIGUSR2) and the run ends when what was sent is done.

    Ctrl-C (KeyboardInterrupt in the parent) stops the workers, which still
    return what they measured. A worker that dies or hangs past the run's end
    plus a grace period is listed as missing instead of hanging the run.
    """
    ctx = mp.get_context("fork")
    pipes: dict[int, Pipe] = {}
    procs: dict[int, Any] = {}
    for cfg in cfgs:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_child, args=(child, cfg), daemon=True,
                        name=f"tailgate-bench-{cfg.worker}")
        p.start()
        ending.track(p.pid, group=False)  # SIGTERM to tailgate ends the workers too
        child.close()
        pipes[cfg.worker], procs[cfg.worker] = parent, p
    results: dict[int, WorkerResult] = {}
    missing: list[int] = []
    interrupted = False
    try:
        ready: set[int] = set()
        deadline = time.monotonic() + ready_timeout_s
        while len(ready) < len(cfgs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerFailure("workers did not get ready in time: "
                                    f"{sorted(set(pipes) - ready)}")
            for c in wait([pipes[k] for k in pipes if k not in ready], timeout=left):
                k = next(k for k, p in pipes.items() if p is c)
                try:
                    msg = c.recv()
                except EOFError:
                    raise WorkerFailure(f"worker {k} exited while starting "
                                        f"(exit code {procs[k].exitcode})") from None
                if msg[0] == "ready":
                    ready.add(k)
        start = time.monotonic() + START_LEAD_S
        for c in pipes.values():
            c.send(("start", start))
        if on_start is not None:
            on_start(start)
        longest = max((float(c.times[-1]) for c in cfgs if c.times.size), default=0.0)
        end_by = start + longest + max(c.timeout_s for c in cfgs) + 30.0
        open_pipes = dict(pipes)
        ended = False
        while open_pipes:
            try:
                now = time.monotonic()
                if now > end_by:
                    missing.extend(sorted(open_pipes))
                    break
                for c in wait(list(open_pipes.values()), timeout=min(0.25, end_by - now)):
                    k = next(k for k, p in open_pipes.items() if p is c)
                    try:
                        msg = c.recv()
                    except (EOFError, OSError):
                        missing.append(k)
                        del open_pipes[k]
                        continue
                    if msg[0] == "progress":
                        if on_progress is not None:
                            on_progress(k, msg[2])
                        if end_when is not None and not ended and end_when():
                            ended = True
                            for j in open_pipes:
                                with contextlib.suppress(OSError):
                                    os.kill(procs[j].pid, signal.SIGUSR2)
                    elif msg[0] == "done":
                        results[k] = msg[2]
                        del open_pipes[k]
            except KeyboardInterrupt:
                if interrupted:  # a second Ctrl-C: give up on stragglers soon
                    end_by = min(end_by, time.monotonic() + 2.0)
                    continue
                interrupted = True
                for k in open_pipes:
                    with contextlib.suppress(OSError):
                        os.kill(procs[k].pid, signal.SIGUSR1)
                end_by = min(end_by, time.monotonic() + 10.0)
    finally:
        for k, p in procs.items():
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
            ending.untrack(p.pid)
            pipes[k].close()
    return [results[k] for k in sorted(results)], interrupted, sorted(missing)
