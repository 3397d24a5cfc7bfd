"""pyslow PORT SECONDS SLOW_US EVERY: a Python TCP server on 127.0.0.1:PORT, one thread per
connection, answering each line with "ok\\n"; one request in EVERY (over all connections) takes
a slow branch that computes in pure Python for SLOW_US of its thread's CPU time (a slow code
path of the service's own, no syscall). Prints "ready" once listening; ends by itself after
SECONDS (at most 60)."""

from __future__ import annotations

import itertools
import os
import socket
import sys
import threading
import time


def slow_branch(us: int) -> int:
    end = time.thread_time() + us / 1e6
    x = 0
    while time.thread_time() < end:
        for i in range(200):
            x += i * i
    return x


def serve(conn: socket.socket, counter, slow_us: int, every: int) -> None:
    with conn:
        buf = b""
        while True:
            data = conn.recv(4096)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                _, buf = buf.split(b"\n", 1)
                if every > 0 and next(counter) % every == every - 1:
                    slow_branch(slow_us)
                conn.sendall(b"ok\n")


def main() -> None:
    port, seconds, slow_us, every = (int(x) for x in sys.argv[1:5])
    seconds = seconds if 1 <= seconds <= 60 else 60
    threading.Timer(seconds, lambda: os._exit(0)).start()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1024)
    counter = itertools.count()  # next() on it is atomic under the GIL
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn, counter, slow_us, every), daemon=True).start()


if __name__ == "__main__":
    main()
