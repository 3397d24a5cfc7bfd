"""A misbehaving server for load-generator tests: one mode per misbehaviour, on loopback.

It speaks HTTP/1.1 (``proto="http"``) or a line protocol over TCP (``proto="tcp"``:
a request is ``<seq>:<payload>\\n``, a response ``<seq>:pong\\n``) and counts what
it received and sent: ``received`` requests read whole, ``completed`` valid
responses written whole (the ones a correct client counts as ``ok``),
``unsolicited`` extra responses/bytes nobody asked for, and the bytes both ways.
Every response carries the sequence number of the request it answers
(``X-Tailgate-Seq`` for HTTP, the ``<seq>:`` prefix for TCP), so a client in its
test mode can check that it credits each response to its own request.

It runs its own asyncio loop in a thread; use it as a context manager. Every
loop it runs is bounded (the endless modes stop after ``ENDLESS_LIMIT`` bytes).
"""

from __future__ import annotations

import asyncio
import socket
import struct

from support.async_server import AsyncServer

ENDLESS_LIMIT = 512 * 1024 * 1024  # an "endless" stream stops here (the client cuts it first)

# mode -> (error kind a correct client reports for the requests not completed, doc)
HTTP_MODES = {
    "ok": (None, "HTTP/1.1 200 with Content-Length, keep-alive"),
    "chunked": (None, "chunked body with chunk extensions and a trailer"),
    "http10_eof": (None, "HTTP/1.0 200, no length: the body ends at the close"),
    "close_eof": (None, "HTTP/1.1 200, Connection: close, no length: ends at the close"),
    "interim": (None, "100 Continue and 103 Early Hints before the final 200"),
    "te_and_cl": (None, "Transfer-Encoding: chunked and a wrong Content-Length (TE wins)"),
    "not_modified": (None, "304 with a Content-Length and no body, keep-alive"),
    "no_content": (None, "204 with a Content-Length and no body, keep-alive"),
    "unsolicited": (None, "a second response in the same write as the first"),
    "unsolicited_late": (None, "a second response 10 ms after the first"),
    "stale": ("stale_connection", "answers the first request on a connection, then closes "
                                  "the connection on the next one without a response"),
    "upgrade": ("upgrade", "101 Switching Protocols nobody asked for"),
    "short_cl": ("truncated", "Content-Length 100, 10 bytes sent, then the close"),
    "eof_mid_chunk": ("truncated", "the close inside a chunk"),
    "reset": ("reset", "RST instead of a response"),
    "bad_status": ("protocol", "not a status line"),
    "endless_header": ("too_large", "header lines that never end"),
    "hang": ("timeout", "reads the request, never answers"),
    "status_503": ("status_5xx", "a complete 503"),
    "wrong_stamp": ("protocol", "a valid response stamped with another request's number"),
}
TCP_MODES = {
    "ok": (None, "the response in one write"),
    "split": (None, "the response in two writes, 5 ms apart"),
    "extra_same_write": (None, "bytes after the delimiter in the same write"),
    "extra_late": (None, "bytes after the delimiter 10 ms later"),
    "truncated": ("truncated", "half a response, then the close"),
    "endless": ("too_large", "bytes without a delimiter, never ending"),
    "reset": ("reset", "RST instead of a response"),
}


