"""The fast engine: the same open-loop engine with its hot loop in C (``fastloop.c``).

It speaks http(s)://, tcp:// and openai+http(s):// (TLS with OpenSSL in the loop, on the
ciphertext it reads itself, so every read keeps its kernel receive time). For openai+
the loop frames each response and its event stream and timestamps each event
when its read arrives; the JSON of the chunks is read by :mod:`.fast_sse` on the recorder
thread, off the hot path, into the same token state and outcomes as the Python engine.

Theory of operation
-------------------
:class:`FastEngine` is the :class:`.recording.LoadEngine` whose send/receive loop runs in
the compiled ``fastloop.Loop`` (the Python engine, :mod:`.engine`, is the other one): the
schedule, the FIFO queue, the pool rules (``MAX_CONNECTING`` attempts,
``max_connections``), time-outs recorded at ``intended + timeout``, the stale
keep-alive retry, the accounting (a done flag per request) and the HTTP/1.1 and
tcp:// framing with the same outcome kinds and reasons as the Python reference
(:mod:`.engine`, :mod:`.http1`, :mod:`.tcp`).

The C loop runs in a thread of its own without the GIL: it waits on epoll with a
nanosecond time-out (``epoll_pwait2``, timer slack 1 ns for that thread) until the
next request is due, sends it at once (never delayed to batch), and reads the
clock once per dispatch. A recorder thread takes what the loop completed every
``progress_s`` (arrays: request id, send, end, outcome, status, bytes; the dispatch
time of each request; the ids that queued; counted example reasons) and records it
with the code both engines share (:meth:`.recording.Recorder.record`): histograms,
``--log``, ``--hdr`` intervals and progress are the same, only their source differs.
The recorder is a SCHED_IDLE thread, so recording never delays a send on a shared core;
the calling thread records the rest once the loop has ended.

:meth:`FastEngine.stop` (Ctrl-C, SIGUSR1 in a worker) ends the run now: requests still
open are ``abandoned``. :meth:`FastEngine.end_schedule` dispatches nothing more and lets
what was dispatched complete; the measured ``scheduled`` count becomes the number
dispatched.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import InputError
from .conn import OUT_OF_STEP
from .engine_types import RECORD, EngineConfig, WorkerResult
from .outcome import KINDS, OK, PROTOCOL
from .protocols import compiled_schemes, tls_schemes
from .recording import LoopState, Recorder, note_reason
from .tls import TlsOptions, client_context, context_settings

try:
    from . import fastloop  # type: ignore[attr-defined]

    UNAVAILABLE: str | None = None
except ImportError as exc:  # no compiler when it was installed: the Python engine remains
    fastloop = None
    UNAVAILABLE = (f"the compiled hot path (tailgate.bench.fastloop) is not built: {exc}; "
                   f"reinstall with a C compiler and OpenSSL's headers (Debian: gcc "
                   f"python3-dev libssl-dev; pip install -e .)")

def out_of_step_with_python(mod: Any) -> list[str]:
    """What the compiled module disagrees on with the Python side (one source of truth:
    outcome.KINDS, engine.MAX_CONNECTING, conn.OUT_OF_STEP and MAX_SUSPECTS, the record
    layout); a module
    built from another fastloop.c is refused, never run with mismatched codes."""
    from .conn import MAX_SUSPECTS, OUT_OF_STEP
    from .engine_types import MAX_CONNECTING

    wrong = []
    kinds = tuple(getattr(mod, "KINDS", ()))
    if not kinds or kinds != KINDS[:len(kinds)]:
        wrong.append(f"outcome kinds {kinds} are not a prefix of {KINDS}")
    if getattr(mod, "MAX_CONNECTING", None) != MAX_CONNECTING:
        wrong.append(f"MAX_CONNECTING {getattr(mod, 'MAX_CONNECTING', None)} != "
                     f"{MAX_CONNECTING}")
    if getattr(mod, "RECORD_SIZE", None) != RECORD.itemsize:
        wrong.append(f"record size {getattr(mod, 'RECORD_SIZE', None)} != {RECORD.itemsize}")
    if getattr(mod, "OUT_OF_STEP", None) != OUT_OF_STEP:
        wrong.append("the out-of-step reason differs")
    if getattr(mod, "MAX_SUSPECTS", None) != MAX_SUSPECTS:
        wrong.append(f"MAX_SUSPECTS {getattr(mod, 'MAX_SUSPECTS', None)} != {MAX_SUSPECTS}")
    return wrong


if fastloop is not None and (_wrong := out_of_step_with_python(fastloop)):
    fastloop = None
    UNAVAILABLE = ("the compiled hot path (tailgate.bench.fastloop) was built from another "
                   f"version: {'; '.join(_wrong)}; rebuild it (pip install -e .)")

ENGINES = ("auto", "fast", "python")
FAST_SCHEMES = compiled_schemes()  # the schemes fastloop.c speaks: see protocols


def tls_unavailable(mod: Any) -> str | None:
    """Why the compiled loop cannot speak TLS as the Python engine does, else None: it
    copies the settings of Python's SSLContext (tls.ContextSettings), whose option bits and
    names mean what they say only to the OpenSSL that Python's ssl runs."""
    ours, python = getattr(mod, "OPENSSL_VERSION_NUMBER", None), ssl.OPENSSL_VERSION_NUMBER
    if ours == python:
        return None
    return (f"the compiled hot path runs OpenSSL {ours:#x}, Python's ssl runs {python:#x} "
            f"({ssl.OPENSSL_VERSION}): the two engines would not speak the same TLS; "
            f"rebuild it against Python's OpenSSL" if ours is not None else
            "the compiled hot path does not say which OpenSSL it runs: rebuild it "
            "(pip install -e .)")


