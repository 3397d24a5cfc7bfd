"""The LLM load test against a small scripted server on loopback (tests/support/llm_server):
every fault counted by kind, nothing lost, the run ends on time, usage vs counted tokens,
and the multi-turn workload really sends shared prefixes. `tailgate bench` runs as a user
runs it (its own process, the one engine of every protocol); its JSON and per-request log
are what is checked."""

from __future__ import annotations

import numpy as np
import pytest

from support.bench_cli import bench, errors
from support.llm_server import FAULTS, ScriptedServer, free_port

# A stream is complete at data: [DONE] (the OpenAI API sends it): one that ends before it,
# whatever the HTTP framing says, is truncated, even after a finish_reason.
EXPECTED_KIND = {"ok": None, "close_without_done": "truncated", "eof_delimited": "truncated",
                 "eof_delimited_done": None, "interim_100": None,
                 "short_content_length": "truncated", "eof_mid_chunk": "truncated",
                 "rst_mid_stream": "reset", "upgrade": "upgrade",
                 "status_500": "status_5xx",
                 "status_404": "status_4xx", "reset_mid_stream": "truncated",
                 "bad_json": "malformed_sse", "bad_sse_line": "malformed_sse",
                 "no_token": "no_token", "hang": "timeout", "error_object": "server_error",
                 "not_event_stream": "protocol"}


def llm(base: str, *args: str, **kw):
    """An openai+ bench of the scripted server: 40/s, 2 s time-out unless ``args`` say."""
    defaults = {"--model": "m", "--rate": "40", "--seed": "1", "--timeout": "2s",
                "--input-len": "6", "--output-len": "3"}
    given = set(args[::2])
    flat = [x for k, v in defaults.items() if k not in given for x in (k, v)]
    return bench("openai+" + base, *args, *flat, **kw)


@pytest.mark.parametrize("api,keep_alive", [("completions", False), ("chat", False),
                                            ("completions", True)])
def test_every_fault_is_counted_by_kind_and_nothing_is_lost(api, keep_alive):
    """Also with a server that keeps its connections open after every completely framed
    answer (errors included): the next request on it is still counted on its own."""
    assert set(EXPECTED_KIND) == set(FAULTS)
    rounds = 2
    n = rounds * len(FAULTS)
    with ScriptedServer(modes=FAULTS, gap_s=0.002, keep_alive=keep_alive) as srv:
        r = llm(srv.base, "--api", api, "--requests", str(n), "--timeout", "1.5s",
                "--input-len", "12", "--output-len", "6")
        assert len(srv.bodies) == n
    assert r.rc == 0, r.stderr
    req = r.json["requests"]
    assert req["scheduled"] == req["sent"] == n and req["abandoned"] == 0
    assert req["sent"] == req["ok"] + sum(req["errors"].values())
    assert r.json["accounting"]["consistent"], r.json["accounting"]
    want: dict[str, int] = {}
    for kind in EXPECTED_KIND.values():
        if kind:
            want[kind] = want.get(kind, 0) + rounds
    assert errors(r.json) == want
    assert req["ok"] == rounds * sum(k is None for k in EXPECTED_KIND.values())
    # A hung request is recorded at its deadline: intended start + time-out, exactly.
    log = r.log
    assert log["id"].size == n
    hung = log["outcome"] == "timeout"
    assert np.count_nonzero(hung) == rounds
    assert np.allclose(log["end_s"][hung] - log["intended_s"][hung], 1.5, atol=1e-6)
    # Every request ended by its intended start plus the time-out.
    assert np.all(log["end_s"] <= log["intended_s"] + 1.5 + 1e-6)
    # Timed-out requests stay in the TTFT tail, at the time-out.
    assert r.json["ttft_ms"]["max"] >= 1500.0
    assert r.json["protocol"] == "openai" and r.json["mode"] == "open"
    if keep_alive:  # connections were reused: fewer opened than requests sent
        assert r.json["connections"]["opened"] < n


def test_a_kept_alive_connection_carries_one_stream_after_another():
    with ScriptedServer(gap_s=0.001, keep_alive=True) as srv:
        r = llm(srv.base, "--requests", "12", "--workers", "1", "--connections", "1",
                "--max-connections", "1", "--rate", "100")
    assert r.json["requests"]["ok"] == 12 and r.json["connections"]["opened"] == 1
    assert r.json["tokens"]["output"] == 36


