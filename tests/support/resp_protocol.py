"""A protocol added the way the registry says (tests/test_bench_spec.py): Redis's RESP
``PING``, in this one module — its target, its connection (the TCP framer: a reply is
one CRLF-terminated line), its error kinds — and a server that answers it."""

from __future__ import annotations

import socket

from support.threaded_server import ThreadedServer
from tailgate.bench.outcome import REQUEST_KINDS
from tailgate.bench.protocols import Protocol
from tailgate.bench.target import Target, TargetError, _host_port
from tailgate.bench.tcp import TcpConnection
from tailgate.slo import parse_slo

PING = b"*1\r\n$4\r\nPING\r\n"


def resp_target(url: str, secure: bool, o) -> Target:
    host, port, _ = _host_port(url, 6379)
    if o.body or o.payload is not None:
        raise TargetError("a resp:// target sends PING")
    return Target(url, "resp", host, port, PING, delimiter=b"\r\n")


def _connections(engine, cfg):
    t = cfg.target
    return lambda: TcpConnection(engine, t.request, t.delimiter, None, cfg.limits,
                                 cfg.check_seq)


BENCH_PROTOCOL = Protocol(
    kind="resp", schemes={"resp": False}, usage="resp://host:port", flags=(),
    kinds=REQUEST_KINDS, default_timeout="2s", target=resp_target,
    connections=_connections, parse_slo=parse_slo)


class PongServer(ThreadedServer):
    """Answers every PING with +PONG; counts the PINGs it read."""

    pings = 0

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while chunk := conn.recv(4096):
                buf += chunk
                while buf.startswith(PING):
                    buf = buf[len(PING):]
                    self.pings += 1
                    conn.sendall(b"+PONG\r\n")
