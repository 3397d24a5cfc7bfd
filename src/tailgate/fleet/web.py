"""`serve --web.config.file`: TLS, basic auth and response headers in the format of the
Prometheus exporter-toolkit (the file node_exporter reads), so one file serves a fleet's
exporters alike.

Supported keys (an unknown or unsupported key is an error naming file, line and key, exit 2)::

    tls_server_config:
      cert_file: server.pem          # relative paths are relative to the config file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert, VerifyClientCertIfGiven
      client_ca_file: ca.pem
      min_version: TLS12             # TLS10..TLS13 (default TLS12)
      max_version: TLS13
    http_server_config:
      http2: false                   # accepted; tailgate serves HTTP/1.1
      headers: {X-Content-Type-Options: nosniff, ...}   # the toolkit's five headers
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

The crypto is the standard library's ``ssl`` (OpenSSL) and PyPI ``bcrypt``. Unlike the toolkit,
the file is read once at start (a bad file stops ``serve`` before it listens); restart to reload.
``RequestClientCert`` and ``RequireAnyClientCert`` (a client certificate nobody verifies) have
no OpenSSL server mode in ``ssl`` and are refused, as are the inline ``cert``/``key``/
``client_ca``, ``cipher_suites``, ``curve_preferences``, ``client_allowed_sans`` and
``rate_limit``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import os
import re
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import yaml

from ..errors import ConfigError

MAX_WEB_CONFIG_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 10.0  # a client that stalls mid-handshake or mid-request is dropped

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
# exporter-toolkit accepts exactly these (web/tls_config.go)
HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options",
           "X-XSS-Protection", "Strict-Transport-Security")
UNSUPPORTED = {
    "tls_server_config": ("cert", "key", "client_ca", "client_allowed_sans", "cipher_suites",
                          "prefer_server_cipher_suites", "curve_preferences"),
    "": ("rate_limit",),
}
BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}$")


class WebConfigError(ConfigError):
    """A web configuration file that cannot be used; the message names file, line and key."""


@dataclass(frozen=True)
class TlsConfig:
    cert_file: str
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[self.min_version]
        ctx.maximum_version = TLS_VERSIONS[self.max_version]
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            ctx.load_verify_locations(cafile=self.client_ca_file)
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        return ctx


@dataclass(frozen=True)
class WebConfig:
    source: str | None = None
    tls: TlsConfig | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def client_certificates(self) -> bool:
        return self.tls is not None and self.tls.client_auth_type == "RequireAndVerifyClientCert"

    def missing_protection(self) -> list[str]:
        """What a scrape from the network would lack: TLS, authentication (none: protected)."""
        out = [] if self.tls else ["TLS"]
        if not self.users and not self.client_certificates:
            out.append("authentication (basic_auth_users or client certificates)")
        return out


# -- the file -----------------------------------------------------------------------------------

class _Doc:
    """A YAML mapping walked with line numbers, strict about keys."""

    def __init__(self, path: str, node: yaml.Node, where: str, allowed: Iterable[str]) -> None:
        self.path, self.where = path, where
        line = node.start_mark.line + 1
        if not isinstance(node, yaml.MappingNode):
            raise WebConfigError(f"{path}:{line}: {where or 'the file'}: expected a mapping")
        self.items: dict[str, tuple[int, yaml.Node]] = {}
        allowed = tuple(allowed)
        for k, v in node.value:
            kline = k.start_mark.line + 1
            if not isinstance(k, yaml.ScalarNode):
                raise WebConfigError(f"{path}:{kline}: {where or 'the file'}: a key must be plain")
            name = str(k.value)
            key = f"{where}.{name}" if where else name
            if name in UNSUPPORTED.get(where, ()):
                raise WebConfigError(f"{path}:{kline}: key {key}: not supported by tailgate "
                                     "(see docs/serve.md)")
            if allowed and name not in allowed:
                raise WebConfigError(f"{path}:{kline}: key {key}: unknown key (allowed: "
                                     f"{', '.join(allowed)})")
            if name in self.items:
                raise WebConfigError(f"{path}:{kline}: key {key}: given twice")
            self.items[name] = (kline, v)

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def line(self, name: str) -> int:
        return self.items[name][0]

    def string(self, name: str, default: str | None = None,
               choices: Iterable[str] = ()) -> str | None:
        if name not in self.items:
            return default
        line, node = self.items[name]
        if not isinstance(node, yaml.ScalarNode) or node.tag != "tag:yaml.org,2002:str":
            raise WebConfigError(f"{self.path}:{line}: key {self.key(name)}: expected a string")
        choices = tuple(choices)
        if choices and node.value not in choices:
            raise WebConfigError(f"{self.path}:{line}: key {self.key(name)}: {node.value!r} is "
                                 f"not one of {', '.join(choices)}")
        return str(node.value)

    def file(self, name: str, base: str) -> str | None:
        value = self.string(name)
        if value is None:
            return None
        path = value if os.path.isabs(value) else os.path.join(base, value)
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise WebConfigError(f"{self.path}:{self.line(name)}: key {self.key(name)}: "
                                 f"{path}: not a readable file")
        return path

    def sub(self, name: str, allowed: Iterable[str]) -> _Doc | None:
        if name not in self.items:
            return None
        _, node = self.items[name]
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return None
        return _Doc(self.path, node, self.key(name), allowed)


def load_web_config(path: str) -> WebConfig:
    """Parse and check ``path`` (certificates loaded, hashes checked): every problem is a
    :class:`WebConfigError` naming the file, line and key."""
    from ..userfiles import UserFileError, compose_yaml, read_user_text

    try:
        root = compose_yaml(read_user_text(path, MAX_WEB_CONFIG_BYTES), path)
    except UserFileError as exc:
        raise WebConfigError(str(exc)) from exc
    if root is None:
        return WebConfig(source=path)
    base = os.path.dirname(os.path.abspath(path))
    doc = _Doc(path, root, "", ("tls_server_config", "http_server_config", "basic_auth_users"))

    tls = None
    t = doc.sub("tls_server_config", ("cert_file", "key_file", "client_auth_type",
                                      "client_ca_file", "min_version", "max_version"))
    if t is not None:
        for need in ("cert_file", "key_file"):
            if need not in t.items:
                raise WebConfigError(f"{path}:{doc.line('tls_server_config')}: key "
                                     f"tls_server_config.{need}: missing")
        auth = t.string("client_auth_type", "NoClientCert",
                        (*CLIENT_AUTH, *UNVERIFIED_CLIENT_AUTH))
        if auth in UNVERIFIED_CLIENT_AUTH:
            raise WebConfigError(f"{path}:{t.line('client_auth_type')}: key "
                                 f"tls_server_config.client_auth_type: {auth} accepts a client "
                                 "certificate nobody verifies; use RequireAndVerifyClientCert")
        ca = t.file("client_ca_file", base)
        if ca and auth == "NoClientCert":
            raise WebConfigError(f"{path}:{t.line('client_ca_file')}: key tls_server_config."
                                 "client_ca_file: a client CA without client_auth_type "
                                 "(RequireAndVerifyClientCert)")
        if not ca and auth != "NoClientCert":
            raise WebConfigError(f"{path}:{t.line('client_auth_type')}: key tls_server_config."
                                 f"client_auth_type: {auth} needs client_ca_file")
        low = t.string("min_version", "TLS12", TLS_VERSIONS)
        high = t.string("max_version", "TLS13", TLS_VERSIONS)
        if TLS_VERSIONS[low] > TLS_VERSIONS[high]:
            raise WebConfigError(f"{path}:{t.line('min_version')}: key tls_server_config."
                                 f"min_version: {low} is above max_version {high}")
        tls = TlsConfig(t.file("cert_file", base), t.file("key_file", base), auth, ca, low, high)
        try:
            tls.context()
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(f"{path}:{t.line('cert_file')}: key tls_server_config: cannot "
                                 f"use {tls.cert_file} / {tls.key_file}"
                                 f"{' / ' + ca if ca else ''}: {exc}") from exc

    headers: list[tuple[str, str]] = []
    h = doc.sub("http_server_config", ("http2", "headers"))
    if h is not None:
        if "http2" in h.items:
            line, node = h.items["http2"]
            if not (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:bool"):
                raise WebConfigError(f"{path}:{line}: key http_server_config.http2: expected "
                                     "true or false")
        hd = h.sub("headers", HEADERS)
        if hd is not None:
            for name in hd.items:
                value = hd.string(name) or ""
                if "\r" in value or "\n" in value:
                    raise WebConfigError(f"{path}:{hd.line(name)}: key {hd.key(name)}: a header "
                                         "value is one line")
                if value:  # the toolkit: unset if blank
                    headers.append((name, value))

    users: dict[str, bytes] = {}
    u = doc.sub("basic_auth_users", ())
    if u is not None:
        for name in u.items:
            hashed = u.string(name) or ""
            if not BCRYPT_HASH.match(hashed):
                raise WebConfigError(f"{path}:{u.line(name)}: key {u.key(name)}: not a bcrypt "
                                     "hash (htpasswd -nBC 10 \"\" | tr -d ':\\n' makes one)")
            users[name] = hashed.encode()
    return WebConfig(source=path, tls=tls, users=users, headers=tuple(headers))


# -- authentication -----------------------------------------------------------------------------

def listen_address(text: str) -> tuple[str, int]:
    """``--listen ADDRESS:PORT`` (an IP address; IPv6 in brackets) as (address, port)."""
    from ..errors import UsageError

    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {text!r}: expected ADDRESS:PORT, e.g. 127.0.0.1:9860")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError as exc:
        raise UsageError(f"--listen {text!r}: {host!r} is not an IP address") from exc
    return host, int(port)


def serving_config(path: str | None, addr: tuple[str, int] | None, listen: str,
                   insecure: bool) -> tuple[WebConfig, list[str]]:
    """The --web.config.file (or none) for serving on ``addr`` (None: no port), and the
    protection it lacks on a non-loopback address, which only ``insecure``
    (--insecure-listen) allows: the caller warns about it."""
    from ..errors import UsageError

    if path and addr is None:
        raise UsageError("--web.config.file needs a port to serve (not --once or --no-listen)")
    try:
        web = load_web_config(path) if path else WebConfig()
    except WebConfigError as exc:
        raise UsageError(str(exc)) from exc
    if addr is None or ipaddress.ip_address(addr[0]).is_loopback:
        return web, []
    missing = web.missing_protection()
    if missing and not insecure:
        raise UsageError(f"--listen {listen}: a non-loopback address without "
                         f"{' and '.join(missing)}: give --web.config.file with them, or "
                         "--insecure-listen to serve it anyway")
    return web, missing


class BasicAuth:
    """Checks ``Authorization: Basic`` against the bcrypt hashes. A success is remembered (by a
    SHA-256 of user, password and hash: a scrape every few seconds would otherwise cost a
    bcrypt each); an unknown user still costs one bcrypt, so timing does not tell users apart."""

    CACHE = 64

    def __init__(self, users: dict[str, bytes]) -> None:
        import bcrypt

        self._bcrypt = bcrypt
        self.users = dict(users)
        self._dummy = bcrypt.hashpw(b"tailgate", bcrypt.gensalt(rounds=10))
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()

    def check(self, header: str | None) -> bool:
        if not header or not header[:6].lower() == "basic ":
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True
                                                   ).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed or b""))
                             ).digest()
        with self._lock:
            if hashed is not None and key in self._ok:
                return True
        try:
            ok = self._bcrypt.checkpw(password.encode(), hashed or self._dummy)
        except ValueError:
            ok = False
        if hashed is None or not ok:
            return False
        with self._lock:
            if len(self._ok) >= self.CACHE:
                self._ok.clear()
            self._ok.add(key)
        return True


def protect(app: Callable, config: WebConfig) -> Callable:
    """A WSGI app behind the config's basic auth, with its extra headers on every response."""
    auth = BasicAuth(config.users) if config.users else None
    extra = list(config.headers)

    def guarded(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        if auth is not None and not auth.check(environ.get("HTTP_AUTHORIZATION")):
            body = b"Unauthorized\n"
            start_response("401 Unauthorized", [
                ("WWW-Authenticate", "Basic"), ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body))), *extra])
            return [body]

        def start(status: str, headers: list, exc_info: Any = None) -> Callable:
            return start_response(status, [*headers, *extra], exc_info)

        return app(environ, start)

    return guarded


# -- the server ---------------------------------------------------------------------------------

class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass


class MetricsServer(ThreadingMixIn, WSGIServer):
    """wsgiref with a thread per connection; the TLS handshake happens in that thread (a client
    that stalls in it holds one thread for at most REQUEST_TIMEOUT_S, not the accept loop)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], context: ssl.SSLContext | None) -> None:
        self.address_family = (socket.AF_INET6 if ipaddress.ip_address(addr[0]).version == 6
                               else socket.AF_INET)
        self.context = context
        super().__init__(addr, _QuietHandler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, peer = self.socket.accept()
        sock.settimeout(REQUEST_TIMEOUT_S)
        return sock, peer

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.context is None:
            super().finish_request(request, client_address)
            return
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):  # no or an untrusted client certificate, not TLS, ...
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (OSError, ssl.SSLError)):  # the peer went away: not our business
            return
        super().handle_error(request, client_address)


def start_server(addr: tuple[str, int], app: Callable, config: WebConfig) -> MetricsServer:
    """Listen on ``addr`` (raises OSError) and serve ``app`` behind ``config`` in a thread."""
    ctx = config.tls.context() if config.tls else None
    server = MetricsServer(addr, ctx)
    server.set_app(protect(app, config))
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
