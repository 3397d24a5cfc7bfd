"""One response's framing, fed bytes without a socket, by either engine's own code.

:func:`frame` runs the Python engine's connection classes (:class:`.http.HttpConnection`,
:class:`.tcp.TcpConnection`, :class:`.openai_sse.OpenAIConnection`: the sans-I/O readers
of :mod:`.http1`, :mod:`.tcp` and :mod:`tailgate.llm.sse` behind the same
``complete``/``fail``/``stray`` calls the engine sees), and :func:`frame_fast` the
compiled loop's (``fastloop.frame``: the same ``http_feed`` / ``tcp_feed`` and event
scanner the loop runs on a socket's reads; for ``openai`` the JSON is then read by
:mod:`.fast_sse`, as the compiled engine reads it). Each chunk is one read; ``eof``
closes the stream after the last. Both return a :class:`Framed`, so one codec table runs
against both engines and every case must agree (tests/test_http1_codec.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .conn import Connection
from .http import HttpConnection
from .http1 import Limits
from .openai_sse import MAX_TOKENS_PER_STREAM, OpenAIConnection
from .outcome import KINDS
from .tcp import TcpConnection


@dataclass(frozen=True)
class Framed:
    """How request 0 ended (``outcome`` None: not yet), with what was charged to the
    connection instead (``conn_errors``) and whether it could take another request."""

    outcome: str | None
    status: int
    bytes: int
    reason: str
    conn_errors: tuple[str, ...]
    open: bool
    tokens: int | None = None  # openai: the token times kept (content chunks)


class _Sink:
    def __init__(self) -> None:
        self.ended: tuple[int, int, int, str] | None = None
        self.conn_errors: list[str] = []

    def on_response(self, conn: Connection, rid: int, outcome: int, status: int,
                    nbytes: int, reason: str) -> None:
        if self.ended is None:
            self.ended = (outcome, status, nbytes, reason)

    def on_stale(self, conn: Connection, rid: int, reason: str) -> None:
        raise AssertionError("a fresh connection is never stale")

    def on_conn_error(self, conn: Connection, kind: int, reason: str) -> None:
        self.conn_errors.append(reason)

    def on_out_of_step(self, conn: Connection, rids: list[int]) -> None:
        pass  # (a first response is never another's)

    def on_closed(self, conn: Connection) -> None:
        pass


class _Wire:
    """The transport a connection writes to: it keeps nothing, and knows when it was cut."""

    def __init__(self) -> None:
        self.cut = False

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        self.cut = True


def frame(kind: str, chunks: list[bytes], *, head: bool = False, eof: bool = False,
          limits: Limits | None = None, delimiter: bytes | None = None,
          response_length: int | None = None, api: str = "completions",
          max_event: int = 16 << 20, require_done: bool = True,
          max_tokens: int = MAX_TOKENS_PER_STREAM) -> Framed:
    """The Python engine's framing of one response to request 0 (see the module doc)."""
    sink = _Sink()
    lim = limits or Limits()
    conn: Connection
    if kind == "openai":
        conn = OpenAIConnection(sink, [b"POST /v1/completions HTTP/1.1\r\n\r\n"], api, lim,
                                max_event, require_done, max_tokens)
    elif kind == "tcp":
        conn = TcpConnection(sink, b"ping\n", delimiter, response_length, lim)
    else:
        conn = HttpConnection(sink, b"HEAD / HTTP/1.1\r\n\r\n" if head
                              else b"GET / HTTP/1.1\r\n\r\n", lim)
    wire = _Wire()
    conn.connection_made(wire)  # type: ignore[arg-type]
    conn.send(0, 0.0)
    for piece in chunks:
        if wire.cut:
            break  # dropped: the rest is never read
        if piece:
            conn.data_received(piece)
    is_open = conn.usable and not wire.cut
    if eof and not wire.cut:
        conn.eof_received()
        conn.connection_lost(None)
        is_open = False
    tokens = len(conn.tok) if isinstance(conn, OpenAIConnection) else None
    if sink.ended is None:
        return Framed(None, 0, conn.nbytes, "", tuple(sink.conn_errors), is_open, tokens)
    outcome, status, nbytes, reason = sink.ended
    return Framed(KINDS[outcome], status, nbytes, reason if outcome else "",
                  tuple(sink.conn_errors), is_open, tokens)


def frame_fast(kind: str, chunks: list[bytes], *, head: bool = False, eof: bool = False,
               limits: Limits | None = None, delimiter: bytes | None = None,
               response_length: int | None = None, api: str = "completions",
               max_event: int = 16 << 20, require_done: bool = True,
               max_tokens: int = MAX_TOKENS_PER_STREAM) -> Framed:
    """The compiled loop's framing of the same (``fastloop.frame``)."""
    from .fastpath import UNAVAILABLE, fastloop

    if fastloop is None:
        raise RuntimeError(UNAVAILABLE)
    lim = limits or Limits()
    got: dict[str, Any] = fastloop.frame(
        kind, list(chunks), head, eof, lim.max_header_bytes, lim.max_line_bytes,
        lim.max_body_bytes, delimiter, response_length if response_length is not None else -1,
        max_event)
    if kind == "openai":
        from .fast_sse import frame_stream

        out, status, nbytes, reason, is_open, tokens = frame_stream(got, api, max_tokens,
                                                                    require_done)
        return Framed(KINDS[out] if out is not None else None, status, nbytes,
                      reason if out else "", tuple(got["conn_errors"]), is_open, tokens)
    return Framed(got["outcome"], got["status"], got["bytes"],
                  got["reason"] if got["outcome"] not in (None, "ok") else "",
                  tuple(got["conn_errors"]), got["open"])
