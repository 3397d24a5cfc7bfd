"""One client connection: the part every protocol shares (asyncio Protocol).

A connection carries at most one request at a time (HTTP/1.1 keep-alive
without pipelining, request/response TCP). It tells its :class:`Sink` (the
engine) when a response is complete or the request failed (``on_response``,
exactly once per request sent on it), when a reused connection turned out to
be dead before any response byte (``on_stale``: the engine retries or records
``stale_connection``), when the server broke the protocol with no request in
flight (``on_conn_error``: charged to the connection, never to a request) and
when the connection went away (``on_closed``).

A stray response (bytes after a complete response, or with none in flight) also
tells the sink which requests completed ok on this connection after its first
(``on_out_of_step``): any of them may have had an earlier request's response, so
they are ``protocol`` after all (the first response on a fresh connection is its own).

A subclass owns a sans-I/O reader: it implements :meth:`Connection.expect`,
``data_received`` and :meth:`Connection.on_eof`, and calls :meth:`complete`,
:meth:`fail` or :meth:`stray`.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import time
from collections import deque
from typing import Protocol

from .http1 import FramingError
from .outcome import CODE, OK, RESET, TRUNCATED

# The reason of an ``ok`` turned ``protocol`` by a stray response after it (fastloop.c's
# OUT_OF_STEP says the same), and how many such requests a connection remembers.
OUT_OF_STEP = ("out of step: a response nobody asked for came on its connection after it, "
               "so its response may have been an earlier request's")
MAX_SUSPECTS = 64


class Sink(Protocol):
    def on_response(self, conn: Connection, rid: int, outcome: int, status: int,
                    nbytes: int, reason: str) -> None: ...

    def on_stale(self, conn: Connection, rid: int, reason: str) -> None: ...

    def on_conn_error(self, conn: Connection, kind: int, reason: str) -> None: ...

    def on_out_of_step(self, conn: Connection, rids: list[int]) -> None: ...

    def on_closed(self, conn: Connection) -> None: ...

    def on_written(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """Base class: ``send`` one request, report its end once, close cleanly."""

    def __init__(self, sink: Sink, request: bytes) -> None:
        self.sink = sink
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.rid = -1  # request in flight, -1 when idle
        self.t_send = 0.0
        self.nbytes = 0  # bytes received for the request in flight
        self.served = 0  # responses completed on this connection (>0: a reused connection)
        # requests completed ok here after the first (the last MAX_SUSPECTS): a stray
        # response shows any may have had an earlier one's response (on_out_of_step)
        self.suspects: deque[int] = deque(maxlen=MAX_SUSPECTS)
        self.closed = False
        self.eof = False  # the peer closed its side
        self.reusable = True
        self.idle = False  # on the engine's idle list (owned by the engine)
        # A request still being written (the transport paused us: the engine sets its
        # limit to 0), and a response that came before it was all out: the connection
        # takes its next request once the write is done (on_written), never over the rest
        # of a body that a reset may yet cut (fastloop.c: want_ready).
        self.writing = False
        self.want_ready = False

    @property
    def usable(self) -> bool:
        return self.reusable and not self.closed and not self.eof

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    # -- what a subclass provides -------------------------------------------------------

    def expect(self, rid: int) -> None:
        """A request is about to go out: make the reader wait for its response."""

    def request_for(self, rid: int) -> bytes:
        return self.request

    def on_eof(self) -> bool:
        """The peer closed with a request in flight: True when that completed the
        response (the subclass called :meth:`complete`); raises FramingError if not."""
        raise FramingError("closed", "connection closed before any response byte")

    # -- the request cycle ---------------------------------------------------------------

    def send(self, rid: int, now: float) -> None:
        self.expect(rid)
        self.rid = rid
        self.t_send = now
        self.nbytes = 0
        self.transport.write(self.request_for(rid))

    def complete(self, outcome: int, status: int = 0, reason: str = "") -> None:
        """The response to the request in flight is complete (or failed)."""
        rid = self.rid
        if rid < 0:
            raise AssertionError("a response completed with no request in flight")
        self.rid = -1
        if outcome == OK and self.served:
            self.suspects.append(rid)
        self.served += 1
        self.sink.on_response(self, rid, outcome, status, self.nbytes, reason)

    def fail(self, outcome: int, reason: str) -> None:
        """The request in flight failed: report it and drop the connection."""
        self.reusable = False
        if self.rid >= 0:
            rid, self.rid = self.rid, -1
            self.sink.on_response(self, rid, outcome, 0, self.nbytes, reason)
        self.abort()

    def stray(self, reason: str) -> None:
        """Bytes with no request in flight: the connection's protocol error; it is dropped."""
        self.reusable = False
        self.sink.on_conn_error(self, CODE["protocol"], reason)
        if self.suspects:
            rids = list(self.suspects)
            self.suspects.clear()
            self.sink.on_out_of_step(self, rids)
        self.abort()

    def abort(self) -> None:
        """Drop the connection now; a request in flight is the caller's to account."""
        self.rid = -1
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def pause_writing(self) -> None:
        self.writing = True

    def resume_writing(self) -> None:
        self.writing = False
        if self.want_ready:
            self.want_ready = False
            self.sink.on_written(self)

    # -- the end of the stream -------------------------------------------------------------

    def eof_received(self) -> bool | None:
        self.eof = True
        if self.rid >= 0:
            self._ended(None)
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.reusable = False
        if (self.rid >= 0 and isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError)
                and self.transport is not None
                and self.transport.get_extra_info("ssl_object") is None):
            # A write failed (the server reset the connection while we sent): it may have
            # answered first, and the kernel still holds that (see read_rest). (A TLS
            # transport reads its own rest: tls.TlsLink.)
            rest = read_rest(self.transport)
            if rest:
                self.data_received(rest)
        if self.rid >= 0:
            self._ended(exc)
        self.sink.on_closed(self)

    def _ended(self, exc: Exception | None) -> None:
        """The stream ended with a request in flight: complete, truncated, reset or stale."""
        if exc is None:
            try:
                if self.on_eof():
                    return
                kind, reason = "truncated", "connection closed inside the response"
            except FramingError as err:
                kind, reason = err.kind, err.reason
        elif isinstance(exc, ssl.SSLError):
            # A TLS alert after the handshake (TLS 1.3: a refused client certificate).
            kind, reason = "tls", handshake_reason(exc)
        else:
            kind = "closed" if not self.nbytes else "reset"
            reason = f"connection reset after {self.nbytes} response bytes: {exc}"
        rid, self.rid = self.rid, -1
        self.reusable = False
        if kind == "closed":
            if self.served:
                reason = (f"reused connection (after {self.served} response(s)) closed "
                          f"before any response byte"
                          + ("" if exc is None else f": {exc}"))
                self.sink.on_stale(self, rid, reason)
                return
            kind = "reset"
            if exc is None:
                reason = "connection closed before any response byte"
        outcome = TRUNCATED if kind == "truncated" else CODE.get(kind, RESET)
        self.sink.on_response(self, rid, outcome, 0, self.nbytes, reason)


