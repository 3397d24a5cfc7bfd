"""Opening a connection for any protocol: TCP connect, then (for TLS targets) the handshake,
each timed apart.

:func:`dial` is the one place the engine opens a connection. It connects the
socket first and only then starts TLS on it (stdlib :mod:`ssl` through the event
loop), so the result carries the TCP connect time and the TLS handshake time
separately; the protocol's ``connection_made`` runs after the handshake, so no
request is ever sent, and no service time ever starts, before the session is up
(a request that *waited* for the connection has the wait in its latency, as for
a plain connect).

What TLS does is fixed by :class:`TlsOptions` (a frozen value, carried by the
target into every worker); :func:`client_context` turns it into an
``ssl.SSLContext`` once per worker. Server name (SNI) and the name verified
against the certificate: ``--sni NAME`` when given, else the URL's host (an IP
address is verified against the certificate's IP entries and sent without SNI,
as RFC 6066 requires). A ``Host`` header is never used for it.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from .conn import Connection


class TlsError(ValueError):
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
        raise TlsError(f"--cacert {opts.cacert}: {_why(exc)}") from None
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
                           + f": {_why(exc)}") from None
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


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.replace("_", " ").lower()
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return re.sub(r"^\[\w+\] |\s*\(_ssl\.c:\d+\)$", "", text)  # "[SSL] x (_ssl.c:1006)"


def handshake_reason(exc: BaseException) -> str:
    """A short, stable reason for a failed handshake (one error-example line per cause)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {exc.verify_message}"
    if isinstance(exc, TimeoutError):
        return "TLS: handshake timed out"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {_why(exc)}"
    if isinstance(exc, ConnectionError | EOFError):
        # asyncio reports a plain close (FIN) as a ConnectionResetError without an errno
        why = _why(exc) if getattr(exc, "errno", None) else "EOF"
        return f"TLS: the server closed the connection during the handshake ({why})"
    return f"TLS: {_why(exc)}"


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
            raise DialError("connect", str(exc) or type(exc).__name__) from None
        return Dialed(conn, time.monotonic() - t0, None)
    try:
        sock = await asyncio.wait_for(_tcp(loop, host, port), timeout_s)
    except (TimeoutError, OSError) as exc:
        raise DialError("connect", str(exc) or type(exc).__name__) from None
    t1 = time.monotonic()
    left = max(timeout_s - (t1 - t0), 1e-3)
    try:
        # connection_made runs only once the handshake is done (or never).
        _, conn = await asyncio.wait_for(
            loop.create_connection(factory, sock=sock, ssl=ctx, server_hostname=sni or host,
                                   ssl_handshake_timeout=left), left)
    except (TimeoutError, OSError, EOFError) as exc:
        sock.close()
        raise DialError("tls", handshake_reason(exc)) from None
    except BaseException:  # cancelled (the run ended): the socket is ours to close
        sock.close()
        raise
    return Dialed(conn, t1 - t0, time.monotonic() - t1)


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
