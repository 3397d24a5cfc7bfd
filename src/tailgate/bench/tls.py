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
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InputError
from .conn import Connection, handshake_reason, tls_why


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
