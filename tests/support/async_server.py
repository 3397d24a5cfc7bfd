"""A loopback asyncio server in a thread of its own: the lifecycle the scripted test servers
share (:class:`support.fault_server.FaultServer`, :class:`support.misbehaving.Misbehaving`).
Subclasses define ``_handle(reader, writer)`` and add each writer to ``_writers``."""

from __future__ import annotations

import asyncio
import threading
from typing import Self


class AsyncServer:
    """``proto`` is ``http`` or ``tcp`` (the scheme of :attr:`url`)."""

    name = "server"

    def __init__(self, proto: str = "http") -> None:
        self.proto = proto
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return (f"http://127.0.0.1:{self.port}/" if self.proto == "http"
                else f"tcp://127.0.0.1:{self.port}")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{self.name} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            srv = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = srv.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()
            srv.close()
            for w in list(self._writers):
                w.transport.abort()
            await asyncio.sleep(0)

        asyncio.run(main())
