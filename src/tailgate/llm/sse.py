"""Server-sent events, sans I/O: bytes in, complete events' data out.

Follows the WHATWG "event stream" interpretation that OpenAI-compatible
servers rely on: lines end in LF, CRLF or CR; ``data:`` lines of one event are
joined with LF; a blank line dispatches the event; lines starting with ``:`` are
comments (keep-alives); ``event:``/``id:``/``retry:`` are accepted and, since no
OpenAI-compatible server uses them for tokens, only ``event`` is kept. A
field name without a colon is a field with an empty value.

The parser never touches a socket or a clock: the caller timestamps the bytes
it feeds. What it holds is bounded: a line longer than ``max_line``, or an
event whose data lines add up to more than ``max_event`` bytes, raises
:class:`SSETooLarge` (a server that never ends a line, or never ends an event
with its blank line, must not eat the memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ProtocolError


class SSEError(ProtocolError):
    """The byte stream is not a well-formed event stream (the request's outcome)."""


class SSETooLarge(SSEError):
    """A line or an event passed its bound."""


@dataclass(frozen=True)
class Event:
    data: str
    event: str = "message"


class SSEParser:
    """Feed bytes with :meth:`feed`; it returns the events those bytes completed."""

    __slots__ = ("_buf", "_data", "_event", "_pending_cr", "_size", "max_event", "max_line")

    def __init__(self, max_line: int = 1 << 20, max_event: int = 16 << 20) -> None:
        self._buf = bytearray()  # the line being read (no line end yet)
        self._data: list[str] = []
        self._size = 0  # bytes of data lines in the event being read
        self.max_event = max_event
        self._event = ""
        self._pending_cr = False  # the last byte fed was CR: a following LF belongs to it
        self.max_line = max_line

    def feed(self, chunk: bytes) -> list[Event]:
        if not chunk:
            return []
        if self._pending_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
            if not chunk:
                self._pending_cr = False
                return []
        self._pending_cr = chunk[-1:] == b"\r"
        if b"\n" not in chunk and b"\r" not in chunk:
            # No line end: the line grows (appended in place, so a line that comes a byte
            # at a time costs linear time) and its bound holds at every read boundary.
            self._buf += chunk
            if len(self._buf) > self.max_line:
                raise SSETooLarge(f"an event-stream line exceeds {self.max_line} bytes")
            return []
        buf = bytes(self._buf) + chunk if self._buf else chunk
        if b"\r" in buf:
            # Rare: normalise CRLF and lone CR to LF (the common LF-only path skips this).
            # A trailing CR stays a line end; its LF, if it comes, was dropped above.
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = bytearray(lines.pop())
        if len(self._buf) > self.max_line or any(len(raw) > self.max_line for raw in lines):
            # (a whole line in one read is held to the same bound as one read byte by byte)
            raise SSETooLarge(f"an event-stream line exceeds {self.max_line} bytes")
        events: list[Event] = []
        for raw in lines:
            if not raw:
                if self._data:
                    events.append(Event("\n".join(self._data), self._event or "message"))
                self._data = []
                self._size = 0
                self._event = ""
                continue
            if raw[:1] == b":":
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SSEError(f"event-stream line is not UTF-8: {exc}") from None
            name, sep, value = line.partition(":")
            if sep and value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._size += len(raw)
                if self._size > self.max_event:
                    raise SSETooLarge(f"an event exceeds {self.max_event} bytes without its "
                                      f"closing blank line")
                self._data.append(value)
            elif name == "event":
                self._event = value
            # id, retry and unknown fields: ignored, as the standard says
        return events

    def close(self) -> list[Event]:
        """End of stream. An event without its closing blank line is discarded (per the
        standard); the caller can tell by :attr:`pending`, which it reads first."""
        self._buf = bytearray()
        self._data = []
        self._size = 0
        return []

    @property
    def pending(self) -> bool:
        """Bytes or data lines received that have not made a complete event."""
        return bool(self._buf or self._data)
