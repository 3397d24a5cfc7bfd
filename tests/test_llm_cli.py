"""`tailgate bench openai+http://...` end to end: the command line against real servers
(llama-cpp-python with a tiny random GGUF, and the scripted fault server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.llm_server import (
    MODEL_NAME,
    ScriptedServer,
    llama_cpp_available,
    llama_server,
)
from support.require import require
from support.signals import sigint_default
from tailgate.bench.result import read_log

FIX = Path(__file__).parent / "fixtures" / "llm"


def tailgate(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailgate", "bench", *args], check=False,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require(llama_cpp_available())
    with llama_server(tmp_path_factory.mktemp("llama-cli")) as base:
        yield base


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_bench_cli_json_and_slo_exit_status(server, api, tmp_path):
    log = tmp_path / "requests.csv"
    out = tailgate(f"openai+{server}", "--model", MODEL_NAME, "--api", api, "--rate", "4",
                   "--requests", "8", "--input-len", "16", "--output-len", "10",
                   "--slo", "ttft_p99<60s", "--slo", "error_rate<1%", "--json", "-",
                   "--log", str(log))
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert set(rep[key]) >= {"p50", "p90", "p99", "p999", "max", "count"}
    assert rep["requests"]["sent"] == rep["requests"]["ok"] == 8
    assert rep["tokens"]["counted_by"] == "chunks"
    assert set(rep["throughput"]) >= {"output_tokens_per_s", "requests_per_s", "goodput_rps"}
    assert [s["pass"] for s in rep["slo"]] == [True, True]
    cols = read_log(log.read_text())  # the bench's per-request CSV, with token columns
    assert cols["id"].size == 8 and set(cols["outcome"]) == {"ok"}
    assert np.all((cols["intended_s"] <= cols["send_s"]) & (cols["send_s"] <= cols["first_token_s"])
                  & (cols["first_token_s"] <= cols["done_s"]) & (cols["done_s"] <= cols["end_s"]))
    # An SLO no server can meet: exit status 1, the failing SLO named.
    bad = tailgate(f"openai+{server}", "--model", MODEL_NAME, "--api", api, "--rate", "4",
                   "--requests", "4", "--output-len", "4", "--slo", "ttft_p50<1us",
                   "--slo", "error_rate<1%")
    assert bad.returncode == 1
    failed = [x for x in bad.stdout.splitlines() if x.startswith("SLO failed")]
    assert failed == ["SLO failed: ttft_p50<1us"]
    assert "TTFT" in bad.stdout


def test_bench_cli_trace_replay_and_multiturn(server):
    out = tailgate(f"openai+{server}", "--model", MODEL_NAME, "--workload", "trace",
                   "--trace", str(FIX / "mooncake_conversation_head.jsonl"),
                   "--trace-token-scale", "0.01", "--trace-time-scale", "1000",
                   "--requests", "12", "--json", "-")
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["requests"]["sent"] == 12 and rep["workload"]["kind"] == "trace"
    mt = tailgate(f"openai+{server}", "--model", MODEL_NAME, "--api", "chat", "--workload",
                  "multiturn", "--conversations", "2", "--turns", "3", "--rate", "20",
                  "--workers", "1", "--max-connections", "1",
                  "--system-len", "30", "--input-len", "8",
                  "--requests", "6", "--output-len", "4", "--json", "-")
    assert mt.returncode == 0, mt.stderr
    assert json.loads(mt.stdout)["requests"]["ok"] == 6


def test_bench_cli_counts_faults_and_uses_usage():
    with ScriptedServer(modes=("ok", "status_500", "reset_mid_stream", "no_token")) as srv:
        out = tailgate(f"openai+{srv.base}", "--model", "m", "--rate", "20", "--requests",
                       "8", "--output-len", "5", "--json", "-", "--slo", "error_rate<1%")
    assert out.returncode == 1  # 6 of 8 failed
    rep = json.loads(out.stdout)
    assert {k: v for k, v in rep["requests"]["errors"].items() if v} == {
        "status_5xx": 2, "truncated": 2, "no_token": 2}
    assert rep["requests"]["ok"] == 2 and rep["tokens"]["counted_by"] == "usage"


@pytest.mark.parametrize("args,words", [
    (["--model", "m"], "--rate"),
    (["--model", "m", "--rate", "2", "--concurrency", "2", "--requests", "2"],
     "--concurrency (closed loop) is gone"),
    (["--rate", "2", "--requests", "2"], "--model"),
    (["--model", "m", "--rate", "2"], "--duration"),
    (["--model", "m", "--rate", "2", "--requests", "2", "--slo", "ttft_p42<1s"], "SLO"),
    (["--model", "m", "--workload", "trace", "--requests", "2"], "--trace"),
])
def test_bench_cli_rejects_bad_input(args, words):
    out = tailgate("openai+http://127.0.0.1:9/v1", *args, timeout=60)
    assert out.returncode == 2 and words in out.stderr, out.stderr


def test_bench_cli_ctrl_c_writes_what_it_has(tmp_path):
    """SIGINT mid-run: exit 130, the JSON written, every request released accounted: the
    hung ones were in flight and are abandoned, not counted as outcomes."""
    import signal
    import time

    out = tmp_path / "r.json"
    with ScriptedServer(modes=("ok", "hang")) as srv:
        p = subprocess.Popen(
            [sys.executable, "-m", "tailgate", "bench", f"openai+{srv.base}", "--model", "m",
             "--rate", "20", "--duration", "30s", "--timeout", "60s", "--output-len", "3",
             "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=sigint_default)
        deadline = time.monotonic() + 30
        while len(srv.bodies) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    rep = json.loads(out.read_text())
    req = rep["requests"]
    assert rep["interrupted"] is True and req["ok"] >= 3  # every other request hangs
    assert req["sent"] == req["ok"] + sum(req["errors"].values())
    assert req["abandoned"] >= 3  # the hung ones (and those not yet due)
    assert req["scheduled"] == req["sent"] + req["abandoned"]
    assert sum(req["errors"].values()) == 0 and rep["accounting"]["consistent"]
