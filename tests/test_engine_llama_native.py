"""llama.cpp's native server (the C++ llama-server the Makefile builds) and its per-request
records: each stream's final ``timings`` read by both load engines into the request log,
placed on tailgate's clock, and the join's error measured against the server's own log."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from support.llm_server import MODEL_NAME, native_llama_server
from tailgate.bench.result import read_log

pytestmark = pytest.mark.timeout(300)


def _stream(base: str, prompt: str, max_tokens: int) -> list[str]:
    body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "stream": True}).encode()
    req = urllib.request.Request(base + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode().splitlines()


def test_the_native_server_streams_its_timings_in_the_last_chunk(tmp_path):
    """The record the engine source reads, from the real server: prompt tokens computed
    and cached add up to the prompt, and a repeated prompt is served from the slot's
    cache (cache_n grows, prompt_n falls)."""
    from tailgate.llm.openai import parse_chunk

    with native_llama_server(tmp_path) as (base, _):
        prompt = " ".join(["the water of time"] * 30)
        first = [ln[6:] for ln in _stream(base, prompt, 8) if ln.startswith("data: {")]
        again = [ln[6:] for ln in _stream(base, prompt, 8) if ln.startswith("data: {")]
    t1, t2 = parse_chunk(first[-1], "chat").timings, parse_chunk(again[-1], "chat").timings
    assert t1.engine == "llama.cpp" and t1.predicted_n == 8 and t2.predicted_n == 8
    assert t1.prompt_n + t1.cache_n == t2.prompt_n + t2.cache_n > 100
    assert t2.cache_n > t1.cache_n and t2.prompt_n < t1.prompt_n
    assert all(parse_chunk(c, "chat").timings is None for c in first[:-1])


def _bench(base: str, log: Path, engine: str, *extra: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tailgate", "bench", "openai+" + base, "--model", MODEL_NAME,
         "--api", "chat", "--input-len", "24", "--output-len", "16", "--rate", "20",
         "--requests", "60", "--engine", engine, "--log", str(log), "--quiet",
         # (llama-server closes a kept-alive connection now and then before answering)
         "--retry-stale", *extra],
        capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("engine", ["fast", "python"])
def test_both_load_engines_log_every_requests_engine_record(tmp_path, engine):
    with native_llama_server(tmp_path, slots=2) as (base, _):
        _bench(base, tmp_path / "log.csv", engine)
    cols = read_log((tmp_path / "log.csv").read_text())
    ok = cols["outcome"] == "ok"
    assert ok.sum() == 60, collections.Counter(cols["outcome"].tolist())
    assert (cols["engine_state"][ok] == "ok").all()
    assert (cols["engine_predicted_n"][ok] == 16).all()
    assert (cols["engine_prompt_n"] + cols["engine_cache_n"] > 24)[ok].all()
    assert (cols["engine_prompt_ms"][ok] > 0).all() and (cols["engine_predicted_ms"][ok] > 0).all()
    # the engine's prefill and decode fit between the request's send and its last token's
    # read (the first token may reach the client late: the join does not assume otherwise)
    seen = cols["last_token_s"] - cols["send_s"]
    work = (cols["engine_prompt_ms"] + cols["engine_predicted_ms"]) / 1e3
    assert (work[ok] <= seen[ok]).all(), (work - seen)[ok].max()
