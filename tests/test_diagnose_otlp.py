"""`tailgate diagnose openai+http://... --otlp-listen HOST:PORT` from the CLI: the real
diagnose against the tests' real llama-server, behind a vLLM-shaped front
(tests/support/otlp_front.py) that exports one ``llm_request`` span per request over
OTLP/HTTP while the run goes on, as vLLM's exporter does (protobuf, POST /v1/traces, in
batches), named by the X-Request-Id tailgate sent.

The spans are built, not recorded from vLLM (no vLLM CPU build here): vLLM's span name and
attribute names, with prefill and decode from llama-server's own ``timings`` and the queue
the rest of the wait the front saw before the prefill. What is real: the load, the server,
the HTTP export and receipt, the protobuf decoding, the join by request id and the clock."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from support.inspect import diagnose_code
from support.llm_server import MODEL_NAME, free_port, native_llama_server
from support.otlp_front import VllmFront

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True, scope="module")
def _needs_root():
    if os.geteuid() != 0:
        pytest.fail("diagnose needs root (bpftrace); CI runs as root")


def _diagnose(front: VllmFront, pid: int, port: int, *extra: str):
    """diagnose from the CLI through ``front`` (a one-slot llama-server behind it): 60
    requests, 16 words in and 8 tokens out, 20 a second, the receiver at ``port``."""
    return subprocess.run(
        [sys.executable, "-m", "tailgate", "diagnose", "openai+" + front.base,
         "--pid", str(pid), "--model", MODEL_NAME, "--api", "chat",
         "--rate", "20", "--duration", "3s", "--input-len", "16", "--output-len", "8",
         "--otlp-listen", f"127.0.0.1:{port}", "--otlp-wait", "2s", "--json", "-", *extra],
        capture_output=True, text=True, timeout=240, check=False)


def test_vllm_spans_received_during_the_run_are_joined_to_its_requests(tmp_path):
    """60 requests (16 words in, 8 tokens out, 20 a second) through the front to a
    one-slot llama-server, the receiver on loopback: every request the front gave a span is
    joined by its id (the one in ten it gave none counted as missing, the three spans of ids
    no client sent counted and ignored), each placed on tailgate's clock with its bound, and
    each slow request's queue, prefill and decode in the JSON are the span's."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    with native_llama_server(tmp_path, slots=1) as (upstream, proc), \
            VllmFront(upstream, endpoint) as front:
        out = _diagnose(front, proc.pid, port, "--log", str(tmp_path / "requests.csv"))
    doc = json.loads(out.stdout)
    assert out.returncode == diagnose_code(doc), out.stderr[-3000:]
    req = doc["bench"]["requests"]
    assert req["ok"] == 60, req  # (the front keeps connections open: none goes stale)
    # --log keeps the run's per-request log where asked (diagnose read the same file)
    from tailgate.bench.result import read_log

    cols = read_log((tmp_path / "requests.csv").read_text())
    assert len(set(zip(cols["worker"].tolist(), cols["id"].tolist(), strict=True))) == 60
    assert len(cols["id"]) == 60
    assert set(cols["outcome"].tolist()) == {"ok"}
    eng = doc["engine"]
    assert eng["engine"] == "vLLM (OTLP spans)", eng
    matched, missing = len(front.spans), len(front.skipped)
    assert missing == 6 and matched == 54
    otlp = eng["otlp"]
    assert otlp["endpoint"] == endpoint
    assert otlp["join"] == {"matched": matched, "missing": missing, "unknown_ids": 3,
                            "not_measured": 0, "malformed": 0}, otlp
    got = otlp["received"]
    assert (got["spans"], got["unknown_ids"], got["malformed"], got["bad_bodies"],
            got["refused_bodies"], got["dropped"]) == (matched, 3, 0, 0, 0, 0), got
    assert eng["records"] == {"ok": matched, "malformed": 0, "none": missing}
    join = eng["join"]
    assert join["placed"] == matched and join["refused"] == 0, join
    bound = join["error_bound_ms"]
    assert 0 <= bound["p50"] <= bound["p99"] <= bound["max"] < 50, bound
    print(f"join error bound (ms): {bound}")
    # six requests' spans never came: diagnose waited the whole --otlp-wait (less the
    # probes' drain, which it waited already) for them, and says so
    assert doc["overhead"]["otlp_wait_s"] >= 1.69, doc["overhead"]
    # each slow request's phases are its span's: the decode exactly (to the document's
    # rounding, 1 us); the queue and the prefill, placed from the first token on tailgate's
    # clock, within the error bound diagnose states for that request (the front read the
    # first token at its own instant, between the engine making it and the load reading it)
    rows = eng["slowest"]
    assert len(rows) == 20
    off = []
    for row in rows:
        span = front.spans[row["request"]]
        bound_ms = row["join_error_ms"] + 2e-3
        queue = span["gen_ai.latency.time_in_queue"] * 1e3
        prefill = span["gen_ai.latency.time_in_model_prefill"] * 1e3
        assert row["queue_ms"] == pytest.approx(queue, abs=bound_ms), row
        assert row["prefill_ms"] == pytest.approx(prefill, abs=bound_ms), row
        assert row["decode_ms"] == pytest.approx(
            span["gen_ai.latency.time_in_model_decode"] * 1e3, abs=2e-3), row
        off.append((abs(row["queue_ms"] - queue), row["join_error_ms"]))
        assert row["prompt_tokens"] == span["gen_ai.usage.prompt_tokens"], row
        assert row["generated"] == span["gen_ai.usage.completion_tokens"], row
        assert row["prompt_cached"] is None and row["join_error_ms"] is not None, row
        assert row["request"] not in front.skipped
    print("slowest rows' |queue - span's queue| vs their stated bound (ms): "
          + ", ".join(f"{a:.3f}/{b:.3f}" for a, b in off))
    # the engine's phases are bands of the timeline, by request
    bands = [b for b in doc["timeline"]["bands"] if b["source"] == "engine"]
    assert {b["kind"] for b in bands} >= {"prefill", "decode"}
    assert {b["request"] for b in bands} == set(front.spans)


