"""One streamed request to an OpenAI-compatible server, timed chunk by chunk.

An asyncio protocol over a fresh TCP connection: httptools parses the HTTP/1.1
response (chunked or not), :class:`~tailgate.llm.sse.SSEParser` the event
stream, :func:`~tailgate.llm.openai.parse_chunk` each event. Every read from
the socket is timestamped once (``time.perf_counter_ns``, CLOCK_MONOTONIC), and
each content-bearing chunk in it takes that time: that is when the client could
first have shown the token.

Every request ends in exactly one :class:`Record` with ``error`` None (ok) or
one kind. The first five mean what they mean in ``tailgate bench``
(:mod:`tailgate.bench.outcome`): ``connect``, ``timeout`` (recorded at its
time-out), ``reset`` (the connection closed or reset before the stream
finished: a dropped stream), ``status_4xx``, ``status_5xx``, ``protocol`` (an
HTTP response we could not parse, or not an event stream); then
``malformed_sse`` (bad event-stream framing or chunk JSON), ``server_error`` (an
error object inside the stream) and ``no_token`` (a complete stream without
any content); ``interrupted`` marks a request still open when the run was stopped
(Ctrl-C).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools

from .openai import PATHS, Api, ChunkError, parse_chunk
from .sse import SSEError, SSEParser

ERROR_KINDS = ("connect", "timeout", "reset", "status_4xx", "status_5xx", "protocol",
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


class _Stream(asyncio.Protocol):
    """Drives one request; resolves ``done`` once the record is complete."""

    def __init__(self, rec: Record, api: Api, payload: bytes, done: asyncio.Future) -> None:
        self.rec = rec
        self.api = api
        self.payload = payload
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.http = httptools.HttpResponseParser(self)
        self.sse = SSEParser()
        self.now = 0
        self.saw_done = False
        self.error_body = b""

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
            self.http.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._finish("protocol", "unexpected protocol upgrade")
        except httptools.HttpParserError as exc:
            # An exception in a callback (our SSE/chunk parsing) arrives wrapped.
            cause = exc.__context__
            if isinstance(cause, NotEventStream):
                self._finish("protocol", str(cause))
            elif isinstance(cause, (SSEError, ChunkError)):
                self._finish("malformed_sse", str(cause))
            elif cause is not None:
                self._finish("protocol", f"{type(cause).__name__}: {cause}")
            else:
                self._finish("protocol", f"bad HTTP response: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.now = time.perf_counter_ns()
            why = f"connection lost: {exc}" if exc else "connection closed mid-stream"
            if self.rec.status is not None and self.rec.status != 200:
                self._status_error()
            elif exc is None and self.rec.status == 200:
                # A body without length or chunking ends at EOF (HTTP/1.0 style): judge the
                # stream as at a message end (finished, or cut short).
                self.on_message_complete()
            else:
                self._finish("reset", why)

    # -- httptools callbacks ---------------------------------------------------
    def on_headers_complete(self) -> None:
        self.rec.status = self.http.get_status_code()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value.lower()

    def on_body(self, body: bytes) -> None:
        if self.rec.status != 200:
            if len(self.error_body) < 300:
                self.error_body += body[: 300 - len(self.error_body)]
            return
        if getattr(self, "content_type", b"text/event-stream")[:17] != b"text/event-stream":
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

    def on_message_complete(self) -> None:
        if self.done.done():
            return
        if self.rec.status != 200:
            self._status_error()
        elif self.sse.pending:
            self._finish("malformed_sse", "stream ended inside an event")
        elif self.rec.finish_reason is None and not self.saw_done:
            self._finish("reset", "response ended without [DONE] or a finish_reason")
        else:
            self._finish_stream()

    # -- ending ------------------------------------------------------------------
    def _status_error(self) -> None:
        kind = "status_4xx" if 400 <= (self.rec.status or 0) < 500 else "status_5xx"
        if self.rec.status is not None and self.rec.status < 400:
            kind = "protocol"  # 1xx/3xx: nothing an OpenAI client can use
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
                         deadline_ns: int) -> Record:
    """Send one request and fill ``rec``; never raises for the server's faults.

    ``deadline_ns`` (perf_counter_ns) bounds the whole request, connection included;
    past it the request is recorded as a ``timeout`` at the deadline.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    proto = _Stream(rec, api, ep.request(api, body), done)
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
