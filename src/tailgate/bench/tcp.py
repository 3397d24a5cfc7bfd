"""Request/response over raw TCP: a response ends at a delimiter or after N bytes."""

from __future__ import annotations

from .conn import Connection, Sink
from .outcome import OK, PROTOCOL


class TcpConnection(Connection):
    """Complete when ``length`` bytes arrived, or when the bytes end with ``delimiter``.

    More bytes than ``length``, or bytes while idle, break the request/response
    contract: the request fails as ``protocol`` and the connection is dropped.
    """

    def __init__(self, sink: Sink, request: bytes, delimiter: bytes | None,
                 length: int | None) -> None:
        super().__init__(sink, request)
        self.delimiter = delimiter
        self.length = length
        self.tail = b""  # last len(delimiter)-1 bytes, for a delimiter split across reads

    def send(self, rid: int, now: float) -> None:
        self.tail = b""
        super().send(rid, now)

    def data_received(self, data: bytes) -> None:
        if self.rid < 0:
            self.fail(PROTOCOL)
            return
        self.nbytes += len(data)
        if self.length is not None:
            if self.nbytes == self.length:
                self.finish(OK)
            elif self.nbytes > self.length:
                self.fail(PROTOCOL)
            return
        delim = self.delimiter
        seen = self.tail + data
        if seen.endswith(delim):
            self.finish(OK)
        else:
            self.tail = seen[-(len(delim) - 1):] if len(delim) > 1 else b""
