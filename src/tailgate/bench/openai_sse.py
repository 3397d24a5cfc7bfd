"""Streamed OpenAI-compatible responses (``openai+http://``), timed token by token.

The HTTP/1.1 framing is the shared sans-I/O :class:`.http1.ResponseReader`
(interim 1xx skipped, a body without a length ends at the close), the event
stream :class:`tailgate.llm.sse.SSEParser`, each event
:func:`tailgate.llm.openai.parse_chunk`. Every read is timestamped once, on the
engine's clock, and each content-bearing chunk in it takes that time: when the
client could first have shown the token. The connection keeps, per request,
the first chunk's time, each token's time, the time of ``data: [DONE]`` and the
server's ``usage`` counts; the engine reads them (:meth:`OpenAIConnection.tokens`)
when it records the request's outcome, whatever it is.

How a request ends (kinds of :mod:`.outcome`): ``ok`` at the end of the HTTP
response after ``data: [DONE]`` (E2E is timed at ``[DONE]``), ``no_token`` for a
complete stream without content, ``server_error`` for an error object in the
stream, ``malformed_sse`` for bad framing or a chunk that is not JSON of the API,
``protocol`` for an answer that is not ``text/event-stream``, ``server_error`` also for
an SSE ``event: error`` (JSON or text: its message is the reason), ``truncated`` for a
stream that ends before ``[DONE]`` (with ``require_done`` off: before ``[DONE]`` or
a ``finish_reason``), ``too_large`` for an event past ``max_event`` bytes or a stream
of more than ``max_tokens`` tokens (memory per stream stays bounded), and the
HTTP kinds (status, reset, upgrade, ...) as for ``http://``.
"""

from __future__ import annotations

import json
import math
from array import array
from typing import Any

from ..llm.engine_records import EngineTimings
from ..llm.engine_tokens import add_time
from ..llm.openai import Chunk, ChunkError, chunk_tokens, parse_chunk
from ..llm.sse import SSEError, SSEParser, SSETooLarge
from .conn import Connection, Sink, monotonic
from .http1 import Data, End, FramingError, Head, Limits, ResponseReader, Unsolicited
from .outcome import (
    CODE,
    ERROR_KINDS,
    MALFORMED_SSE,
    NO_TOKEN,
    OK,
    PROTOCOL,
    SERVER_ERROR,
    TOO_LARGE,
)
from .protocols import Protocol
from .target import openai_target

# What the engine reads of one request: (first chunk, token times, [DONE] time,
# usage completion tokens or -1, usage prompt tokens or -1, tokens of each content
# chunk (-1: the server did not say), usage cached prompt tokens or -1, the engine's
# own timings of the request or the reason they were unreadable or None, the engine's
# time of each content chunk (llm.engine_tokens: llama-server's per-token timings) or the
# reason they are unknown or None); times NaN when absent. The token times are an array
# of doubles (8 bytes a content chunk), the counts of ints (4 bytes), the engine's times
# doubles, at most max_tokens long. The accounting also takes the first five alone
# (every chunk's count unknown, no cached count).
TokenState = tuple[float, "array[float]", float, int, int, "array[int]", int,
                   EngineTimings | str | None, "array[float] | str | None"]
MAX_TOKENS_PER_STREAM = 1_000_000  # --max-tokens-per-stream: 8 MB of token times a stream


def error_event(data: str) -> str:
    """The server's message of an SSE ``event: error`` (JSON with a message, or text)."""
    try:
        obj = json.loads(data)
    except ValueError:
        return data.strip()[:200] or "(no message)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        msg = err.get("message", err) if isinstance(err, dict) else err
        return str(msg)[:200]
    return str(obj)[:200]


class _Fail(Exception):
    def __init__(self, outcome: int, reason: str) -> None:
        self.outcome, self.reason = outcome, reason


