"""Misbehaving servers for the bench-core bug tests (issue 23), on loopback.

Each is an asyncio server in a thread of its own (a context manager, like
:class:`support.fault_server.FaultServer`) that counts what it did, so a test can
compare the client's accounting with the server's:

* ``header_first`` (HTTP): answers as soon as it has a request's header block, then
  reads the request's body (Content-Length) before the next request: a client that
  writes the next request over the unsent rest of a body desynchronises it.
* ``double`` (HTTP or a TCP line protocol): answers each request, then sends a second,
  unsolicited response ``delay_s`` later (a connection out of step).
* ``reset_alternate`` (HTTP): resets (RST) every other connection at accept, before
  reading anything; the others answer one request and close (``Connection: close``),
  so the client keeps opening connections while requests wait for them.
* ``reset_all`` (HTTP): resets (RST) every connection at accept, before reading anything.
* ``answer_reset`` (HTTP): reads a request's header block, answers it whole (200 with a
  Content-Length body), then resets the connection with the request's body unread: a
  client still uploading a large body finds its write failing while the whole answer
  waits in its receive buffer.
* ``idle_close`` (HTTP): closes a connection that has been idle ``delay_s``.
* ``by_seq`` (HTTP, for the client's test mode that stamps requests): a deterministic
  answer per request id (``X-Tailgate-Seq``): :func:`by_seq_response`, whichever
  connection carries it, so two engines can be compared request by request.

Every loop is bounded: a connection serves until the client goes or the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from support.async_server import AsyncServer

BEHAVIOURS = ("header_first", "double", "reset_alternate", "reset_all", "answer_reset",
              "idle_close", "by_seq")


def by_seq_response(seq: int) -> bytes:
    """Request ``seq``'s answer in ``by_seq`` mode (stamped with its id): by seq % 5 a
    200 with a Content-Length body, a 404, a chunked 503, a chunked 200 with a trailer,
    or a 200 whose body ends at the close."""
    stamp = b"X-Tailgate-Seq: %d\r\n" % seq
    body = b"b" * (seq % 7 + 1)
    kind = seq % 5
    if kind == 0:
        return b"HTTP/1.1 200 OK\r\n" + stamp + b"Content-Length: %d\r\n\r\n" % len(body) + body
    if kind == 1:
        return b"HTTP/1.1 404 Not Found\r\n" + stamp + b"Content-Length: 0\r\n\r\n"
    if kind == 2:
        return (b"HTTP/1.1 503 Busy\r\n" + stamp + b"Transfer-Encoding: chunked\r\n\r\n"
                b"4\r\nbusy\r\n0\r\n\r\n")
    if kind == 3:
        return (b"HTTP/1.1 200 OK\r\n" + stamp + b"Transfer-Encoding: chunked\r\n\r\n"
                b"%x\r\n" % len(body) + body + b"\r\n0\r\nX-Trailer: t\r\n\r\n")
    return b"HTTP/1.1 200 OK\r\n" + stamp + b"Connection: close\r\n\r\n" + body


class Misbehaving(AsyncServer):
    """``with Misbehaving("double", delay_s=0.06) as srv: ... srv.url ...``."""
    name = "misbehaving server"

    def __init__(self, behaviour: str, proto: str = "http", delay_s: float = 0.02,
                 body: bytes = b"hello", body_pause_s: float = 0.0) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {behaviour!r}")
        super().__init__(proto)
        self.behaviour = behaviour
        self.delay_s = delay_s
        self.body = body
        self.body_pause_s = body_pause_s  # header_first: a pause after each 64 KiB of body
        self.accepted = 0
        self.reset = 0  # connections reset at accept
        self.received = 0  # requests read whole (header block and body)
        self.body_bytes = 0  # request body bytes read
        self.answered = 0  # real responses written
        self.unsolicited = 0  # extra responses written
        self.closed_idle = 0
        self.last_seq = -1

    def response(self, tag: bytes = b"") -> bytes:
        if self.proto == "tcp":
            return b"pong" + tag + b"\n"
        body = self.body + tag
        close = b"Connection: close\r\n" if self.behaviour == "reset_alternate" else b""
        return (b"HTTP/1.1 200 OK\r\n" + close + b"Content-Length: %d\r\n\r\n" % len(body)
                + body)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.accepted += 1
        try:
            if (self.behaviour == "reset_alternate" and self.accepted % 2 == 1
                    or self.behaviour == "reset_all"):
                self._rst(writer)
                return
            while not self._stop.is_set():
                if self.behaviour == "idle_close":
                    try:
                        length = await asyncio.wait_for(self._read_head(reader), self.delay_s)
                    except TimeoutError:
                        self.closed_idle += 1
                        return
                else:
                    length = await self._read_head(reader)
                if length is None:
                    return
                if self.behaviour == "answer_reset":
                    writer.write(self.response())
                    await writer.drain()
                    self.answered += 1
                    self._rst(writer)
                    return
                if self.behaviour != "header_first":
                    await self._read_body(reader, length)
                self.received += int(self.behaviour != "header_first")
                if self.behaviour == "by_seq":
                    seq = self.last_seq  # (read just now: no await in between)
                    writer.write(by_seq_response(seq))
                    await writer.drain()
                    self.answered += 1
                    if seq % 5 == 4:
                        return  # the body ends at the close
                    continue
                writer.write(self.response())
                await writer.drain()
                self.answered += 1
                if self.behaviour == "reset_alternate":
                    return
                if self.behaviour == "header_first":
                    await self._read_body(reader, length)
                    self.received += 1
                elif self.behaviour == "double":
                    await asyncio.sleep(self.delay_s)
                    writer.write(self.response(b"-again"))
                    await writer.drain()
                    self.unsolicited += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    def _rst(self, writer: asyncio.StreamWriter) -> None:
        """Reset the connection (RST, not FIN): SO_LINGER 0, then the close."""
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.reset += 1
        writer.transport.abort()

    async def _read_head(self, reader: asyncio.StreamReader) -> int | None:
        """A request's header block (or a TCP line): its body length, None at the end."""
        try:
            if self.proto == "tcp":
                await reader.readuntil(b"\n")
                return 0
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return None
        length = 0
        self.last_seq = -1
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"x-tailgate-seq":
                self.last_seq = int(value)
        return length

    async def _read_body(self, reader: asyncio.StreamReader, length: int) -> None:
        left = length
        while left:
            chunk = await reader.read(min(left, 1 << 16))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(chunk)
            self.body_bytes += len(chunk)
            if self.body_pause_s:
                await asyncio.sleep(self.body_pause_s)
