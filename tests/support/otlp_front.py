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
import uuid
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
        end_unix = arrival_unix + int((t_end - t_arrival) * 1e9)
        self._keep(number, rid, h.headers.get("traceparent", ""), t_arrival, first, t_end,
                   timings, arrival_unix, end_unix)

    def _keep(self, number: int, rid: str, parent: str, t_arrival: float, first: float,
              t_end: float, timings: dict[str, Any], arrival_unix: int, end_unix: int) -> None:
        """The span of one request, posted with the next batch."""
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
        return self._send(req)

    def _send(self, req: ExportTraceServiceRequest) -> bool:
        """POST one export as the exporters do; True where the receiver took it."""
        post = urllib.request.Request(self.endpoint, data=req.SerializeToString(),
                                      headers={"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(post, timeout=5) as r:
                ok = r.status == 200
        except (urllib.error.URLError, OSError):
            return False
        self.posted += ok
        return ok


class SglangFront(VllmFront):
    """The same front, exporting as SGLang does with ``--enable-trace`` (and
    ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``): per request, a root span (named
    ``" Req <rid[:8]>"``, ``rid`` and ``module`` ``sglang::…`` attributes, then the
    ``gen_ai.*`` ones of its tokenizer manager) continuing the trace of the ``traceparent``
    the client sent, its ``gen_ai.request.id`` SGLang's own (``chatcmpl-`` and a random
    hex, not the client's), no queue attribute and a prefill counted from the tokenizer's
    dispatch (the queue included); and, from the scheduler's process in exports of its
    own, a ``prefill_waiting`` span in the same trace: the queue.

    Not SGLang (it needs AVX-512 on a CPU, this VM has AVX2): the shape is read from SGLang's
    source (python/sglang/srt/observability/trace.py, req_time_stats.py and the tokenizer
    manager's span attributes). The request numbered ``n`` gets no root span where ``n %
    skip_every == skip_at``, and no ``prefill_waiting`` span where ``n % skip_every ==
    no_wait_at``; ``waits``: request number -> the queue span's length (s)."""

    def __init__(self, upstream: str, endpoint: str, no_wait_at: int = 3, **kw: Any) -> None:
        super().__init__(upstream, endpoint, **kw)
        self.no_wait_at = no_wait_at
        self.waits: dict[int, float] = {}
        self.no_wait: set[int] = set()

    def _keep(self, number: int, rid: str, parent: str, t_arrival: float, first: float,
              t_end: float, timings: dict[str, Any], arrival_unix: int, end_unix: int) -> None:
        _, trace, parent_span, _ = parent.split("-")
        prefill, decode = timings["prompt_ms"] / 1e3, timings["predicted_ms"] / 1e3
        queue = max(first - prefill - t_arrival, 0.0)
        own = "chatcmpl-" + uuid.uuid4().hex
        attrs = {"rid": own, "module": "sglang::request",
                 "gen_ai.usage.completion_tokens": timings["predicted_n"],
                 "gen_ai.usage.prompt_tokens": timings["prompt_n"] + timings["cache_n"],
                 "gen_ai.usage.cached_tokens": timings["cache_n"],
                 "gen_ai.request.id": own, "gen_ai.request.max_tokens": 8,
                 "gen_ai.response.model": "tiny", "gen_ai.response.finish_reasons":
                 '["length"]',
                 "gen_ai.latency.time_to_first_token": first - t_arrival,
                 "gen_ai.latency.e2e": t_end - t_arrival,
                 "gen_ai.latency.time_in_model_decode": decode,
                 "gen_ai.latency.time_in_model_inference": t_end - t_arrival,
                 "gen_ai.latency.time_in_model_prefill": first - t_arrival}
        wait = None if number % self.skip_every == self.no_wait_at else queue
        with self._lock:
            self.spans[number] = attrs
            if wait is None:
                self.no_wait.add(number)
            else:
                self.waits[number] = wait
            self._pending.append((attrs, arrival_unix, end_unix, bytes.fromhex(trace),
                                  bytes.fromhex(parent_span), wait))

    def _post(self, spans: list[tuple]) -> bool:
        tokenizer, scheduler = ExportTraceServiceRequest(), ExportTraceServiceRequest()
        roots = _scope(tokenizer, "sglang")
        slices = _scope(scheduler, "sglang")
        for k, item in enumerate(spans):
            attrs, start, end = item[:3]
            trace, parent, wait = (item[3:] if len(item) > 3 else
                                   (uuid.uuid4().bytes, b"", None))
            if len(item) == 3:  # (a stranger: another client's request, SGLang's shape)
                attrs = {"module": "sglang::request", **{
                    key: v for key, v in attrs.items() if "time_in_queue" not in key}}
            root = roots.spans.add()
            root.name = f" Req {attrs['gen_ai.request.id'][9:17]}"
            root.trace_id, root.span_id, root.parent_span_id = trace, _sid(k, 1), parent
            root.start_time_unix_nano, root.end_time_unix_nano = start, max(end, start)
            root.attributes.extend(_kv(key, v) for key, v in attrs.items())
            thread = roots.spans.add()  # (the tokenizer's thread span: no request attributes)
            thread.name = "Tokenizer (host:0a1b2c3d | pid:4242)"
            thread.trace_id, thread.span_id, thread.parent_span_id = trace, _sid(k, 2), \
                root.span_id
            thread.start_time_unix_nano, thread.end_time_unix_nano = start, max(end, start)
            thread.attributes.extend([_kv("thread_label", "Tokenizer"), _kv("pid", 4242)])
            if wait is None:
                continue
            for name, a, b in (("request_process", start, start + 50_000),
                               ("prefill_waiting", start + 50_000,
                                start + 50_000 + int(wait * 1e9))):
                sp = slices.spans.add()
                sp.name, sp.trace_id, sp.span_id = name, trace, _sid(k, 3 if a == start else 4)
                sp.start_time_unix_nano, sp.end_time_unix_nano = a, b
        ok = all(self._send(req) for req in (scheduler, tokenizer) if
                 any(s.spans for rs in req.resource_spans for s in rs.scope_spans))
        return ok


def _scope(req: ExportTraceServiceRequest, service: str):
    rs = req.resource_spans.add()
    rs.resource.attributes.append(_kv("service.name", service))
    ss = rs.scope_spans.add()
    ss.scope.name = "sglang server"
    return ss


def _sid(k: int, part: int) -> bytes:
    return (k * 8 + part).to_bytes(8, "big")
