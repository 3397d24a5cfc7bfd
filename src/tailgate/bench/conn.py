"""One client connection: the part every protocol shares (asyncio Protocol).

A connection carries at most one request at a time (HTTP/1.1 keep-alive
without pipelining, request/response TCP). It tells its :class:`Sink` (the
engine) when a response is complete, when the request failed, and when the
connection went away. A subclass only parses bytes: ``data_received`` and a
call to :meth:`Connection.finish`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from .outcome import PROTOCOL, RESET


class Sink(Protocol):
    def on_response(self, conn: Connection, rid: int, outcome: int, status: int,
                    nbytes: int) -> None: ...

    def on_closed(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """Base class: ``send`` one request, report its end once, close cleanly."""

    def __init__(self, sink: Sink, request: bytes) -> None:
        self.sink = sink
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.rid = -1  # request in flight, -1 when idle
        self.t_send = 0.0
        self.nbytes = 0
        self.closed = False
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, rid: int, now: float) -> None:
        self.rid = rid
        self.t_send = now
        self.nbytes = 0
        self.transport.write(self.request)

    def finish(self, outcome: int, status: int = 0) -> None:
        """The response to the request in flight is complete (or failed)."""
        rid = self.rid
        self.rid = -1
        self.sink.on_response(self, rid, outcome, status, self.nbytes)

    def fail(self, outcome: int = PROTOCOL) -> None:
        """The peer broke the protocol: fail the request in flight and drop the connection."""
        self.reusable = False
        if self.rid >= 0:
            self.finish(outcome)
        self.abort()

    def abort(self) -> None:
        """Drop the connection now; a request in flight is the caller's to account."""
        self.rid = -1
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.reusable = False
        if self.rid >= 0:
            self.finish(RESET)
        self.sink.on_closed(self)

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost accounts a request in flight


def monotonic() -> float:
    """The clock every bench time is read from (CLOCK_MONOTONIC on Linux)."""
    return time.monotonic()
