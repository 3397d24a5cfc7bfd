"""HTTP/1.1 keep-alive responses, parsed by httptools (llhttp, the parser in Node.js)."""

from __future__ import annotations

import httptools

from .conn import Connection, Sink
from .outcome import PROTOCOL, http_outcome


class HttpConnection(Connection):
    """Counts response bytes, completes on ``on_message_complete`` with the status code.

    A response that says ``Connection: close`` (or HTTP/1.0 without keep-alive)
    completes normally and retires the connection.
    """

    def __init__(self, sink: Sink, request: bytes) -> None:
        super().__init__(sink, request)
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

    # httptools callback
    def on_message_complete(self) -> None:
        if not self.parser.should_keep_alive():
            self.reusable = False
        self.finish(http_outcome(self.parser.get_status_code()), self.parser.get_status_code())
