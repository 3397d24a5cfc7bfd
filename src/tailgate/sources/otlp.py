"""The engine's request spans, received over OTLP/HTTP during a run: vLLM's and SGLang's.

vLLM (``--otlp-traces-endpoint``) ends each request with a span ``llm_request`` whose
attributes give its phases in seconds (vllm/tracing: ``gen_ai.latency.time_in_queue``,
``…time_to_first_token``, ``…e2e``, ``…time_in_model_prefill``, ``…time_in_model_decode``,
``…time_in_model_inference``), its token counts (``gen_ai.usage.prompt_tokens``,
``…completion_tokens``) and its id (``gen_ai.request.id``: the ``X-Request-Id`` the client
sent, behind a prefix such as ``chatcmpl-``).

SGLang (``--enable-trace --otlp-traces-endpoint``, with
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``) names the same attributes on its
request's root span (``sglang::`` in its ``module`` attribute;
srt/observability/trace.py and the tokenizer manager's span attributes), but states no
queue, and its ``time_in_model_prefill`` runs from the tokenizer's dispatch to the first
token, the scheduler's queue included. The queue is a span of its own in the same trace,
``prefill_waiting`` (the scheduler's wait-queue entry to its forward entry), sent by the
scheduler's process: the two are joined by their trace id, which is tailgate's own, as
SGLang (and vLLM) continue the trace of the ``traceparent`` header the client sends
(:func:`traceparent`). A root span whose trace has no ``prefill_waiting`` span cannot be
split into queue and prefill, and is not used (:meth:`Received.request_spans`).

:func:`parse_export` is pure: an ``ExportTraceServiceRequest`` body (protobuf, or OTLP's
JSON encoding) in, an :class:`Export` out, decoded with the OpenTelemetry
protocol definitions (``opentelemetry-proto``). :class:`Receiver` is the reader: an HTTP
server on loopback (unless told otherwise) that keeps the spans of the requests it is told
about and counts the rest; memory is bounded (a body over :data:`MAX_BODY` is refused with
413, spans past :data:`MAX_SPANS` are counted as dropped, and the run's record says so).
"""

from __future__ import annotations

import http.server
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..model import ParseError

MAX_BODY = 4 << 20  # one export request
MAX_SPANS = 200_000  # kept over a run (~100 bytes each)
SPAN_NAME = "llm_request"  # vLLM's
QUEUE_SPAN = "prefill_waiting"  # SGLang's scheduler queue (RequestStage.PREFILL_WAITING)
VLLM, SGLANG = "vLLM", "SGLang"
ATTR = {
    "queue_s": "gen_ai.latency.time_in_queue",
    "ttft_s": "gen_ai.latency.time_to_first_token",
    "e2e_s": "gen_ai.latency.e2e",
    "prefill_s": "gen_ai.latency.time_in_model_prefill",
    "decode_s": "gen_ai.latency.time_in_model_decode",
    "inference_s": "gen_ai.latency.time_in_model_inference",
}
PROMPT, COMPLETION, REQUEST_ID = ("gen_ai.usage.prompt_tokens",
                                  "gen_ai.usage.completion_tokens", "gen_ai.request.id")
CACHED = "gen_ai.usage.cached_tokens"  # SGLang's: the prompt tokens its prefix cache held


@dataclass(frozen=True)
class RequestSpan:
    """One request's phases as the engine reports them (s; None where the span lacks one).
    ``request_id`` is "" where an SGLang span names none (its trace id still does)."""

    request_id: str
    start_unix_ns: int
    end_unix_ns: int
    queue_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    prefill_s: float | None
    decode_s: float | None
    inference_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    trace_id: bytes = b""
    engine: str = VLLM
    cached_tokens: int | None = None  # of prompt_tokens (SGLang says it; vLLM does not)


