"""gRPC unary calls over HTTP/2 (``grpc://`` cleartext h2c, ``grpcs://`` TLS with ALPN h2).

HTTP/2 framing, HPACK and flow control are the sans-I/O ``h2`` library's; this
module adds what gRPC puts on top, also sans-I/O (:class:`CallReader`: response
headers, length-prefixed messages and trailers in, one outcome out), and a thin
:class:`GrpcConnection` that feeds the socket's bytes to both.

One call in flight per connection, like HTTP/1.1 here: the engine's model (a
connection is idle or carries one request; time-outs, stale connections and
queueing) holds unchanged, and ``--connections``/``--max-connections`` bound the
concurrency exactly. HTTP/2 could multiplex many calls on one connection (as
grpc-go clients do); tailgate opens more connections instead, so a server's
per-connection stream limit is never what the figures measure.

Outcomes: ``ok`` only for ``grpc-status: 0`` with exactly one response message;
a response header list over ``--max-header-bytes`` or a message over
``--max-body-bytes`` is ``too_large``; another ``grpc-status`` is ``grpc_status``
with the code in the status column and ``grpc-message`` in the reason; an HTTP status other than 200 is
``status_4xx``/``status_5xx`` (HTTP status in the column); a missing
``grpc-status``, a wrong content-type or a message cut short is ``protocol``;
RST_STREAM on the call is ``reset`` (the connection stays); GOAWAY that drops
the call is ``reset`` with its error code (the connection is retired).
"""

from __future__ import annotations

from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from .. import __version__
from ..slo import parse_slo
from .conn import Connection, Sink
from .http1 import FramingError, Limits
from .outcome import GRPC_STATUS, OK, PROTOCOL, REQUEST_KINDS, RESET, TOO_LARGE, http_outcome
from .protocols import Protocol
from .target import Target, grpc_target

# https://grpc.github.io/grpc/core/md_doc_statuscodes.html
STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
# Our receive window, per stream and for the connection: large, so a big response
# is never paced by window updates.
WINDOW = 1 << 24
# Retire a connection before its client stream ids (odd, < 2**31) run out.
LAST_STREAM_ID = (1 << 31) - 1 - 2 * 1024


def status_name(code: int) -> str:
    return STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES) else f"code {code}"


def _error_name(code: int) -> str:
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return f"error code {code}"


class CallReader:
    """One unary call's response (sans-I/O): feed headers, data and trailers, then
    :meth:`end` gives ``(outcome, status, reason)``. Messages are only counted and
    framed, never kept; one larger than ``max_message`` is ``too_large``
    (raised as :class:`FramingError` as soon as its length prefix is read)."""

    __slots__ = ("http_status", "content_type", "grpc_status", "grpc_message", "messages",
                 "_prefix", "_left", "max_message", "nbytes")

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.http_status = 0
        self.content_type = b""
        self.grpc_status: int | None = None
        self.grpc_message = ""
        self.messages = 0
        self.nbytes = 0
        self._prefix = b""
        self._left = 0

    def headers(self, headers: list[tuple[bytes, bytes]]) -> None:
        for name, value in headers:
            if name == b":status":
                self.http_status = int(value) if value.isdigit() else -1
            elif name == b"content-type":
                self.content_type = value
        self.trailers(headers)  # a trailers-only response has grpc-status here

    def trailers(self, headers: list[tuple[bytes, bytes]]) -> None:
        for name, value in headers:
            if name == b"grpc-status":
                self.grpc_status = int(value) if value.isdigit() else -1
            elif name == b"grpc-message":
                self.grpc_message = unquote(value.decode("utf-8", "replace"))

    def data(self, data: bytes) -> None:
        """Frame length-prefixed messages: 1 flag byte (0, or 1 compressed), 4 length bytes."""
        self.nbytes += len(data)
        i, n = 0, len(data)
        while i < n:
            if self._left:
                take = min(self._left, n - i)
                self._left -= take
                i += take
                continue
            take = min(5 - len(self._prefix), n - i)
            self._prefix += data[i:i + take]
            i += take
            if len(self._prefix) < 5:
                break
            flag, size = self._prefix[0], int.from_bytes(self._prefix[1:], "big")
            self._prefix = b""
            if flag > 1:
                raise FramingError("protocol", f"gRPC message flag {flag} (0 or 1 expected)")
            if size > self.max_message:
                raise FramingError("too_large", f"gRPC message of {size} bytes (limit "
                                                f"{self.max_message})")
            self.messages += 1
            self._left = size

    def end(self) -> tuple[int, int, str]:
        """The call's outcome once the stream ended: (outcome code, status, reason)."""
        if self.http_status != 200:
            outcome = http_outcome(self.http_status)
            return (outcome or PROTOCOL, self.http_status,
                    f"HTTP {self.http_status} to a gRPC call"
                    + (f" (grpc-status {self.grpc_status})" if self.grpc_status is not None
                       else ""))
        if self.grpc_status is None:
            return PROTOCOL, 0, "the response ended without grpc-status"
        if self.grpc_status != 0:
            reason = f"grpc-status {self.grpc_status} {status_name(self.grpc_status)}"
            if self.grpc_message:
                reason += f": {self.grpc_message[:200]}"
            return GRPC_STATUS, self.grpc_status, reason
        if not self.content_type.startswith(b"application/grpc"):
            return PROTOCOL, 0, f"content-type {self.content_type.decode('latin-1')!r}, " \
                                f"not application/grpc"
        if self._prefix or self._left:
            return PROTOCOL, 0, "the stream ended inside a gRPC message"
        if self.messages != 1:
            return PROTOCOL, 0, f"a unary response with {self.messages} messages"
        return OK, 0, ""


