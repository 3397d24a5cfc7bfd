"""Drive a workload against an endpoint: open loop (rate, trace) or closed (concurrency).

Open loop: request *i* is due at its intended time (from
:func:`tailgate.bench.schedule.arrival_times`, or the trace's timestamps)
whatever the server does; every figure is measured from that intended time, so
a server that stalls shows the stall in TTFT and E2E instead of making the
generator wait (no coordinated omission). Closed loop (``concurrency``) keeps C
requests in flight; there the intended time is the moment a slot frees, and the
result says so.

The run ends on time: each request is bounded by ``intended + timeout``, so
the run ends by the last intended start plus the time-out, and a request still
open then is recorded as a ``timeout`` at its deadline. Every request the
schedule released gets exactly one record.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..bench.http1 import Limits
from .client import Endpoint, Record, stream_request
from .openai import Api, request_body
from .workload import LLMRequest


@dataclass(frozen=True)
class RunConfig:
    endpoint: Endpoint
    api: Api
    model: str
    timeout_s: float
    rate: float | None = None  # open loop at this rate (constant/poisson)
    arrival: str = "constant"
    concurrency: int | None = None  # closed loop with this many in flight
    trace: bool = False  # open loop at the workload's own offsets
    duration_s: float | None = None
    requests: int | None = None
    seed: int = 0
    usage: bool = True  # ask for usage with stream_options
    ignore_eos: bool = False
    limits: Limits = field(default_factory=Limits)  # header block and body bounds
    max_event_bytes: int = 16 << 20  # one server-sent event
    require_done: bool = True  # a stream is complete at data: [DONE] (the OpenAI API)


@dataclass
class RunResult:
    records: list[Record]
    start_ns: int  # perf_counter_ns of offset 0
    end_ns: int
    mode: str  # "open" or "closed"
    interrupted: bool = False


def intended_offsets(cfg: RunConfig) -> list[float] | None:
    """Offsets (s) of the open-loop schedule; None for trace replay or closed loop."""
    from ..bench.schedule import arrival_times

    if cfg.rate is None:
        return None
    if cfg.duration_s is not None:
        offsets = arrival_times(cfg.rate, cfg.duration_s, cfg.arrival, seed=cfg.seed)
        return offsets.tolist()[: cfg.requests] if cfg.requests else offsets.tolist()
    assert cfg.requests is not None
    # --requests N alone: the first N arrivals; draw a long enough horizon.
    horizon = (cfg.requests + 6 * cfg.requests ** 0.5 + 16) / cfg.rate
    offsets = arrival_times(cfg.rate, horizon, cfg.arrival, seed=cfg.seed).tolist()
    while len(offsets) < cfg.requests:
        horizon *= 2
        offsets = arrival_times(cfg.rate, horizon, cfg.arrival, seed=cfg.seed).tolist()
    return offsets[: cfg.requests]


async def _until(due_ns: int) -> None:
    """Sleep until ``due_ns``, never waking early (the loop's timers round to a
    millisecond and may fire before it): the last millisecond yields in a loop."""
    while True:
        wait = due_ns - time.perf_counter_ns()
        if wait <= 0:
            return
        await asyncio.sleep((wait - 1_000_000) / 1e9 if wait > 2_000_000 else 0)


async def _one(cfg: RunConfig, req: LLMRequest, rec: Record) -> Record:
    body = request_body(cfg.api, cfg.model, req.prompt, req.max_tokens, usage=cfg.usage,
                        ignore_eos=cfg.ignore_eos)
    deadline = rec.intended_ns + int(cfg.timeout_s * 1e9)
    return await stream_request(cfg.endpoint, cfg.api, body, rec, deadline, cfg.limits,
                                cfg.max_event_bytes, cfg.require_done)


def _record(i: int, req: LLMRequest, intended_ns: int) -> Record:
    return Record(index=i, intended_ns=intended_ns, conversation=req.conversation,
                  turn=req.turn, nominal_input=req.input_words)


async def run_open(cfg: RunConfig, work: Iterator[LLMRequest],
                   offsets: list[float] | None) -> RunResult:
    """Release each request at its intended time (``offsets``, or each request's own)."""
    lead = 50_000_000  # 50 ms to set up before offset 0
    start = time.perf_counter_ns() + lead
    tasks: list[asyncio.Task] = []
    records: list[Record] = []
    horizon = cfg.duration_s
    source: Iterator[tuple[float, LLMRequest]]
    if offsets is not None:
        source = zip(offsets, work, strict=False)
    else:
        source = ((r.offset_s or 0.0, r) for r in work)
    if cfg.requests is not None:
        source = itertools.islice(source, cfg.requests)
    try:
        for i, (off, req) in enumerate(source):
            if horizon is not None and off >= horizon:
                break
            due = start + int(off * 1e9)
            await _until(due)
            rec = _record(i, req, due)
            records.append(rec)
            tasks.append(asyncio.ensure_future(_one(cfg, req, rec)))
        if tasks:
            await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return RunResult(records, start, time.perf_counter_ns(), "open", interrupted=True)
    return RunResult(records, start, time.perf_counter_ns(), "open")


async def run_closed(cfg: RunConfig, work: Iterator[LLMRequest]) -> RunResult:
    """``concurrency`` workers, each sending its next request when the last one ends."""
    assert cfg.concurrency
    start = time.perf_counter_ns()
    stop = start + int(cfg.duration_s * 1e9) if cfg.duration_s is not None else None
    records: list[Record] = []
    counter = itertools.count()
    limit = cfg.requests

    async def worker() -> None:
        while True:
            now = time.perf_counter_ns()
            if stop is not None and now >= stop:
                return
            i = next(counter)
            if limit is not None and i >= limit:
                return
            try:
                req = next(work)
            except StopIteration:  # a finite workload (a trace) ran out
                return
            rec = _record(i, req, now)
            records.append(rec)
            await _one(cfg, req, rec)

    workers = [asyncio.ensure_future(worker()) for _ in range(cfg.concurrency)]
    try:
        await asyncio.gather(*workers)
    except asyncio.CancelledError:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        return RunResult(records, start, time.perf_counter_ns(), "closed", interrupted=True)
    return RunResult(records, start, time.perf_counter_ns(), "closed")


def run(cfg: RunConfig, work: Iterator[LLMRequest]) -> RunResult:
    """Run to completion on a fresh event loop (uvloop when installed)."""
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop is a dependency
        runner = asyncio.Runner()
    with runner:
        if cfg.concurrency:
            return runner.run(run_closed(cfg, work))
        offsets = None if cfg.trace else intended_offsets(cfg)
        return runner.run(run_open(cfg, work, offsets))
