"""How a request ended: one small integer per request, one name per kind.

``sent == ok + sum(errors)`` holds because every request gets exactly one of
these. New kinds go at the end (codes are stored in per-request logs). What
each kind means (also in the README):

* ``connect``: no connection could be made for it (refused, unreachable, connect time-out).
* ``timeout``: no complete response by intended start + time-out; recorded at the time-out.
* ``reset``: the connection was reset (RST) during the exchange, or closed before any
  response byte on a fresh connection.
* ``status_4xx`` / ``status_5xx``: a complete response with that status class.
* ``protocol``: a response that is not valid HTTP/1.1 (or, in the test mode that checks
  sequence stamps, a response stamped for another request).
* ``truncated``: the connection closed (FIN) inside a response: short Content-Length, EOF
  inside a chunked body or the header block, a TCP response cut before its length or
  delimiter, an event stream without its end.
* ``too_large``: a response passed a buffer limit (header block, chunk-size line, body,
  one SSE line or event); the connection is dropped at the limit.
* ``upgrade``: a ``101 Switching Protocols`` nobody asked for.
* ``stale_connection``: a reused keep-alive connection closed or reset before any byte of
  the response (the server had closed it); with ``--retry-stale`` the request is sent
  again on a new connection instead, and fails only as that attempt does.
* ``tls``: no connection could be made for it because the TLS handshake failed
  (certificate not trusted, name mismatch, client certificate refused, handshake
  time-out), or a TLS alert ended the connection after it (TLS 1.3 refuses a client
  certificate only once the client's side of the handshake is done); the reason says which.
* ``grpc_status``: a complete gRPC response whose ``grpc-status`` is not 0 (OK); the
  code is the request's status, its ``grpc-message`` the example reason.

Only ``openai+`` targets (a streamed response, :mod:`.openai_sse`):

* ``malformed_sse``: bad event-stream framing, or a ``data:`` event that is not a chunk
  of the API (not JSON, no ``choices``).
* ``server_error``: an ``{"error": ...}`` object inside the stream.
* ``no_token``: a complete stream without any content.

Only ``udp://`` targets (datagrams, :mod:`.udp`):

* ``lost``: no echo of the datagram within the time-out (recorded at the time-out); a
  datagram whose send the kernel refused (ICMP unreachable) is ``connect``.

(An answer that is not ``text/event-stream`` is ``protocol``; a stream that ends
before ``data: [DONE]`` is ``truncated``.)
"""

from __future__ import annotations

OK = 0
CONNECT = 1
TIMEOUT = 2
RESET = 3
STATUS_4XX = 4
STATUS_5XX = 5
PROTOCOL = 6
TRUNCATED = 7
TOO_LARGE = 8
UPGRADE = 9
STALE = 10
MALFORMED_SSE = 11
SERVER_ERROR = 12
NO_TOKEN = 13
TLS = 14
GRPC_STATUS = 15
LOST = 16

KINDS = ("ok", "connect", "timeout", "reset", "status_4xx", "status_5xx", "protocol",
         "truncated", "too_large", "upgrade", "stale_connection",
         "malformed_sse", "server_error", "no_token", "tls", "grpc_status", "lost")
ERROR_KINDS = KINDS[1:]
STREAM_KINDS = KINDS[MALFORMED_SSE:NO_TOKEN + 1]  # only a streamed (openai+) response


# What a request over HTTP/1.1, TCP or gRPC can end with (no stream; grpc adds its status).
REQUEST_KINDS = tuple(k for k in ERROR_KINDS
                      if k not in STREAM_KINDS and k not in ("grpc_status", "lost"))
CODE = {k: i for i, k in enumerate(KINDS)}


def http_outcome(status: int) -> int:
    """2xx and 3xx are answers; 4xx and 5xx are errors of their own kind."""
    if 200 <= status < 400:
        return OK
    if 400 <= status < 500:
        return STATUS_4XX
    if 500 <= status < 600:
        return STATUS_5XX
    return PROTOCOL
