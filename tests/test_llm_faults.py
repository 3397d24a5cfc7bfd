"""The LLM load test against a small scripted server on loopback (tests/support/llm_server):
every fault counted by kind, nothing lost, the run ends on time, usage vs counted tokens,
and the multi-turn workload really sends shared prefixes."""

from __future__ import annotations

import pytest

from support.llm_server import FAULTS, ScriptedServer, free_port
from tailgate.llm import workload as wl
from tailgate.llm.client import Endpoint
from tailgate.llm.results import analyse, derive, parse_slo
from tailgate.llm.run import RunConfig, run

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


def cfg_for(base: str, **kw) -> RunConfig:
    args = {"api": "completions", "model": "m", "timeout_s": 2.0, "rate": 40.0, "seed": 1}
    args.update(kw)
    return RunConfig(Endpoint.parse("openai+" + base), **args)


def report(result, slos=(), **kw):
    return analyse(result, [parse_slo(s) for s in slos], target="t", model="m",
                   api="completions", rate=kw.get("rate"), timeout_s=2.0, workload={})


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_every_fault_is_counted_by_kind_and_nothing_is_lost(api):
    assert set(EXPECTED_KIND) == set(FAULTS)
    rounds = 2
    with ScriptedServer(modes=FAULTS, gap_s=0.002) as srv:
        cfg = cfg_for(srv.base, api=api, requests=rounds * len(FAULTS), timeout_s=1.5)
        result = run(cfg, wl.independent(2, 12, 6, chat=api == "chat"))
        assert len(srv.bodies) == rounds * len(FAULTS)
    rep = report(result)
    req = rep["requests"]
    assert req["sent"] == rounds * len(FAULTS)
    assert req["sent"] == req["ok"] + sum(req["errors"].values())
    want: dict[str, int] = {}
    for kind in EXPECTED_KIND.values():
        if kind:
            want[kind] = want.get(kind, 0) + rounds
    assert req["errors"] == want
    assert req["ok"] == rounds * sum(k is None for k in EXPECTED_KIND.values())
    # A hung request is recorded at its deadline: intended start + time-out, exactly.
    for r in result.records:
        if r.error == "timeout":
            assert r.end_ns == r.intended_ns + int(1.5e9)
    # The run ended on time: by the last intended start plus the time-out (+ slack).
    last = max(r.intended_ns for r in result.records)
    assert result.end_ns <= last + int(1.5e9) + int(1e9)
    # Timed-out requests stay in the TTFT tail, at the time-out.
    assert rep["ttft_ms"]["max"] >= 1500.0


def test_examples_of_each_error_kind_with_counts():
    with ScriptedServer(modes=("upgrade", "status_500", "short_content_length"),
                        gap_s=0.001) as srv:
        result = run(cfg_for(srv.base, requests=6, timeout_s=1.0), wl.independent(1, 6, 3))
    rep = report(result)
    ex = rep["requests"]["error_examples"]
    assert sorted(ex) == ["status_5xx", "truncated", "upgrade"]
    assert ex["upgrade"] == [{"reason": "101 Switching Protocols (to websocket) without an "
                                        "upgrade request", "count": 2}]
    (cut,) = ex["truncated"]  # Content-Length 100000, then the close
    assert cut["count"] == 2 and cut["reason"].startswith("connection closed after ")
    assert cut["reason"].endswith(" of 100000 body bytes (Content-Length)")
    assert ex["status_5xx"][0]["count"] == 2 and "scripted failure" in ex["status_5xx"][0]["reason"]
    from tailgate.llm.results import format_report

    text = format_report(rep)
    assert "  upgrade: 101 Switching Protocols (to websocket) without an upgrade request (x2)" in text


def test_a_stream_without_done_is_accepted_only_when_asked():
    with ScriptedServer(modes=("close_without_done",), gap_s=0.001) as srv:
        strict = report(run(cfg_for(srv.base, requests=2), wl.independent(1, 6, 3)))
        lax = report(run(cfg_for(srv.base, requests=2, require_done=False),
                         wl.independent(1, 6, 3)))
    assert strict["requests"]["errors"] == {"truncated": 2}
    assert lax["requests"]["ok"] == 2 and lax["requests"]["errors"] == {}


def test_connection_refused_is_counted_not_raised():
    port = free_port()  # nobody listens there now
    result = run(cfg_for(f"http://127.0.0.1:{port}/v1", requests=5), wl.independent(1, 5, 3))
    rep = report(result)
    assert rep["requests"] == {"sent": 5, "ok": 0, "good": 0, "errors": {"connect": 5},
                               "error_examples": rep["requests"]["error_examples"]}
    assert rep["ttft_ms"]["count"] == 0 and rep["throughput"]["goodput_rps"] == 0