class FaultServer(AsyncServer):
    """``with FaultServer("unsolicited") as srv: ... srv.url ... srv.completed``."""
    name = "fault server"

    def __init__(self, mode: str, proto: str = "http") -> None:
        modes = HTTP_MODES if proto == "http" else TCP_MODES
        if mode not in modes:
            raise ValueError(f"unknown {proto} mode {mode!r}")
        super().__init__(proto)
        self.mode = mode
        self.received = 0
        self.completed = 0
        self.unsolicited = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.seqs: list[int] = []  # sequence numbers of the requests received, in order
        # The late modes' stray comes 10 ms after a response; after the run's last response
        # nobody reads it (the run ends there), so the test names that request: no stray.
        self.last_seq: int | None = None

    # -- one connection ---------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        served = 0
        try:
            while True:
                seq = await (self._read_http(reader) if self.proto == "http"
                             else self._read_tcp(reader))
                if seq is None:
                    return
                self.received += 1
                self.seqs.append(seq)
                go_on = await (self._answer_http(writer, seq, served) if self.proto == "http"
                               else self._answer_tcp(writer, seq))
                served += 1
                if not go_on:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    async def _read_http(self, reader: asyncio.StreamReader) -> int | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return None
        self.bytes_in += len(head)
        seq, length = -1, 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"x-tailgate-seq":
                seq = int(value)
            elif name.lower() == b"content-length":
                length = int(value)
        if length:
            self.bytes_in += len(await reader.readexactly(length))
        return seq

    async def _read_tcp(self, reader: asyncio.StreamReader) -> int | None:
        try:
            line = await reader.readuntil(b"\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return None
        self.bytes_in += len(line)
        return int(line.split(b":", 1)[0])

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        self.bytes_out += len(data)
        await writer.drain()

    def _rst(self, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def _endless(self, writer: asyncio.StreamWriter, line: bytes) -> None:
        sent = 0
        while sent < ENDLESS_LIMIT and not self._stop.is_set():
            await self._write(writer, line)
            sent += len(line)

    async def _answer_http(self, w: asyncio.StreamWriter, seq: int, served: int) -> bool:
        """Write the mode's response to request ``seq``; False: the connection is done."""
        mode = self.mode
        stamp = b"X-Tailgate-Seq: %d\r\n" % seq

        def response(body: bytes = b"hello", status: bytes = b"200 OK", extra: bytes = b"",
                     version: bytes = b"1.1") -> bytes:
            return (b"HTTP/" + version + b" " + status + b"\r\n" + stamp + extra
                    + b"Content-Length: %d\r\n\r\n" % len(body) + body)

        if mode in ("ok", "unsolicited", "unsolicited_late"):
            await self._write(w, response() + (response(b"again") if mode == "unsolicited"
                                               else b""))
            self.completed += 1
            if mode == "unsolicited":
                self.unsolicited += 1
            elif mode == "unsolicited_late" and seq != self.last_seq:
                await asyncio.sleep(0.010)
                await self._write(w, response(b"again"))
                self.unsolicited += 1
            return True
        if mode == "wrong_stamp":
            stamp = b"X-Tailgate-Seq: %d\r\n" % (seq + 1)
            await self._write(w, response())
            return True
        if mode == "status_503":
            await self._write(w, response(b"busy", b"503 Service Unavailable"))
            return True
        if mode == "chunked":
            await self._write(w, b"HTTP/1.1 200 OK\r\n" + stamp
                              + b"Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n"
                              + b"6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
            self.completed += 1
            return True
        if mode in ("http10_eof", "close_eof"):
            first = (b"HTTP/1.0 200 OK\r\n" if mode == "http10_eof"
                     else b"HTTP/1.1 200 OK\r\nConnection: close\r\n")
            await self._write(w, first + stamp + b"\r\nbody until the close")
            await asyncio.sleep(0.002)
            await self._write(w, b" ... end")
            w.close()
            self.completed += 1
            return False
        if mode == "interim":
            await self._write(w, b"HTTP/1.1 100 Continue\r\n\r\n")
            await asyncio.sleep(0.002)
            await self._write(w, b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n"
                                 b"\r\n" + response())
            self.completed += 1
            return True
        if mode == "te_and_cl":
            await self._write(w, b"HTTP/1.1 200 OK\r\n" + stamp + b"Content-Length: 3\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            self.completed += 1
            return True
        if mode in ("not_modified", "no_content"):
            status = b"304 Not Modified" if mode == "not_modified" else b"204 No Content"
            await self._write(w, b"HTTP/1.1 " + status + b"\r\n" + stamp
                              + b"Content-Length: 1000\r\n\r\n")
            self.completed += 1
            return True
        if mode == "stale":
            if served:
                w.close()  # as if it had timed the idle connection out just before
                return False
            await self._write(w, response())
            self.completed += 1
            return True
        if mode == "upgrade":
            await self._write(w, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                                 b"Connection: Upgrade\r\n" + stamp + b"\r\n\x81\x05hello")
            await asyncio.sleep(0.05)
            return False
        if mode == "short_cl":
            await self._write(w, b"HTTP/1.1 200 OK\r\n" + stamp
                              + b"Content-Length: 100\r\n\r\n0123456789")
            w.close()
            return False
        if mode == "eof_mid_chunk":
            await self._write(w, b"HTTP/1.1 200 OK\r\n" + stamp
                              + b"Transfer-Encoding: chunked\r\n\r\n10\r\nonly half")
            w.close()
            return False
        if mode == "reset":
            self._rst(w)
            return False
        if mode == "bad_status":
            await self._write(w, b"HTTP/1.1 OK 200\r\n" + stamp + b"Content-Length: 0\r\n\r\n")
            return True
        if mode == "endless_header":
            await self._write(w, b"HTTP/1.1 200 OK\r\n" + stamp)
            await self._endless(w, b"X-Pad: " + b"p" * 1000 + b"\r\n")
            return False
        if mode == "hang":
            await self._stop.wait()
            return False
        raise AssertionError(mode)

    async def _answer_tcp(self, w: asyncio.StreamWriter, seq: int) -> bool:
        mode = self.mode
        resp = b"%d:pong\n" % seq
        if mode in ("ok", "extra_same_write", "extra_late"):
            await self._write(w, resp + (b"XX" if mode == "extra_same_write" else b""))
            self.completed += 1
            if mode == "extra_same_write":
                self.unsolicited += 1
            elif mode == "extra_late" and seq != self.last_seq:
                await asyncio.sleep(0.010)
                await self._write(w, b"XX")
                self.unsolicited += 1
            return True
        if mode == "split":
            await self._write(w, resp[:-3])
            await asyncio.sleep(0.005)
            await self._write(w, resp[-3:])
            self.completed += 1
            return True
        if mode == "truncated":
            await self._write(w, resp[:-3])
            w.close()
            return False
        if mode == "endless":
            await self._endless(w, b"%d:" % seq + b"z" * 65536)
            return False
        if mode == "reset":
            self._rst(w)
            return False
        raise AssertionError(mode)
