"""A small threaded HTTPS server on loopback for what nginx cannot be made to do:
a handshake that starts a known time after the TCP accept, and a client certificate
required in the handshake itself (nginx asks for it but answers 400 without one).

    with TlsServer(cert, key, handshake_delay_s=0.2) as srv:   # https://127.0.0.1:srv.port/
        ...

Every request (up to its blank line) gets ``200`` with body ``ok``, keep-alive.
:class:`OneAnswerTlsServer` answers one request per connection and then closes it
silently (every reused connection is stale), as llama-server does.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
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

    def _handshake(self, conn: socket.socket) -> ssl.SSLSocket | None:
        conn.settimeout(10.0)
        try:
            if self.delay:
                time.sleep(self.delay)
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            self.failed.append(str(exc))
            conn.close()
            return None
        self.handshakes += 1
        return tls

    def _serve(self, conn: socket.socket) -> None:
        tls = self._handshake(conn)
        if tls is None:
            return
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


class OneAnswerTlsServer(TlsServer):
    """Answers the first request on each connection ``answer_delay_s`` after it came, with
    keep-alive headers, then closes the connection ``close_after_s`` later without reading
    or answering anything more: a request sent on a reused connection gets no response
    byte. ``received`` counts requests that arrived (up to that close), ``answered`` the
    answers."""

    def __init__(self, cert: str, key: str, *, handshake_delay_s: float,
                 answer_delay_s: float, close_after_s: float) -> None:
        super().__init__(cert, key, handshake_delay_s=handshake_delay_s)
        self.answer_delay = answer_delay_s
        self.close_after = close_after_s
        self.received = 0
        self.answered = 0
        self._mu = threading.Lock()

    def _serve(self, conn: socket.socket) -> None:
        tls = self._handshake(conn)
        if tls is None:
            return
        with contextlib.suppress(OSError), tls:
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = tls.recv(65536)
                if not data:
                    return
                buf += data
            with self._mu:
                self.received += 1
            time.sleep(self.answer_delay)
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                        b"Keep-Alive: timeout=5, max=100\r\n\r\nok")
            with self._mu:
                self.answered += 1
            # What comes meanwhile is read only to be counted (a reused connection's
            # request), never answered; then the close, without a TLS close_notify.
            end = time.monotonic() + self.close_after
            buf = buf.split(b"\r\n\r\n", 1)[1]
            while (left := end - time.monotonic()) > 0:
                tls.settimeout(left)
                try:
                    data = tls.recv(65536)
                except TimeoutError:
                    break
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    _, buf = buf.split(b"\r\n\r\n", 1)
                    with self._mu:
                        self.received += 1
            tls.shutdown(socket.SHUT_RDWR)
