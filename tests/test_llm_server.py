"""End to end against a real OpenAI-compatible server: llama-cpp-python serving a tiny
random-weight GGUF written by the test (tests/support/llm_server.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from support.bench_cli import bench, errors
from support.inspect import gate_code
from support.llm_server import MODEL_NAME, llama_cpp_available, llama_server
from support.require import require


@pytest.fixture(autouse=True, scope="module")
def _needs_llama_cpp():
    require(llama_cpp_available())


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama")
    with llama_server(tmp) as base:
        yield base, tmp / "llama-server.log"


@pytest.fixture
def server(llama):
    return llama[0]


def tailgate(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailgate", *args], check=False,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


SERIAL = ("--workers", "1", "--connections", "1", "--max-connections", "1")


def llm(base: str, *args: str):
    return bench("openai+" + base, "--model", MODEL_NAME, "--timeout", "60s", *args)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_accounting_and_ttft_itl_relationships(server, api):
    n, out_len = 10, 12
    r = llm(server, "--api", api, "--rate", "4", "--requests", str(n), "--seed", "3",
            "--input-len", "20", "--output-len", str(out_len),
            "--slo", "ttft_p99<60s", "--slo", "error_rate<1%")
    assert r.rc == 0, r.stderr
    rep, log = r.json, r.log
    req = rep["requests"]
    assert (req["sent"], req["ok"], req["good"], errors(rep)) == (n, n, n, {})
    assert req["error_examples"] == {} and rep["accounting"]["consistent"]
    # llama-cpp-python ignores stream_options: tokens are counted as content chunks.
    assert rep["tokens"]["counted_by"] == "chunks"
    chunks = log["chunks"]
    assert rep["tokens"]["output"] == int(chunks.sum())
    # max_tokens bounds the content chunks; the first chunk may carry no text.
    assert np.all((out_len - 1 <= chunks) & (chunks <= out_len))
    assert rep["itl_ms"]["count"] == int((chunks - 1).sum())
    assert rep["ttft_ms"]["count"] == rep["e2e_ms"]["count"] == n
    ttft = log["first_token_s"] - log["intended_s"]
    e2e = log["done_s"] - log["intended_s"]
    assert np.all(log["intended_s"] <= log["send_s"])
    assert np.all(log["send_s"] <= log["first_token_s"])
    assert np.all((0 < ttft) & (ttft <= e2e))
    assert np.all(log["last_token_s"] <= log["done_s"])  # tokens arrive inside the request
    tpot = (e2e - ttft) / (log["output_tokens"] - 1) * 1e3
    assert rep["tpot_ms"]["max"] == pytest.approx(float(tpot.max()), rel=0.01)
    assert rep["ttft_ms"]["p50"] <= rep["ttft_ms"]["p99"] <= rep["ttft_ms"]["max"] + 1e-9
    assert rep["e2e_ms"]["p50"] >= rep["ttft_ms"]["p50"]
    assert all(s["pass"] for s in rep["slo"])
    assert rep["throughput"]["goodput_rps"] == rep["throughput"]["requests_per_s"] > 0


def test_one_connection_serves_requests_one_at_a_time_kept_alive(server):
    """--max-connections 1 bounds the requests in flight (the open-loop engine's answer to
    a closed loop): each request goes out when the previous one ended, on the same
    keep-alive connection, and its latency still counts from its intended start."""
    r = llm(server, "--rate", "1000", "--requests", "6", "--input-len", "16",
            "--output-len", "8", *SERIAL)
    assert r.rc == 0, r.stderr
    assert r.json["requests"]["ok"] == 6
    assert r.json["connections"]["opened"] == 1
    order = np.argsort(r.log["send_s"])
    send, end = r.log["send_s"][order], r.log["end_s"][order]
    assert np.all(send[1:] >= end[:-1])
    assert r.json["requests"]["queued"] >= 1  # 1000/s outpaces one stream: they waited


def test_engine_without_metrics_is_unknown_with_reason(server):
    """llama-cpp-python has no /metrics: inspect --engine says so instead of passing."""
    metrics = server.rsplit("/v1", 1)[0] + "/metrics"
    out = tailgate("inspect", "--engine", metrics, "--interval", "0", "--json", "-", "--quiet")
    report = json.loads(out.stdout)
    assert out.returncode == gate_code(report), out.stderr  # the status the report decides
    l4 = {f["id"]: f for f in report["findings"] if f["layer"] == "L4"}
    for cid in ("l4.prefix_cache.hit_rate", "l4.specdec.acceptance", "l4.kv.quantization"):
        assert l4[cid]["status"] == "unknown" and "HTTP 404" in l4[cid]["reason"]
    models = server + "/models"  # a JSON body, not the exposition format
    out = tailgate("inspect", "--engine", models, "--interval", "0", "--json", "-", "--quiet")
    f = {f["id"]: f for f in json.loads(out.stdout)["findings"]}["l4.prefix_cache.hit_rate"]
    assert f["status"] == "unknown" and "not Prometheus" in f["reason"]


def _prefix_hits(log: Path, offset: int) -> list[int]:
    """The server's own account (verbose llama.cpp) of the prompt prefix it reused."""
    text = log.read_text(errors="replace")[offset:]
    return [int(m) for m in re.findall(r"Llama\.generate: (\d+) prefix-match hit", text)]


def test_multiturn_server_reuses_each_turns_prefix(llama):
    """One conversation, one request at a time: llama.cpp keeps the previous request's
    tokens and logs how many of the next prompt's leading tokens match them. Every later
    turn must reuse at least the whole previous prompt; independent prompts reuse ~none."""
    base, log = llama
    turns = 4
    offset = len(log.read_text(errors="replace"))
    conv = llm(base, "--rate", "50", "--requests", str(turns), "--workload", "multiturn",
               "--conversations", "1", "--turns", str(turns), "--system-len", "40",
               "--input-len", "10", "--output-len", "8", "--seed", "11", *SERIAL)
    assert conv.rc == 0 and conv.json["requests"]["ok"] == turns, conv.stderr
    time.sleep(0.5)  # let the server flush its log
    hits = _prefix_hits(log, offset)
    order = np.argsort(conv.log["send_s"])
    words = conv.log["input_tokens"][order].tolist()  # the workload's words: no usage here
    assert len(hits) >= turns - 1
    for prev_words, hit in zip(words[:-1], hits[-(turns - 1):], strict=True):
        assert hit >= prev_words  # each word is at least one token
    offset = len(log.read_text(errors="replace"))
    indep = llm(base, "--rate", "50", "--requests", str(turns), "--input-len", "40",
                "--output-len", "8", "--seed", "11", *SERIAL)
    assert indep.json["requests"]["ok"] == turns
    time.sleep(0.5)
    assert all(h <= 4 for h in _prefix_hits(log, offset))


def _complete_with_request_id(base: str, request_id: str) -> int:
    """The status of a one-token completion sent with ``x-request-id`` as vllm bench serve
    sends it."""
    req = urllib.request.Request(
        base + "/completions", method="POST",
        data=json.dumps({"model": MODEL_NAME, "prompt": "hello", "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json", "x-request-id": request_id})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_vllm_style_request_ids_are_refused_unless_the_server_accepts_any(server, tmp_path):
    # (why bench_llm_engine starts the server with any_request_id when vLLM runs)
    assert _complete_with_request_id(server, "bench-1a2b3c4d-0") == 400
    with llama_server(tmp_path, any_request_id=True) as lenient:
        assert _complete_with_request_id(lenient, "bench-1a2b3c4d-0") == 200
