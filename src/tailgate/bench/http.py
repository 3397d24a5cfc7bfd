"""HTTP/1.1 keep-alive responses, parsed by httptools (llhttp, the parser in Node.js)."""

from __future__ import annotations

import httptools

from .conn import Connection, Sink
from .outcome import PROTOCOL, http_outcome


class HttpConnection(Connection):
    """Counts response bytes, completes on ``on_message_complete`` with the status code.

    A response that says ``Connection: close`` (or HTTP/1.0 without keep-alive)
    completes normally and retires the connection. A response to HEAD has no body
    whatever its Content-Length says (RFC 9110, 9.3.2), but llhttp cannot be told
    so through httptools: it completes on its headers, and a fresh parser takes the
    next response.
    """

    def __init__(self, sink: Sink, request: bytes) -> None:
        super().__init__(sink, request)
        self.head = request.startswith(b"HEAD ")
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        if self.rid < 0:
            self.fail(PROTOCOL)  # bytes nobody asked for
            return
        self.nbytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.fail(PROTOCOL)

    # httptools callbacks
    def on_headers_complete(self) -> None:
        if not self.head:
            return
        status, keep = self.parser.get_status_code(), self.parser.should_keep_alive()
        self.parser = httptools.HttpResponseParser(self)
        if not keep:
            self.reusable = False
        self.finish(http_outcome(status), status)

    def on_message_complete(self) -> None:
        if self.head:
            return  # completed on its headers
        if not self.parser.should_keep_alive():
            self.reusable = False
        self.finish(http_outcome(self.parser.get_status_code()), self.parser.get_status_code())
