"""Opening a connection for any protocol: TCP connect, then (for TLS targets) the handshake,
each timed apart.

:func:`dial` is the one place the engine opens a connection. It connects the
socket first and only then starts TLS on it (stdlib :mod:`ssl` through the event
loop), so the result carries the TCP connect time and the TLS handshake time
separately; the protocol's ``connection_made`` runs after the handshake, so no
request is ever sent, and no service time ever starts, before the session is up
(a request that *waited* for the connection has the wait in its latency, as for
a plain connect).

The session is :class:`TlsLink`'s (an ``ssl.SSLObject`` over memory BIOs, as the
compiled loop drives OpenSSL), not the event loop's: when a write fails because the
server reset the connection, what it sent first (a whole response, a TLS 1.3 alert such
as ``certificate required``) is still in the kernel, and only a session of our own can
read it through (:func:`.conn.read_rest`); the loop's own TLS transport reports the
reset and drops those bytes.

A reset before anything was written (``ECONNRESET`` when the TCP connect completes: the
handshake was done, a refusal is ``ECONNREFUSED``) is a ``reset`` (a TLS target's, its
handshake's ``tls``), never ``connect``, which means refused, unreachable or timed out.

What TLS does is fixed by :class:`TlsOptions` (a frozen value, carried by the
target into every worker); :func:`client_context` turns it into an
``ssl.SSLContext`` once per worker. Server name (SNI) and the name verified
against the certificate: ``--sni NAME`` when given, else the URL's host (an IP
address is verified against the certificate's IP entries and sent without SNI,
as RFC 6066 requires). A ``Host`` header is never used for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InputError
from .conn import Connection, handshake_reason, read_rest, tls_why


class TlsError(InputError):
    """TLS options that cannot be used (unreadable file, key without certificate...)."""


@dataclass(frozen=True)
class TlsOptions:
    """How to speak TLS to the target; ``alpn`` is set by the protocol (h2, http/1.1)."""

    insecure: bool = False  # no certificate or name verification
    cacert: str | None = None  # PEM file of trusted CAs (default: the system store)
    cert: str | None = None  # client certificate chain (PEM)
    key: str | None = None  # its private key (PEM; default: inside ``cert``)
    sni: str | None = None  # server name to send and verify (default: the URL's host)
    alpn: tuple[str, ...] = ()


class DialError(Exception):
    """A connection attempt failed: ``kind`` is an outcome kind (``connect`` or ``tls``)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class Dialed:
    conn: Connection
    connect_s: float  # TCP connect (name resolution included)
    handshake_s: float | None  # TLS handshake; None without TLS


def client_context(opts: TlsOptions) -> ssl.SSLContext:
    """The client context for ``opts``; TlsError when a file cannot be used."""
    try:
        ctx = ssl.create_default_context(cafile=opts.cacert)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"--cacert {opts.cacert}: {tls_why(exc)}") from None
    if opts.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if opts.key and not opts.cert:
        raise TlsError("--key needs --cert (the client certificate)")
    if opts.cert:
        try:
            ctx.load_cert_chain(opts.cert, opts.key)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"--cert {opts.cert}"
                           + (f" --key {opts.key}" if opts.key else "")
                           + f": {tls_why(exc)}") from None
    if opts.alpn:
        ctx.set_alpn_protocols(list(opts.alpn))
    return ctx


@dataclass(frozen=True)
class ContextSettings:
    """What an ``ssl.SSLContext`` sets that another OpenSSL client context can be given: the
    compiled loop's context is made from these, so both engines send the same client hello
    and verify alike on every Python (Debian's, with OpenSSL's default cipher list and no
    minimum version, offers other suites and versions than upstream CPython's defaults).
    Not readable from Python, so left to OpenSSL's defaults in both: the security level,
    the groups and the signature algorithms."""

    ciphers: str  # TLS 1.2 and older, OpenSSL names in the context's order
    ciphersuites: str  # TLS 1.3
    minimum_version: int  # a protocol number (0x0303: TLS 1.2); 0: OpenSSL's lowest
    maximum_version: int  # 0: OpenSSL's highest
    options: int  # SSL_OP_* bits (Debian's Python sets OP_IGNORE_UNEXPECTED_EOF, for one)
    verify_flags: int  # X509_V_FLAG_* bits
    verify: bool  # verify_mode is not CERT_NONE
    check_hostname: bool
    hostname_checks_common_name: bool
    post_handshake_auth: bool
    keylog_filename: str | None  # SSLKEYLOGFILE, as create_default_context reads it


