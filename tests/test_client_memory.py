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


# -- the compiled loop gives a connection's buffers back (issue 48) -------------------------

MIB = 1 << 20
EV_HARD = 4 * MIB  # fastloop.c: the event backlog past which the loop stops reading


def peak_rss_mib(base: str, *args: str) -> tuple[float, dict]:
    """Peak RSS of `tailgate bench` (its own process, os.wait4) and its JSON."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tailgate-rss-") as tmp:
        out = Path(tmp, "r.json")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tailgate", "bench", "openai+" + base, "--model", "m",
             "--engine", "fast", "--quiet", "--workers", "1", "--json", str(out), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
        _, status, usage = os.wait4(proc.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read().decode()
        return usage.ru_maxrss / 1024, json.loads(out.read_text())


def test_the_compiled_loop_gives_a_connections_event_buffer_back():
    """16 keep-alive connections, each response one 15 MB event, the server writing one
    response at a time: so at most three connections hold part of an event at once (the
    one written, and the tails the loopback buffers still held of the ones before). The
    bound of docs/bench.md ("Memory a run holds"), over the same run against small
    events: in_progress x (event + SSE line + header limits) + connections x 9 x 64 KiB
    (what a connection keeps between messages) + 4 x (EV_HARD + event limit) (the event
    backlog and Python's copies while it reads the JSON): 141 MiB here. Measured: 23-29
    MiB; before the fix, when each connection kept its last event's buffers until its next
    request, 237-245 MiB (about every connection's 15 MB)."""
    from support.llm_server import BIG_EVENT

    conns, in_progress = 16, 3
    args = ("--rate", "25", "--duration", "1s", "--connections", str(conns),
            "--max-connections", str(conns), "--timeout", "60s")
    with ScriptedServer(modes=("ok",), keep_alive=True) as srv:
        base_mib, base = peak_rss_mib(srv.base, *args)
    with ScriptedServer(modes=("big_event",), keep_alive=True) as srv:
        peak_mib, data = peak_rss_mib(srv.base, *args)
    for run in (base, data):
        assert run["requests"]["ok"] == run["requests"]["sent"] == 25, run["requests"]
    assert data["connections"]["max_open"] == conns  # every connection took events
    event, line, header = 16 * MIB, 1 * MIB, 256 << 10
    bound = (in_progress * (event + line + header) + conns * 9 * (64 << 10)
             + 4 * (EV_HARD + event)) / MIB
    assert BIG_EVENT < event
    assert peak_mib - base_mib < bound, (peak_mib, base_mib, bound)
