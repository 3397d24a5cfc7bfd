"""HTTP/1.1 responses, sans I/O (RFC 9112 framing): bytes in, events out.

Theory of operation
-------------------
One :class:`ResponseReader` per connection. The driver calls :meth:`expect`
when it has written a request (``head=True`` for HEAD), then hands it every
read with :meth:`feed` and the end of the stream with :meth:`feed_eof`. It
never touches a socket or a clock; the driver timestamps what it feeds.

States::

    IDLE --expect--> HEAD --(1xx: Informational)--> HEAD
                     HEAD --(HEAD/204/304, CL 0)--> End --> IDLE
                     HEAD --Content-Length--> BODY_LEN --> End
                     HEAD --chunked--> CHUNK_SIZE <-> CHUNK_DATA/CHUNK_CRLF --0--> TRAILER --> End
                     HEAD --neither--> BODY_EOF --feed_eof--> End (close-delimited)

Framing follows RFC 9112 section 6.3 for a response: no body after HEAD, a 1xx,
204 or 304; ``Transfer-Encoding`` wins over ``Content-Length`` (and the
connection is not reused: the pair hints at response splitting); a final
coding other than chunked, or no length at all, reads to the close. A ``101``
we never asked for is an ``upgrade`` error; other 1xx responses are skipped
(the final response is the one timed).

Bytes that arrive while ``IDLE`` — after the response was complete, even in
the same read — belong to no request: they come out as one
:class:`Unsolicited` event and the reader stays idle (the driver drops the
connection). A request never gets another one's bytes.

Every buffer is bounded (:class:`Limits`): the header block (and trailer
section), a chunk-size line, and the body. Errors are :class:`FramingError`
with a ``kind``: ``protocol`` (not HTTP/1.x or bad framing), ``too_large`` (a
limit), ``upgrade``, ``truncated`` (the stream ended inside a response) or
``closed`` (it ended before any byte of the response).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# states
IDLE, HEAD, BODY_LEN, BODY_EOF, CHUNK_SIZE, CHUNK_DATA, CHUNK_CRLF, TRAILER, DEAD = range(9)

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field name
_STATUS = re.compile(rb"HTTP/1\.([0-9]) ([0-9]{3})(?: .*)?", re.S)  # NUL and CR: checked apart
_HEXDIGITS = b"0123456789abcdefABCDEF"
_DIGITS = re.compile(rb"[0-9]{1,18}")
# A field line (RFC 9112 5) is token ":" value: this finds a line start (in LF + the
# lower-cased field lines) that is not. Searching from each LF is far cheaper than
# matching every byte of every value (CPython's re steps a character class byte by byte).
_BAD_LINE = re.compile(rb"\n(?![!#$%&'*+\-.^_`|~0-9a-z]+:|\Z)")
_FRAMING = re.compile(rb"\n(transfer-encoding|content-length|connection):[ \t]*([^\r\n]*)")


@dataclass(frozen=True)
class Limits:
    """Bounds on what one response may make the client hold or read (bytes).

    The defaults are far above what real servers send (nginx's largest response
    header buffer is 8 KiB; curl refuses header blocks above 300 KiB) and keep a
    misbehaving server from growing the client without end.
    """

    max_header_bytes: int = 256 * 1024  # one header block, or one trailer section
    max_line_bytes: int = 4096  # one chunk-size line (extensions included)
    max_body_bytes: int = 1 << 30  # one response body, after de-chunking

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_line_bytes", "max_body_bytes"):
            if getattr(self, name) < 64:
                raise ValueError(f"{name} must be >= 64 bytes, not {getattr(self, name)}")


class FramingError(Exception):
    """The server broke HTTP/1.1 framing; ``kind`` names the error, ``reason`` says how."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Informational:
    """An interim 1xx response (skipped; the final response follows)."""

    __slots__ = ("status",)

    def __init__(self, status: int) -> None:
        self.status = status