def apply_chunk(st: Any, chunk: Chunk, now: float, max_tokens: int) -> tuple[int, str] | None:
    """One parsed chunk into a stream's token state (``st``: first_chunk, tok, ntok,
    usage_each, finish_reason, out_tokens, in_tokens, cached, timings, etok), on both
    engines (the compiled one's :mod:`.fast_sse` too): the (outcome, reason) that ends the
    stream, or None."""
    if st.first_chunk != st.first_chunk:  # NaN: this is the first
        st.first_chunk = now
    if chunk.error is not None:
        return SERVER_ERROR, chunk.error
    if chunk.text:
        if len(st.tok) >= max_tokens:
            return TOO_LARGE, (f"more than {max_tokens} tokens in one stream "
                               "(--max-tokens-per-stream)")
        st.tok.append(now)
        st.ntok.append(chunk_tokens(chunk, st.out_tokens, st.usage_each))
        st.usage_each = st.usage_each and chunk.completion_tokens is not None
        if chunk.timings is not None or st.etok is not None:  # (per token, when asked)
            st.etok = add_time(st.etok, chunk.timings, len(st.tok))
    if chunk.finish_reason:
        st.finish_reason = chunk.finish_reason
    if chunk.completion_tokens is not None:
        st.out_tokens = chunk.completion_tokens
    if chunk.prompt_tokens is not None:
        st.in_tokens = chunk.prompt_tokens
    if chunk.cached_tokens is not None:
        st.cached = chunk.cached_tokens
    if chunk.timings is not None:  # the last one holds the whole request
        st.timings = chunk.timings
    return None


class OpenAIConnection(Connection):
    """One streamed request at a time on a keep-alive connection; each request's bytes
    come from ``requests`` (the workload's prompts, by request id)."""

    def __init__(self, sink: Sink, requests: list[bytes], api: str,
                 limits: Limits | None = None, max_event: int = 16 << 20,
                 require_done: bool = True,
                 max_tokens: int = MAX_TOKENS_PER_STREAM) -> None:
        super().__init__(sink, b"")
        self.requests = requests
        self.api = api
        self.reader = ResponseReader(limits, keep_body=True)
        self.max_event = max_event
        self.require_done = require_done
        self.max_tokens = max_tokens
        self._reset()

    def _reset(self) -> None:
        self.sse = SSEParser(max_event=self.max_event)
        self.status = 0
        self.event_stream = True
        self.ctype = b""
        self.error_body = b""
        self.first_chunk = math.nan
        self.tok: array[float] = array("d")
        self.t_done = math.nan
        self.finish_reason: str | None = None
        self.out_tokens = -1
        self.in_tokens = -1
        self.ntok: array[int] = array("i")  # per content chunk: its tokens, -1 unknown
        self.cached = -1
        self.timings: EngineTimings | str | None = None
        self.etok: array[float] | str | None = None  # the engine's time of each token
        self.usage_each = True  # every content chunk so far carried a cumulative usage
        self.settled = False  # the stream's outcome is decided (the HTTP end may follow)

    def tokens(self) -> TokenState:
        return (self.first_chunk, self.tok, self.t_done, self.out_tokens, self.in_tokens,
                self.ntok, self.cached, self.timings, self.etok)

    # -- Connection hooks ----------------------------------------------------------------

    def expect(self, rid: int) -> None:
        self.reader.expect()
        self._reset()

    def request_for(self, rid: int) -> bytes:
        return self.requests[rid]

    def data_received(self, data: bytes) -> None:
        if self.rid >= 0:
            self.nbytes += len(data)
        try:
            events = self.reader.feed(data)
            self._events(events, monotonic())
        except FramingError as err:
            self._framing(err)
        except _Fail as f:
            self.fail(f.outcome, f.reason)

    def on_eof(self) -> bool:
        try:
            for ev in self.reader.feed_eof():
                if type(ev) is End:
                    self._end(ev, monotonic())
                    return True
                if type(ev) is Data:
                    self._body(ev.data, monotonic())
        except _Fail as f:
            self.rid, rid = -1, self.rid
            self.reusable = False
            self.sink.on_response(self, rid, f.outcome, self.status, self.nbytes, f.reason)
            return True
        except FramingError as err:
            if self.status and self.status != 200 and err.kind == "truncated":
                self.reusable = False
                self.complete(*self._status_error())
                return True
            raise
        return False

    # -- the response --------------------------------------------------------------------

    def _events(self, events: list, now: float) -> None:
        for ev in events:
            kind = type(ev)
            if kind is Data:
                if self.rid >= 0:
                    self._body(ev.data, now)
            elif kind is Head:
                self.status = ev.status
                self.ctype = ev.get(b"content-type") or b"text/event-stream"
                self.event_stream = self.ctype.lower()[:17] == b"text/event-stream"
            elif kind is End:
                if self.rid >= 0:
                    self._end(ev, now)
            elif kind is Unsolicited:
                self.reusable = False
                self.stray(ev.describe())
                return
            # Informational (1xx): skipped

    def _framing(self, err: FramingError) -> None:
        if self.status and self.status != 200 and err.kind == "truncated":
            self.reusable = False
            self.complete(*self._status_error())
            self.abort()
            return
        self.fail(CODE[err.kind], err.reason)

    def _not_stream(self) -> str:
        return f"not an event stream (Content-Type {self.ctype.decode(errors='replace')})"

    def _body(self, body: bytes, now: float) -> None:
        if self.status != 200:
            if len(self.error_body) < 300:
                self.error_body += body[:300 - len(self.error_body)]
            return
        if not self.event_stream:
            raise _Fail(PROTOCOL, self._not_stream())
        if self.settled:
            return  # bytes after [DONE]: the HTTP framing still ends the response
        try:
            events = self.sse.feed(body)
        except SSETooLarge as exc:
            raise _Fail(TOO_LARGE, str(exc)) from None
        except SSEError as exc:
            raise _Fail(MALFORMED_SSE, str(exc)) from None
        for ev in events:
            if ev.event == "error":
                raise _Fail(SERVER_ERROR, f"event: error: {error_event(ev.data)}")
            if ev.data == "[DONE]":
                self.t_done = now
                self.settled = True
                return
            try:
                chunk = parse_chunk(ev.data, self.api)  # type: ignore[arg-type]
            except ChunkError as exc:
                raise _Fail(MALFORMED_SSE, str(exc)) from None
            failed = apply_chunk(self, chunk, now, self.max_tokens)
            if failed is not None:
                raise _Fail(*failed)

    def _end(self, ev: End, now: float) -> None:
        """The HTTP response is complete: decide the request's outcome."""
        if not ev.keep_alive:
            self.reusable = False
        if self.status != 200:
            self.complete(*self._status_error())
        elif not self.event_stream:
            self.reusable = False
            self.complete(PROTOCOL, self.status, self._not_stream())
        elif self.settled or (not self.require_done and self.finish_reason is not None
                              and not self.sse.pending):
            if self.t_done != self.t_done:
                self.t_done = now  # ended by a finish_reason and the framing, no [DONE]
            if self.tok:
                self.complete(OK, self.status)
            else:
                self.complete(NO_TOKEN, self.status, "the stream finished without any content")
        elif self.sse.pending:
            self.complete(CODE["truncated"], self.status, "the response ended inside an event")
        else:
            self.complete(CODE["truncated"], self.status,
                          "the response ended before data: [DONE]"
                          + ("" if self.require_done else " or a finish_reason"))

    def _status_error(self) -> tuple[int, int, str]:
        st = self.status
        outcome = CODE["status_4xx"] if 400 <= st < 500 else CODE["status_5xx"]
        if st < 400:
            outcome = PROTOCOL  # 3xx: nothing an OpenAI client can use
        return outcome, st, (f"HTTP {st}: "
                             + self.error_body.decode("utf-8", errors="replace").strip()[:200])


