"""Record a DPDK process's telemetry replies, and replay them in place of the socket.

A recording is ``{"hello": {...}, "replies": {command: data}, "clock": [t, ...]}``:
exactly what the process sent, so ``read_process(..., client=Replay(rec))`` parses
captured replies through the same code as the live socket.
"""

from __future__ import annotations

from typing import Any

from tailgate.model import SourceError
from tailgate.sources.dpdk import Telemetry


class Recorder(Telemetry):
    def __init__(self, path: str, timeout_s: float):
        super().__init__(path, timeout_s)
        self.record: dict[str, Any] = {"hello": self.hello, "replies": {}, "clock": []}

    def clock(self) -> float:
        t = super().clock()
        self.record["clock"].append(t)
        return t

    def query(self, command: str) -> Any:
        data = super().query(command)
        self.record["replies"][command] = data
        return data


class Replay:
    """Answers from a recording; a command it lacks ends the read as a process exit would."""

    def __init__(self, record: dict[str, Any]):
        self.hello = record["hello"]
        self.replies = record["replies"]
        self.clocks = list(record.get("clock") or [])

    def __call__(self, path: str, timeout_s: float) -> Replay:
        return self

    def clock(self) -> float:
        return self.clocks.pop(0) if self.clocks else 0.0

    def query(self, command: str) -> Any:
        if command not in self.replies:
            raise SourceError(f"replay: the process closed the socket during {command}")
        return self.replies[command]

    def close(self) -> None:
        pass

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
