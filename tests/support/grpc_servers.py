"""gRPC servers on loopback for the grpc:// tests.

* :func:`grpcio_server`: the real ``grpcio`` server (C core) with a generic handler on raw
  bytes, so no generated code is needed. Service ``test.Svc``: ``Echo`` (answers the
  request reversed), ``Fail`` (NOT_FOUND, "no such thing"), ``Sleep`` (answers after
  ``SLEEP_S``), ``Count`` (counts the calls and request bytes it got, keeps the last
  call's metadata). ``tls=(cert, key)``
  serves grpcs.
* :class:`H2Misbehaving`: an HTTP/2 server (the ``h2`` library, server side) that breaks
  gRPC or HTTP/2 on purpose, per method of service ``bad.Svc`` (see :data:`BAD`); grpcio
  cannot be made to send RST_STREAM, GOAWAY or a response without grpc-status.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent import futures

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
from hyperframe.frame import GoAwayFrame

from .threaded_server import ThreadedServer

SLEEP_S = 0.1


class Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.bytes = 0
        self.metadata: dict[str, str] = {}  # of the last call
        self.lock = threading.Lock()


def grpcio_server(tls: tuple[str, str] | None = None, workers: int = 16,
                  counter: Counter | None = None) -> tuple[grpc.Server, int]:
    """A started grpcio server and its port; stop it with ``server.stop(0)``."""

    def echo(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        return req[::-1]

    def fail(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing")

    def sleep(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        time.sleep(SLEEP_S)
        return b"slept"

    def count(req: bytes, ctx: grpc.ServicerContext) -> bytes:
        if counter is not None:
            with counter.lock:
                counter.calls += 1
                counter.bytes += len(req)
                counter.metadata = dict(ctx.invocation_metadata())
        return req[:16]

    handler = grpc.method_handlers_generic_handler("test.Svc", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
        "Sleep": grpc.unary_unary_rpc_method_handler(sleep),
        "Count": grpc.unary_unary_rpc_method_handler(count),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((handler,))
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        with open(tls[0], "rb") as f:
            cert = f.read()
        with open(tls[1], "rb") as f:
            key = f.read()
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    server.start()
    return server, port


def _msg(data: bytes) -> bytes:
    return b"\x00" + len(data).to_bytes(4, "big") + data


OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]
BAD = {
    "Ok": "a proper answer",
    "Reset": "RST_STREAM CANCEL on the call",
    "GoAway": "GOAWAY ENHANCE_YOUR_CALM before the call (last stream: the one before)",
    "Graceful": "GOAWAY NO_ERROR covering the call, then a proper answer",
    "NoStatus": "a message and the end of the stream, no trailers",
    "Http503": "HTTP 503 with no gRPC headers",
    "TwoMessages": "two messages, grpc-status 0",
    "Cut": "a message whose prefix says 10 bytes, 3 sent, grpc-status 0",
    "Html": "content-type text/html, grpc-status 0",
    "BigHeaders": "a proper answer with a 4 KiB header",
}


class H2Misbehaving(ThreadedServer):
    """Threaded loopback HTTP/2 (h2c prior knowledge) server; see the module docstring."""

    def url(self, method: str) -> str:
        return f"grpc://127.0.0.1:{self.port}/bad.Svc/{method}"

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(10.0)
        h2c = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8"))
        h2c.initiate_connection()
        paths: dict[int, str] = {}
        # the client may break off (a GOAWAY sent, a connection aborted): that ends this one
        with contextlib.suppress(OSError, h2.exceptions.ProtocolError), sock:
            sock.sendall(h2c.data_to_send())
            while not self._stop.is_set():
                data = sock.recv(65536)
                if not data:
                    return
                out = b""
                for ev in h2c.receive_data(data):
                    if isinstance(ev, h2.events.RequestReceived):
                        paths[ev.stream_id] = dict(ev.headers)[":path"]
                    elif isinstance(ev, h2.events.DataReceived):
                        h2c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, h2.events.StreamEnded):
                        out += h2c.data_to_send()
                        out += self._answer(h2c, ev.stream_id, paths.pop(ev.stream_id))
                sock.sendall(out + h2c.data_to_send())

    def _answer(self, h2c: h2.connection.H2Connection, sid: int, path: str) -> bytes:
        """Queue the answer in ``h2c``; returns raw bytes to send before it (if any)."""
        method = path.rsplit("/", 1)[-1]
        if method == "Reset":
            h2c.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        elif method == "GoAway":
            h2c.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM,
                                 additional_data=b"too many calls", last_stream_id=sid - 2)
        elif method == "Graceful":
            # GOAWAY first, then the answer to the call it covers (h2 itself sends
            # nothing after its own GOAWAY, so the frame is written by hand)
            self._proper(h2c, sid)
            return GoAwayFrame(0, last_stream_id=sid, error_code=0).serialize()
        elif method == "NoStatus":
            h2c.send_headers(sid, OK_HEADERS)
            h2c.send_data(sid, _msg(b"hi"), end_stream=True)
        elif method == "Http503":
            h2c.send_headers(sid, [(":status", "503")], end_stream=True)
        elif method == "TwoMessages":
            h2c.send_headers(sid, OK_HEADERS)
            h2c.send_data(sid, _msg(b"a") + _msg(b"b"))
            h2c.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        elif method == "Cut":
            h2c.send_headers(sid, OK_HEADERS)
            h2c.send_data(sid, b"\x00\x00\x00\x00\x0aabc")
            h2c.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        elif method == "Html":
            h2c.send_headers(sid, [(":status", "200"), ("content-type", "text/html")])
            h2c.send_data(sid, _msg(b"<p>"))
            h2c.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        elif method == "BigHeaders":
            h2c.send_headers(sid, [*OK_HEADERS, ("x-big", "b" * 4096)])
            h2c.send_data(sid, _msg(b"ok"))
            h2c.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        else:
            self._proper(h2c, sid)
        return b""

    @staticmethod
    def _proper(h2c: h2.connection.H2Connection, sid: int) -> None:
        h2c.send_headers(sid, OK_HEADERS)
        h2c.send_data(sid, _msg(b"ok"))
        h2c.send_headers(sid, [("grpc-status", "0")], end_stream=True)
