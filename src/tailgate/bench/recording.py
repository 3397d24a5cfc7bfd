"""What both engines share: turning ended requests into histograms, counts, the per-request
log and progress, and the worker's result.

The Python engine (:mod:`.engine`) and the compiled one (:mod:`.fastpath`) are two
implementations of one interface (:class:`LoadEngine`): each runs its own loop and hands
batches of ended requests to its :class:`Recorder` (vectorised, a few times a second);
at the end it describes its loop in a :class:`LoopState` and the recorder builds the
:class:`~.engine.WorkerResult`. So the accounting — what is measured, what counts as
sent, abandoned or relabelled — is written once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import numpy as np

from ..hist import Histogram, IntervalHistograms
from ..llm.engine_tokens import NONE, engine_tokens
from ..sched import Breather
from .conn import OUT_OF_STEP, monotonic
from .outcome import KINDS, OK, PROTOCOL, TIMEOUT

# Measured dispatch offsets kept per worker for the arrival test (bench/arrivals.py):
# 2**18 gaps give a KS test far more power than the timer's tolerance leaves to use.
MAX_ARRIVALS = 1 << 18
MAX_REASONS = 5  # distinct example reasons kept per error kind (the rest are counted apart)
LOG_SLICE = 8192  # --log rows formatted and written at a time
OTHER_REASONS = "(other reasons)"


def note_reason(book: dict[str, dict[str, int]], kind: str, reason: str, count: int = 1) -> None:
    """Count ``count`` examples of ``reason`` under ``kind``, keeping at most MAX_REASONS apart."""
    reasons = book.setdefault(kind, {})
    if reason not in reasons and len(reasons) >= MAX_REASONS:
        reason = OTHER_REASONS
    reasons[reason] = reasons.get(reason, 0) + count


class LoadEngine(Protocol):
    """One load-generating process: :func:`.workers.run_here` and the worker children drive
    either engine through this (``prepare`` opens the initial connections, ``run`` runs the
    schedule from a monotonic start and returns the worker's result)."""

    def prepare(self) -> None: ...

    def run(self, start: float) -> Any: ...

    def stop(self) -> None: ...  # end now (open requests are abandoned); any thread

    def end_schedule(self) -> None: ...  # dispatch nothing more; the rest complete

    def on_signal(self, sig: int, action: Callable[[], None]) -> None: ...

    def close(self) -> None: ...


@dataclass
class LoopState:
    """What an engine's loop knows at the end of a run (the recorder knows the rest)."""

    n: int  # the schedule's length (what was dispatched, when end_schedule() cut it)
    next_i: int  # requests dispatched
    done: bytes  # a flag per request: it has its outcome
    n_sent: int  # measured requests that got an outcome (the loop's own counter)
    retried: int  # measured requests resent after a stale connection
    interrupted: bool
    precise_timer: bool
    schedule_ended: bool
    opened: int = 0
    connect_failures: int = 0
    max_open: int = 0
    connect_errors: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    tick_s: float = 0.0
    connect_s: list[float] = field(default_factory=list)
    handshake_s: list[float] | None = None  # None: not a TLS target
    read_pauses: int = 0  # openai+, compiled: the loop stopped reading (its JSON behind)
    read_paused_s: float = 0.0
    spin_s: float = 0.0  # compiled: the most it polled before a due time


class Recorder:
    """The recorded side of one worker's run. ``gauges`` says (open connections, queued
    requests) now, for progress; ``tokens`` is the TokenBook of a streamed (openai+) run."""

    def __init__(self, cfg: Any, times: np.ndarray, first_measured: int,
                 on_progress: Callable[[dict[str, Any]], None] | None,
                 gauges: Callable[[], tuple[int, int]], tokens: Any = None) -> None:
        spec = cfg.spec
        self.cfg = cfg
        self.times = times
        self.first_measured = first_measured
        self.on_progress = on_progress
        self.gauges = gauges
        self.tokens = tokens
        self.start = 0.0
        self.examples: dict[str, dict[str, int]] = {}
        self.conn_errors: dict[str, dict[str, int]] = {}
        self.counts = np.zeros(len(KINDS), dtype=np.int64)
        self.latency = Histogram(spec)
        self.service = Histogram(spec)
        self.lateness = Histogram(spec)
        # the kernel's receive stamp -> the loop's read of the reply's last bytes (compiled
        # engine): the generator's own delay, kept out of every latency and shown apart
        self.read_lag = Histogram(spec)
        self.intervals = IntervalHistograms(spec)
        self.queued = 0
        self.last_dispatch = 0.0
        self._relabelled: set[int] = set()  # recorded as ok, found out of step since
        self._arrivals: list[np.ndarray] = []
        self._n_arrivals = 0
        self._disp_all = np.full(times.size, np.nan) if cfg.log_path else None
        self._log: IO[str] | None = None
        # a take's records, accounting and --log rows are 5-9 ms of CPU at 1,000 LLM
        # streams: given back to the loop every YIELD_NS of it (see Breather)
        self.breathe = Breather()

    # -- the per-request log -----------------------------------------------------------

    def open_log(self) -> None:
        if self.cfg.log_path:
            self._log = open(self.cfg.log_path, "w", encoding="ascii")  # noqa: SIM115

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._patch_log()

    def _patch_log(self) -> None:
        """Rewrite the --log rows written as ok before their request was found out of
        step (rare: only after a stray response; one pass over this worker's part)."""
        if not self._relabelled or not self.cfg.log_path:
            return
        with open(self.cfg.log_path, encoding="ascii") as f:
            rows = f.readlines()
        fixed = []
        for row in rows:
            cols = row.split(",", 7)
            if len(cols) == 8 and cols[6] == "ok" and int(cols[1]) in self._relabelled:
                cols[6] = "protocol"
                row = ",".join(cols)
            fixed.append(row)
        with open(self.cfg.log_path, "w", encoding="ascii") as f:
            f.writelines(fixed)

    # -- recording -----------------------------------------------------------------------

    def out_of_step(self, rids: np.ndarray, note: bool = True) -> None:
        """Requests recorded as ok that a later stray response showed out of step: their
        count moves from ok to protocol (their latency stays recorded), a stream's tokens
        and goodput are taken back, and their --log rows are corrected when the run ends."""
        if not rids.size:
            return
        self._relabelled.update(rids.tolist())
        measured = rids[rids >= self.first_measured]
        n = int(measured.size)
        if n:
            self.counts[OK] -= n
            self.counts[PROTOCOL] += n
            if self.tokens is not None:
                self.tokens.relabel(measured.tolist())
            if note:  # (the fast engine's loop notes its own reasons)
                note_reason(self.examples, "protocol", OUT_OF_STEP, n)

    def record(self, rid: np.ndarray, send: np.ndarray, end: np.ndarray, out: np.ndarray,
               status: np.ndarray, nbytes: np.ndarray, disp: np.ndarray,
               disp_ids: np.ndarray, queued: np.ndarray, final: bool,
               toks: list[Any] | None = None, arrive: np.ndarray | None = None) -> None:
        """Record ended requests and dispatch times (monotonic seconds, send NaN: never on
        the wire) into the histograms, --log, --hdr intervals and progress. ``arrive``: when
        the kernel received the bytes that completed each (NaN or None: not known)."""
        cfg, start, times = self.cfg, self.start, self.times
        if disp.size:
            self.last_dispatch = float(disp[-1])
        if self._disp_all is not None:
            self._disp_all[disp_ids] = disp

        offs = times[rid]
        measured = offs >= cfg.warmup_s
        # a reply's time is the kernel's receive stamp where the engine took one: the loop's
        # own delay in reading it is no part of the service's latency (read_lag shows it)
        stop = end if arrive is None else np.where(np.isnan(arrive), end, arrive)
        lat = (stop - (start + offs))[measured]
        lat_ns = lat * 1e9
        chunk = Histogram(cfg.spec)  # this batch's latencies: also the progress delta
        chunk.record(lat_ns)
        self.breathe()
        self.latency.add(chunk)
        self.breathe()
        m_send, m_end = send[measured], stop[measured]
        on_wire = ~np.isnan(m_send)
        self.service.record((m_end[on_wire] - m_send[on_wire]) * 1e9)
        if arrive is not None:
            lag = (end - arrive)[measured]
            self.read_lag.record(np.maximum(lag[~np.isnan(lag)], 0.0) * 1e9)
        self.counts += np.bincount(out[measured], minlength=len(KINDS))
        self.breathe()
        d_offs = times[disp_ids]
        d_meas = d_offs >= cfg.warmup_s
        self.lateness.record(np.maximum(disp[d_meas] - (start + d_offs[d_meas]), 0.0) * 1e9)
        if self._n_arrivals < MAX_ARRIVALS and np.any(d_meas):
            keep = (disp[d_meas] - start)[:MAX_ARRIVALS - self._n_arrivals]
            self._arrivals.append(keep)
            self._n_arrivals += keep.size
        self.queued += int(np.count_nonzero(times[queued] >= cfg.warmup_s))
        self.breathe()
        if cfg.hdr_interval_s:
            slot = ((offs[measured] - cfg.warmup_s) // cfg.hdr_interval_s).astype(np.int64)
            for k in np.unique(slot).tolist():
                self.breathe()
                self.intervals.record(k, lat_ns[slot == k])
        if self.tokens is not None:
            self.breathe()
            nominal = (cfg.nominal_input[rid] if cfg.nominal_input is not None
                       else np.zeros(rid.size, dtype=np.int64))
            self.tokens.record(start + offs, end, out, measured, toks, nominal, start,
                               cfg.warmup_s, cfg.hdr_interval_s, cfg.good_slos, OK, TIMEOUT,
                               rids=rid, sends=send, breathe=self.breathe)
        if self._log is not None and rid.size:
            if arrive is None:
                arrive = np.full(rid.size, np.nan)
            self._write_log(rid, offs, send, end, out, status, nbytes, toks, arrive)
        if self.on_progress is not None and not final:
            idx, cnt = chunk.nonzero()
            extra: dict[str, Any] = {}
            if self.tokens is not None and self.tokens.ttft_delta is not None:
                t = self.tokens.ttft_delta
                extra["ttft"] = (*t.nonzero(), t.min, t.max)
            n_open, n_queued = self.gauges()
            self.on_progress({
                **extra,
                "worker": cfg.worker,
                "outcomes": np.bincount(out[measured], minlength=len(KINDS)).tolist(),
                "dispatched": int(np.count_nonzero(d_meas)),
                "lat_idx": idx, "lat_cnt": cnt,
                "lat_lo": chunk.min, "lat_hi": chunk.max,
                "open": n_open, "queued": n_queued, "t": monotonic(),
            })

    def _write_log(self, rid: np.ndarray, offs: np.ndarray, send: np.ndarray,
                   end: np.ndarray, out: np.ndarray, status: np.ndarray,
                   nbytes: np.ndarray, toks: list[Any] | None, arrive: np.ndarray) -> None:
        # A recorder that fell behind takes a large batch at once: its rows go out in slices,
        # so the strings of a million rows are never held together (the heap they took would
        # stay the process's RSS floor for the rest of the run).
        for a in range(0, rid.size, LOG_SLICE):
            b = a + LOG_SLICE
            self._write_rows(rid[a:b], offs[a:b], send[a:b], end[a:b], out[a:b], status[a:b],
                             nbytes[a:b], toks[a:b] if toks is not None else None,
                             arrive[a:b])

    def _write_rows(self, rid: np.ndarray, offs: np.ndarray, send: np.ndarray,
                    end: np.ndarray, out: np.ndarray, status: np.ndarray,
                    nbytes: np.ndarray, toks: list[Any] | None, arrive: np.ndarray) -> None:
        start, w, breathe = self.start, self.cfg.worker, self.breathe
        rows = []
        warm = self.cfg.warmup_s
        disp = self._disp_all[rid] - start  # type: ignore[index]
        streamed = self.tokens is not None
        noms = (self.cfg.nominal_input[rid].tolist() if self.cfg.nominal_input is not None
                else [0] * rid.size)
        for i, (r, o, d, s, e, oc, st, nb, a, t, nom) in enumerate(zip(
                rid.tolist(), offs.tolist(), disp.tolist(), (send - start).tolist(),
                (end - start).tolist(), out.tolist(), status.tolist(), nbytes.tolist(),
                (arrive - start).tolist(), toks or [None] * rid.size, noms, strict=True)):
            if not i & 7:  # (every 8 rows: 20-80 us of formatting; a breath is 0.2 us)
                breathe()
            s_txt = "" if s != s else f"{s:.9f}"  # NaN: never reached the wire
            a_txt = "" if a != a else f"{a:.9f}"  # NaN: no reply's bytes timed by the kernel
            rows.append(f"{w},{r},{o:.9f},{d:.9f},{s_txt},{e:.9f},{KINDS[oc]},{st},{nb},"
                        f"{int(o < warm)},{a_txt}"
                        + (_token_columns(t, start, nom) if streamed else "") + "\n")
        self._log.writelines(rows)  # type: ignore[union-attr]

    # -- the end -------------------------------------------------------------------------

    def result(self, loop: LoopState, engine: str) -> Any:
        from .engine_types import WorkerResult

        warm = self.cfg.warmup_s
        # loop.n: the whole schedule, or what was dispatched when end_schedule() cut it
        measured_sched = int(np.count_nonzero(self.times[:loop.n] >= warm))
        dispatched = int(np.count_nonzero(self.times[:loop.next_i] >= warm))
        # Measured requests without an outcome (in flight, queued or never due when stopped).
        abandoned = int(np.count_nonzero(
            np.frombuffer(loop.done, dtype=np.uint8)[self.first_measured:loop.n] == 0))
        return WorkerResult(
            worker=self.cfg.worker,
            counts=self.counts.tolist(),
            latency=self.latency, service=self.service, lateness=self.lateness,
            read_lag=self.read_lag if self.read_lag.total else None,
            intervals=self.intervals.histograms(),
            scheduled=measured_sched, dispatched=dispatched, abandoned=abandoned,
            last_dispatch_s=max(self.last_dispatch - self.start, 0.0) if loop.next_i else 0.0,
            queued=self.queued,
            connections={"opened": loop.opened, "connect_failures": loop.connect_failures,
                         "max_open": loop.max_open, "cap": self.cfg.max_connections},
            interrupted=loop.interrupted,
            precise_timer=loop.precise_timer,
            log_path=self.cfg.log_path,
            warmup_requests=loop.n - measured_sched,
            connect_errors=dict(loop.connect_errors),
            cpu_s=loop.cpu_s,
            read_pauses=loop.read_pauses, read_paused_s=loop.read_paused_s, spin_s=loop.spin_s,
            sent=loop.n_sent,
            error_examples=self.examples,
            conn_errors=self.conn_errors,
            retried=loop.retried,
            schedule_ended=loop.schedule_ended,
            arrivals_s=(np.concatenate(self._arrivals) if self._arrivals
                        else np.zeros(0, dtype=np.float64)),
            tick_s=loop.tick_s,
            tokens=self.tokens,
            connect_time=self._times_hist(loop.connect_s),
            handshake_time=(self._times_hist(loop.handshake_s)
                            if loop.handshake_s is not None else None),
            engine=engine,
        )

    def _times_hist(self, seconds: list[float]) -> Histogram:
        h = Histogram(self.cfg.spec)
        h.record(np.array(seconds, dtype=np.float64) * 1e9)
        return h


def _token_columns(t: Any, start: float, nominal: int) -> str:
    """The log's token columns of one request (empty where it had none)."""
    if t is None:
        return f",,,,,0,0,{nominal},,,,,,,,,,,,"
    chunk0, times, done, use_out, use_in = t[:5]

    def ts(v: float) -> str:
        return "" if v != v else f"{v - start:.9f}"

    first, last = (times[0], times[-1]) if times else (math.nan, math.nan)
    gap = ",,"
    k = -1
    if len(times) > 1:
        gaps = np.diff(np.asarray(times, dtype=np.float64))
        k = int(gaps.argmax())
        gap = f",{ts(times[k])},{ts(times[k + 1])}"
    et = (engine_tokens(np.asarray(times, dtype=np.float64), t[8], k)
          if len(t) > 8 and t[8] is not None else NONE)  # (per token: when asked)
    state = et.state if et.state in ("", "ok") else "bad: " + _csv_safe(et.state)
    return (f",{ts(chunk0)},{ts(first)},{ts(last)},{ts(done)},{len(times)},"
            f"{use_out if use_out >= 0 else len(times)},{use_in if use_in >= 0 else nominal}"
            + gap + _engine_columns(t[7] if len(t) > 7 else None)
            + f",{state},{et.timed or ''},{ts(et.start_bound)},"
            + ("" if et.gap_engine_ms != et.gap_engine_ms else f"{et.gap_engine_ms:.3f}"))


def _csv_safe(reason: str) -> str:
    """A reason as one field of the log (no comma, no line break)."""
    return reason.replace(",", ";").replace("\n", " ").replace("\r", " ")[:200]


def _engine_columns(e: Any) -> str:
    """The log's engine columns: state, then the engine's record (empty where none)."""
    if e is None:
        return ",,,,,,"
    if isinstance(e, str):
        return ",bad,,,,,"
    return (f",ok,{e.prompt_n},{'' if e.cache_n is None else e.cache_n},"
            f"{'' if e.prompt_ms is None else f'{e.prompt_ms:.3f}'},{e.predicted_n},"
            f"{'' if e.predicted_ms is None else f'{e.predicted_ms:.3f}'}")
