"""One streamed request to an OpenAI-compatible server, timed chunk by chunk.

An asyncio protocol over a fresh TCP connection: the sans-I/O
:class:`tailgate.bench.http1.ResponseReader` frames the HTTP/1.1 response,
:class:`~tailgate.llm.sse.SSEParser` the event stream,
:func:`~tailgate.llm.openai.parse_chunk` each event. Every read from the socket
is timestamped once (``time.perf_counter_ns``, CLOCK_MONOTONIC), and each
content-bearing chunk in it takes that time: that is when the client could
first have shown the token.

Every request ends in exactly one :class:`Record` with ``error`` None (ok) or
one kind. The first five mean what they mean in ``tailgate bench``
(:mod:`tailgate.bench.outcome`): ``connect``, ``timeout`` (recorded at its
time-out), ``reset`` (the connection was reset, or closed before any response
byte), ``status_4xx``, ``status_5xx``, ``protocol`` (an HTTP response we could
not parse, or not an event stream), ``truncated`` (the stream ended before its
framing or ``[DONE]`` said it was complete), ``too_large`` (a header block,
body, SSE line or event past its limit), ``upgrade`` (a 101 nobody asked for);
then ``malformed_sse`` (bad event-stream framing or chunk JSON),
``server_error`` (an error object inside the stream) and ``no_token`` (a
complete stream without any content); ``interrupted`` marks a request still open when the run was stopped
(Ctrl-C).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..bench.http1 import Data, End, FramingError, Head, Limits, ResponseReader
from .openai import PATHS, Api, ChunkError, parse_chunk
from .sse import SSEError, SSEParser, SSETooLarge

ERROR_KINDS = ("connect", "timeout", "reset", "status_4xx", "status_5xx", "protocol",
               "truncated", "too_large", "upgrade",
               "malformed_sse", "server_error", "no_token", "interrupted")


@dataclass
class Record:
    """What happened to one request; times are perf_counter_ns values."""

    index: int
    intended_ns: int
    conversation: int | None = None
    turn: int | None = None
    nominal_input: int = 0  # the workload's input length in tokens (words)
    sent_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)  # arrival of each content chunk
    first_chunk_ns: int | None = None  # arrival of the first chunk, content or not
    end_ns: int | None = None
    status: int | None = None
    error: str | None = None
    detail: str = ""
    prompt_tokens: int | None = None  # from the server's usage, when sent
    completion_tokens: int | None = None
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    base_path: str  # e.g. "/v1"
    tls: bool

    @classmethod
    def parse(cls, target: str) -> Endpoint:
        """``openai+http://host:port/v1`` (or https); raises ValueError when malformed."""
        if not target.startswith(("openai+http://", "openai+https://")):
            raise ValueError(f"{target!r}: expected openai+http://HOST:PORT/PATH")
        url = urlsplit(target[len("openai+"):])
        if not url.hostname:
            raise ValueError(f"{target!r}: no host")
        tls = url.scheme == "https"
        try:
            port = url.port or (443 if tls else 80)
        except ValueError as exc:
            raise ValueError(f"{target!r}: {exc}") from None
        return cls(url.hostname, port, url.path.rstrip("/"), tls)

    def request(self, api: Api, body: bytes) -> bytes:
        host = f"[{self.host}]" if ":" in self.host else self.host
        head = (f"POST {self.base_path}{PATHS[api]} HTTP/1.1\r\n"
                f"Host: {host}:{self.port}\r\n"
                "Content-Type: application/json\r\n"
                "Accept: text/event-stream\r\n"
                "User-Agent: tailgate-bench\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n")
        return head.encode() + body


class NotEventStream(ValueError):
    """A 200 response whose Content-Type is not text/event-stream."""


_KIND = {"closed": "reset"}  # FramingError kinds are client kinds, except "closed"