class Head:
    """The final response's status and header fields (parsed on demand: the hot path
    needs only the framing fields, which the reader has already read)."""

    __slots__ = ("_fields", "_headers", "keep_alive", "status")

    def __init__(self, status: int, fields: bytes, keep_alive: bool) -> None:
        self.status = status
        self._fields = fields  # the field lines, each ending in LF
        self._headers: list[tuple[bytes, bytes]] | None = None
        self.keep_alive = keep_alive

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """Every field as (lower-cased name, value), in order."""
        if self._headers is None:
            self._headers = _parse_fields(self._fields.split(b"\n")[:-1])
        return self._headers

    def get(self, name: bytes) -> bytes | None:
        """The first value of field ``name`` (lower-case), or None."""
        for k, v in self.headers:
            if k == name:
                return v
        return None


class Data:
    """Body bytes (de-chunked), only when the reader was made with ``keep_body``."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class End:
    """The response is complete. ``keep_alive``: the connection may carry another request."""

    __slots__ = ("body_bytes", "keep_alive", "status")

    def __init__(self, status: int, keep_alive: bool, body_bytes: int) -> None:
        self.status = status
        self.keep_alive = keep_alive
        self.body_bytes = body_bytes


class Unsolicited:
    """Bytes that arrived with no response expected (a protocol error of the connection)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def describe(self) -> str:
        # The first bytes only: the reason stays the same across responses (it is counted).
        return (f"{len(self.data)} byte(s) with no request in flight, starting "
                f"{bytes(self.data[:16])!r}")


Event = Informational | Head | Data | End | Unsolicited


def _head_error(block: bytes | bytearray, why: str) -> FramingError:
    return FramingError("protocol", f"{why}: {bytes(block[:48])!r}")


def parse_head(block: bytes | bytearray) -> tuple[int, int, list[tuple[bytes, bytes]]]:
    """A header block without its final empty line -> (minor version, status, fields).

    Lines end in CRLF or a bare LF (RFC 9112 2.2); an obs-fold (a line starting
    with SP or HTAB) continues the previous field's value (5.2). Field names are
    lower-cased; values have surrounding whitespace stripped.
    """
    lines = bytes(block).split(b"\n")
    first = lines[0][:-1] if lines[0][-1:] == b"\r" else lines[0]
    m = _STATUS.fullmatch(first)
    if m is None or b"\r" in first:
        raise _head_error(first, "not an HTTP/1.x status line")
    return int(m.group(1)), int(m.group(2)), _parse_fields(lines[1:])


def _parse_fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    for raw in lines:
        if raw[-1:] == b"\r":
            raw = raw[:-1]
        if b"\r" in raw or b"\x00" in raw:
            raise _head_error(raw, "CR or NUL inside a header line")
        if raw[:1] in (b" ", b"\t"):
            if not headers:
                raise _head_error(raw, "a folded line before any header field")
            name, value = headers[-1]
            headers[-1] = (name, (value + b" " + raw.strip(b" \t")).strip(b" "))
            continue
        name, sep, value = raw.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None:
            raise _head_error(raw, "malformed header field")
        headers.append((name.lower(), value.strip(b" \t")))
    return headers


def scan_head(block: bytes) -> tuple[int, int, bytes, list[tuple[bytes, bytes]]]:
    """The hot path of :func:`parse_head`: (minor, status, field lines, framing fields).

    The framing fields are Transfer-Encoding, Content-Length and Connection as
    (lower-cased name, lower-cased value) pairs, in order. Two regular
    expressions that only look at line starts check every field line and find
    those; anything unusual (an obs-fold, a malformed line) goes through
    :func:`parse_head`, which folds or raises the precise error."""
    nl = block.find(b"\n")
    first = block if nl < 0 else block[:nl]
    if first[-1:] == b"\r":
        first = first[:-1]
    m = _STATUS.fullmatch(first)
    if m is None or b"\r" in first or b"\x00" in first:
        raise _head_error(first, "not an HTTP/1.x status line")
    fields = b"" if nl < 0 else block[nl + 1:] + b"\n"
    low = b"\n" + fields.lower()
    if fields and (_BAD_LINE.search(low) is not None or b"\x00" in fields
                   or fields.count(b"\r") != fields.count(b"\r\n")):
        _, _, headers = parse_head(block)  # folds, or raises what is wrong
        fields = b"".join(k + b": " + v + b"\n" for k, v in headers)
        low = b"\n" + fields.lower()
    minor, status = m.group(1, 2)
    return int(minor), int(status), fields, _FRAMING.findall(low)


