"""llama.cpp's native server (the C++ llama-server the Makefile builds) and its per-request
records: each stream's final ``timings`` read by both load engines into the request log,
placed on tailgate's clock, and the join's error measured against the server's own log."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from support.llm_server import MODEL_NAME, native_llama_server
from tailgate.bench.result import read_log
from tailgate.diagnose.engine import Requests, place

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
    from tailgate.compare import extract

    with native_llama_server(tmp_path, slots=2) as (base, _):
        _bench(base, tmp_path / "log.csv", engine, "--json", str(tmp_path / "r.json"))
    doc = json.loads((tmp_path / "r.json").read_text())
    # the result's rows (compare, campaign): the engine's queue, held, prefill and decode
    assert [doc[f"engine_{k}_ms"]["count"]
            for k in ("queue", "held", "prefill", "decode")] == [60] * 4
    assert doc["engine_wait"]["split"] == 60 and doc["engine_wait"]["refused"] == 0
    rows = {m.name: (m.layer, m.value) for m, _ in extract(doc)[1]}
    assert rows["engine_prefill.p99"][0] == rows["engine_decode.p50"][0] == "L4"
    assert rows["engine_queue.p99"][0] == "L4" and rows["engine_held.p99"][0] == "L3"
    assert 0 < rows["engine_prefill.p50"][1] <= rows["ttft.p50"][1]
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


_LOG_LINE = (r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I slot +{what}: id +\d+ \| task (\d+)")


def _log_times(text: str, what: str) -> np.ndarray:
    """The server log's times of ``what`` per task (ns from its log's start: llama.cpp's
    --log-timestamps prints minutes.seconds.ms.us of the wall clock since then)."""
    out = [(((int(a) * 60 + int(b)) * 1000 + int(c)) * 1000 + int(d)) * 1000
           for a, b, c, d, _ in re.findall(_LOG_LINE.format(what=what), text, re.M)]
    return np.array(out, dtype=np.int64)


def test_the_joins_error_against_the_servers_own_log(tmp_path):
    """The join measured against the server's own log: each request's prefill start and
    decode end as tailgate placed them (from the response's timings and the client's
    reads) against the log's "processing task" and "stop processing" lines of the same
    task (one slot: tasks run in the order they were placed). The log's clock has another
    origin (the wall clock since its start): the median difference is that offset, and what
    is left per request is the join's error. It stays within the bound the join states."""
    with native_llama_server(tmp_path, slots=1, cpu="1", nice=-10) as (base, _):
        _bench(base, tmp_path / "log.csv", "fast", "--json", str(tmp_path / "r.json"))
    start = json.loads((tmp_path / "r.json").read_text())["clock"]["start_monotonic_s"]
    r = Requests.from_log(read_log((tmp_path / "log.csv").read_text()),
                          int(round(start * 1e9)))
    ph = place(r)
    assert ph.ok.all(), [w for w in ph.why if w]
    text = (tmp_path / "llama-native.log").read_text()
    launch, release = _log_times(text, "launch_slot_"), _log_times(text, "release")
    assert len(launch) == len(release) == len(r.ids), (len(launch), len(r.ids))
    order = np.argsort(ph.prefill_start, kind="stable")
    bound = np.percentile(ph.error_ns, 99)
    for log, ours in ((launch, ph.prefill_start[order]), (release, ph.decode_end[order])):
        diff = log - ours
        err = np.abs(diff - np.median(diff))
        print(f"join error P50 {np.percentile(err, 50) / 1e6:.3f} ms, P99 "
              f"{np.percentile(err, 99) / 1e6:.3f} ms, max {err.max() / 1e6:.3f} ms; "
              f"stated bound P99 {bound / 1e6:.3f} ms")
        assert np.percentile(err, 99) <= max(bound, 1e6), err.max()