TLS_UNAVAILABLE = tls_unavailable(fastloop) if fastloop is not None else None


def _unavailable(scheme: str) -> str | None:
    """Why the compiled loop cannot run a ``scheme`` target it speaks, else None."""
    if UNAVAILABLE is not None:
        return UNAVAILABLE
    return TLS_UNAVAILABLE if scheme in tls_schemes() else None
NO_TIME = np.iinfo(np.int64).min  # a record's send time when it never reached the wire
# A due time this close is polled for, never slept to: a timed wake-up costs ~8-14 µs of
# CPU on our VMs and comes ~7-20 µs late. How early the loop wakes before a due time to
# poll from there is learnt from its own wake-ups (spin_for in fastloop.c): the
# (WAKE_Q+1)th latest of the last 64, at most 500 µs and at most 1/SPIN_DIV of the time
# between two requests.
POLL_NS = 10_000
WAKE_Q = 62
SPIN_DIV = 8
# A send due this soon: sleep to it without waking for replies, and read them then (a
# reply's time is its kernel receive stamp, which a later read does not move; one timed
# wake-up a request is saved, ~8-10 us of CPU here). 0: every reply wakes the loop. Never
# for streams: chunks read together share one stamp (the last one's), which would bend ITL.
DEFER_NS = 1_000_000
# The loop thread's scheduler slice (see short_slice in fastloop.c): a due request waits
# at most about this long for a core it shares with other work.
SLICE_NS = 100_000


def _background() -> bool:
    """The recorder below the loop thread (:func:`tailgate.sched.background`). Recording in
    the loop's own process at normal priority took ~1 % of the core in runs of 1-3 ms every
    0.25 s, which was most of the generator's lateness P99 at 50k-120k/s (0.21 ms at 120k/s,
    0.02 ms as an idle task)."""
    from ..sched import background

    return background()


@contextmanager
def _competing(yes: bool) -> Iterator[None]:
    """An idle-policy recorder competes as an ordinary thread, at nice 19, while it reads a
    backlog of streamed events: the loop stops reading when 4 MiB of them wait (fastloop.c
    EV_HARD), and an idle task on a CPU that other work keeps busy might not run for
    seconds. At nice 0 it took the loop's core in slices of milliseconds (lateness P99 4.0 ms
    at 1,000 streams; 0.37 ms at nice 19: docs/llm-scale.md)."""
    idle = yes and os.sched_getscheduler(0) == os.SCHED_IDLE
    tid = threading.get_native_id()
    if idle:
        nice = os.getpriority(os.PRIO_PROCESS, tid)  # (per thread on Linux)
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, 19)
    try:
        yield
    finally:
        if idle:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _restore(tid: int | None, policy: int, param: os.sched_param) -> None:
    """Give thread `tid` the caller's policy back: once the loop has ended, an idle-policy
    recorder on a busy core would otherwise hold up the end of the run (it might never get
    the CPU to return)."""
    if tid is None:
        return
    try:
        os.sched_setscheduler(tid, policy, param)
    except OSError:  # it has ended already
        pass


class EngineUnavailable(InputError):
    """``--engine fast`` was asked for but cannot run (the message says why)."""


