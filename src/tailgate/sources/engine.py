"""Inference-engine facts: a Prometheus ``/metrics`` scrape and an allocator dump.

``tailgate inspect --engine URL`` scrapes the engine's metrics endpoint (vLLM,
SGLang) at t0 and t1, so checks judge counters over the window. ``URL`` may
also be the path of a saved scrape (one sample only: checks then fall back to
the totals since the engine started, and say so). ``--memory-stats FILE`` is a
JSON dump of PyTorch's ``torch.cuda.memory_stats()``.

Reading (``fetch``) and parsing (``parse_exposition``) are separate: the parser
is pure text in, samples out, and raises :class:`ParseError` on a body that is
not the Prometheus text exposition format (an HTML error page, JSON, ...).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from ..collect import Scope, collector
from ..host import Host, read_regular
from ..llm.engine_metrics import impossible
from ..model import ParseError, SourceError

# Only the engines' own series are kept in the snapshot (a vLLM scrape also has
# ~100 process/http series that no check reads).
ENGINE_PREFIXES = ("vllm:", "sglang:")
MAX_BODY = 16 * 1024 * 1024  # a /metrics body larger than this is not an engine's


def parse_exposition(text: str) -> list[list[Any]]:
    """Parse Prometheus text exposition into ``[[name, labels, value], ...]``.

    Uses ``prometheus_client``'s parser. Raises :class:`ParseError` when the
    body is not in that format or holds no sample at all.
    """
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        first = text.strip().splitlines()[0][:80] if text.strip() else ""
        raise ParseError(
            f"not Prometheus text exposition format ({exc}); body starts {first!r}"
        ) from exc
    samples: list[list[Any]] = []
    for fam in families:
        for s in fam.samples:
            value = float(s.value)
            # NaN or an infinite sample never helps a judgment (and is not JSON); +Inf
            # buckets are kept (le label, not value).
            if not math.isfinite(value):
                continue
            samples.append([s.name, dict(s.labels), value])
    if not samples:
        raise ParseError("the body holds no metric samples")
    return samples


def engine_samples(samples: list[list[Any]]) -> list[list[Any]]:
    """Keep the inference engines' series (``vllm:*``, ``sglang:*``)."""
    return [s for s in samples if s[0].startswith(ENGINE_PREFIXES)]


class _DeadlineSocket(socket.socket):
    """A socket whose every receive waits only until one deadline for the whole exchange: a
    plain time-out restarts with each byte, so a server sending one byte a second never ends."""

    deadline = 0.0

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.settimeout(left)

    def recv_into(self, buffer, nbytes=0, flags=0):  # type: ignore[override]
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize, flags=0):  # type: ignore[override]
        self._arm()
        return super().recv(bufsize, flags)


class _DeadlineSSLSocket(ssl.SSLSocket):
    deadline = 0.0
    _arm = _DeadlineSocket._arm

    def recv_into(self, buffer, nbytes=0, flags=0):  # type: ignore[override]
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, buflen=1024, flags=0):  # type: ignore[override]
        self._arm()
        return super().recv(buflen, flags)