@dataclass(frozen=True)
class Export:
    """What one OTLP export held: the request spans, why any was left out, and SGLang's
    queue spans (trace id, span id, seconds)."""

    spans: list[RequestSpan]
    bad: list[str]
    waits: list[tuple[bytes, bytes, float]] = field(default_factory=list)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def parse_export(body: bytes, content_type: str = "application/x-protobuf") -> Export:
    """The request spans of one OTLP trace export (vLLM's ``llm_request``, SGLang's request
    root), why any was left out (a missing id, a phase that is not a non-negative number),
    and SGLang's ``prefill_waiting`` spans. Raises ParseError for a body that is not an
    export request."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    try:
        if "json" in content_type:
            json_format.Parse(body.decode("utf-8"), req)
        else:
            req.ParseFromString(body)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError) as exc:
        raise ParseError(f"not an OTLP trace export ({content_type}): {exc}") from None
    out = Export([], [], [])
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                if sp.name == QUEUE_SPAN:
                    if sp.end_time_unix_nano >= sp.start_time_unix_nano:
                        out.waits.append((sp.trace_id, sp.span_id, (
                            sp.end_time_unix_nano - sp.start_time_unix_nano) / 1e9))
                    continue
                attrs = {kv.key: _value(kv.value) for kv in sp.attributes}
                module = attrs.get("module")
                sglang = isinstance(module, str) and module.startswith("sglang::")
                if sp.name != SPAN_NAME and not sglang:
                    continue
                try:
                    out.spans.append(_span(sp, attrs, SGLANG if sglang else VLLM))
                except ParseError as exc:
                    out.bad.append(str(exc))
    return out


def _span(sp: Any, attrs: dict[str, Any], engine: str) -> RequestSpan:
    rid = attrs.get(REQUEST_ID)
    if engine == SGLANG and rid is None:
        rid = ""  # (SGLang drops a request id it was not given: the trace id names it)
        if not any(k.startswith("gen_ai.latency.") for k in attrs):
            raise ParseError(f"SGLang span {sp.span_id.hex()}: no gen_ai.latency attributes "
                             "(a request that did not finish?)")
    elif not isinstance(rid, str) or not rid:
        raise ParseError(f"span {sp.span_id.hex()}: no {REQUEST_ID}")
    who = rid or "trace " + sp.trace_id.hex()  # (how a reason names it)
    times: dict[str, float | None] = {}
    for key, name in ATTR.items():
        v = attrs.get(name)
        if v is None:
            times[key] = None
        elif isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 86400:
            raise ParseError(f"span of {who}: {name} = {v!r} is not a duration in s")
        else:
            times[key] = float(v)
    counts: dict[str, int | None] = {}
    for key in (PROMPT, COMPLETION, CACHED):
        v = attrs.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ParseError(f"span of {who}: {key} = {v!r} is not a token count")
        counts[key] = v
    if sp.end_time_unix_nano < sp.start_time_unix_nano:
        raise ParseError(f"span of {who}: it ends before it starts")
    return RequestSpan(rid, sp.start_time_unix_nano, sp.end_time_unix_nano, times["queue_s"],
                       times["ttft_s"], times["e2e_s"], times["prefill_s"],
                       times["decode_s"], times["inference_s"], counts[PROMPT],
                       counts[COMPLETION], bytes(sp.trace_id), engine, counts[CACHED])


# The id tailgate sends (X-Request-Id): a UUID, because some servers (llama-cpp-python)
# refuse any other shape; its last group is the run's request number.
_ID = re.compile(r"([0-9a-f]{8})-0000-4000-8000-([0-9a-f]{12})$")


def request_uuid(run: int, rid: int) -> str:
    """The X-Request-Id of request ``rid`` of the run tagged ``run`` (32 bits)."""
    return f"{run & 0xFFFFFFFF:08x}-0000-4000-8000-{rid:012x}"


def traceparent(request_id: str) -> str:
    """The W3C ``traceparent`` header tailgate sends with the request of id ``request_id``
    (a :func:`request_uuid`): the trace id is the id's 32 hex digits, so the engine's spans
    of the request carry it (:func:`trace_number`); sampled (flags 01), as an engine whose
    sampler follows its parent would otherwise record nothing."""
    trace = request_id.replace("-", "")
    return f"00-{trace}-{trace[16:]}-01"


def trace_number(trace_id: bytes, run: int) -> int | None:
    """The request number a span's trace id carries (:func:`traceparent`), None when the
    trace is not one of this run's requests."""
    if len(trace_id) != 16:
        return None
    return request_number(str(uuid.UUID(bytes=trace_id)), run)


def request_number(request_id: str, run: int) -> int | None:
    """The request number in a span's id (the engine may prefix it), None when the id is
    not one of this run's."""
    m = _ID.search(request_id)
    if m is None or int(m.group(1), 16) != run & 0xFFFFFFFF:
        return None
    return int(m.group(2), 16)