def context_settings(ctx: ssl.SSLContext) -> ContextSettings:
    """The settings of ``ctx`` (see :class:`ContextSettings`)."""
    suites = ctx.get_ciphers()

    def version(v: ssl.TLSVersion) -> int:
        # MINIMUM_SUPPORTED and MAXIMUM_SUPPORTED (negative): no bound, OpenSSL's 0
        return max(int(v), 0)

    return ContextSettings(
        ciphers=":".join(c["name"] for c in suites if c["protocol"] != "TLSv1.3"),
        ciphersuites=":".join(c["name"] for c in suites if c["protocol"] == "TLSv1.3"),
        minimum_version=version(ctx.minimum_version),
        maximum_version=version(ctx.maximum_version),
        options=int(ctx.options), verify_flags=int(ctx.verify_flags),
        verify=ctx.verify_mode != ssl.CERT_NONE, check_hostname=ctx.check_hostname,
        hostname_checks_common_name=ctx.hostname_checks_common_name,
        post_handshake_auth=bool(ctx.post_handshake_auth),
        keylog_filename=ctx.keylog_filename)


_RESET = (errno.ECONNRESET, errno.EPIPE)


def _connect_error(exc: BaseException, tls: bool) -> DialError:
    """Why a TCP connect failed: ``connect``, or a reset once it was up (see the module doc)."""
    if isinstance(exc, OSError) and exc.errno in _RESET:
        if tls:
            return DialError("tls", handshake_reason(exc))
        return DialError("reset", f"connection reset before its first request was written: "
                                  f"{exc}")
    return DialError("connect", str(exc) or type(exc).__name__)


async def dial(loop: asyncio.AbstractEventLoop, factory: Callable[[], Connection],
               host: str, port: int, ctx: ssl.SSLContext | None, sni: str | None,
               timeout_s: float) -> Dialed:
    """Connect (and shake hands when ``ctx`` is given) within ``timeout_s`` in all."""
    t0 = time.monotonic()
    if ctx is None:
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(factory, host, port),
                                             timeout_s)
        except (TimeoutError, OSError) as exc:
            raise _connect_error(exc, False) from None
        return Dialed(conn, time.monotonic() - t0, None)
    try:
        sock = await asyncio.wait_for(_tcp(loop, host, port), timeout_s)
    except (TimeoutError, OSError) as exc:
        raise _connect_error(exc, True) from None
    t1 = time.monotonic()
    left = max(timeout_s - (t1 - t0), 1e-3)
    shaken: asyncio.Future[Connection] = loop.create_future()
    link: TlsLink | None = None
    try:
        # connection_made runs only once the handshake is done (or never).
        _, link = await loop.create_connection(
            lambda: TlsLink(ctx, sni or host, factory, shaken), sock=sock)
        conn = await asyncio.wait_for(shaken, left)
        if isinstance(link.refused, ssl.SSLError):
            # The server's alert came before our first request could be written (TLS 1.3:
            # the client's handshake ends first, the server refuses its certificate after):
            # the handshake failed, as when the request did go out (conn.py: tls).
            raise link.refused
    except (TimeoutError, OSError, EOFError) as exc:
        if link is not None:
            link.abort()
        sock.close()
        raise DialError("tls", handshake_reason(exc)) from None
    except BaseException:  # cancelled (the run ended): the socket is ours to close
        if link is not None:
            link.abort()
        sock.close()
        raise
    return Dialed(conn, t1 - t0, time.monotonic() - t1)