def url_scheme(target: Any) -> str:
    """The URL scheme of a target as the registry names it (``openai+http`` or
    ``openai+https``; ``Target.scheme`` says ``openai`` for both)."""
    if target.kind == "openai":
        return "openai+https" if target.tls is not None else "openai+http"
    return str(target.scheme)


def choose(engine: str, scheme: str) -> str:
    """Which engine runs a ``scheme`` target (a URL scheme, see :func:`url_scheme`): "fast"
    or "python" (raises EngineUnavailable)."""
    if engine not in ENGINES:
        raise EngineUnavailable(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "python":
        return "python"
    if engine == "fast":
        if scheme not in FAST_SCHEMES:
            raise EngineUnavailable(f"--engine fast speaks "
                                    f"{', '.join(s + '://' for s in FAST_SCHEMES)} only, "
                                    f"not {scheme}:// targets")
        if (why := _unavailable(scheme)) is not None:
            raise EngineUnavailable(f"--engine fast: {why}")
        return "fast"
    return "fast" if scheme in FAST_SCHEMES and _unavailable(scheme) is None else "python"


def fallback_note(engine: str, scheme: str) -> str | None:
    """Why ``auto`` ran the Python engine for a target the fast one speaks, else None."""
    if engine == "auto" and scheme in FAST_SCHEMES and (why := _unavailable(scheme)):
        return f"ran the python engine: {why}"
    return None


def _address(host: str, port: int) -> tuple[int, str]:
    """Resolve once (the Python engine resolves per connection; a load run's target does
    not move): (address family, numeric address)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for fam in (socket.AF_INET, socket.AF_INET6):
        for f, _, _, _, sa in infos:
            if f == fam:
                return int(f), str(sa[0])
    raise OSError(f"no IPv4 or IPv6 address for {host!r}")


def _tls_args(opts: TlsOptions, host: str) -> dict[str, Any]:
    """The loop's TLS keywords: the files and names of ``opts`` and every setting of the
    context the Python engine makes from them (:func:`.tls.client_context`, which checks
    the files first: a bad one is a TlsError, not a C error)."""
    s = context_settings(client_context(opts))
    return {"tls": True, "cafile": opts.cacert, "certfile": opts.cert, "keyfile": opts.key,
            "verify": s.verify, "check_hostname": s.check_hostname,
            "server_name": opts.sni or host,
            "alpn": b"".join(bytes([len(p)]) + p.encode() for p in opts.alpn),
            "ciphers": s.ciphers, "ciphersuites": s.ciphersuites,
            "min_version": s.minimum_version, "max_version": s.maximum_version,
            "options": s.options, "verify_flags": s.verify_flags,
            "common_name": s.hostname_checks_common_name,
            "post_handshake_auth": s.post_handshake_auth, "keylog": s.keylog_filename}


def _seconds(ns: bytes | None) -> list[float]:
    return (np.frombuffer(ns or b"", dtype=np.int64) * 1e-9).tolist()


class FastEngine:
    """Runs one :class:`EngineConfig` with the compiled loop. See the module docstring."""

    def __init__(self, cfg: EngineConfig,
                 on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        if fastloop is None:
            raise EngineUnavailable(UNAVAILABLE)
        t, lim = cfg.target, cfg.limits
        if url_scheme(t) not in FAST_SCHEMES:
            raise EngineUnavailable(f"the fast engine speaks "
                                    f"{', '.join(s + '://' for s in FAST_SCHEMES)}, "
                                    f"not {url_scheme(t)}://")
        if t.tls is not None and TLS_UNAVAILABLE is not None:
            raise EngineUnavailable(TLS_UNAVAILABLE)
        self.cfg = cfg
        self.times = np.asarray(cfg.times, dtype=np.float64)
        self.first_measured = int(np.searchsorted(self.times, cfg.warmup_s, side="left"))
        self._streams = None
        tokens = None
        loop_args: dict[str, Any] = {}  # the Loop's keywords: openai+'s bodies, TLS
        if t.kind == "openai":
            from ..llm.accounting import TokenBook
            from .fast_sse import Streams

            reqs = list(cfg.requests or ())
            if len(reqs) != self.times.size:
                raise ValueError(f"{len(reqs)} request bodies for {self.times.size} "
                                 f"scheduled requests")
            self._streams = Streams(t.api or "completions", cfg.max_tokens_per_stream,
                                    cfg.require_done)
            tokens = TokenBook(cfg.spec)
            offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
            np.cumsum([len(r) for r in reqs], out=offsets[1:])
            loop_args = {"requests": b"".join(reqs), "request_offsets": offsets.tobytes(),
                         "max_event": cfg.max_event_bytes}
            self._final_ok = np.zeros(self.times.size, dtype=np.uint8)  # recorded ok
        self.rec = Recorder(cfg, self.times, self.first_measured, on_progress,
                            lambda: self._gauge, tokens)
        self.start = 0.0
        self.stopping = False
        self._disp_base = 0  # request id of the next dispatch time taken
        self._cpu_s = 0.0
        family, address = _address(t.host, t.port)
        times_ns = np.round(self.times * 1e9).astype(np.int64)
        if t.tls is not None:
            loop_args.update(_tls_args(t.tls, t.host))
        self._c = fastloop.Loop(
            t.kind, family, address, t.port, t.request, times_ns, self.first_measured,
            cfg.max_connections, cfg.timeout_s, lim.max_header_bytes, lim.max_line_bytes,
            lim.max_body_bytes, t.delimiter,
            t.response_length if t.response_length is not None else -1,
            cfg.retry_stale, cfg.check_seq, **loop_args)
        self._gauge = (0, 0)
        self._connect_errors: dict[str, int] = {}
        self._ended = False
        self.background = False  # whether the recorder thread ran as an idle task
        self._error: BaseException | None = None

    def prepare(self) -> None:
        """Open the initial connections (failures are counted, not fatal)."""
        self._c.prepare(min(self.cfg.connections, self.cfg.max_connections))
        self._warm()

    def _warm(self) -> None:
        """Record nothing once, before the start: the first record's one-off work (numpy
        imports numpy.ma at the first np.unique, ~30 ms) then happens before the run, not in
        its first measured second on the loop's core (with ``--warmup 0`` it is measured)."""
        i, f = np.zeros(0, dtype=np.int64), np.zeros(0)
        self.rec.record(i, f, f, i, i, i, f, i, i, final=True,
                        toks=[] if self._streams is not None else None, arrive=f)

    def run(self, start: float) -> WorkerResult:
        """Run the schedule from monotonic time ``start``; return when every request ended
        (or :meth:`stop`). Ctrl-C in this thread stops the run and still returns."""
        self.start = self.rec.start = start
        self.rec.open_log()
        cpu0 = time.process_time()
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        loop = threading.Thread(target=self._loop, args=(round(start * 1e9),),
                                name=f"tailgate-fastloop-{self.cfg.worker}", daemon=True)
        rec = threading.Thread(target=self._recorder, args=(loop,),
                               name=f"tailgate-recorder-{self.cfg.worker}", daemon=True)
        loop.start()
        rec.start()
        try:
            while loop.is_alive():
                loop.join(self.cfg.progress_s)
        except KeyboardInterrupt:
            self.stop()
            loop.join()
        _restore(rec.native_id, policy, param)
        rec.join()
        self._cpu_s = time.process_time() - cpu0
        if self._error is not None:
            raise self._error
        self._take(final=True)
        self.rec.close_log()
        return self._result()

    def _recorder(self, loop: threading.Thread) -> None:
        """Record what the loop completed every ``progress_s`` while it runs, as an idle
        task (see :func:`_background`); the caller's thread takes the rest at the end."""
        self.background = _background()
        try:
            while loop.is_alive():
                backlog = False
                if self._streams is not None:  # sooner when events pile up (fast_sse)
                    backlog = self._c.wait(self.cfg.progress_s)
                    loop.join(0.0)
                else:
                    loop.join(self.cfg.progress_s)
                if loop.is_alive():
                    with _competing(backlog and self.background):
                        self._take(final=False)
        except BaseException as exc:  # a bug in recording: end the run, re-raise in run()
            self._error = exc
            self._c.stop()

    def _loop(self, start_ns: int) -> None:
        try:
            self._c.run(start_ns, POLL_NS, SLICE_NS, WAKE_Q, SPIN_DIV,
                        DEFER_NS if self._streams is None else 0,
                        round(self.cfg.coalesce_s * 1e9))
        except BaseException as exc:  # re-raised in the calling thread
            self._error = exc

    def stop(self) -> None:
        """Stop issuing requests and end the run now (Ctrl-C): open requests are abandoned."""
        self.stopping = True
        self._c.stop()

    def on_signal(self, sig: int, action: Callable[[], None]) -> None:
        signal.signal(sig, lambda *_: action())

    def close(self) -> None:
        """Nothing to release: the loop's sockets close when its run ends."""

    def end_schedule(self) -> None:
        """Dispatch nothing more; requests already dispatched complete normally."""
        if self._ended or self.stopping:
            return
        self._ended = True
        self._c.end_schedule()

    def _take(self, final: bool) -> None:
        recs, disp, queued, reasons, n_open, n_queued, fixes, evs, blob = self._c.take()
        self._gauge = (n_open, n_queued)
        if self._streams is None:
            self.rec.out_of_step(np.frombuffer(fixes, dtype=np.int64), note=False)
        start = self.start
        r = np.frombuffer(recs, dtype=RECORD)
        send = np.where(r["send"] == NO_TIME, np.nan, r["send"] * 1e-9 + start)
        end = r["end"] * 1e-9 + start
        arrive = np.where(r["arrive"] == NO_TIME, np.nan, r["arrive"] * 1e-9 + start)
        d = np.frombuffer(disp, dtype=np.int64) * 1e-9 + start
        disp_ids = np.arange(self._disp_base, self._disp_base + d.size)
        self._disp_base += d.size
        for scope, kind, reason, count in reasons:
            if scope == 0:
                note_reason(self.rec.examples, KINDS[kind], reason, count)
            elif scope == 1:
                note_reason(self.rec.conn_errors, KINDS[kind], reason, count)
            else:
                self._connect_errors[reason] = self._connect_errors.get(reason, 0) + count
        rid, out = r["rid"].astype(np.int64), r["out"].astype(np.int64)
        status, nbytes = r["status"].astype(np.int64), r["bytes"].astype(np.int64)
        toks = None
        if self._streams is not None:
            # The JSON of this take's events, then each ended request's final outcome.
            cut = self._streams.events(evs, blob, start)
            if cut and not final:
                self._c.cut(np.array(cut, dtype=np.int64).tobytes())
            done = self._streams.settle(rid, end, out, status, nbytes, self.rec.breathe)
            # a stream failed on its JSON ended at that event's read, not at the record's
            arrive = np.where(done.end == end, arrive, np.nan)
            out, end, status, nbytes, toks = (done.out, done.end, done.status, done.nbytes,
                                              done.toks)
            reasons_now = done.reasons
            fx = np.frombuffer(fixes, dtype=np.int64)
            if fx.size:  # out of step before being recorded: protocol now (as engine.py does)
                here = np.isin(rid, fx) & (out == OK)
                out[here] = PROTOCOL
                reasons_now = [OUT_OF_STEP if h else w
                               for h, w in zip(here.tolist(), reasons_now, strict=True)]
                fixes = fx[~np.isin(fx, rid[here])].tobytes()
            for r_, o, why in zip(rid.tolist(), out.tolist(), reasons_now, strict=True):
                if o == OK:
                    self._final_ok[r_] = 1
                elif r_ >= self.first_measured:
                    note_reason(self.rec.examples, KINDS[o], why or KINDS[o])
            self.rec.breathe()
        self.rec.record(rid, send, end, out, status, nbytes, d, disp_ids,
                        np.frombuffer(queued, dtype=np.int64), final, toks, arrive)
        if self._streams is not None:  # found out of step: those recorded ok become protocol
            fx = np.frombuffer(fixes, dtype=np.int64)
            fx = fx[self._final_ok[fx] == 1] if fx.size else fx
            if fx.size:
                self._final_ok[fx] = 0
                self.rec.out_of_step(fx, note=True)

    def _result(self) -> WorkerResult:
        st = self._c.state()
        done = bytes(st["done"])
        n = self.times.size
        if self._ended:  # the schedule ended early: what was dispatched is what was scheduled
            n = st["next_i"]
        retried = np.flatnonzero(np.frombuffer(st["retried"], dtype=np.uint8))
        return self.rec.result(LoopState(
            n=n, next_i=st["next_i"], done=done, n_sent=st["n_sent"],
            retried=int(np.count_nonzero(retried >= self.first_measured)),
            interrupted=self.stopping, precise_timer=bool(st["precise"]),
            schedule_ended=self._ended, opened=st["opened"],
            connect_failures=st["connect_failures"], max_open=st["max_open"],
            connect_errors=self._connect_errors, cpu_s=self._cpu_s,
            connect_s=_seconds(st["connect_ns"]),
            handshake_s=_seconds(st["handshake_ns"]) if self.cfg.target.tls else None,
            read_pauses=st["pauses"], read_paused_s=st["paused_ns"] * 1e-9,
            spin_s=st["spin_ns"] * 1e-9), "fast")
