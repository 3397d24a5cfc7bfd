"""The TLS client hellos a client sends, caught on a loopback listener and parsed (scapy).

    with HelloCatcher() as catcher:      # accepts, reads the first TLS record, closes
        ...connect clients to catcher.port...
    hellos = [parse(r) for r in catcher.records]

:func:`parse` keeps what a server chooses by and what identifies a client, and leaves out
what differs on every connection (the random, the session id, the key shares).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass

from scapy.layers.tls.extensions import (
    TLS_Ext_ALPN,
    TLS_Ext_ServerName,
    TLS_Ext_SignatureAlgorithms,
    TLS_Ext_SupportedGroups,
    TLS_Ext_SupportedVersion_CH,
)
from scapy.layers.tls.handshake import TLSClientHello
from scapy.layers.tls.record import TLS


@dataclass(frozen=True)
class Hello:
    version: int  # legacy_version (0x0303)
    cipher_suites: tuple[int, ...]  # in the client's order
    compression: tuple[int, ...]
    extensions: tuple[int, ...]  # types, in the client's order
    supported_groups: tuple[int, ...]
    signature_algorithms: tuple[int, ...]
    supported_versions: tuple[int, ...]
    alpn: tuple[bytes, ...]
    sni: tuple[bytes, ...]


def parse(record: bytes) -> Hello:
    """The client hello in ``record`` (one TLS record, as the client sent it)."""
    msgs = TLS(record).msg
    assert msgs and isinstance(msgs[0], TLSClientHello), f"not a client hello: {record[:16]!r}"
    ch = msgs[0]

    def ext(kind: type) -> object | None:
        return next((e for e in ch.ext or () if isinstance(e, kind)), None)

    groups, sigalgs = ext(TLS_Ext_SupportedGroups), ext(TLS_Ext_SignatureAlgorithms)
    versions, alpn, sni = (ext(TLS_Ext_SupportedVersion_CH), ext(TLS_Ext_ALPN),
                           ext(TLS_Ext_ServerName))
    return Hello(
        version=ch.version, cipher_suites=tuple(ch.ciphers), compression=tuple(ch.comp),
        extensions=tuple(e.type for e in ch.ext or ()),
        supported_groups=tuple(groups.groups) if groups else (),
        signature_algorithms=tuple(sigalgs.sig_algs) if sigalgs else (),
        supported_versions=tuple(versions.versions) if versions else (),
        alpn=tuple(p.protocol for p in alpn.protocols) if alpn else (),
        sni=tuple(n.servername for n in sni.servernames) if sni else ())


class HelloCatcher:
    """A loopback TCP listener that keeps the first TLS record of every connection (the
    client hello) and then closes it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.records: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> HelloCatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept() (close alone does not)
        self.listener.close()
        self._thread.join(5)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # the listener closed: the end
                return
            with conn, contextlib.suppress(OSError):  # (a client that gave up first)
                conn.settimeout(5)
                data = b""
                while len(data) < 5 or len(data) < 5 + int.from_bytes(data[3:5], "big"):
                    got = conn.recv(65536)
                    if not got:
                        break
                    data += got
                if len(data) >= 5:
                    self.records.append(data[:5 + int.from_bytes(data[3:5], "big")])