def _connections(engine, cfg):
    reqs = list(cfg.requests or ())
    if len(reqs) != engine.n:
        raise ValueError(f"{len(reqs)} request bodies for {engine.n} scheduled requests")
    t, lim = cfg.target, cfg.limits
    return lambda: OpenAIConnection(engine, reqs, t.api or "completions", lim,
                                    cfg.max_event_bytes, cfg.require_done,
                                    cfg.max_tokens_per_stream)


def _parse_slo(expr: str):
    from ..llm.accounting import parse_slo

    return parse_slo(expr)


BENCH_PROTOCOL = Protocol(
    kind="openai", schemes={"openai+http": False, "openai+https": True},
    usage="openai+http(s)://host:port/v1",
    flags=("--header", "--max-event-bytes", "--max-tokens-per-stream", "--model", "--api",
           "--workload", "--input-len", "--output-len", "--range-ratio", "--conversations",
           "--turns", "--system-len", "--trace", "--allow-no-done", "--trace-token-scale",
           "--trace-time-scale", "--no-usage", "--ignore-eos", "--concurrency",
           "--continuous-usage", "--engine-timings"),
    kinds=tuple(k for k in ERROR_KINDS if k != "grpc_status"), default_timeout="60s",
    target=openai_target, connections=_connections, parse_slo=_parse_slo, tokens=True,
    compiled=True)  # both schemes: fastloop.c frames the stream (fast_sse.py its JSON)