class _H2(h2.connection.H2Connection):
    """h2's client connection, except that a graceful GOAWAY lets the call it covers finish.

    RFC 9113 6.8: streams at or below the GOAWAY's last stream id may still complete
    (grpc-go's graceful shutdown sends GOAWAY just ahead of the answer), but h2 closes
    its state machine on any GOAWAY (python-hyper/h2#1181) and would refuse the answer.
    The connection is retired at the GOAWAY either way (no new stream starts on it)."""

    def _receive_goaway_frame(self, frame):  # type: ignore[no-untyped-def]
        frames, events = super()._receive_goaway_frame(frame)
        sid = self.highest_outbound_stream_id or 0
        stream = self.streams.get(sid)
        if (frame.error_code == 0 and stream is not None and not stream.closed
                and sid <= frame.last_stream_id):
            self.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        return frames, events


class GrpcConnection(Connection):
    """One unary call at a time on one HTTP/2 connection (see the module docstring)."""

    def __init__(self, sink: Sink, target: Target, limits: Limits | None = None) -> None:
        super().__init__(sink, target.request)
        self.limits = limits or Limits()
        # Our headers are fixed and were checked when the target was parsed (method path,
        # metadata names and values): h2 re-validating them per call costs ~20 µs. The
        # server's headers are still validated.
        self.h2 = _H2(h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False))
        scheme = b"https" if target.tls is not None else b"http"
        authority = f"{target.host}:{target.port}".encode("idna")
        self.headers = [(b":method", b"POST"), (b":scheme", scheme),
                        (b":path", target.path.encode("ascii")), (b":authority", authority),
                        (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                        (b"user-agent", f"tailgate/{__version__}".encode()),
                        *((k.encode("latin-1"), v.encode("latin-1"))
                          for k, v in target.metadata)]
        self.sid = 0  # the call's stream id (0: none yet)
        self.call: CallReader | None = None
        self._out = b""  # request bytes still held back by flow control
        self.alpn: str | None = "h2"  # what the TLS server agreed to (cleartext: h2c assumed)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        tls = transport.get_extra_info("ssl_object")
        if tls is not None:
            self.alpn = tls.selected_alpn_protocol()
        self.h2.initiate_connection()
        codes = h2.settings.SettingCodes
        self.h2.update_settings({codes.INITIAL_WINDOW_SIZE: WINDOW, codes.ENABLE_PUSH: 0,
                                 codes.MAX_HEADER_LIST_SIZE: self.limits.max_header_bytes})
        # enforced from the first response on, not only once the server acknowledges it
        self.h2.decoder.max_header_list_size = self.limits.max_header_bytes
        self.h2.increment_flow_control_window(WINDOW - 65535)
        transport.write(self.h2.data_to_send())

    def send(self, rid: int, now: float) -> None:
        self.rid = rid
        self.t_send = now
        self.nbytes = 0
        self.call = CallReader(self.limits.max_body_bytes)
        self.sid = self.h2.get_next_available_stream_id()
        if self.sid >= LAST_STREAM_ID:
            self.reusable = False  # this call is the connection's last
        self.h2.send_headers(self.sid, self.headers)
        self._out = self.request
        self._push()
        self.transport.write(self.h2.data_to_send())

    def _push(self) -> None:
        """Send as much of the request as the peer's flow-control windows allow."""
        while self._out:
            size = min(self.h2.local_flow_control_window(self.sid),
                       self.h2.max_outbound_frame_size, len(self._out))
            if size <= 0:
                return  # the rest goes when a WINDOW_UPDATE opens the window
            chunk, self._out = self._out[:size], self._out[size:]
            self.h2.send_data(self.sid, chunk, end_stream=not self._out)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
            for ev in events:
                self._event(ev)
                if self.closed or self.transport is None or self.transport.is_closing():
                    return
        except h2.exceptions.DenialOfServiceError as exc:  # e.g. a header list over the limit
            self._broken(f"HTTP/2: {exc}", TOO_LARGE)
            return
        except h2.exceptions.ProtocolError as exc:
            self._broken(f"HTTP/2: {type(exc).__name__}: {exc}")
            return
        except FramingError as err:
            if self.rid >= 0:
                self.fail(TOO_LARGE if err.kind == "too_large" else PROTOCOL, err.reason)
            else:
                self.stray(err.reason)
            return
        out = self.h2.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def _broken(self, reason: str, outcome: int = PROTOCOL) -> None:
        """The server broke HTTP/2: charge the call in flight, or the connection."""
        if self.alpn != "h2":  # the likely why: it does not speak HTTP/2 at all
            reason += f" (over TLS the server chose {self.alpn or 'no protocol'} by ALPN, not h2)"
        if self.rid >= 0:
            self.fail(outcome, reason)
        else:
            self.stray(reason)

    def _ours(self, ev: h2.events.Event) -> bool:
        return self.rid >= 0 and getattr(ev, "stream_id", None) == self.sid

    def _event(self, ev: h2.events.Event) -> None:
        kind = type(ev)
        if kind is h2.events.DataReceived:
            self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if self._ours(ev):
                self.nbytes += len(ev.data)
                self.call.data(ev.data)
        elif kind is h2.events.ResponseReceived:
            if self._ours(ev):
                self.call.headers(ev.headers)
        elif kind is h2.events.TrailersReceived:
            if self._ours(ev):
                self.call.trailers(ev.headers)
        elif kind is h2.events.StreamEnded:
            if self._ours(ev):
                outcome, status, reason = self.call.end()
                self.call = None
                self.complete(outcome, status, reason)
        elif kind is h2.events.StreamReset:
            if self._ours(ev):
                self.call = None
                self.complete(RESET, 0, f"RST_STREAM {_error_name(ev.error_code)} on the call")
        elif kind is h2.events.WindowUpdated:
            if self.rid >= 0 and self._out:
                self._push()
        elif kind is h2.events.ConnectionTerminated:
            self._goaway(ev)

    def _goaway(self, ev: h2.events.ConnectionTerminated) -> None:
        self.reusable = False
        code = ev.error_code if ev.error_code is not None else 0
        why = f"GOAWAY {_error_name(code)}"
        if ev.additional_data:
            why += f": {ev.additional_data[:100].decode('utf-8', 'replace')}"
        if self.rid >= 0 and (code != 0 or ev.last_stream_id is None
                              or self.sid > ev.last_stream_id):
            self.fail(RESET, f"{why} (the call, stream {self.sid}, was not processed)"
                             if code == 0 else why)
            return
        if self.rid < 0:
            if code != 0:
                self.sink.on_conn_error(self, RESET, why)
            self.abort()  # an idle connection the server has retired
            return
        # else: the call in flight was accepted and completes (see _H2); the connection
        # then goes

    def on_eof(self) -> bool:
        if self.call is not None and self.call.http_status:
            raise FramingError("truncated", "connection closed inside the gRPC response")
        raise FramingError("closed", "connection closed before any response to the call")


def _connections(engine, cfg):
    t, lim = cfg.target, cfg.limits
    return lambda: GrpcConnection(engine, t, lim)


BENCH_PROTOCOL = Protocol(
    kind="grpc", schemes={"grpc": False, "grpcs": True},
    usage="grpc(s)://host:port/package.Service/Method",
    flags=("--body", "--body-file", "--header"), kinds=(*REQUEST_KINDS, "grpc_status"),
    default_timeout="2s", target=grpc_target, connections=_connections,
    parse_slo=parse_slo)