def read_rest(transport: asyncio.BaseTransport) -> bytes:
    """What the kernel still holds for a transport whose write failed (reset by the peer).

    A server may answer a request whole and then reset the connection while the client
    is still sending (an upload it does not want; a TLS 1.3 alert after the client's
    handshake was done); the write then fails while the answer sits readable: Linux keeps
    the bytes that came before a RST and returns them before the end. Both event loops
    (uvloop, asyncio) call ``connection_lost`` before they close the socket, so it is read
    there, non-blocking, to its end (RFC 9112 9.5: a client keeps reading while it sends).
    fastloop.c's send_failed does the same."""
    sock = transport.get_extra_info("socket")
    fd = sock.fileno() if sock is not None else -1
    chunks: list[bytes] = []
    while fd >= 0:
        try:
            data = os.read(fd, 1 << 16)
        except InterruptedError:
            continue
        except OSError:  # nothing more yet (EAGAIN), or the reset itself
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def monotonic() -> float:
    """The clock every bench time is read from (CLOCK_MONOTONIC on Linux)."""
    return time.monotonic()


def tls_why(exc: BaseException) -> str:
    """An SSL or socket error as a short phrase (no "[SSL]" prefix, no _ssl.c line)."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.replace("_", " ").lower()
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return re.sub(r"^\[\w+\] |\s*\(_ssl\.c:\d+\)$", "", text)  # "[SSL] x (_ssl.c:1006)"


def handshake_reason(exc: BaseException) -> str:
    """A short, stable reason for a failed handshake (one error-example line per cause)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {exc.verify_message}"
    if isinstance(exc, TimeoutError):
        return "TLS: handshake timed out"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {tls_why(exc)}"
    if isinstance(exc, ConnectionError | EOFError):
        # asyncio reports a plain close (FIN) as a ConnectionResetError without an errno
        why = tls_why(exc) if getattr(exc, "errno", None) else "EOF"
        return f"TLS: the server closed the connection during the handshake ({why})"
    return f"TLS: {tls_why(exc)}"