def _content_length(values: list[bytes]) -> int:
    """One length from every Content-Length value; a list of equal values is one (RFC 9110
    8.6), differing or non-numeric values are faulty framing."""
    if len(values) == 1 and values[0].isdigit() and len(values[0]) <= 18:
        return int(values[0])  # the usual case
    seen = set()
    for v in values:
        for item in v.split(b","):
            item = item.strip(b" \t")
            if _DIGITS.fullmatch(item) is None:
                raise FramingError("protocol", f"bad Content-Length {v[:32]!r}")
            seen.add(int(item))
    if len(seen) != 1:
        raise FramingError("protocol", f"conflicting Content-Length values {sorted(seen)}")
    return seen.pop()


class ResponseReader:
    """One connection's responses. See the module docstring for the rules."""

    __slots__ = ("_body", "_buf", "_head", "_keep", "_remaining", "_scan", "_status", "heads",
                 "keep_body", "limits", "received", "state")

    def __init__(self, limits: Limits | None = None, keep_body: bool = False,
                 heads: bool = True) -> None:
        self.limits = limits or Limits()
        self.keep_body = keep_body
        self.heads = heads  # emit Head events (a load generator that only counts needs none)
        self.state = IDLE
        self.received = 0  # bytes of the current exchange (interim responses included)
        self._buf = bytearray()
        self._scan = 0
        self._head = False
        self._status = 0
        self._keep = True
        self._remaining = 0
        self._body = 0

    def expect(self, head: bool = False) -> None:
        """A request was written: read its response (``head``: the request was HEAD)."""
        if self.state != IDLE:
            raise RuntimeError("a response is already expected (no pipelining)")
        self.state = HEAD
        self._head = head
        self.received = 0
        self._scan = 0
        self._body = 0
        self._buf.clear()

    def feed(self, data: bytes) -> list[Event]:
        """The events ``data`` completes; raises :class:`FramingError`."""
        if self.state == DEAD or not data:
            return []
        if self.state == IDLE:
            return [Unsolicited(data)]
        self.received += len(data)
        buf: bytes | bytearray
        if self._buf:
            buf = self._buf
            buf += data
        else:
            buf = data  # the usual case: a whole response in one read, nothing copied
        try:
            events: list[Event] = []
            pos = self._run(buf, events)
        except FramingError:
            self.state = DEAD
            self._buf.clear()
            raise
        if pos >= len(buf):
            if self._buf:
                self._buf.clear()
            self._scan = 0
        elif self.state == IDLE:
            events.append(Unsolicited(bytes(buf[pos:])))
            self._buf.clear()
        elif buf is data:
            self._buf = bytearray(data[pos:])
            self._scan = max(self._scan - pos, 0)
        else:
            del buf[:pos]
            self._scan = max(self._scan - pos, 0)
        return events

    def feed_eof(self) -> list[Event]:
        """The peer closed its side. Completes a close-delimited body; raises
        ``truncated`` inside any other response, ``closed`` before its first byte."""
        state = self.state
        if state in (IDLE, DEAD):
            return []
        self.state = DEAD
        if state == BODY_EOF:
            self.state = IDLE
            return [End(self._status, False, self._body)]
        if state == HEAD:
            if not self.received:
                raise FramingError("closed", "connection closed before any response byte")
            raise FramingError("truncated", f"connection closed inside the header block "
                                            f"({self.received} bytes received)")
        if state == BODY_LEN:
            raise FramingError("truncated", f"connection closed after {self._body} of "
                                            f"{self._body + self._remaining} body bytes "
                                            f"(Content-Length)")
        raise FramingError("truncated", f"connection closed inside a chunked body "
                                        f"({self._body} body bytes received, no last chunk)")

    # -- the state machine -------------------------------------------------------------

    def _run(self, buf: bytes | bytearray, events: list[Event]) -> int:
        """Consume ``buf`` from 0 as far as it goes; returns the position reached."""
        pos = 0
        lim = self.limits
        n = len(buf)
        while pos < n:
            state = self.state
            if state == HEAD:
                end, nxt = self._find_blank(buf, pos)
                if end < 0:
                    if n - pos > lim.max_header_bytes:
                        raise FramingError("too_large", f"header block exceeds "
                                                        f"{lim.max_header_bytes} bytes")
                    return pos
                if end - pos > lim.max_header_bytes:
                    raise FramingError("too_large", f"header block exceeds "
                                                    f"{lim.max_header_bytes} bytes")
                block = buf[pos:end]
                pos = nxt
                self._scan = pos
                self._on_head(block, events)
            elif state == BODY_LEN:
                take = min(self._remaining, n - pos)
                if take and self.keep_body:
                    events.append(Data(bytes(buf[pos:pos + take])))
                pos += take
                self._remaining -= take
                self._body += take
                if not self._remaining:
                    self._end(events)
            elif state == BODY_EOF:
                take = n - pos
                self._body += take
                if self._body > lim.max_body_bytes:
                    raise FramingError("too_large", f"body exceeds {lim.max_body_bytes} bytes")
                if self.keep_body:
                    events.append(Data(bytes(buf[pos:])))
                pos = n
            elif state == CHUNK_SIZE:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    if n - pos > lim.max_line_bytes:
                        raise FramingError("too_large", f"chunk-size line exceeds "
                                                        f"{lim.max_line_bytes} bytes")
                    return pos
                if nl - pos > lim.max_line_bytes:
                    raise FramingError("too_large", f"chunk-size line exceeds "
                                                    f"{lim.max_line_bytes} bytes")
                line = bytes(buf[pos:nl])
                semi = line.find(b";")  # chunk extensions are ignored
                size_txt = (line if semi < 0 else line[:semi]).strip(b" \t\r")
                # int(x, 16) alone would take "0x1f", "+1" or "1_0": hex digits only.
                if not size_txt or len(size_txt) > 15 or size_txt.strip(_HEXDIGITS):
                    raise FramingError("protocol", f"bad chunk-size line {line[:32]!r}")
                size = int(size_txt, 16)
                pos = nl + 1
                if size == 0:
                    self.state = TRAILER
                    self._remaining = 0
                    continue
                if self._body + size > lim.max_body_bytes:
                    raise FramingError("too_large", f"body exceeds {lim.max_body_bytes} bytes")
                end = pos + size
                if end + 2 <= n and buf[end] == 0x0D and buf[end + 1] == 0x0A:
                    # The usual case: the whole chunk and its CRLF are here; stay in CHUNK_SIZE.
                    if self.keep_body:
                        events.append(Data(bytes(buf[pos:end])))
                    self._body += size
                    pos = end + 2
                    continue
                self._remaining = size
                self.state = CHUNK_DATA
            elif state == CHUNK_DATA:
                take = min(self._remaining, n - pos)
                if take and self.keep_body:
                    events.append(Data(bytes(buf[pos:pos + take])))
                pos += take
                self._remaining -= take
                self._body += take
                if not self._remaining:
                    self.state = CHUNK_CRLF
            elif state == CHUNK_CRLF:
                c = buf[pos]
                if c == 0x0A:
                    pos += 1
                elif c == 0x0D:
                    if pos + 1 >= n:
                        return pos
                    if buf[pos + 1] != 0x0A:
                        raise FramingError("protocol", "chunk data not followed by CRLF")
                    pos += 2
                else:
                    raise FramingError("protocol", "chunk data longer than its chunk-size")
                self.state = CHUNK_SIZE
            elif state == TRAILER:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    if n - pos + self._remaining > lim.max_header_bytes:
                        raise FramingError("too_large", f"trailer section exceeds "
                                                        f"{lim.max_header_bytes} bytes")
                    return pos
                line = buf[pos:nl]
                pos = nl + 1
                if line in (b"", b"\r"):
                    self._end(events)
                    continue
                self._remaining += len(line) + 1  # trailer bytes so far
                if self._remaining > lim.max_header_bytes:
                    raise FramingError("too_large", f"trailer section exceeds "
                                                    f"{lim.max_header_bytes} bytes")
                if b":" not in line:
                    raise FramingError("protocol", f"malformed trailer field "
                                                   f"{bytes(line[:32])!r}")
            else:  # IDLE: the rest is unsolicited (the caller reports it)
                return pos
        return pos

    def _find_blank(self, buf: bytes | bytearray, pos: int) -> tuple[int, int]:
        """(end of the header block's last line, start of what follows its blank line),
        or (-1, 0) while the blank line has not arrived."""
        start = max(self._scan, pos)
        if start == pos and buf[pos:pos + 1] in (b"\n", b"\r"):
            raise FramingError("protocol", f"an empty line where a status line belongs: "
                                           f"{bytes(buf[pos:pos + 16])!r}")
        i = buf.find(b"\n\r\n", start)
        j = buf.find(b"\n\n", start, i + 2 if i >= 0 else len(buf))
        if j >= 0 and (i < 0 or j < i):
            return j, j + 2
        if i >= 0:
            return i, i + 3
        self._scan = max(len(buf) - 2, pos)
        return -1, 0

    def _on_head(self, block: bytes | bytearray, events: list[Event]) -> None:
        minor, status, fields, framing = scan_head(bytes(block))
        if status == 101:
            up = Head(status, fields, False).get(b"upgrade") or b"?"
            raise FramingError("upgrade", f"101 Switching Protocols (to {up[:32].decode('latin-1')})"
                                          f" without an upgrade request")
        if 100 <= status < 200:
            events.append(Informational(status))
            return  # still HEAD: the final response follows
        if status < 100:
            raise FramingError("protocol", f"status {status} is not a valid status code")
        te: list[bytes] = []
        cl: list[bytes] = []
        conns: list[bytes] = []
        for name, value in framing:
            (te if name[0] == 0x74 else cl if name[3] == 0x74 else conns).append(
                value.rstrip(b" \t"))
        if conns:
            tokens = {t.strip(b" \t") for t in b",".join(conns).split(b",")}
            keep = b"close" not in tokens and (minor >= 1 or b"keep-alive" in tokens)
        else:
            keep = minor >= 1
        self._status = status
        if self._head or status in (204, 304):
            self._keep = keep
            if self.heads:
                events.append(Head(status, fields, keep))
            self._end(events)
            return
        if te:
            if minor == 0:
                raise FramingError("protocol", "Transfer-Encoding in an HTTP/1.0 response "
                                               "(faulty framing, RFC 9112 6.1)")
            codings = [c.strip(b" \t").lower() for c in b",".join(te).split(b",")]
            if b"chunked" in codings[:-1]:
                raise FramingError("protocol", "chunked is not the final transfer coding")
            if codings[-1] == b"chunked":
                self.state = CHUNK_SIZE
            else:
                self.state, keep = BODY_EOF, False  # read to the close (RFC 9112 6.3 rule 4)
            if cl:
                keep = False  # both: TE wins, and the connection is not trusted again
            self._keep = keep
            if self.heads:
                events.append(Head(status, fields, keep))
            return
        if cl:
            length = _content_length(cl)
            if length > self.limits.max_body_bytes:
                raise FramingError("too_large", f"Content-Length {length} exceeds "
                                                f"{self.limits.max_body_bytes} bytes")
            self._keep = keep
            if self.heads:
                events.append(Head(status, fields, keep))
            if length == 0:
                self._end(events)
            else:
                self._remaining = length
                self.state = BODY_LEN
            return
        self._keep = False
        self.state = BODY_EOF
        if self.heads:
            events.append(Head(status, fields, False))

    def _end(self, events: list[Event]) -> None:
        events.append(End(self._status, self._keep, self._body))
        self.state = IDLE
        self._remaining = 0