@dataclass
class Received:
    """What the receiver took in over a run."""

    spans: dict[int, RequestSpan] = field(default_factory=dict)  # by request number
    # SGLang's queue spans by request number: span id -> s (an exporter's retry sends a
    # span again; a request queued again after a retraction has another)
    waits: dict[int, dict[bytes, float]] = field(default_factory=dict)
    wait_spans: int = 0  # (held in waits, at most MAX_SPANS)
    unknown_ids: int = 0  # spans of requests this run never sent
    malformed: list[str] = field(default_factory=list)  # (the first few)
    malformed_count: int = 0
    bad_bodies: int = 0
    refused_bodies: int = 0  # over MAX_BODY
    dropped: int = 0  # past MAX_SPANS

    def add(self, export: Export, run: int,
            max_spans: int = MAX_SPANS) -> list[tuple[int, RequestSpan]]:
        """One export's spans (and why any was left out): a span of this run's requests
        (by its trace id, else its request id) is kept by its request number, up to
        ``max_spans`` of them (the rest counted as dropped); one of any other counted.
        SGLang's queue spans of this run's traces are kept alike. Returns the request
        spans kept."""
        self.malformed_count += len(export.bad)
        self.malformed.extend(export.bad[:max(0, 3 - len(self.malformed))])
        kept = []
        for sp in export.spans:
            n = trace_number(sp.trace_id, run)
            if n is None:
                n = request_number(sp.request_id, run)
            if n is None:
                self.unknown_ids += 1
            elif len(self.spans) >= max_spans and n not in self.spans:
                self.dropped += 1
            else:
                self.spans[n] = sp
                kept.append((n, sp))
        for trace_id, span_id, wait_s in export.waits:
            n = trace_number(trace_id, run)
            if n is None:
                continue  # (another trace's: not this run's request)
            sid = bytes(span_id)
            if self.wait_spans >= max_spans and sid not in self.waits.get(n, {}):
                self.dropped += 1
                continue
            held = self.waits.setdefault(n, {})
            self.wait_spans += sid not in held
            held[sid] = wait_s
        return kept

    def request_spans(self) -> dict[int, RequestSpan]:
        """The request spans, SGLang's with their queue: the ``prefill_waiting`` span of its
        trace, out of the prefill (which SGLang counts from the tokenizer's dispatch). An
        SGLang span without one, or with a queue longer than that prefill (the two disagree),
        keeps no prefill (queue and prefill cannot be told apart), so its record is not
        used."""
        out = {}
        for n, sp in self.spans.items():
            if sp.engine == SGLANG and sp.queue_s is None:
                w = sum(self.waits[n].values()) if self.waits.get(n) else None
                ok = w is not None and sp.prefill_s is not None and w <= sp.prefill_s + 1e-6
                sp = replace(sp, queue_s=w,
                             prefill_s=max(sp.prefill_s - w, 0.0) if ok else None)
            out[n] = sp
        return out

    def without_queue(self) -> int:
        """SGLang spans whose trace brought no ``prefill_waiting`` span (those
        :meth:`request_spans` leaves without a queue)."""
        return sum(sp.engine == SGLANG and sp.queue_s is None
                   for sp in self.request_spans().values())

    def to_json(self) -> dict[str, Any]:
        out = {"spans": len(self.spans), "unknown_ids": self.unknown_ids,
               "malformed": self.malformed_count, "malformed_examples": self.malformed[:3],
               "bad_bodies": self.bad_bodies, "refused_bodies": self.refused_bodies,
               "dropped": self.dropped}
        if self.waits or any(sp.engine == SGLANG for sp in self.spans.values()):
            out |= {"queue_spans": self.wait_spans, "without_queue_span": self.without_queue()}
        return out


class Receiver:
    """An OTLP/HTTP trace receiver (``POST /v1/traces``) for the spans of one run: a span
    whose trace (:func:`trace_number`) or id (:func:`request_number`) maps to this run is
    kept, the rest counted."""

    def __init__(self, run: int, host: str = "127.0.0.1", port: int = 0,
                 max_body: int = MAX_BODY, max_spans: int = MAX_SPANS,
                 on_span: Callable[[int, RequestSpan], None] | None = None) -> None:
        self.run, self.max_body, self.max_spans = run, max_body, max_spans
        self.got = Received()
        self._lock = threading.Lock()
        self._on_span = on_span
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # (no stderr lines per export)
                pass

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                receiver._post(self)

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="otlp-receiver")

    def numbers(self) -> set[int]:
        """The request numbers it holds a span of, now (the server's threads add more)."""
        with self._lock:
            return set(self.got.spans)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1/traces"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _post(self, h: http.server.BaseHTTPRequestHandler) -> None:
        try:
            length = int(h.headers.get("Content-Length", "-1"))
        except ValueError:
            length = -1
        if h.path.split("?")[0] != "/v1/traces":
            return self._reply(h, 404, b"")
        if length < 0 or length > self.max_body:
            with self._lock:
                self.got.refused_bodies += 1
            h.close_connection = True  # (its body is not read)
            return self._reply(h, 413, b"")
        body = h.rfile.read(length)
        try:
            export = parse_export(body, h.headers.get("Content-Type", ""))
        except ParseError:
            with self._lock:
                self.got.bad_bodies += 1
            return self._reply(h, 400, b"")
        with self._lock:
            kept = self.got.add(export, self.run, self.max_spans)
            if self._on_span:
                for n, sp in kept:
                    self._on_span(n, sp)
        self._reply(h, 200, b"", "application/x-protobuf")

    @staticmethod
    def _reply(h: http.server.BaseHTTPRequestHandler, status: int, body: bytes,
               ctype: str = "text/plain") -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