def test_examples_of_each_error_kind_with_counts():
    with ScriptedServer(modes=("upgrade", "status_500", "short_content_length"),
                        gap_s=0.001) as srv:
        r = llm(srv.base, "--requests", "6", "--timeout", "1s")
    ex = r.json["requests"]["error_examples"]
    assert sorted(ex) == ["status_5xx", "truncated", "upgrade"]
    assert ex["upgrade"] == [{"reason": "101 Switching Protocols (to websocket) without an "
                                        "upgrade request", "count": 2}]
    (cut,) = ex["truncated"]  # Content-Length 100000, then the close
    assert cut["count"] == 2 and cut["reason"].startswith("connection closed after ")
    assert cut["reason"].endswith(" of 100000 body bytes (Content-Length)")
    assert ex["status_5xx"][0]["count"] == 2 and "scripted failure" in ex["status_5xx"][0]["reason"]
    assert ("  upgrade: 101 Switching Protocols (to websocket) without an upgrade request (x2)"
            in r.stdout)


def test_a_stream_without_done_is_accepted_only_when_asked():
    with ScriptedServer(modes=("close_without_done",), gap_s=0.001) as srv:
        strict = llm(srv.base, "--requests", "2")
        lax = llm(srv.base, "--requests", "2", "--allow-no-done")
    assert errors(strict.json) == {"truncated": 2}
    assert lax.json["requests"]["ok"] == 2 and errors(lax.json) == {}


def test_connection_refused_is_counted_not_raised():
    port = free_port()  # nobody listens there now
    r = llm(f"http://127.0.0.1:{port}/v1", "--requests", "5")
    req = r.json["requests"]
    assert (req["sent"], req["ok"], req["good"], errors(r.json)) == (5, 0, 0, {"connect": 5})
    assert r.json["ttft_ms"]["count"] == 0 and r.json["throughput"]["goodput_rps"] == 0


def test_usage_when_sent_else_counted_chunks():
    with ScriptedServer(gap_s=0.001) as srv:
        with_usage = llm(srv.base, "--requests", "6", "--input-len", "10",
                         "--output-len", "5").json
        counted = llm(srv.base, "--requests", "6", "--input-len", "10", "--output-len", "5",
                      "--no-usage").json
        asked = [("stream_options" in b) for b in srv.bodies]
    assert sorted(asked) == [False] * 6 + [True] * 6
    assert with_usage["tokens"]["counted_by"] == "usage"
    assert with_usage["tokens"]["input_counted_by"] == "usage"
    assert with_usage["tokens"]["output"] == 30
    assert counted["tokens"]["counted_by"] == "chunks" and counted["tokens"]["output"] == 30
    assert counted["tokens"]["input_counted_by"] == "workload" and counted["tokens"]["input"] == 60


def test_ttft_ignores_empty_first_chunks_and_itl_adds_up():
    with ScriptedServer(gap_s=0.003, first_empty=True) as srv:
        r = llm(srv.base, "--requests", "4", "--input-len", "8", "--output-len", "5")
        sends = srv.send_ns
    rep, log = r.json, r.log
    assert rep["requests"]["ok"] == 4
    assert list(log["chunks"]) == [5] * 4  # the empty first chunk is not a token
    ttft = log["first_token_s"] - log["intended_s"]
    e2e = log["done_s"] - log["intended_s"]
    assert np.all(ttft <= e2e)
    # first token + every gap = the last token, inside the request
    assert np.all(log["last_token_s"] <= log["done_s"]) and np.all(log["done_s"] <= log["end_s"])
    assert rep["tpot_ms"]["count"] == 4
    tpot = (e2e - ttft) / 4 * 1e3
    assert rep["tpot_ms"]["max"] == pytest.approx(tpot.max(), rel=0.01)
    # Each token arrives after the server sent it (same clock: CLOCK_MONOTONIC).
    t0 = rep["clock"]["start_monotonic_s"]
    firsts = np.sort(log["first_token_s"] + t0)
    lasts = np.sort(log["last_token_s"] + t0)
    assert len(sends) == 4
    assert np.all(firsts >= np.sort([s[0] / 1e9 for s in sends]) - 1e-6)
    assert np.all(lasts >= np.sort([s[-1] / 1e9 for s in sends]) - 1e-6)
    assert rep["itl_ms"]["count"] == 4 * 4
    # The empty first chunk came earlier than the first token: TTFT does not count it.
    assert np.all(log["first_chunk_s"] < log["first_token_s"])
    assert rep["first_chunk_ms"]["p50"] < rep["ttft_ms"]["p50"]


