"""`tailgate diagnose openai+http://...` against llama.cpp's native server (the C++
llama-server the Makefile builds; tests/support/llm_server.native_llama_server), with a
known engine-side cause injected by the workload and the server's flags: each named
exactly, from the engine's own record of every request (its ``timings``), on tailgate's
clock. The workloads are Mooncake traces the test writes: exact arrival times, prompt and
output lengths, and prefix sharing by hash id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.llm_server import MODEL_NAME, native_llama_server

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(autouse=True, scope="module")
def _needs():
    if os.geteuid() != 0:
        pytest.fail("diagnose needs root (bpftrace); CI runs as root")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("the server and the load are pinned to different CPUs: need 2")


def _trace(path: Path, rows: list[tuple[float, int, int, list[int]]]) -> Path:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o,
                                        "hash_ids": h}) + "\n" for t, i, o, h in rows))
    return path


def _diagnose(base: str, pid: int, trace: Path, *extra: str) -> dict:
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-m", "tailgate", "diagnose", "openai+" + base,
         "--pid", str(pid), "--model", MODEL_NAME, "--api", "chat", "--workload", "trace",
         "--trace", str(trace), "--json", "-", *extra],
        capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert out.returncode == (1 if doc["verdict"]["claimed"] else 0)
    return doc


def _why(doc: dict) -> str:
    return "\n".join(f"{c['claimed']} {c['cause']}: {c['sentence']}" for c in doc["causes"])


def test_one_slot_short_requests_queued_behind_long_generations_name_queue_wait(tmp_path):
    """One slot; a request every 25 ms, one in twenty generating 400 tokens and the rest 8
    (the issue's case): the short ones after a long one wait in the engine's queue for the
    only slot. Queue wait is named first, with what it was behind; no futex."""
    rows = [(i * 25.0, 16, 400 if i % 20 == 19 else 8, [i]) for i in range(1000)]
    trace = _trace(tmp_path / "t.jsonl", rows)
    with native_llama_server(tmp_path, slots=1, cpu="1") as (base, proc):
        doc = _diagnose(base, proc.pid, trace)
    why = _why(doc)
    assert doc["verdict"]["first"] == "engine_queue", why
    assert "futex" not in doc["verdict"]["claimed"], why
    (q,) = [c for c in doc["causes"] if c["cause"] == "engine_queue"]
    assert q["sentence"].startswith("TTFT P99: ") and q["tail_time_share"] > 0.5, why
    assert q["decode_tokens"] >= 200, why  # behind a long generation
    eng = doc["engine"]
    assert eng["records"] == {"ok": 1000, "malformed": 0, "none": 0}
    assert eng["join"]["refused"] == 0 and eng["join"]["error_bound_ms"]["p99"] < 5
    slow = eng["slowest"][0]
    assert slow["queue_ms"] > slow["prefill_ms"] and slow["generated"] == 8
    bands = doc["timeline"]["bands"]
    assert {b["kind"] for b in bands} >= {"queue", "prefill", "decode"}
    assert all(b["source"] == "engine" for b in bands)