class TlsLink(asyncio.Protocol):
    """A TLS session over a plain transport: the handshake, then the connection's
    transport (``write``, ``abort``, ``is_closing``, ``get_extra_info``) with the
    plaintext going to and from it. When a write failed (the transport is lost with an
    ``OSError``) the ciphertext the kernel still holds goes through the session first,
    so a response that arrived whole completes and an alert is the connection's
    ``ssl.SSLError`` (conn.py: ``tls``), as the compiled loop reads it."""

    def __init__(self, ctx: ssl.SSLContext, name: str, factory: Callable[[], Connection],
                 shaken: asyncio.Future[Connection]) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self._incoming, self._outgoing, server_hostname=name)
        self.factory = factory
        self.shaken = shaken
        self.raw: asyncio.Transport | None = None
        self.app: Connection | None = None
        self._lost = False
        self.refused: Exception | None = None  # the session's error, if it failed

    # -- the transport the connection sees ----------------------------------------------

    def write(self, data: bytes) -> None:
        if self._lost or self.raw is None:
            return
        try:
            self.obj.write(data)
        except ssl.SSLError as exc:
            self._fail(exc)
            return
        self._flush()

    def abort(self) -> None:
        if self.raw is not None:
            self.raw.abort()

    def close(self) -> None:
        self.abort()

    def is_closing(self) -> bool:
        return self._lost or self.raw is None or self.raw.is_closing()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self.raw is not None:
            self.raw.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return 0 if self.raw is None else self.raw.get_write_buffer_size()

    def get_extra_info(self, name: str, default: object = None) -> object:
        if name == "ssl_object":
            return self.obj
        if name == "sslcontext":
            return self.obj.context
        return default if self.raw is None else self.raw.get_extra_info(name, default)

    # -- the plain transport's protocol --------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]
        self._shake()

    def data_received(self, data: bytes) -> None:
        self._incoming.write(data)
        if self.app is None:
            self._shake()
        else:
            self._read()

    def pause_writing(self) -> None:
        if self.app is not None:
            self.app.pause_writing()

    def resume_writing(self) -> None:
        if self.app is not None and not self._lost:
            self.app.resume_writing()

    def eof_received(self) -> bool | None:
        if self.app is None:
            self._handshake_failed(ConnectionResetError())  # (no errno: "EOF")
        elif not self._lost:
            self.app.eof_received()
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.app is None:
            self._handshake_failed(exc if exc is not None else ConnectionResetError())
            self._lost = True
            return
        if self._lost:
            return
        if isinstance(exc, OSError) and self.raw is not None:
            rest = read_rest(self.raw)  # (conn.read_rest: what the server sent first)
            if rest:
                self._incoming.write(rest)
                self._read()
                if self._lost:
                    return
        self._lost = True
        self.app.connection_lost(exc)

    # -- the session ----------------------------------------------------------------------

    def _flush(self) -> None:
        if self._outgoing.pending and self.raw is not None and not self.raw.is_closing():
            self.raw.write(self._outgoing.read())

    def _shake(self) -> None:
        try:
            self.obj.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except (ssl.SSLError, OSError) as exc:
            self._flush()  # the alert, when there is one (as the loop's TLS sends it)
            self._handshake_failed(exc)
            return
        self._flush()
        self.app = self.factory()
        self.app.connection_made(self)
        if not self.shaken.done():
            self.shaken.set_result(self.app)
        if self._incoming.pending:
            self._read()

    def _handshake_failed(self, exc: BaseException) -> None:
        if not self.shaken.done():
            self.shaken.set_exception(exc)
        if self.raw is not None:
            self.raw.abort()

    def _read(self) -> None:
        app, obj, incoming = self.app, self.obj, self._incoming
        while not self._lost:
            try:
                data = obj.read(1 << 16)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLError as exc:  # an alert (TLS 1.3: a refused client certificate)
                self._fail(exc)
                return
            if not data:  # close_notify: the end of the stream (our own goes back)
                self.eof_received()
                with contextlib.suppress(ssl.SSLError):
                    self.obj.unwrap()
                self._flush()
                if self.raw is not None:
                    self.raw.close()
                return
            app.data_received(data)
            if not incoming.pending and not obj.pending():
                break  # all read (a read now would only raise SSLWantReadError)
        self._flush()  # (a post-handshake message may want an answer)

    def _fail(self, exc: Exception) -> None:
        """The session failed: the connection ends with ``exc``, the socket goes."""
        if self._lost:
            return
        self._lost = True
        self.refused = exc
        if self.raw is not None:
            self.raw.abort()
        self.app.connection_lost(exc)


async def _tcp(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket (the first address that accepts)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    last: OSError | None = None
    for family, type_, proto, _, addr in infos:
        sock = socket.socket(family, type_, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await loop.sock_connect(sock, addr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
        except BaseException:
            sock.close()
            raise
    raise last or OSError(f"no address for {host!r}")
