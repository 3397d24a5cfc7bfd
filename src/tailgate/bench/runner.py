"""``run(spec) -> BenchResult``: one benchmark from a :class:`~.spec.BenchSpec`, on this host.

The library call every local path makes (the ``bench`` command, ``diagnose``, ``--sweep``):
plan the workers, run them (stopping early when ``--confidence`` is reached), merge
exactly, add the chosen percentiles, judge the SLOs (:func:`.slo.evaluate`, the one
meaning of an SLO) and merge the per-request log. It prints nothing; the live display
is the caller's (:class:`Hooks`), and :func:`tailgate.report.bench_outputs.save` writes
the other outputs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import EXIT_INTERRUPTED, TailgateError, UsageError
from .result import BenchResult
from .spec import BenchSpec


class NoResult(TailgateError):
    """No worker returned a result (each one failed or the run was stopped at once)."""


@dataclass(frozen=True)
class Hooks:
    """What the caller watches: progress messages per worker, and the agreed start."""

    on_progress: Callable[[int, dict[str, Any]], None] | None = None
    on_start: Callable[[float], None] | None = None


def run(spec: BenchSpec, hooks: Hooks = Hooks()) -> BenchResult:
    """Run ``spec`` and return its result (``result.json`` is the ``tailgate_bench``
    document); Ctrl-C ends the run early and the result says ``interrupted``."""
    from .result import build_result, merge_logs, owed_by_worker
    from .workers import WorkerFailure, run_workers

    if spec.protocol == "udp":  # datagrams: the compiled loop of bench.udp
        from .udp import run as run_udp

        return run_udp(spec, hooks)
    info, opts = spec.info, spec.options
    parts = [f"{opts.log}.part{k}" for k in range(info.workers)] if opts.log else None
    cfgs = configs(spec, info, parts)
    watch = None
    if info.confidence:
        from .confidence import ConfidenceWatch

        watch = ConfidenceWatch(list(info.confidence), info.spec, info.warmup_s, info.workers)
    started: dict[str, float] = {}

    def on_progress(worker: int, msg: dict[str, Any]) -> None:
        if hooks.on_progress is not None:
            hooks.on_progress(worker, msg)
        if watch is not None:
            watch.update(worker, msg)

    def on_start(start: float) -> None:
        started["mono"] = start
        started["epoch"] = time.time() + (start - time.monotonic())
        if watch is not None:
            watch.start = start
        if hooks.on_start is not None:
            hooks.on_start(start)

    try:
        results, interrupted, missing = run_workers(
            cfgs, on_progress=on_progress if hooks.on_progress or watch else None,
            on_start=on_start, ready_timeout_s=info.timeout_s + 30.0,
            end_when=watch.reached if watch is not None else None)
    except WorkerFailure as exc:
        raise UsageError(str(exc)) from None
    if not results:
        err = NoResult("no worker returned a result")
        if interrupted:
            err.exit_status = EXIT_INTERRUPTED
        raise err
    result = build_result(info, results, interrupted, missing,
                          confidence_after_s=watch.after_s if watch is not None else None,
                          owed=owed_by_worker(cfgs))
    result.stopped = interrupted
    judge(spec, result)
    # CLOCK_MONOTONIC of the log's time 0: `tailgate diagnose` lines requests up with probes.
    result.json["clock"] = {"start_monotonic_s": started.get("mono"),
                            "start_epoch_s": started.get("epoch")}
    result.start_epoch_s = started.get("epoch", time.time())
    if parts:
        with open(opts.log, "w", encoding="ascii") as f:  # type: ignore[arg-type]
            merge_logs(f, parts, llm=info.llm is not None)
        for path in parts:
            if os.path.exists(path):
                os.unlink(path)
    return result


def configs(spec: BenchSpec, info=None, parts: list[str] | None = None) -> list:
    """The workers' configurations of ``spec`` (its own :class:`~.result.RunInfo`, or
    ``info``: the fleet's, split over many nodes), each with its share of the schedule."""
    from .workers import plan

    return plan(info or spec.info, spec.target, parts, schedule=spec.schedule,
                **spec.engine_fields)


def judge(spec: BenchSpec, result: BenchResult) -> BenchResult:
    """The merged result's chosen percentiles and its SLO verdicts (:func:`.slo.evaluate`,
    the one meaning of an SLO): every path's last step, one host or many."""
    from ..slo import evaluate
    from .result import add_percentiles

    if spec.options.percentiles:
        add_percentiles(result, list(spec.options.percentiles))
    result.json["slo"] = evaluate(list(spec.slos), result.json)
    return result