def test_usage_when_sent_else_counted_chunks():
    with ScriptedServer(gap_s=0.001) as srv:
        with_usage = report(run(cfg_for(srv.base, requests=6), wl.independent(1, 10, 5)))
        counted = report(run(cfg_for(srv.base, requests=6, usage=False),
                             wl.independent(1, 10, 5)))
        asked = [("stream_options" in b) for b in srv.bodies]
    assert asked == [True] * 6 + [False] * 6
    assert with_usage["tokens"]["counted_by"] == "usage"
    assert with_usage["tokens"]["input_counted_by"] == "usage"
    assert with_usage["tokens"]["output"] == 30
    assert counted["tokens"]["counted_by"] == "chunks" and counted["tokens"]["output"] == 30
    assert counted["tokens"]["input_counted_by"] == "workload" and counted["tokens"]["input"] == 60


def test_ttft_ignores_empty_first_chunks_and_itl_adds_up():
    with ScriptedServer(gap_s=0.003, first_empty=True) as srv:
        result = run(cfg_for(srv.base, requests=4), wl.independent(1, 8, 5))
        sends = srv.send_ns
    rep = report(result)
    assert rep["requests"]["ok"] == 4
    for r in result.records:
        d = derive(r)
        assert len(r.token_ns) == 5  # the empty first chunk is not a token
        assert d.ttft <= d.e2e
        assert d.ttft + int(d.itl.sum()) <= d.e2e
        assert d.tpot == pytest.approx((d.e2e - d.ttft) / 4)
    # Each token arrives after the server sent it (same clock: CLOCK_MONOTONIC).
    got = sorted(t for r in result.records for t in r.token_ns)
    sent = sorted(t for s in sends for t in s)
    assert len(got) == len(sent) == 20
    assert all(g >= s for g, s in zip(got, sent, strict=True))
    assert rep["itl_ms"]["count"] == 4 * 4
    # The empty first chunk came earlier than the first token: TTFT does not count it.
    for r in result.records:
        assert r.first_chunk_ns < r.token_ns[0]
    assert rep["first_chunk_ms"]["p50"] < rep["ttft_ms"]["p50"]


def test_slo_and_goodput():
    with ScriptedServer(gap_s=0.002) as srv:
        result = run(cfg_for(srv.base, requests=8), wl.independent(1, 8, 4))
    ok = report(result, ["ttft_p99<10s", "itl_p99<10s", "error_rate<1%"])
    assert all(s["pass"] for s in ok["slo"])
    assert ok["throughput"]["goodput_rps"] == ok["throughput"]["requests_per_s"] > 0
    strict = report(result, ["ttft_p50<1us"])
    assert strict["slo"][0]["pass"] is False
    assert strict["requests"]["good"] == 0 and strict["throughput"]["goodput_rps"] == 0


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_multiturn_sends_growing_shared_prefixes(api):
    with ScriptedServer(gap_s=0.001) as srv:
        work = wl.multiturn(3, conversations=2, turns=3, system_len=16, user_len=6,
                            output_len=4, chat=api == "chat")
        result = run(cfg_for(srv.base, api=api, requests=6), work)
        bodies = list(srv.bodies)
    assert report(result)["requests"]["ok"] == 6
    by_conv: dict[int, list] = {}
    for rec in result.records:
        by_conv.setdefault(rec.conversation, []).append(rec.index)
    # What the server received (matched by the conversation's unique system prompt).
    key = "messages" if api == "chat" else "prompt"

    def text(b):
        return b[key] if api == "completions" else "\n".join(m["content"] for m in b[key])

    for cid in by_conv:
        mine = [text(b) for b in bodies if text(b).startswith(f"conversation {cid}.")]
        assert len(mine) == 3
        mine.sort(key=len)
        for a, b in zip(mine, mine[1:], strict=False):
            assert b.startswith(a) and len(b) > len(a)


def test_warmup_requests_are_sent_but_reported_apart():
    with ScriptedServer(gap_s=0.001) as srv:
        result = run(cfg_for(srv.base, requests=10, rate=40.0), wl.independent(1, 6, 3))
    rep = analyse(result, [], target="t", model="m", api="completions", rate=40.0,
                  timeout_s=2.0, workload={}, warmup_s=0.1)
    # Constant 40/s: offsets 0, 25, 50, 75 ms fall in the 100 ms warm-up.
    assert rep["requests"]["warmup"] == {"sent": 4, "ok": 4}
    assert rep["requests"]["sent"] == 6 and rep["ttft_ms"]["count"] == 6
