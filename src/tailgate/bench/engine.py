"""One load-generating process: open-loop schedule, connection pool, time-outs, recording.

Theory of operation
-------------------
The schedule (``times``) fixes when every request is due. A precise waker
(:mod:`.timer`) fires at the next due time; :meth:`Engine._dispatch` takes every
request due by *now* and

1. hands it to an idle connection (sent at once), or
2. queues it FIFO and opens a new connection if fewer connections are opening
   than requests are queued, fewer than ``MAX_CONNECTING`` attempts are in
   flight and the pool is below ``max_connections``.

Wake-ups cost CPU (see :meth:`Engine._tick_period`): slow schedules get one
exact wake-up per request, fast ones a ticking timer and batches, and a
response that arrives when a request is due sends it at once.

A connection that finishes a response (or finishes connecting) takes the head
of the queue. So the server sees the schedule's real burst up to
``max_connections`` concurrent requests, and beyond that requests wait in
our queue — and their latency still counts from their intended time.

Every request ends exactly once (a ``done`` flag per request id): with a
response (``ok`` or a status error), a failure (``connect``, ``reset``,
``protocol``, ``truncated``, ``too_large``, ``upgrade``, ``stale_connection``:
see :mod:`.outcome`), or a time-out. A connection is on the idle list at most
once (checked: a second entry would hand one connection two requests), and
bytes that arrive with no request in flight are the connection's error
(``conn_errors``), never the next request's.

Stale keep-alive: a request sent on a reused connection that closes before any
byte of the response is ``stale_connection``; with ``retry_stale`` it goes back
to the head of the queue instead (once) and waits for a connection opened for
it: reused connections pass it by (the server may have closed them too). A retry
that fails on its new connection is what it is (never stale). Its latency is
still counted from its intended time, so the failed attempt and the reconnect
stay in the figures; its service time is that of the retry.

Accounting is kept by independent counters, so a bookkeeping bug shows in the
result: ``sent`` (a counter bumped when a measured request gets its outcome),
the outcome counts (from the recorded outcomes), the latency histogram's count,
and ``abandoned`` (measured requests whose ``done`` flag is unset at the end).

Time-outs are found by a sweep over the oldest queued and in-flight requests
(both FIFO in intended order) and are recorded at ``intended + timeout``
exactly, whenever the sweep notices. The run ends when the last request has
ended, at most ``timeout`` after the last one was due, or when
:meth:`Engine.stop` is called (the requests still open are then reported as
``abandoned``, not as outcomes). :meth:`Engine.end_schedule` (``--confidence``
reached) instead cuts the schedule at the last request dispatched: those
complete normally, and the measured schedule becomes what was dispatched.

Per-request times are appended to plain lists in the hot path (cheap) and
turned into numpy arrays and histograms by :meth:`Engine._flush` a few times a
second — recording is vectorised, never a Python call per sample.

Protocols: the target's protocol (:mod:`.protocols`) gives the connection class;
nothing else here depends on it. Recording, the log and the result are
:mod:`.recording`'s, shared with the compiled engine (:mod:`.fastpath`). An ``openai`` request's bytes are
its own (``EngineConfig.requests``, by request id), and when it ends the engine
also keeps its connection's token state; ``_flush`` hands those to
:class:`tailgate.llm.accounting.TokenBook` (TTFT, ITL, TPOT, E2E histograms,
tokens, goodput), the same batch as the latencies.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from .conn import OUT_OF_STEP, Connection, monotonic
from .engine_types import MAX_CONNECTING, EngineConfig, WorkerResult
from .outcome import CODE, KINDS, OK, PROTOCOL, STALE, TIMEOUT
from .protocols import by_kind
from .recording import LoopState, Recorder, note_reason
from .timer import Waker
from .tls import DialError, client_context, dial

_CHUNK = 1 << 16
# The shortest wake-up period: above 1 / MIN_TICK_S requests/s per worker the timer
# ticks at this period and dispatches in batches (a wake-up costs ~20 µs of CPU).
MIN_TICK_S = 200e-6  # schedule entries turned into a Python list at a time
class Engine:
    """Runs one :class:`EngineConfig` on an event loop. See the module docstring."""

    def __init__(self, cfg: EngineConfig, loop: asyncio.AbstractEventLoop,
                 on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.cfg = cfg
        self.loop = loop
        self.on_progress = on_progress
        self.times = np.asarray(cfg.times, dtype=np.float64)
        self.n = int(self.times.size)
        t = cfg.target
        proto = by_kind(t.kind)
        self._llm = proto.tokens
        tokens = None
        if self._llm:
            from ..llm.accounting import TokenBook

            tokens = TokenBook(cfg.spec)
        # Times are sorted: request ids from here on are measured (after the warm-up).
        self.first_measured = int(np.searchsorted(self.times, cfg.warmup_s, side="left"))
        self.rec = Recorder(cfg, self.times, self.first_measured, on_progress, self._gauges,
                            tokens)
        self._factory: Callable[[], Connection] = proto.connections(self, cfg)
        self.n_sent = 0
        self.retried: set[int] = set()
        self.done = bytearray(self.n)
        self.idle: list[Connection] = []
        self.pending: deque[int] = deque()
        self._retries_queued = 0  # stale retries in pending (see _take)
        self.inflight: deque[tuple[int, Connection]] = deque()
        self.n_open = 0
        self.n_connecting = 0
        self.n_done = 0
        self.next_i = 0
        self.start = 0.0
        self.stopping = False
        self.schedule_ended = False
        self.finished: asyncio.Future[None] | None = None
        # connection statistics
        self.opened = 0
        self.connect_failures = 0
        self.max_open = 0
        self.connect_errors: dict[str, int] = {}
        self._tls = client_context(t.tls) if t.tls is not None else None
        self._connect_s: list[float] = []
        self._handshake_s: list[float] = []
        # hot-path records, turned into arrays by _flush
        self._rid: list[int] = []
        self._send: list[float] = []
        self._end: list[float] = []
        self._out: list[int] = []
        self._status: list[int] = []
        self._bytes: list[int] = []
        self._disp: list[float] = []
        self._disp_base = 0  # request id of _disp[0]
        self._queued_ids: list[int] = []
        self._tok: list[Any] = []  # openai+: each recorded request's token state
        self._chunk: list[float] = []
        self._chunk_lo = 0
        self._waker: Waker | None = None
        self._precise = False
        self._tick = 0.0
        self._slack = 0.0
        self._next_due = math.inf  # due time of request next_i (inf: none, or not started)
        self._cpu_s = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    # -- setup -----------------------------------------------------------------

    async def prepare(self) -> None:
        """Open the initial connections (failures are counted, not fatal)."""
        want = min(self.cfg.connections, self.cfg.max_connections)
        self.n_connecting += want
        await asyncio.gather(*(self._connect(initial=True) for _ in range(want)))

    async def run(self, start: float) -> WorkerResult:
        """Run the schedule from monotonic time ``start``; return when every request ended."""
        self.start = self.rec.start = start
        self.finished = self.loop.create_future()
        self.rec.open_log()
        self._waker = Waker(self.loop, self._dispatch)
        self._precise = self._waker.precise
        sweep = self.loop.call_at(self.loop.time(), self._sweep)
        self._next_progress = start + self.cfg.progress_s
        # A cyclic-GC pass over everything stalls the loop for milliseconds (lateness).
        # Freeze what exists now and collect the young generation rarely; not off
        # entirely, so a long run that does make cycles (failed connects) stays bounded.
        gc.collect()
        gc.freeze()
        cpu0 = time.process_time()
        thresholds = gc.get_threshold()
        gc.set_threshold(50_000, 50, 1000)
        try:
            if self.n and not self.stopping:
                self._tick, self._slack = self._tick_period()
                self._waker.at(start + float(self.times[0]), self._tick)
            else:
                self.finished.set_result(None)
            await self.finished
        finally:
            self._cpu_s = time.process_time() - cpu0
            gc.set_threshold(*thresholds)
            gc.unfreeze()
            sweep.cancel()
            self._waker.close()
            self._close_all()
        self._flush(final=True)
        self.rec.close_log()
        return self._result()

    def _tick_period(self) -> tuple[float, float]:
        """(period, slack) of the wake-up timer; (0, 0) means one-shot at each due time.

        Each wake-up costs ~20 µs of CPU under virtualisation and a re-arm ~10 µs,
        so: a constant schedule ticks at its own spacing (exact, re-armed only when
        rounding drift passes 5 µs); a Poisson one re-arms for every request; and
        above ``1 / MIN_TICK_S`` requests/s per worker both tick every
        ``MIN_TICK_S`` and send what is due in a batch (lateness at most one tick,
        and less under load: responses also trigger sends that are due, see
        :meth:`on_response`)."""
        if self.n < 2 or not self._waker.precise:
            return 0.0, 0.0
        mean = float(self.times[-1] - self.times[0]) / (self.n - 1)
        if mean < MIN_TICK_S:
            return MIN_TICK_S, MIN_TICK_S
        gaps = np.diff(self.times[:1024])
        if float(gaps.max() - gaps.min()) < 1e-9:
            return mean, 5e-6
        return 0.0, 0.0

    def stop(self) -> None:
        """Stop issuing requests and end the run now (Ctrl-C)."""
        self.stopping = True
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)

    def end_schedule(self) -> None:
        """Dispatch nothing more; requests already dispatched complete normally and the
        measured schedule becomes the requests dispatched (none is abandoned by this)."""
        if self.schedule_ended or self.stopping:
            return
        self.schedule_ended = True
        self.n = self.next_i
        self._next_due = math.inf
        if self._waker is not None:
            self._waker.disarm()
        self._check_finished()

    # -- the hot path ------------------------------------------------------------

    def _dispatch(self) -> None:
        if self.stopping:
            return
        now = monotonic()
        start, n = self.start, self.n
        i = self.next_i
        chunk, lo = self._chunk, self._chunk_lo
        idle, pending, inflight, disp = self.idle, self.pending, self.inflight, self._disp
        budget = 0
        while i < n:
            if i - lo >= len(chunk):
                lo = i
                chunk = self.times[i:i + _CHUNK].tolist()
                self._chunk, self._chunk_lo = chunk, lo
            due = start + chunk[i - lo]
            if due > now:
                budget += 1
                if budget > 1:
                    break
                now = monotonic()  # one fresh look before sleeping
                continue
            disp.append(now)
            while idle and not idle[-1].usable:
                idle.pop().idle = False
            if idle:
                conn = idle.pop()
                conn.idle = False
                conn.send(i, now)
                inflight.append((i, conn))
            else:
                pending.append(i)
                self._queued_ids.append(i)
                if len(pending) > self.n_connecting and not self.stopping:
                    self._maybe_open()
            i += 1
            if not i & 63:
                now = monotonic()  # a long burst: keep dispatch times honest
        self.next_i = i
        if i < n:
            nxt = self._next_due = start + chunk[i - lo]
            # Re-arming is a slow system call: keep a ticking timer when its next tick
            # is at (or within the slack after) the next due time; never let it be early.
            if self._tick:
                fire = self._waker.next_fire(now)
                if not (nxt <= fire <= nxt + self._slack):
                    self._waker.at(nxt, self._tick)
            else:
                self._waker.at(nxt)
        else:
            self._next_due = math.inf
            self._waker.disarm()
            self._check_finished()

    def on_response(self, conn: Connection, rid: int, outcome: int, status: int,
                    nbytes: int, reason: str = "") -> None:
        now = monotonic()
        if rid >= 0 and not self.done[rid]:
            self.done[rid] = 1
            self.n_done += 1
            if rid >= self.first_measured:
                self.n_sent += 1
                if outcome:
                    note_reason(self.rec.examples, KINDS[outcome], reason or KINDS[outcome])
            self._rid.append(rid)
            self._send.append(conn.t_send)
            self._end.append(now)
            self._out.append(outcome)
            self._status.append(status)
            self._bytes.append(nbytes)
            if self._llm:
                self._tok.append(conn.tokens())  # type: ignore[attr-defined]
        if conn.usable and conn.writing:
            conn.want_ready = True  # the rest of its request first (on_written)
        elif conn.usable:
            self._ready(conn, now)
        else:
            conn.abort()
        if self._next_due <= now:
            self._dispatch()  # already awake: send what is due without waiting for a tick
        elif self.next_i >= self.n and self.n_done == self.n:
            self._check_finished()

    def _ready(self, conn: Connection, now: float) -> None:
        """A connection is free: it takes the oldest queued request, or waits idle."""
        if conn.idle or conn.rid >= 0:
            raise AssertionError(f"connection freed twice (idle {conn.idle}, request "
                                 f"{conn.rid} in flight)")
        if self.pending and not self.stopping:
            # (-1: only retries wait, for a new connection: see on_stale)
            rid = self._take(not conn.served) if self._retries_queued else self.pending.popleft()
            if rid >= 0:
                conn.send(rid, now)
                self.inflight.append((rid, conn))
                return
        conn.idle = True
        self.idle.append(conn)

    def _take(self, fresh: bool) -> int:
        """With stale retries queued: the oldest request a connection may carry. A retry
        goes only on a connection opened for it (``fresh``: none served yet), since a
        reused one may have been closed by the server as the first was; a fresh one takes
        the first retry in the queue (only it can), else the oldest request; a reused one
        the oldest request that is not a retry. -1: none."""
        pending, retried, done = self.pending, self.retried, self.done
        other = -1
        for k, rid in enumerate(pending):
            if (rid in retried) == fresh and not done[rid]:
                break
            if other < 0 and fresh and not done[rid]:
                other = k
        else:
            if other < 0:
                return -1
            k = other
        rid = pending[k]
        del pending[k]
        if rid in retried:
            self._retries_queued -= 1
        return rid

    def _popleft(self) -> int:
        """The queue's head leaves it (a retry is counted out)."""
        rid = self.pending.popleft()
        if rid in self.retried:
            self._retries_queued -= 1
        return rid

    def on_stale(self, conn: Connection, rid: int, reason: str) -> None:
        """A reused connection died before any response byte: retry once (on a new
        connection: _take), or record it. The cap never holds the retry back, so no idle
        connection is closed for it: this connection's close (on_closed) frees the slot and
        opens one (more pending than connecting, unless one is opening already), and a new
        connection takes a waiting retry before anything else; one that fails to open
        records the queue's head, where the latest retry is."""
        if self.cfg.retry_stale and rid not in self.retried and not self.done[rid] \
                and not self.stopping:
            self.retried.add(rid)
            self.pending.appendleft(rid)  # (for a new connection: _take)
            self._retries_queued += 1
            self._maybe_open()
            return
        self.on_response(conn, rid, STALE, 0, 0, reason)

    def on_conn_error(self, conn: Connection, kind: int, reason: str) -> None:
        """The server broke the protocol with no request in flight (not a request's error)."""
        note_reason(self.rec.conn_errors, KINDS[kind], reason)

    def on_out_of_step(self, conn: Connection, rids: list[int]) -> None:
        """A stray response came on a reused connection: the requests in ``rids``
        completed ok on it after its first may have had an earlier request's response,
        so they are ``protocol`` after all (see conn.py)."""
        want = set(rids)
        out_rid, outs = self._rid, self._out
        for j in range(len(out_rid) - 1, -1, -1):  # not flushed yet: changed in place
            if not want:
                break
            r = out_rid[j]
            if r in want:
                want.discard(r)
                if outs[j] == OK:
                    outs[j] = PROTOCOL
                    if r >= self.first_measured:
                        note_reason(self.rec.examples, "protocol", OUT_OF_STEP)
        if want:
            self.rec.out_of_step(np.array(sorted(want), dtype=np.int64))

    def on_written(self, conn: Connection) -> None:
        """A connection whose response came while its request was still being written
        has written it all: now it is free."""
        if conn.usable:
            self._ready(conn, monotonic())
            if self._next_due <= monotonic():
                self._dispatch()
        else:
            conn.abort()

    def on_closed(self, conn: Connection) -> None:
        self.n_open -= 1
        if self.pending and not self.stopping:
            self._maybe_open()

    # -- connections ---------------------------------------------------------------

    def _maybe_open(self) -> None:
        cap = self.cfg.max_connections
        while (len(self.pending) > self.n_connecting
               and self.n_connecting < MAX_CONNECTING
               and self.n_open + self.n_connecting < cap):
            self.n_connecting += 1  # counted now, so this loop ends
            task = self.loop.create_task(self._connect())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, initial: bool = False) -> None:
        """One connection attempt; the caller has already counted it in ``n_connecting``."""
        t = self.cfg.target
        try:
            dialed = await dial(self.loop, self._factory, t.host, t.port, self._tls,
                                t.tls.sni if t.tls else None, self.cfg.timeout_s)
        except DialError as exc:
            self.n_connecting -= 1
            self.connect_failures += 1
            reason = exc.reason
            self.connect_errors[reason] = self.connect_errors.get(reason, 0) + 1
            if self.pending and not initial:
                # The oldest waiting request could not get this connection.
                rid = self._popleft()
                self._record_failure(rid, CODE[exc.kind], monotonic(), reason=reason)
                if self.pending and not self.stopping:
                    self._maybe_open()
            return
        conn = dialed.conn
        self._connect_s.append(dialed.connect_s)
        if dialed.handshake_s is not None:
            self._handshake_s.append(dialed.handshake_s)
        self.n_connecting -= 1
        self.n_open += 1
        self.opened += 1
        self.max_open = max(self.max_open, self.n_open)
        if self.stopping:
            conn.abort()
            return
        if not conn.usable:
            # Reset or closed before its first request was written (on_closed has run,
            # while this attempt still counted as connecting): no request was on it; the
            # queue gets another connection. (Writing to it would raise under uvloop and
            # kill this task with the request it had taken.)
            note_reason(self.rec.conn_errors, "reset", "connection closed or reset before its "
                                                   "first request was written")
            conn.abort()
            if self.pending and not self.stopping:
                self._maybe_open()
            return
        # Told whenever a write is held back (pause_writing): see Connection.writing.
        conn.transport.set_write_buffer_limits(0)
        self._ready(conn, monotonic())

    def _record_failure(self, rid: int, outcome: int, end: float, send: float = math.nan,
                        nbytes: int = 0, reason: str = "", tokens: Any = None) -> None:
        if self.done[rid]:
            return
        self.done[rid] = 1
        self.n_done += 1
        if rid >= self.first_measured:
            self.n_sent += 1
            note_reason(self.rec.examples, KINDS[outcome], reason or KINDS[outcome])
        self._rid.append(rid)
        self._send.append(send)
        self._end.append(end)
        self._out.append(outcome)
        self._status.append(0)
        self._bytes.append(nbytes)
        if self._llm:
            self._tok.append(tokens)
        if self.next_i >= self.n and self.n_done == self.n:
            self._check_finished()

    def _close_all(self) -> None:
        for conn in self.idle:
            conn.abort()
        for _, conn in self.inflight:
            conn.abort()
        for task in list(self._tasks):
            task.cancel()
        self.idle.clear()

    # -- time-outs, progress, end ----------------------------------------------------

    def _sweep(self) -> None:
        now = monotonic()
        limit = now - self.cfg.timeout_s  # requests intended before this have timed out
        start, times, done, timeout = self.start, self.times, self.done, self.cfg.timeout_s
        pending = self.pending
        while pending:
            rid = pending[0]
            if done[rid]:
                self._popleft()
                continue
            intended = start + float(times[rid])
            if intended > limit:
                break
            self._popleft()
            self._record_failure(rid, TIMEOUT, intended + timeout,
                                 reason=f"still waiting for a connection after {timeout:g} s")
        inflight = self.inflight
        while inflight:
            rid, conn = inflight[0]
            if done[rid]:
                inflight.popleft()
                continue
            intended = start + float(times[rid])
            if intended > limit:
                break
            inflight.popleft()
            if conn.rid != rid:  # resent after a stale connection: the newer entry times it
                continue
            nbytes = conn.nbytes
            toks = conn.tokens() if self._llm else None  # type: ignore[attr-defined]
            conn.abort()  # HTTP/1.1 cannot cancel a request: the connection goes
            self._record_failure(rid, TIMEOUT, intended + timeout, conn.t_send, nbytes,
                                 reason=f"no complete response within {timeout:g} s "
                                        f"({'no' if not nbytes else 'partial'} response)",
                                 tokens=toks)
        if now >= self._next_progress:
            self._next_progress = now + self.cfg.progress_s
            self._flush()
        if self.finished is None or not self.finished.done():
            self.loop.call_later(min(0.01, timeout / 10), self._sweep)

    def _check_finished(self) -> None:
        if (self.next_i >= self.n and self.n_done >= self.n and self.finished is not None
                and not self.finished.done()):
            self.finished.set_result(None)

    def _flush(self, final: bool = False) -> None:
        """Move the hot-path lists into histograms (vectorised), the log and progress."""
        rid = np.array(self._rid, dtype=np.int64)
        send = np.array(self._send, dtype=np.float64)
        end = np.array(self._end, dtype=np.float64)
        out = np.array(self._out, dtype=np.int64)
        status = np.array(self._status, dtype=np.int64)
        nbytes = np.array(self._bytes, dtype=np.int64)
        disp = np.array(self._disp, dtype=np.float64)
        queued = np.array(self._queued_ids, dtype=np.int64)
        toks, self._tok = self._tok, []
        for lst in (self._rid, self._send, self._end, self._out, self._status, self._bytes,
                    self._disp, self._queued_ids):
            lst.clear()
        disp_ids = np.arange(self._disp_base, self._disp_base + disp.size)
        self._disp_base += disp.size
        self.rec.record(rid, send, end, out, status, nbytes, disp, disp_ids, queued, final, toks)

    def _gauges(self) -> tuple[int, int]:
        """(open connections, queued requests) now, for progress."""
        return self.n_open, len(self.pending)

    def _result(self) -> WorkerResult:
        return self.rec.result(LoopState(
            n=self.n, next_i=self.next_i, done=bytes(self.done), n_sent=self.n_sent,
            retried=sum(1 for r in self.retried if r >= self.first_measured),
            interrupted=self.stopping, precise_timer=self._precise,
            schedule_ended=self.schedule_ended, opened=self.opened,
            connect_failures=self.connect_failures, max_open=self.max_open,
            connect_errors=self.connect_errors, cpu_s=self._cpu_s, tick_s=self._tick,
            connect_s=self._connect_s, handshake_s=self._handshake_s if self._tls else None),
            "python")


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency; stay usable without
        return asyncio.new_event_loop()


class PythonEngine:
    """The Python engine as a :class:`.recording.LoadEngine`: an :class:`Engine` on an event
    loop of its own (the compiled one is :class:`.fastpath.FastEngine`)."""

    def __init__(self, cfg: EngineConfig,
                 on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.loop = new_loop()
        asyncio.set_event_loop(self.loop)
        self.core = Engine(cfg, self.loop, on_progress)

    def prepare(self) -> None:
        self.loop.run_until_complete(self.core.prepare())

    def run(self, start: float) -> WorkerResult:
        return self.loop.run_until_complete(self.core.run(start))

    def stop(self) -> None:
        """From any thread: the loop stops issuing at its next turn."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.core.stop)

    def end_schedule(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.core.end_schedule)

    def on_signal(self, sig: int, action: Callable[[], None]) -> None:
        # on the loop: the pipe to the parent stays blocking (a loop reader would make it
        # non-blocking, and a large send could then fail half-written)
        self.loop.add_signal_handler(sig, action)

    def close(self) -> None:
        self.loop.close()
