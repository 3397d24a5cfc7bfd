"""End to end against a real OpenAI-compatible server: llama-cpp-python serving a tiny
random-weight GGUF written by the test (tests/support/llm_server.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.llm_server import MODEL_NAME, llama_cpp_available, llama_server
from support.require import require
from tailgate.llm import workload as wl
from tailgate.llm.client import Endpoint
from tailgate.llm.results import analyse, derive, parse_slo
from tailgate.llm.run import RunConfig, run


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


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_accounting_and_ttft_itl_relationships(server, api):
    n, out_len = 10, 12
    cfg = RunConfig(Endpoint.parse("openai+" + server), api, MODEL_NAME, timeout_s=60,
                    rate=4.0, requests=n, seed=3)
    result = run(cfg, wl.independent(3, 20, out_len, chat=api == "chat"))
    rep = analyse(result, [parse_slo("ttft_p99<60s"), parse_slo("error_rate<1%")],
                  target=server, model=MODEL_NAME, api=api, rate=4.0, timeout_s=60, workload={})
    req = rep["requests"]
    assert req == {"sent": n, "ok": n, "good": n, "errors": {}, "error_examples": {}}
    # llama-cpp-python ignores stream_options: tokens are counted as content chunks.
    assert rep["tokens"]["counted_by"] == "chunks"
    chunks = [len(r.token_ns) for r in result.records]
    assert rep["tokens"]["output"] == sum(chunks)
    # max_tokens bounds the content chunks; the first chunk may carry no text.
    assert all(out_len - 1 <= c <= out_len for c in chunks)
    assert rep["itl_ms"]["count"] == sum(c - 1 for c in chunks)
    assert rep["ttft_ms"]["count"] == rep["e2e_ms"]["count"] == n
    for r in result.records:
        d = derive(r)
        assert r.intended_ns <= r.sent_ns <= r.token_ns[0]
        assert 0 < d.ttft <= d.e2e
        assert d.ttft + int(d.itl.sum()) <= d.e2e  # tokens arrive inside the request
        assert d.tpot == pytest.approx((d.e2e - d.ttft) / (d.output_tokens - 1))
    assert rep["ttft_ms"]["p50"] <= rep["ttft_ms"]["p99"] <= rep["ttft_ms"]["max"] + 1e-9
    assert rep["e2e_ms"]["p50"] >= rep["ttft_ms"]["p50"]
    assert all(s["pass"] for s in rep["slo"])
    assert rep["throughput"]["goodput_rps"] == rep["throughput"]["requests_per_s"] > 0


def test_closed_loop_keeps_concurrency_and_accounts(server):
    cfg = RunConfig(Endpoint.parse("openai+" + server), "completions", MODEL_NAME,
                    timeout_s=60, concurrency=2, requests=6)
    result = run(cfg, wl.independent(5, 16, 8))
    assert [r.error for r in result.records] == [None] * 6
    assert result.mode == "closed"


def test_engine_without_metrics_is_unknown_with_reason(server):
    """llama-cpp-python has no /metrics: inspect --engine says so instead of passing."""
    metrics = server.rsplit("/v1", 1)[0] + "/metrics"
    out = tailgate("inspect", "--engine", metrics, "--interval", "0", "--json", "-", "--quiet")
    assert out.returncode in (0, 1), out.stderr
    l4 = {f["id"]: f for f in json.loads(out.stdout)["findings"] if f["layer"] == "L4"}
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
    ep = Endpoint.parse("openai+" + base)
    turns = 4
    offset = len(log.read_text(errors="replace"))
    cfg = RunConfig(ep, "completions", MODEL_NAME, timeout_s=60, concurrency=1, requests=turns)
    conv = run(cfg, wl.multiturn(11, conversations=1, turns=turns, system_len=40, user_len=10,
                                 output_len=8))
    assert [r.error for r in conv.records] == [None] * turns
    time.sleep(0.5)  # let the server flush its log
    hits = _prefix_hits(log, offset)
    words = [r.nominal_input for r in conv.records]
    assert len(hits) >= turns - 1
    for prev_words, hit in zip(words[:-1], hits[-(turns - 1):], strict=True):
        assert hit >= prev_words  # each word is at least one token
    offset = len(log.read_text(errors="replace"))
    indep = run(RunConfig(ep, "completions", MODEL_NAME, timeout_s=60, concurrency=1,
                          requests=turns), wl.independent(11, 40, 8))
    assert [r.error for r in indep.records] == [None] * turns
    time.sleep(0.5)
    assert all(h <= 4 for h in _prefix_hits(log, offset))