def test_sglang_spans_are_joined_by_the_trace_tailgate_sent_with_their_queue_span(tmp_path):
    """The same run through an SGLang-shaped front (tests/support/otlp_front.SglangFront:
    SGLang's span shapes, from its source): its root spans name the request by SGLang's own
    id, so each is joined by the trace of the traceparent tailgate sent; its queue is the
    scheduler's ``prefill_waiting`` span of that trace, its prefill SGLang's less that
    queue. The one in ten without a root span is missing, the one in ten whose trace
    brought no waiting span is a record not used (queue and prefill cannot be told apart),
    and both are said."""
    from support.otlp_front import SglangFront

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    with native_llama_server(tmp_path, slots=1) as (upstream, proc), \
            SglangFront(upstream, endpoint) as front:
        out = _diagnose(front, proc.pid, port)
    doc = json.loads(out.stdout)
    assert out.returncode == diagnose_code(doc), out.stderr[-3000:]
    assert doc["bench"]["requests"]["ok"] == 60
    eng = doc["engine"]
    assert eng["engine"] == "SGLang (OTLP spans)", eng
    roots, skipped, no_wait = len(front.spans), len(front.skipped), len(front.no_wait)
    assert (roots, skipped, no_wait) == (54, 6, 6)
    otlp = eng["otlp"]
    assert otlp["join"] == {"matched": 48, "missing": 6, "unknown_ids": 3,
                            "not_measured": 0, "malformed": 6}, otlp
    got = otlp["received"]
    assert (got["spans"], got["unknown_ids"], got["malformed"], got["queue_spans"],
            got["without_queue_span"], got["dropped"]) == (54, 3, 0, 48, 6, 0), got
    assert eng["records"] == {"ok": 48, "malformed": 6, "none": 6}
    join = eng["join"]
    assert join["placed"] == 48 and join["refused"] == 0, join
    rows = eng["slowest"]
    assert rows
    for row in rows:
        n = row["request"]
        assert n not in front.skipped and n not in front.no_wait, row
        span, wait = front.spans[n], front.waits[n]
        bound_ms = row["join_error_ms"] + 2e-3
        assert row["queue_ms"] == pytest.approx(wait * 1e3, abs=bound_ms), row
        prefill = span["gen_ai.latency.time_in_model_prefill"] - wait
        assert row["prefill_ms"] == pytest.approx(prefill * 1e3, abs=bound_ms), row
        assert row["decode_ms"] == pytest.approx(
            span["gen_ai.latency.time_in_model_decode"] * 1e3, abs=2e-3), row
        assert row["prompt_tokens"] == span["gen_ai.usage.prompt_tokens"], row
        # SGLang says how many prompt tokens its prefix cache held: computed apart
        assert row["prompt_cached"] == span["gen_ai.usage.cached_tokens"], row
        assert row["prompt_computed"] == row["prompt_tokens"] - row["prompt_cached"], row
    bands = [b for b in doc["timeline"]["bands"] if b["source"] == "engine"]
    assert {b["request"] for b in bands} == set(front.waits)
    # the terminal says which records were not used, and why
    from rich.console import Console

    from tailgate.report.diagnose_render import engine as render

    con = Console(file=io.StringIO(), width=300)
    render(eng, con)
    assert (f"spans at {endpoint}: 48 joined, 6 requests without one, 3 of ids this run "
            "never sent (ignored), 6 malformed, 0 bodies refused, 0 dropped, 6 SGLang spans "
            "without their prefill_waiting span (not used)") in con.file.getvalue()
