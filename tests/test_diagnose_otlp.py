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
        out = subprocess.run(
            [sys.executable, "-m", "tailgate", "diagnose", "openai+" + front.base,
             "--pid", str(proc.pid), "--model", MODEL_NAME, "--api", "chat",
             "--rate", "20", "--duration", "3s", "--input-len", "16", "--output-len", "8",
             "--otlp-listen", f"127.0.0.1:{port}", "--otlp-wait", "2s", "--json", "-",
             "--log", str(tmp_path / "requests.csv")],
            capture_output=True, text=True, timeout=240, check=False)
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
