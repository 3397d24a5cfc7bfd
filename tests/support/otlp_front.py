"""A vLLM-shaped front for the tests' llama-server: it serves the OpenAI API by passing
each request to the real llama-server and its stream back unchanged, and, as vLLM does
with ``--otlp-traces-endpoint`` (and ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``),
exports one ``llm_request`` span per request over OTLP/HTTP, in batches, named by the
``X-Request-Id`` the client sent.

Not vLLM (a real vLLM's spans are kept as fixtures: fixtures/engine/vllm-0.32.0-cpu-otlp):
the spans are built with the OpenTelemetry protocol classes, with vLLM's span name and
attribute names (vllm/tracing), from what this front saw and what the engine said: prefill
and decode are llama-server's own ``timings`` (``prompt_ms``, ``predicted_ms``), the first
token the time the front read it, the queue the rest of the wait before the prefill (vLLM's
``scheduled_ts - queued_ts``), arrival the front's reading of the request.
"""

from __future__ import annotations

import http.client
import http.server
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def _kv(key: str, v: Any) -> KeyValue:
    val = (AnyValue(string_value=v) if isinstance(v, str) else
           AnyValue(int_value=v) if isinstance(v, int) else AnyValue(double_value=v))
    return KeyValue(key=key, value=val)


class VllmFront:
    """``with VllmFront(upstream, endpoint) as front:`` serve ``front.base`` (…/v1). Spans
    are posted every ``batch_s`` to ``endpoint`` (kept and retried while it refuses); the
    request numbered ``n`` (the last group of its X-Request-Id) gets none where ``n %
    skip_every == skip_at``; the first batch carries ``strangers`` spans of ids no client
    sent. ``spans``: request number -> the attributes posted; ``skipped``: numbers left out."""

    def __init__(self, upstream: str, endpoint: str, skip_every: int = 10, skip_at: int = 7,
                 strangers: int = 3, batch_s: float = 0.5) -> None:
        up = urlsplit(upstream)
        self.up_host, self.up_port = up.hostname or "127.0.0.1", up.port or 80
        self.endpoint, self.batch_s = endpoint, batch_s
        self.skip_every, self.skip_at, self.strangers = skip_every, skip_at, strangers
        self.spans: dict[int, dict[str, Any]] = {}
        self.skipped: set[int] = set()
        self.posted = 0  # export requests the receiver took (200)
        self._pending: list[tuple[dict[str, Any], int, int]] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the load expects

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                front._serve(self)

            def do_GET(self) -> None:  # noqa: N802 - /metrics, /health: passed through
                front._get(self)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._threads = [threading.Thread(target=self._server.serve_forever, daemon=True),
                         threading.Thread(target=self._export_loop, daemon=True)]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> VllmFront:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._server.shutdown()
        self._server.server_close()
        for t in self._threads:
            t.join(10)

    # -- serving ---------------------------------------------------------------------

    def _get(self, h: http.server.BaseHTTPRequestHandler) -> None:
        conn = http.client.HTTPConnection(self.up_host, self.up_port, timeout=10)
        conn.request("GET", h.path)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        h.send_response(resp.status)
        h.send_header("Content-Type", resp.getheader("Content-Type") or "text/plain")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        arrival_unix = time.time_ns()
        t_arrival = time.monotonic()
        body = h.rfile.read(int(h.headers.get("Content-Length", "0")))
        rid = h.headers.get("X-Request-Id", "")
        conn = http.client.HTTPConnection(self.up_host, self.up_port, timeout=60)
        conn.request("POST", h.path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        h.send_response(resp.status)
        h.send_header("Content-Type", resp.getheader("Content-Type") or "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        buf, first, timings = b"", None, None
        while True:
            data = resp.read1(65536)
            if not data:
                break
            now = time.monotonic()
            buf += data
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                for line in ev.split(b"\n"):
                    if not line.startswith(b"data: {"):
                        continue
                    obj = json.loads(line[6:])
                    choice = (obj.get("choices") or [{}])[0]
                    text = (choice.get("delta") or {}).get("content") or choice.get("text")
                    if text and first is None:
                        first = now
                    timings = obj.get("timings") or timings
            h.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
            h.wfile.flush()
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
        conn.close()
        t_end = time.monotonic()
        if resp.status != 200 or timings is None or first is None or not rid:
            return
        number = int(rid.rsplit("-", 1)[1], 16)
        if number % self.skip_every == self.skip_at:
            with self._lock:
                self.skipped.add(number)
            return
        prefill, decode = timings["prompt_ms"] / 1e3, timings["predicted_ms"] / 1e3
        queue = max(first - prefill - t_arrival, 0.0)
        attrs = {"gen_ai.request.id": "chatcmpl-" + rid,
                 "gen_ai.latency.time_in_queue": queue,
                 "gen_ai.latency.time_to_first_token": first - t_arrival,
                 "gen_ai.latency.e2e": t_end - t_arrival,
                 "gen_ai.latency.time_in_model_prefill": prefill,
                 "gen_ai.latency.time_in_model_decode": decode,
                 "gen_ai.latency.time_in_model_inference": prefill + decode,
                 "gen_ai.usage.prompt_tokens": timings["prompt_n"] + timings["cache_n"],
                 "gen_ai.usage.completion_tokens": timings["predicted_n"]}
        end_unix = arrival_unix + int((t_end - t_arrival) * 1e9)
        with self._lock:
            self.spans[number] = attrs
            self._pending.append((attrs, arrival_unix, end_unix))

    # -- exporting -------------------------------------------------------------------

    def _export_loop(self) -> None:
        strangers = [({"gen_ai.request.id": f"chatcmpl-not-sent-by-tailgate-{k}",
                       "gen_ai.latency.time_in_queue": 0.0,
                       "gen_ai.latency.time_in_model_prefill": 0.001,
                       "gen_ai.latency.time_in_model_decode": 0.001}, time.time_ns(),
                      time.time_ns()) for k in range(self.strangers)]
        while True:
            stop = self._done.wait(self.batch_s)
            with self._lock:
                batch, self._pending = self._pending, []
            if batch:
                ok = self._post(strangers + batch)
                if ok:
                    strangers = []
                else:
                    with self._lock:
                        self._pending[:0] = batch
            if stop:
                return

    def _post(self, spans: list[tuple[dict[str, Any], int, int]]) -> bool:
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.attributes.append(_kv("service.name", "vllm"))
        ss = rs.scope_spans.add()
        ss.scope.name = "vllm.llm_engine"
        for k, (attrs, start, end) in enumerate(spans):
            sp = ss.spans.add()
            sp.name = "llm_request"
            sp.kind = Span.SPAN_KIND_SERVER
            sp.trace_id = (time.time_ns() + k).to_bytes(16, "big")
            sp.span_id = (k + 1).to_bytes(8, "big")
            sp.start_time_unix_nano, sp.end_time_unix_nano = start, max(end, start)
            sp.attributes.extend(_kv(key, v) for key, v in attrs.items())
        post = urllib.request.Request(self.endpoint, data=req.SerializeToString(),
                                      headers={"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(post, timeout=5) as r:
                ok = r.status == 200
        except (urllib.error.URLError, OSError):
            return False
        self.posted += ok
        return ok
