"""A loopback TCP server that serves each connection in a thread of its own: the accept
loop and lifecycle shared by the test servers that speak what nginx cannot be made to."""

from __future__ import annotations

import socket
import threading
from typing import Self


class ThreadedServer:
    """Subclasses define ``_serve(conn)``; ``accepted`` counts connections."""

    def __init__(self, backlog: int = 128) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=backlog)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=5)