def test_slo_and_goodput():
    with ScriptedServer(gap_s=0.002) as srv:
        ok = llm(srv.base, "--requests", "8", "--input-len", "8", "--output-len", "4",
                 "--slo", "ttft_p99<10s", "--slo", "itl_p99<10s", "--slo", "error_rate<1%")
        strict = llm(srv.base, "--requests", "8", "--slo", "ttft_p50<1us")
    assert ok.rc == 0 and all(s["pass"] for s in ok.json["slo"])
    tp = ok.json["throughput"]
    assert tp["goodput_rps"] == tp["requests_per_s"] > 0
    assert strict.rc == 1 and strict.json["slo"][0]["pass"] is False
    assert strict.json["requests"]["good"] == 0 and strict.json["throughput"]["goodput_rps"] == 0
    assert "SLO failed: ttft_p50<1us" in strict.stdout


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_multiturn_sends_growing_shared_prefixes(api):
    with ScriptedServer(gap_s=0.001) as srv:
        r = llm(srv.base, "--api", api, "--requests", "6", "--workload", "multiturn",
                "--conversations", "2", "--turns", "3", "--system-len", "16",
                "--input-len", "6", "--output-len", "4", "--seed", "3")
        bodies = list(srv.bodies)
    assert r.json["requests"]["ok"] == 6
    # What the server received (matched by the conversation's unique system prompt).
    key = "messages" if api == "chat" else "prompt"

    def text(b):
        return b[key] if api == "completions" else "\n".join(m["content"] for m in b[key])

    for cid in range(2):
        mine = [text(b) for b in bodies if text(b).startswith(f"conversation {cid}.")]
        assert len(mine) == 3
        mine.sort(key=len)
        for a, b in zip(mine, mine[1:], strict=False):
            assert b.startswith(a) and len(b) > len(a)


def test_warmup_requests_are_sent_but_reported_apart():
    with ScriptedServer(gap_s=0.001) as srv:
        r = llm(srv.base, "--requests", "10", "--rate", "40", "--warmup", "0.1s")
    rep = r.json
    # Constant 40/s: offsets 0, 25, 50, 75 ms fall in the 100 ms warm-up.
    assert rep["requests"]["warmup"] == 4 and rep["requests"]["warmup_ok"] == 4
    assert rep["requests"]["sent"] == 6 and rep["ttft_ms"]["count"] == 6
    assert sorted(r.log["warmup"].tolist()) == [0] * 6 + [1] * 4  # the log keeps them all


# -- issue 23: error events and endless streams ------------------------------------------------


@pytest.mark.parametrize("mode", ["event_error_json", "event_error_text"])
def test_an_sse_error_event_is_a_server_error_with_its_message(mode):
    from support.llm_server import ERROR_MESSAGE

    with ScriptedServer(modes=(mode,)) as srv:
        r = llm(srv.base, "--requests", "4")
    assert r.rc == 1, r.stderr  # no request succeeded: exit 1
    assert errors(r.json) == {"server_error": 4}, r.json["requests"]
    (ex,) = r.json["requests"]["error_examples"]["server_error"]
    assert ex == {"reason": f"event: error: {ERROR_MESSAGE}", "count": 4}


def test_an_endless_token_stream_is_cut_at_the_token_limit():
    with ScriptedServer(modes=("endless_tokens",)) as srv:
        r = llm(srv.base, "--requests", "2", "--timeout", "30s",
                "--max-tokens-per-stream", "5000")
        sent = srv.endless_sent
    assert r.rc == 1, r.stderr  # no request succeeded: exit 1
    assert errors(r.json) == {"too_large": 2}, r.json["requests"]
    (ex,) = r.json["requests"]["error_examples"]["too_large"]
    assert ex["reason"] == "more than 5000 tokens in one stream (--max-tokens-per-stream)"
    assert list(r.log["chunks"]) == [5000, 5000]  # what was kept of each: the limit
    assert sent > 2 * 5000  # the server really went on


def test_max_tokens_per_stream_is_for_llm_targets_and_positive():
    r = bench("http://127.0.0.1:9/", "--rate", "1", "--duration", "1s",
              "--max-tokens-per-stream", "10")
    assert r.rc == 2 and "--max-tokens-per-stream" in r.stderr, r.stderr
    r = llm("http://127.0.0.1:9/v1", "--requests", "1", "--max-tokens-per-stream", "0")
    assert r.rc == 2 and "--max-tokens-per-stream must be >= 1" in r.stderr, r.stderr
