"""A small threaded HTTPS server on loopback for what nginx cannot be made to do:
a handshake that starts a known time after the TCP accept, and a client certificate
required in the handshake itself (nginx asks for it but answers 400 without one).

    with TlsServer(cert, key, handshake_delay_s=0.2) as srv:   # https://127.0.0.1:srv.port/
        ...

Every request (up to its blank line) gets ``200`` with body ``ok``, keep-alive.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time

from .threaded_server import ThreadedServer


class TlsServer(ThreadedServer):
    def __init__(self, cert: str, key: str, handshake_delay_s: float = 0.0,
                 client_ca: str | None = None) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        if client_ca:
            self.ctx.load_verify_locations(client_ca)
            self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.delay = handshake_delay_s
        self.handshakes = 0  # completed
        self.failed: list[str] = []  # handshake errors seen by the server
        super().__init__()

    def url(self, path: str = "/") -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10.0)
        try:
            if self.delay:
                time.sleep(self.delay)
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            self.failed.append(str(exc))
            conn.close()
            return
        self.handshakes += 1
        buf = b""
        with contextlib.suppress(OSError), tls:
            while not self._stop.is_set():
                data = tls.recv(65536)
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    _, buf = buf.split(b"\r\n\r\n", 1)
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
