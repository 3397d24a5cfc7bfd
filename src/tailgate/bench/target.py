"""Targets (``http(s)://host:port/path``, ``tcp://host:port``,
``grpc(s)://host:port/package.Service/Method``, ``openai+http(s)://host:port/v1``) and the
bytes sent (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .. import __version__
from ..errors import InputError
from .tls import TlsOptions

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 method/header name


class TargetError(InputError):
    """The target or its request options are malformed (message says why)."""


@dataclass(frozen=True)
class Target:
    """Where to send and what: ``kind`` is the wire protocol, ``"http"``, ``"tcp"``,
    ``"grpc"`` or ``"openai"``; ``tls`` is set for https://, grpcs:// and openai+https://
    (``scheme`` says which).

    For ``tcp`` a response is complete after ``response_length`` bytes, or when
    the bytes received so far end with ``delimiter`` (exactly one is set). For
    ``grpc`` ``request`` is the length-prefixed message, ``path`` the method
    (``/package.Service/Method``) and ``metadata`` the extra request headers. For
    ``openai`` (an OpenAI-compatible server, streamed) ``request`` is the header
    block without its Content-Length: every request has its own body (the
    workload's prompt), joined by :meth:`with_body`; ``api`` says which endpoint.
    """

    url: str
    kind: str
    host: str
    port: int
    request: bytes
    delimiter: bytes | None = None
    response_length: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
    api: str | None = None  # openai: "completions" or "chat"
    tls: TlsOptions | None = None
    path: str = "/"
    metadata: tuple[tuple[str, str], ...] = ()

    def with_body(self, body: bytes) -> bytes:
        """openai: one request's bytes (the shared head, its length, its body)."""
        return self.request + b"Content-Length: %d\r\n\r\n" % len(body) + body

    @property
    def scheme(self) -> str:
        """``http``, ``https``, ``tcp``, ``grpc``, ``grpcs`` or ``openai`` (the protocol the
        JSON names; an openai+https:// target's TLS shows in ``tls``)."""
        if self.kind == "openai":
            return "openai"
        return self.kind + ("s" if self.tls is not None else "")


def _host_port(url: str, default_port: int | None) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if not parts.hostname:
        raise TargetError(f"no host in {url!r}")
    try:
        port = parts.port or default_port
    except ValueError:
        raise TargetError(f"bad port in {url!r}") from None
    if port is None:
        raise TargetError(f"{url!r} needs a port (tcp://host:port)")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, port, path


def http_request(method: str, host: str, port: int, path: str,
                 headers: list[tuple[str, str]] = (), body: bytes = b"") -> bytes:
    """One HTTP/1.1 keep-alive request, built once and sent as is for every request."""
    if not _TOKEN.match(method):
        raise TargetError(f"bad HTTP method {method!r}")
    names = {k.lower() for k, _ in headers}
    lines = [f"{method} {path} HTTP/1.1"]
    if "host" not in names:
        lines.append(f"Host: {host}:{port}")
    if "user-agent" not in names:
        lines.append(f"User-Agent: tailgate/{__version__}")
    for k, v in headers:
        if not _TOKEN.match(k) or "\r" in v or "\n" in v:
            raise TargetError(f"bad header {k!r}: {v!r}")
        lines.append(f"{k}: {v}")
    if (body or method in ("POST", "PUT", "PATCH")) and "content-length" not in names:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse_header(text: str) -> tuple[str, str]:
    """``"Name: value"`` -> ("Name", "value")."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise TargetError(f"header must be 'Name: value', not {text!r}")
    return name.strip(), value.strip()


def openai_head(host: str, port: int, path: str, headers: list[tuple[str, str]] = ()) -> bytes:
    """The header block of every streamed request to ``path``, up to its Content-Length."""
    names = {k.lower() for k, _ in headers}
    for name in ("content-length", "transfer-encoding"):
        if name in names:
            raise TargetError(f"-H {name}: set by tailgate for an openai+ target (each "
                              f"request has its own body)")
    std = [("Content-Type", "application/json"), ("Accept", "text/event-stream")]
    full = [*[(k, v) for k, v in std if k.lower() not in names], *headers,
            ("Content-Length", "0")]  # a stand-in, so http_request adds none
    block = http_request("POST", host, port, path, full)
    return block[:-len(b"Content-Length: 0\r\n\r\n")]  # each request adds its own


@dataclass(frozen=True)
class RequestOptions:
    """What each request is, as the protocol options give it (a protocol reads its own)."""

    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    payload: bytes | None = None
    delimiter: bytes | None = None
    response_length: int | None = None
    api: str = "completions"
    tls: TlsOptions | None = None

    def no_tcp_options(self) -> None:
        if self.payload is not None or self.delimiter is not None \
                or self.response_length is not None:
            raise TargetError("--payload/--delimiter/--response-length are for tcp:// targets")


def parse_target(url: str, *, method: str = "GET", headers: list[tuple[str, str]] = (),
                 body: bytes = b"", payload: bytes | None = None,
                 delimiter: bytes | None = None,
                 response_length: int | None = None, api: str = "completions",
                 tls: TlsOptions | None = None) -> Target:
    """Check a target URL and its request options, and build the request bytes (the
    protocol of its scheme does, see :mod:`.protocols`).

    ``tls`` (the --insecure/--cacert/--cert/--key/--sni options) applies to https://,
    grpcs:// and openai+https:// only; given for another scheme it is an error, never
    ignored."""
    from .protocols import protocols, registry, scheme_of

    scheme = scheme_of(url)
    proto = registry().get(scheme)
    if proto is None:
        raise TargetError("target must be " + ", ".join(p.usage for p in protocols())
                          + f", not {url!r}")
    secure = proto.schemes[scheme]
    if tls is not None and tls != TlsOptions() and not secure:
        given = [f"--{k}" for k, v in vars(tls).items() if v and k != "alpn"]
        tls_schemes = [f"{s}://" for p in protocols() for s, t in p.schemes.items() if t]
        raise TargetError(f"{' '.join(given)} does not apply to {scheme}:// targets "
                          f"(it is for {', '.join(tls_schemes)})")
    return proto.target(url, secure, RequestOptions(
        method=method, headers=tuple(headers), body=body, payload=payload,
        delimiter=delimiter, response_length=response_length, api=api, tls=tls))


def http_target(url: str, secure: bool, o: RequestOptions) -> Target:
    host, port, path = _host_port(url, 443 if secure else 80)
    o.no_tcp_options()
    return Target(url, "http", host, port, http_request(o.method, host, port, path,
                                                        list(o.headers), o.body),
                  tls=_tls(o.tls, "http/1.1") if secure else None)


def openai_target(url: str, secure: bool, o: RequestOptions) -> Target:
    from ..llm.openai import PATHS

    if o.api not in PATHS:
        raise TargetError(f"--api must be one of {', '.join(PATHS)}, not {o.api!r}")
    host, port, path = _host_port(url[len("openai+"):], 443 if secure else 80)
    path = path.rstrip("/") + PATHS[o.api]  # type: ignore[index]
    return Target(url, "openai", host, port, openai_head(host, port, path, list(o.headers)),
                  api=o.api, tls=_tls(o.tls, "http/1.1") if secure else None)


def tcp_target(url: str, secure: bool, o: RequestOptions) -> Target:
    host, port, _ = _host_port(url, None)
    if not o.payload:
        raise TargetError("a tcp:// target needs --payload (the request bytes)")
    if (o.delimiter is None) == (o.response_length is None):
        raise TargetError("a tcp:// target needs exactly one of --delimiter "
                          "or --response-length")
    if o.delimiter is not None and not o.delimiter:
        raise TargetError("--delimiter must not be empty")
    if o.response_length is not None and o.response_length < 1:
        raise TargetError("--response-length must be >= 1")
    return Target(url, "tcp", host, port, o.payload, o.delimiter, o.response_length)


def _tls(opts: TlsOptions | None, alpn: str) -> TlsOptions:
    from dataclasses import replace

    return replace(opts or TlsOptions(), alpn=(alpn,))


_GRPC_PATH = re.compile(r"^/[A-Za-z0-9_.]+/[A-Za-z0-9_]+$")
# Request headers gRPC (or HTTP/2) owns; -H may not set them.
_GRPC_RESERVED = {"content-type", "te", "host", "connection", "grpc-encoding",
                  "grpc-accept-encoding", "grpc-timeout", "user-agent", "content-length"}


def grpc_frame(message: bytes) -> bytes:
    """One uncompressed gRPC message: flag 0, 4-byte big-endian length, the bytes."""
    if len(message) >= 1 << 32:
        raise TargetError("a gRPC message must be smaller than 4 GiB")
    return b"\x00" + len(message).to_bytes(4, "big") + message


def grpc_target(url: str, secure: bool, o: RequestOptions) -> Target:
    method, headers, body, tls = o.method, o.headers, o.body, o.tls
    host, port, path = _host_port(url, 443 if secure else None)
    try:
        import h2  # noqa: F401  (HTTP/2 for the gRPC connection)
    except ImportError:
        raise TargetError("grpc:// targets need the h2 package (pip install h2)") from None
    if not _GRPC_PATH.match(path):
        raise TargetError(f"a gRPC target names its method: grpc://host:port/"
                          f"package.Service/Method, not path {path!r}")
    o.no_tcp_options()
    if method.upper() not in ("GET", "POST"):  # GET is the default: not asked for
        raise TargetError(f"gRPC calls are HTTP/2 POSTs: -X {method} does not apply")
    meta = []
    for k, v in headers:
        name = k.lower()
        if name in _GRPC_RESERVED or name.startswith(":") or not _TOKEN.match(name):
            raise TargetError(f"-H {k!r}: not settable as gRPC metadata")
        try:
            v.encode("latin-1")
        except UnicodeEncodeError:
            raise TargetError(f"-H {k!r}: gRPC metadata values are ASCII text") from None
        if any(c < " " and c != "\t" or c == "\x7f" for c in v):
            raise TargetError(f"bad header {k!r}: {v!r}")
        meta.append((name, v))
    return Target(url, "grpc", host, port, grpc_frame(body),
                  tls=_tls(tls, "h2") if secure else None, path=path, metadata=tuple(meta))
