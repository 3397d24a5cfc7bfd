"""How a request ended: one small integer per request, one name per kind.

``sent == ok + sum(errors)`` holds because every request gets exactly one of
these. New kinds go at the end (codes are stored in per-request logs).
"""

from __future__ import annotations

OK = 0
CONNECT = 1  # no connection could be made for it (refused, unreachable, connect time-out)
TIMEOUT = 2  # no complete response by intended start + time-out; recorded at the time-out
RESET = 3  # the connection closed or reset before the response was complete
STATUS_4XX = 4
STATUS_5XX = 5
PROTOCOL = 6  # a response we could not parse, or an unexpected status line (1xx)

KINDS = ("ok", "connect", "timeout", "reset", "status_4xx", "status_5xx", "protocol")
ERROR_KINDS = KINDS[1:]


def http_outcome(status: int) -> int:
    """2xx and 3xx are answers; 4xx and 5xx are errors of their own kind."""
    if 200 <= status < 400:
        return OK
    if 400 <= status < 500:
        return STATUS_4XX
    if 500 <= status < 600:
        return STATUS_5XX
    return PROTOCOL
