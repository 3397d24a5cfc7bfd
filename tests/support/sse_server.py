"""A deterministic OpenAI-compatible streaming server for engine agreement tests.

Unlike :class:`support.llm_server.ScriptedServer` (whose behaviour goes by the order
requests arrive in), what a request gets here depends only on its body: the mode is
``MODES[crc32(body) % len(MODES)]`` and the stream has the body's ``max_tokens`` chunks.
Every write is followed by a pause, and after a failing chunk the server waits for the
client to drop the connection (both engines do), so a request's bytes are the same
whichever engine asks: two engines given the same workload (same ``--seed``) must then
agree request by request. With ``tls=(certificate, key)`` it speaks HTTPS (``base`` is an
``https://`` URL), for the same comparison over TLS.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import threading
import zlib

MODES = ("ok", "ok", "ok", "no_token", "bad_json", "error_object", "event_error",
         "no_done", "status_500", "not_event_stream", "reset", "hang", "eof_done",
         "chunk_cut")
WANT = {"ok": "ok", "no_token": "no_token", "bad_json": "malformed_sse",
        "error_object": "server_error", "event_error": "server_error", "no_done": "truncated",
        "status_500": "status_5xx", "not_event_stream": "protocol", "reset": "reset",
        "hang": "timeout", "eof_done": "ok", "chunk_cut": "truncated"}


def mode_of(body: bytes) -> str:
    return MODES[zlib.crc32(body) % len(MODES)]


class SseServer:
    """Run in a thread of its own; use as a context manager. ``gap_s`` between writes."""

    def __init__(self, gap_s: float = 0.002, settle_s: float = 0.03,
                 tls: tuple[str, str] | None = None) -> None:
        self.gap_s = gap_s
        self.ctx = None
        if tls is not None:
            self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ctx.load_cert_chain(*tls)
        self.settle_s = settle_s  # after a failing chunk: the client reads it alone
        self.modes: dict[str, int] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.port = 0

    def __enter__(self) -> SseServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("sse server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def base(self) -> str:
        return f"{'https' if self.ctx else 'http'}://127.0.0.1:{self.port}/v1"

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            srv = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024,
                                             ssl=self.ctx)
            self.port = srv.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()
            srv.close()

        asyncio.run(main())

    async def _handle(self, reader, writer) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError,
                ssl.SSLError):
            pass  # (a hung stream is cancelled when the server stops)
        finally:
            writer.close()

    async def _one(self, reader, writer) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        raw = await reader.readexactly(length)
        body = json.loads(raw)
        mode = mode_of(raw)
        self.modes[mode] = self.modes.get(mode, 0) + 1
        n = int(body.get("max_tokens", 4))
        chat = "messages" in body
        gap = self.gap_s

        async def send(data: bytes, pause: float = gap) -> None:
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(pause)

        def chunk(i: int, finish: str | None = None) -> bytes:
            text = "" if i < 0 else f" t{i}"
            ch = ({"index": 0, "delta": {"content": text}, "finish_reason": finish} if chat
                  else {"index": 0, "text": text, "finish_reason": finish})
            return b"data: " + json.dumps({"id": "x", "choices": [ch]}).encode() + b"\n\n"

        def piece(data: bytes) -> bytes:
            return b"%x\r\n%s\r\n" % (len(data), data)

        if mode == "status_500":
            msg = b'{"error": {"message": "scripted failure"}}'
            await send(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json"
                       b"\r\nContent-Length: %d\r\n\r\n%s" % (len(msg), msg))
            return True
        if mode == "not_event_stream":
            msg = b'{"choices": [{"text": "whole"}]}'
            await send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(msg), msg))
            return True
        eof = mode == "eof_done"
        if eof:
            await send(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        else:
            await send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n")
        wrap = (lambda d: d) if eof else piece
        if mode == "hang":
            await self._stop.wait()
            return False
        tokens = 0 if mode == "no_token" else n
        for i in range(tokens):
            if i == 2 and mode in ("bad_json", "error_object", "event_error", "reset"):
                if mode == "reset":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return False
                bad = {"bad_json": b"data: {not json\n\n",
                       "error_object": b'data: {"error": {"message": "engine overloaded"}}\n\n',
                       "event_error": b'event: error\ndata: {"message": "out of KV cache"}\n\n'
                       }[mode]
                await send(wrap(bad), 0.0)
                # Both engines drop a stream that failed (the compiled one once its JSON is
                # read): nothing more is sent, so its bytes are the same on both. A client
                # that kept it open gets the rest after a while (and the bytes differ).
                try:
                    if await asyncio.wait_for(reader.read(1), 5.0) == b"":
                        return False
                except ConnectionError:
                    return False
                except TimeoutError:
                    pass
            await send(wrap(chunk(i)))
        await send(wrap(chunk(-1, "length")))
        await send(wrap(b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,'
                        b'"completion_tokens":%d}}\n\n' % tokens))
        if mode == "chunk_cut":
            await send(b"40\r\ndata: [DO", self.settle_s)
            return False
        if mode != "no_done":
            await send(wrap(b"data: [DONE]\n\n"))
        if eof:
            return False
        await send(b"0\r\n\r\n")
        return True