class _Stream(asyncio.Protocol):
    """Drives one request; resolves ``done`` once the record is complete.

    The HTTP/1.1 framing is :class:`tailgate.bench.http1.ResponseReader`'s (the
    same rules as ``tailgate bench``): interim 1xx responses are skipped, a body
    without a length ends at the close, and a stream that ends before its
    framing says it is complete is ``truncated`` whatever chunks came before.
    The stream itself is complete at ``data: [DONE]``; with ``require_done``
    off, a properly framed end after a ``finish_reason`` is accepted too (for
    servers that omit ``[DONE]``).
    """

    def __init__(self, rec: Record, api: Api, payload: bytes, done: asyncio.Future,
                 limits: Limits | None = None, max_event: int = 16 << 20,
                 require_done: bool = True) -> None:
        self.rec = rec
        self.api = api
        self.payload = payload
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader(limits, keep_body=True)
        self.reader.expect()
        self.sse = SSEParser(max_event=max_event)
        self.require_done = require_done
        self.now = 0
        self.saw_done = False
        self.error_body = b""
        self.event_stream = True

    # -- asyncio ---------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.rec.sent_ns = time.perf_counter_ns()
        transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self.now = time.perf_counter_ns()
        try:
            self._events(self.reader.feed(data))
        except FramingError as exc:
            self._framing_error(exc)
        except NotEventStream as exc:
            self._finish("protocol", str(exc))
        except SSETooLarge as exc:
            self._finish("too_large", str(exc))
        except (SSEError, ChunkError) as exc:
            self._finish("malformed_sse", str(exc))

    def eof_received(self) -> bool | None:
        if not self.done.done():
            self.now = time.perf_counter_ns()
            try:
                self._events(self.reader.feed_eof())
            except FramingError as exc:
                self._framing_error(exc)
            except (SSEError, ChunkError, NotEventStream) as exc:  # pragma: no cover - as above
                self._finish("malformed_sse", str(exc))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None and not self.done.done():
            self.eof_received()  # a transport that closes without calling it
        if not self.done.done():
            self.now = time.perf_counter_ns()
            got = self.reader.received
            self._finish("reset", f"connection reset after {got} response bytes: {exc}"
                         if exc else f"connection closed after {got} response bytes")

    # -- the response ------------------------------------------------------------
    def _events(self, events: list) -> None:
        for ev in events:
            if self.done.done():
                return
            kind = type(ev)
            if kind is Data:
                self._body(ev.data)
            elif kind is Head:
                self.rec.status = ev.status
                ctype = ev.get(b"content-type") or b"text/event-stream"
                self.event_stream = ctype.lower()[:17] == b"text/event-stream"
                self.content_type = ctype
            elif kind is End:
                self._message_complete()
            # Informational: skipped; Unsolicited: the request is over, the connection closes

    def _framing_error(self, exc: FramingError) -> None:
        if self.rec.status is not None and self.rec.status != 200 and exc.kind == "truncated":
            self._status_error()  # the status is what matters for an error response
        else:
            self._finish(_KIND.get(exc.kind, exc.kind), exc.reason)

    def _body(self, body: bytes) -> None:
        if self.rec.status != 200:
            if len(self.error_body) < 300:
                self.error_body += body[: 300 - len(self.error_body)]
            return
        if not self.event_stream:
            raise NotEventStream(f"not an event stream (Content-Type "
                                 f"{self.content_type.decode(errors='replace')})")
        for ev in self.sse.feed(body):
            if self.done.done():
                return
            if ev.data == "[DONE]":
                self.saw_done = True
                self._finish_stream()
                return
            chunk = parse_chunk(ev.data, self.api)
            if self.rec.first_chunk_ns is None:
                self.rec.first_chunk_ns = self.now
            if chunk.error is not None:
                self._finish("server_error", chunk.error)
                return
            if chunk.text:
                self.rec.token_ns.append(self.now)
            if chunk.finish_reason:
                self.rec.finish_reason = chunk.finish_reason
            if chunk.completion_tokens is not None:
                self.rec.completion_tokens = chunk.completion_tokens
            if chunk.prompt_tokens is not None:
                self.rec.prompt_tokens = chunk.prompt_tokens

    def _message_complete(self) -> None:
        if self.done.done():
            return
        if self.rec.status != 200:
            self._status_error()
        elif not self.event_stream:
            self._finish("protocol", "not an event stream (Content-Type "
                         f"{self.content_type.decode(errors='replace')})")
        elif self.sse.pending:
            self._finish("truncated", "the response ended inside an event")
        elif self.require_done or self.rec.finish_reason is None:
            self._finish("truncated", "the response ended before data: [DONE]"
                         + ("" if self.require_done else " or a finish_reason"))
        else:
            self._finish_stream()

    # -- ending ------------------------------------------------------------------
    def _status_error(self) -> None:
        kind = "status_4xx" if 400 <= (self.rec.status or 0) < 500 else "status_5xx"
        if self.rec.status is not None and self.rec.status < 400:
            kind = "protocol"  # 3xx: nothing an OpenAI client can use
        self._finish(kind, f"HTTP {self.rec.status}: "
                     + self.error_body.decode("utf-8", errors="replace").strip()[:200])

    def _finish_stream(self) -> None:
        if not self.rec.token_ns:
            self._finish("no_token", "the stream finished without any content")
        else:
            self._finish(None, "")

    def _finish(self, error: str | None, detail: str) -> None:
        if self.done.done():
            return
        self.rec.end_ns = self.now or time.perf_counter_ns()
        self.rec.error = error
        self.rec.detail = detail
        self.done.set_result(self.rec)
        if self.transport is not None:
            self.transport.close()


async def stream_request(ep: Endpoint, api: Api, body: bytes, rec: Record,
                         deadline_ns: int, limits: Limits | None = None,
                         max_event: int = 16 << 20, require_done: bool = True) -> Record:
    """Send one request and fill ``rec``; never raises for the server's faults.

    ``deadline_ns`` (perf_counter_ns) bounds the whole request, connection included;
    past it the request is recorded as a ``timeout`` at the deadline.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    proto = _Stream(rec, api, ep.request(api, body), done, limits, max_event, require_done)
    remaining = (deadline_ns - time.perf_counter_ns()) / 1e9
    transport = None
    try:
        if remaining <= 0:
            raise TimeoutError
        ctx = ssl.create_default_context() if ep.tls else None
        async with asyncio.timeout(remaining):
            try:
                transport, _ = await loop.create_connection(
                    lambda: proto, ep.host, ep.port, ssl=ctx,
                    server_hostname=ep.host if ctx else None)
            except OSError as exc:
                rec.end_ns = time.perf_counter_ns()
                rec.error, rec.detail = "connect", f"{type(exc).__name__}: {exc}"
                return rec
            await done
    except TimeoutError:
        # The time-out cancels the await, and with it ``done``: the record is then open.
        if not done.done() or done.cancelled():
            rec.end_ns = deadline_ns  # recorded at its time-out, as it was bound to end
            rec.error, rec.detail = "timeout", "no complete response before the time-out"
    except asyncio.CancelledError:
        if not done.done() or done.cancelled():
            rec.end_ns = time.perf_counter_ns()
            rec.error, rec.detail = "interrupted", "still open when the run was stopped"
        raise
    finally:
        if transport is not None and not transport.is_closing():
            transport.abort()
    return rec
