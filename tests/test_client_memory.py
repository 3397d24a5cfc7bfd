"""Memory: a server that never ends an event, or never ends a header block, cannot grow
the client. The client runs in its own process (its peak RSS is what is measured); the
servers are tests/support's, on loopback, and would send up to 1 GiB / 512 MiB."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.fault_server import FaultServer
from support.llm_server import ScriptedServer

pytestmark = pytest.mark.timeout(120)

# The bound: peak RSS may grow by at most this over the client's own baseline (imports
# done, event loop made). The limits it rests on: one SSE event 16 MiB, one header block
# 256 KiB (the defaults); without them the client grew by gigabytes (issue 17).
RSS_BOUND_MIB = 64
SRC = str(Path(__file__).resolve().parents[1] / "src")

SSE_CLIENT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    from tailgate.bench.result import RunInfo, build_result
    from tailgate.bench.target import parse_target
    from tailgate.bench.workers import plan, run_here
    def bench(url, **extra):
        target = parse_target("openai+" + url)
        info = RunInfo(target=url, protocol="openai", rate=10.0, duration_s=0.1, workers=1,
                       connections=1, timeout_s=30.0, llm={"model": "m"})
        body = target.with_body(b'{"model":"m","prompt":"a b","max_tokens":2,"stream":true}')
        cfg = plan(info, target, schedule=np.zeros(1), requests=[body],
                   nominal=np.array([2]), **extra)[0]
        return build_result(info, [run_here(cfg)]).json
    bench("http://127.0.0.1:9/v1")  # warm: everything imported, nothing held
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    data = bench(sys.argv[1], **extra)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"requests": data["requests"], "before_kib": before,
                      "after_kib": after}))
""")

HEADER_CLIENT = textwrap.dedent("""
    import json, resource, sys
    from tailgate.bench.result import RunInfo, build_result
    from tailgate.bench.target import parse_target
    from tailgate.bench.workers import plan, run_here
    def bench(url, rate, duration):
        target = parse_target(url)
        info = RunInfo(target=url, protocol="http", rate=rate, duration_s=duration,
                       workers=1, connections=1, timeout_s=20.0)
        return build_result(info, [run_here(plan(info, target)[0])]).json
    bench("http://127.0.0.1:9/", 10, 0.2)  # warm: everything imported, nothing held
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data = bench(sys.argv[1], 4, 1.0)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"requests": data["requests"], "before_kib": before, "after_kib": after}))
""")


def child(code: str, url: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, url, *args], capture_output=True,
                         text=True,
                         timeout=100, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
                         check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def grown_mib(res: dict) -> float:
    return (res["after_kib"] - res["before_kib"]) / 1024


def test_a_never_ending_event_is_cut_at_its_limit():
    with ScriptedServer(modes=("endless_event",)) as srv:
        res = child(SSE_CLIENT, srv.base)
    req = res["requests"]
    assert req["sent"] == 1 and req["errors"]["too_large"] == 1, req
    (ex,) = req["error_examples"]["too_large"]
    assert "an event exceeds 16777216 bytes" in ex["reason"]
    assert grown_mib(res) < RSS_BOUND_MIB, res


def test_a_never_ending_header_block_is_cut_at_its_limit():
    with FaultServer("endless_header") as srv:
        res = child(HEADER_CLIENT, srv.url)
        sent = srv.bytes_out
    req = res["requests"]
    assert req["sent"] == 4 and req["errors"]["too_large"] == 4, req
    (ex,) = req["error_examples"]["too_large"]
    assert ex["reason"] == "header block exceeds 262144 bytes"
    assert grown_mib(res) < RSS_BOUND_MIB, res
    # The server really was endless: it got well past the limit before the client cut it.
    assert sent > 4 * 262144


def test_a_never_ending_token_stream_is_cut_at_the_token_limit():
    """Content chunks that never end (each a valid token): what the client keeps of one
    stream is bounded by --max-tokens-per-stream (here 200,000; 8 bytes a token). Before
    the limit every token's time was a Python float in a list until the 30 s time-out."""
    with ScriptedServer(modes=("endless_tokens",)) as srv:
        res = child(SSE_CLIENT, srv.base, json.dumps({"max_tokens_per_stream": 200_000}))
        sent = srv.endless_sent
    req = res["requests"]
    assert req["sent"] == 1 and req["errors"]["too_large"] == 1, req
    (ex,) = req["error_examples"]["too_large"]
    assert ex["reason"] == "more than 200000 tokens in one stream (--max-tokens-per-stream)"
    assert grown_mib(res) < RSS_BOUND_MIB, res
    assert sent > 200_000  # the server really went on