def _opener(deadline: float) -> urllib.request.OpenerDirector:
    """A urllib opener (redirects, proxies and HTTP errors as usual) whose connections read
    under ``deadline`` (time.monotonic())."""

    def bounded(sock: socket.socket) -> socket.socket:
        out = _DeadlineSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        out.deadline = deadline
        out._arm()
        return out

    class Plain(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            self.sock = bounded(self.sock)

    class PlainHandler(urllib.request.HTTPHandler):
        def http_open(self, req):  # type: ignore[override]
            return self.do_open(Plain, req)

    context = ssl.create_default_context()
    context.sslsocket_class = type("Bounded", (_DeadlineSSLSocket,), {"deadline": deadline})
    return urllib.request.build_opener(PlainHandler, urllib.request.HTTPSHandler(context=context))


LATE = "no complete answer within"  # a fetch's time-out reason (it then names the limit)


def fetch(url: str, timeout_s: float) -> str:
    """GET ``url`` (http/https) or read a saved scrape; every failure is a SourceError.

    The whole exchange (connect, headers, body) has one deadline, ``timeout_s`` from now;
    a body over :data:`MAX_BODY` is refused, never cut (a cut counter reads as another number).
    """
    if not url.startswith(("http://", "https://")):
        path = url.removeprefix("file://")
        try:  # a regular file under the cap: a FIFO or /dev/zero would never end
            return read_regular(os.path.realpath(path), MAX_BODY, what=path).decode(
                "utf-8", errors="replace")
        except SourceError as exc:
            raise SourceError(f"saved scrape {exc}") from exc
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    late = f"{url}: {LATE} {timeout_s:g} s"
    try:
        with _opener(time.monotonic() + timeout_s).open(req, timeout=timeout_s) as resp:
            length = resp.headers.get("Content-Length")
            if length is not None and length.strip().isascii() and length.strip().isdigit() \
                    and int(length) > MAX_BODY:
                raise SourceError(f"{url}: a body of {int(length)} bytes, over the "
                                  f"{MAX_BODY // 2**20} MiB cap (not an engine's /metrics)")
            body = resp.read(MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        raise SourceError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise SourceError(late) from exc
        raise SourceError(f"{url}: unreachable ({exc.reason})") from exc
    except TimeoutError as exc:
        raise SourceError(late) from exc
    except http.client.HTTPException as exc:
        raise SourceError(f"{url}: not a valid HTTP answer ({type(exc).__name__}: "
                          f"{str(exc)[:80]})") from exc
    except OSError as exc:
        raise SourceError(f"{url}: {exc.strerror or exc}") from exc
    if len(body) > MAX_BODY:
        raise SourceError(f"{url}: the body is over the {MAX_BODY // 2**20} MiB cap (refused "
                          "rather than cut: a cut counter reads as another number)")
    return body.decode("utf-8", errors="replace")


@collector("engine.metrics", counter=True)
def engine_metrics(host: Host, scope: Scope) -> dict[str, Any]:
    url = scope.options.get("engine")
    if not url:
        raise SourceError("no inference engine given (--engine URL)")
    samples = parse_exposition(fetch(str(url), host.timeout_s))
    kept = engine_samples(samples)
    if not kept:
        raise ParseError(f"{url}: Prometheus metrics, but none from vLLM or SGLang "
                         f"({len(samples)} other samples)")
    why = impossible(kept)
    if why:
        raise ParseError(f"{url}: {why}")
    return {"url": str(url), "samples": kept}


def parse_memory_stats(text: str) -> dict[str, dict[str, float]]:
    """Parse a JSON dump of ``torch.cuda.memory_stats()``.

    Accepts the flat mapping torch returns (``{"reserved_bytes.all.current": ...}``)
    or a mapping of devices to such mappings (``{"cuda:0": {...}, "cuda:1": {...}}``).
    Returns ``{device: {key: number}}`` (device ``"device"`` for a flat dump).
    """
    def no_constant(name: str) -> None:
        raise ValueError(f"non-finite number {name}")

    try:
        data = json.loads(text, parse_constant=no_constant)
    except RecursionError as exc:
        raise ParseError("memory stats: nested too deep") from exc
    except ValueError as exc:
        raise ParseError(f"memory stats: not JSON ({exc})") from exc
    if not isinstance(data, dict) or not data:
        raise ParseError("memory stats: expected a JSON object of torch.cuda.memory_stats()")

    def numbers(d: dict[str, Any]) -> dict[str, float]:
        out = {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if any(v < 0 or v > 2**64 for v in out.values()):  # byte counts of one device
            raise ParseError("memory stats: a negative or implausible byte count")
        return {k: float(v) for k, v in out.items()}

    if all(isinstance(v, dict) for v in data.values()):
        devices = {str(k): numbers(v) for k, v in data.items()}
    else:
        devices = {"device": numbers(data)}
    for name, stats in devices.items():
        if "reserved_bytes.all.current" not in stats:
            raise ParseError(f"memory stats ({name}): no 'reserved_bytes.all.current' key; "
                             "is this torch.cuda.memory_stats() output?")
    return devices


@collector("engine.memory_stats")
def engine_memory_stats(host: Host, scope: Scope) -> dict[str, dict[str, float]]:
    path = scope.options.get("memory_stats")
    if not path:
        raise SourceError("no allocator statistics given (--memory-stats FILE with "
                          "torch.cuda.memory_stats() as JSON)")
    text = read_regular(os.path.realpath(str(path)), MAX_BODY, what=str(path)).decode(
        "utf-8", errors="replace")
    return parse_memory_stats(text)
