"""Request/response over raw TCP: a response ends at a delimiter or after N bytes."""

from __future__ import annotations

from ..slo import parse_slo
from .conn import Connection, Sink
from .http1 import FramingError, Limits
from .outcome import CODE, OK, PROTOCOL, REQUEST_KINDS
from .protocols import Protocol
from .target import tcp_target


class TcpReader:
    """Sans-I/O framing of one response: complete after ``length`` bytes, or at the first
    ``delimiter``. :meth:`feed` returns ``(complete, extra)``: bytes after the end are
    ``extra`` (the caller's protocol error, charged to the connection). A response longer
    than ``max_bytes`` without its end is ``too_large``."""

    __slots__ = ("delimiter", "first", "got", "length", "max_bytes", "tail", "waiting")

    def __init__(self, delimiter: bytes | None, length: int | None,
                 max_bytes: int = Limits().max_body_bytes) -> None:
        if (delimiter is None) == (length is None) or delimiter == b"":
            raise ValueError("exactly one of a non-empty delimiter and a length")
        self.delimiter = delimiter
        self.length = length
        self.max_bytes = max_bytes
        self.waiting = False
        self.got = 0
        self.tail = b""  # the last len(delimiter)-1 bytes: a delimiter split across reads
        self.first = b""  # the response's first bytes (up to 32), for the sequence stamp

    def expect(self) -> None:
        self.waiting = True
        self.got = 0
        self.tail = b""
        self.first = b""

    def feed(self, data: bytes) -> tuple[bool, bytes]:
        if not self.waiting:
            return False, data
        if len(self.first) < 32:
            self.first += data[:32 - len(self.first)]
        if self.length is not None:
            need = self.length - self.got
            if len(data) >= need:
                self.got, self.waiting = self.length, False
                return True, data[need:]
            self.got += len(data)
            return False, b""
        delim = self.delimiter
        seen = self.tail + data
        at = seen.find(delim)
        if at >= 0:
            end = at + len(delim)
            self.got += end - len(self.tail)
            self.waiting = False
            return True, seen[end:]
        self.got += len(data)
        if self.got > self.max_bytes:
            self.waiting = False
            raise FramingError("too_large", f"no delimiter within {self.max_bytes} bytes")
        self.tail = seen[-(len(delim) - 1):] if len(delim) > 1 else b""
        return False, b""

    def feed_eof(self) -> None:
        if not self.waiting:
            return
        self.waiting = False
        if not self.got:
            raise FramingError("closed", "connection closed before any response byte")
        want = (f"of {self.length} bytes" if self.length is not None
                else f"bytes without the delimiter {self.delimiter!r}")
        raise FramingError("truncated", f"connection closed after {self.got} {want}")


class TcpConnection(Connection):
    """One request at a time, framed by :class:`TcpReader`.

    Bytes after the end of a response (in the same read or later, with no request
    in flight) are the connection's ``protocol`` error: the response is still
    timed and counted, the connection is dropped. With ``check_seq`` (a test mode)
    each request is sent as ``<id>:`` + payload and its response must begin with
    ``<id>:``.
    """

    def __init__(self, sink: Sink, request: bytes, delimiter: bytes | None,
                 length: int | None, limits: Limits | None = None,
                 check_seq: bool = False) -> None:
        super().__init__(sink, request)
        self.reader = TcpReader(delimiter, length, (limits or Limits()).max_body_bytes)
        self.check_seq = check_seq

    def expect(self, rid: int) -> None:
        self.reader.expect()

    def request_for(self, rid: int) -> bytes:
        return b"%d:" % rid + self.request if self.check_seq else self.request

    def data_received(self, data: bytes) -> None:
        if self.rid < 0:
            self.stray(f"{len(data)} byte(s) with no request in flight, starting {data[:16]!r}")
            return
        self.nbytes += len(data)
        try:
            done, extra = self.reader.feed(data)
        except FramingError as err:
            self.fail(CODE[err.kind], err.reason)
            return
        if not done:
            return
        if extra:
            self.reusable = False
        outcome, reason = OK, ""
        if self.check_seq and not self.reader.first.startswith(b"%d:" % self.rid):
            outcome, self.reusable = PROTOCOL, False
            reason = f"response {self.reader.first[:16]!r} not stamped for request {self.rid}"
        self.complete(outcome, 0, reason)
        if extra:
            self.stray(f"{len(extra)} byte(s) after the complete response, starting "
                       f"{extra[:16]!r}")

    def on_eof(self) -> bool:
        self.reader.feed_eof()
        return False


def _connections(engine, cfg):
    t, lim, seq = cfg.target, cfg.limits, cfg.check_seq
    return lambda: TcpConnection(engine, t.request, t.delimiter, t.response_length, lim, seq)


BENCH_PROTOCOL = Protocol(
    kind="tcp", schemes={"tcp": False}, usage="tcp://host:port",
    flags=("--payload", "--delimiter", "--response-length"), kinds=REQUEST_KINDS,
    default_timeout="2s", target=tcp_target, connections=_connections,
    parse_slo=parse_slo, compiled=True)
