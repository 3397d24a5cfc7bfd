"""HTTP/1.1 keep-alive responses, framed by the sans-I/O :mod:`.http1` reader."""

from __future__ import annotations

from ..slo import parse_slo
from .conn import Connection, Sink
from .http1 import End, FramingError, Head, Limits, ResponseReader, Unsolicited
from .outcome import CODE, PROTOCOL, REQUEST_KINDS, http_outcome
from .protocols import Protocol
from .target import http_target

SEQ_HEADER = b"x-tailgate-seq"  # the test mode's sequence stamp, request and response


class HttpConnection(Connection):
    """One request at a time; the response is timed when its framing says it is complete.

    A response that says ``Connection: close`` (or is HTTP/1.0 without keep-alive,
    or ends at the close) completes normally and retires the connection. With
    ``check_seq`` (a test mode) every request carries ``X-Tailgate-Seq: <id>`` and
    a response not stamped with the same id is a ``protocol`` error.
    """

    def __init__(self, sink: Sink, request: bytes, limits: Limits | None = None,
                 check_seq: bool = False) -> None:
        super().__init__(sink, request)
        self.head = request.startswith(b"HEAD ")
        self.reader = ResponseReader(limits, heads=check_seq)  # heads: for the stamp only
        self.check_seq = check_seq
        self.mismatch = ""
        if check_seq:
            cut = request.index(b"\r\n\r\n") + 2
            self._pre, self._post = request[:cut], request[cut:]

    def expect(self, rid: int) -> None:
        self.reader.expect(self.head)
        self.mismatch = ""

    def send(self, rid: int, now: float) -> None:
        # Connection.send without its two hook calls: this is the hot path.
        self.reader.expect(self.head)
        self.mismatch = ""
        self.rid = rid
        self.t_send = now
        self.nbytes = 0
        self.transport.write(self.request_for(rid) if self.check_seq else self.request)

    def request_for(self, rid: int) -> bytes:
        if not self.check_seq:
            return self.request
        return self._pre + b"X-Tailgate-Seq: %d\r\n" % rid + self._post

    def data_received(self, data: bytes) -> None:
        if self.rid >= 0:
            self.nbytes += len(data)
        try:
            events = self.reader.feed(data)
        except FramingError as err:
            self.fail(CODE[err.kind], err.reason)
            return
        if events and type(events[-1]) is Unsolicited:
            self.reusable = False  # decided before the response completes and frees us
        for ev in events:
            kind = type(ev)
            if kind is End:
                self._end(ev)
            elif kind is Head and self.check_seq:
                self._check(ev)
            elif kind is Unsolicited:
                self.stray(ev.describe())
                return

    def on_eof(self) -> bool:
        for ev in self.reader.feed_eof():
            if type(ev) is End:
                self._end(ev)
                return True
        return False

    def _check(self, head: Head) -> None:
        stamp = head.get(SEQ_HEADER)
        if stamp != b"%d" % self.rid:
            self.mismatch = (f"response stamped for request {stamp.decode('latin-1')}, "
                             f"not {self.rid}" if stamp is not None
                             else "response without a sequence stamp")

    def _end(self, ev: End) -> None:
        if not ev.keep_alive:
            self.reusable = False
        if self.mismatch:
            self.reusable = False
            self.complete(PROTOCOL, ev.status, self.mismatch)
            return
        outcome = http_outcome(ev.status)
        self.complete(outcome, ev.status, f"HTTP {ev.status}" if outcome else "")


def _connections(engine, cfg):
    t, lim, seq = cfg.target, cfg.limits, cfg.check_seq
    return lambda: HttpConnection(engine, t.request, lim, seq)


BENCH_PROTOCOL = Protocol(
    kind="http", schemes={"http": False, "https": True}, usage="http(s)://host:port/path",
    flags=("--method", "--body", "--body-file", "--header"), kinds=REQUEST_KINDS,
    default_timeout="2s", target=http_target, connections=_connections,
    parse_slo=parse_slo, compiled=True)
