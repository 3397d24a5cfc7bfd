"""Targets (``http://host:port/path``, ``tcp://host:port``,
``openai+http://host:port/v1``) and the bytes sent (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .. import __version__

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 method/header name


class TargetError(ValueError):
    """The target or its request options are malformed (message says why)."""


@dataclass(frozen=True)
class Target:
    """Where to send and what: ``kind`` is ``"http"``, ``"tcp"`` or ``"openai"``.

    For ``tcp`` a response is complete after ``response_length`` bytes, or when
    the bytes received so far end with ``delimiter`` (exactly one is set). For
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

    def with_body(self, body: bytes) -> bytes:
        """openai: one request's bytes (the shared head, its length, its body)."""
        return self.request + b"Content-Length: %d\r\n\r\n" % len(body) + body


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


def parse_target(url: str, *, method: str = "GET", headers: list[tuple[str, str]] = (),
                 body: bytes = b"", payload: bytes | None = None,
                 delimiter: bytes | None = None,
                 response_length: int | None = None, api: str = "completions") -> Target:
    """Check a target URL and its request options, and build the request bytes."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "openai+http":
        from ..llm.openai import PATHS

        if api not in PATHS:
            raise TargetError(f"--api must be one of {', '.join(PATHS)}, not {api!r}")
        host, port, path = _host_port(url[len("openai+"):], 80)
        path = path.rstrip("/") + PATHS[api]  # type: ignore[index]
        return Target(url, "openai", host, port, openai_head(host, port, path, list(headers)),
                      api=api)
    if scheme == "openai+https":
        raise TargetError("openai+https:// is not supported yet (openai+http:// only)")
    if scheme == "http":
        host, port, path = _host_port(url, 80)
        if payload is not None or delimiter is not None or response_length is not None:
            raise TargetError("--payload/--delimiter/--response-length are for tcp:// targets")
        return Target(url, "http", host, port, http_request(method, host, port, path,
                                                            list(headers), body))
    if scheme == "tcp":
        host, port, _ = _host_port(url, None)
        if not payload:
            raise TargetError("a tcp:// target needs --payload (the request bytes)")
        if (delimiter is None) == (response_length is None):
            raise TargetError("a tcp:// target needs exactly one of --delimiter "
                              "or --response-length")
        if delimiter is not None and not delimiter:
            raise TargetError("--delimiter must not be empty")
        if response_length is not None and response_length < 1:
            raise TargetError("--response-length must be >= 1")
        return Target(url, "tcp", host, port, payload, delimiter, response_length)
    if scheme == "https":
        raise TargetError("https:// is not supported (plain HTTP/1.1 or tcp:// only)")
    raise TargetError(f"target must be http://host:port/path, tcp://host:port or "
                      f"openai+http://host:port/v1, not {url!r}")
