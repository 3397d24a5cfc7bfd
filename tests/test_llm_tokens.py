"""Token truth (issue 27, docs/llm-tokens.md): a chunk that carries several tokens is
counted as several (ITL per token beside ITL per chunk), the client's token count is
compared with the server's usage on every request, and the cached prompt tokens the
server reports give the prefix-cache hit rate. Pure parts on hand-made chunks and
batches; the end-to-end part runs `tailgate bench` against the scripted server
(tests/support/llm_server.py) that streams several tokens a chunk, misreports its usage,
or reports cached tokens."""

from __future__ import annotations

import json
from array import array

import numpy as np
import pytest

from support.llm_server import ScriptedServer
from tailgate.bench.outcome import OK, TIMEOUT
from tailgate.llm.accounting import TokenBook, good_slos, llm_block, parse_slo
from tailgate.llm.openai import chunk_tokens, parse_chunk, request_body


def test_a_chunk_says_its_tokens_by_logprobs_and_its_cached_prompt_by_usage():
    comp = parse_chunk(json.dumps({"choices": [{"text": " a b c", "logprobs": {
        "tokens": [" a", " b", " c"], "token_logprobs": [-1, -1, -1]}}]}), "completions")
    assert (comp.text, comp.tokens) == (" a b c", 3)
    chat = parse_chunk(json.dumps({"choices": [{"delta": {"content": "xy"}, "logprobs": {
        "content": [{"token": "x"}, {"token": "y"}]}}]}), "chat")
    assert chat.tokens == 2
    plain = parse_chunk(json.dumps({"choices": [{"text": "x"}]}), "completions")
    assert plain.tokens is None and plain.cached_tokens is None
    usage = parse_chunk(json.dumps({"choices": [], "usage": {
        "prompt_tokens": 40, "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 32}}}), "chat")
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (40, 9, 32)
    # a count that is not a count (a bool, a negative number) is no count
    odd = parse_chunk(json.dumps({"choices": [], "usage": {
        "prompt_tokens": True, "completion_tokens": -3,
        "prompt_tokens_details": {"cached_tokens": "32"}}}), "chat")
    assert (odd.prompt_tokens, odd.completion_tokens, odd.cached_tokens) == (None, None, None)


def test_a_chunks_tokens_come_from_cumulative_usage_only_when_every_chunk_had_one():
    def c(usage: int | None, lp: int | None = None):
        obj: dict = {"choices": [{"text": "t"}]}
        if usage is not None:
            obj["usage"] = {"prompt_tokens": 1, "completion_tokens": usage}
        if lp is not None:
            obj["choices"][0]["logprobs"] = {"tokens": ["t"] * lp}
        return parse_chunk(json.dumps(obj), "completions")

    assert chunk_tokens(c(3), -1, True) == 3  # the first chunk: 3 so far
    assert chunk_tokens(c(7), 3, True) == 4  # the difference
    # a usage on the last chunk alone is the stream's total, not this chunk's share
    assert chunk_tokens(c(7), -1, False) == -1
    assert chunk_tokens(c(7, lp=2), -1, False) == 2  # logprobs then
    assert chunk_tokens(c(None), 3, True) == -1  # the server did not say
    body = json.loads(request_body("chat", "m", "hi", 8, continuous_usage=True))
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "continuous_usage_stats" not in json.loads(request_body("chat", "m", "hi", 8))[
        "stream_options"]


def _book(toks, out=None, goods=()):
    start = 100.0
    n = len(toks)
    intended = start + np.arange(1.0, n + 1.0)
    end = np.array([t[2] if t[2] == t[2] else start + 50 for t in toks])
    out = np.array(out if out is not None else [OK] * n)
    book = TokenBook()
    book.record(intended, end, out, np.ones(n, dtype=bool), toks, np.full(n, 5), start, 0.0,
                None, goods, OK, TIMEOUT)
    return book


def test_itl_per_token_spreads_each_chunks_gap_over_the_tokens_the_server_stated():
    # request 1: chunks of 1, 3, 3 tokens (stated), 40 ms apart; usage 7: agrees
    # request 2: 3 chunks, no count stated (one each), usage 9: a mismatch
    # request 3: 2 chunks stated 2 and 2, usage absent: not compared; cached 3 of 5 prompt
    # request 4: the 5-tuple without counts (another engine's state): one token a chunk
    toks = [
        (101.0, array("d", [101.1, 101.14, 101.18]), 101.2, 7, 5, array("i", [1, 3, 3]), 0),
        (102.0, array("d", [102.1, 102.2, 102.3]), 102.35, 9, 5, array("i", [-1, -1, -1]),
         -1),
        (103.0, array("d", [103.1, 103.16]), 103.2, -1, 5, array("i", [2, 2]), 3),
        (104.0, [104.1, 104.12], 104.2, 2, 4),
    ]
    book = _book(toks)
    h = book.hists
    assert h["itl"].total == 2 + 2 + 1 + 1  # per chunk: every gap once
    # per token: 3+3 (request 1), 1+1 (2, assumed), 2 (3), 1 (4): first chunks' tokens not
    assert h["itl_per_token"].total == 6 + 2 + 2 + 1
    assert h["itl_per_token"].min == pytest.approx(40e6 / 3, rel=1e-3)
    assert h["itl_per_token"].max == pytest.approx(100e6, rel=1e-3)
    block = llm_block(book, 0.0)
    tc = block["token_check"]
    assert tc["chunks"] == 10 and tc["chunk_tokens_stated"] == 5
    assert tc["chunk_tokens_assumed_one"] == 5 and tc["itl_per_token_basis"] == "mixed"
    assert tc["multi_token_chunks"] == 4 and tc["max_tokens_in_chunk"] == 3
    assert (tc["usage_compared"], tc["usage_mismatch"], tc["usage_not_reported"]) == (3, 1, 1)
    assert tc["mismatch_examples"] == [{"client": 3, "usage": 9}]
    # output tokens: usage where given, else the client's count (request 3: 4)
    assert block["tokens"]["output"] == 7 + 9 + 4 + 2
    pc = block["prefix_cache"]
    assert (pc["requests_reporting"], pc["requests_with_hits"]) == (2, 1)
    assert (pc["prompt_tokens"], pc["cached_tokens"], pc["hit_rate"]) == (10, 3, 0.3)
    assert block["itl_per_token_ms"]["count"] == 11
    assert block["metrics"]["itl_per_token_max"] == pytest.approx(100.0, rel=1e-3)


def test_a_relabelled_request_leaves_every_count_of_ok_requests():
    """A request taken back out of ok (found out of step later) takes its usage, its
    token-truth comparison and its prefix-cache figures with it: the book then counts as
    if only the others had been ok (before, `usage_out` stayed, so `counted_by` read
    "chunks" and `usage_not_reported` went negative)."""
    toks = [(101.0, array("d", [101.1, 101.2]), 101.3, 2, 5, array("i", [-1, -1]), 0),
            (102.0, array("d", [102.1, 102.2]), 102.3, 7, 6, array("i", [-1, -1]), 4),
            (103.0, array("d", [103.1, 103.2]), 103.3, 2, 5, array("i", [-1, -1]), 5)]
    n = len(toks)
    start = 100.0
    book = TokenBook()
    book.record(start + np.arange(1.0, n + 1.0), np.array([t[2] for t in toks]),
                np.array([OK] * n), np.ones(n, dtype=bool), toks, np.full(n, 5), start, 0.0,
                None, (), OK, TIMEOUT, rids=np.array([10, 11, 12]))
    before = llm_block(book, 0.0)
    assert before["token_check"]["usage_mismatch"] == 1  # the second: 2 streamed, usage 7
    book.relabel([11])
    after = llm_block(book, 0.0)
    assert after["tokens"] == {"input": 10, "output": 4, "counted_by": "usage",
                               "input_counted_by": "usage"}
    tc = after["token_check"]
    assert (tc["usage_compared"], tc["usage_mismatch"], tc["usage_not_reported"]) == (2, 0, 0)
    assert after["prefix_cache"] == {"requests_reporting": 2, "requests_with_hits": 1,
                                     "prompt_tokens": 10, "cached_tokens": 5, "hit_rate": 0.5}
    book.relabel([99])  # no longer (or never) recent: counted as such, nothing taken
    late = llm_block(book, 0.0)["tokens"]
    assert late.pop("out_of_step_still_counted") == 1 and late == after["tokens"]


def test_merged_books_add_the_token_truth_and_a_huge_stated_count_costs_nothing():
    a = _book([(101.0, array("d", [101.1, 101.2]), 101.3, 2_000_001, 5,
                array("i", [1, 2_000_000]), 5)])
    assert a.hists["itl_per_token"].total == 2_000_000  # one bucket entry, not 2e6 copies
    assert a.hists["itl_per_token"].max == pytest.approx(100e6 / 2e6, rel=1e-3)
    b = _book([(101.0, array("d", [101.1, 101.2]), 101.3, 5, 5, array("i", [-1, -1]), -1)])
    a.add(b)
    a.add(b)
    block = llm_block(a, 0.0)
    assert block["token_check"]["usage_compared"] == 3
    assert block["token_check"]["usage_mismatch"] == 2  # b twice: 2 streamed, usage 5
    assert block["token_check"]["mismatch_examples"] == [{"client": 2, "usage": 5}]  # distinct
    assert block["token_check"]["max_tokens_in_chunk"] == 2_000_000
    assert block["prefix_cache"]["hit_rate"] == 1.0  # 5 of 5 in the one request reporting


def test_goodput_can_hold_each_request_to_its_own_per_token_itl():
    # two requests, each 3 chunks of 2 tokens: gaps 40 ms (20 ms a token) and 100 ms (50)
    toks = [(101.0, array("d", [101.1, 101.14, 101.18]), 101.2, 6, 5, array("i", [2, 2, 2]), -1),
            (102.0, array("d", [102.1, 102.2, 102.3]), 102.4, 6, 5, array("i", [2, 2, 2]), -1)]
    slo = parse_slo("itl_per_token_p99<30ms")
    assert slo.metric == "itl_per_token_p99"
    book = _book(toks, goods=good_slos([slo]))
    assert book.good == 1
    per_chunk = _book(toks, goods=good_slos([parse_slo("itl_p99<30ms")]))
    assert per_chunk.good == 0  # per chunk both gaps are over 30 ms


def llm(base: str, *args: str):
    from support.bench_cli import bench

    defaults = {"--model": "m", "--rate": "40", "--seed": "1", "--timeout": "5s",
                "--input-len": "6", "--output-len": "9", "--requests": "12",
                "--workers": "1"}
    given = set(args[::2])
    flat = [x for k, v in defaults.items() if k not in given for x in (k, v)]
    return bench("openai+" + base, *args, *flat)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_several_tokens_a_chunk_with_usage_in_every_chunk(api):
    """A server that sends 3 tokens a chunk (9 tokens: 3 chunks) and, asked with
    --continuous-usage, a cumulative usage in each: ITL per token counts 3 per gap."""
    with ScriptedServer(gap_s=0.03, tokens_per_chunk=3) as srv:
        r = llm(srv.base, "--api", api, "--continuous-usage")
        assert all(b["stream_options"]["continuous_usage_stats"] for b in srv.bodies)
    assert r.rc == 0, r.stderr
    d = r.json
    assert d["requests"]["ok"] == 12
    assert d["itl_ms"]["count"] == 12 * 2 and d["itl_per_token_ms"]["count"] == 12 * 6
    tc = d["token_check"]
    assert tc["itl_per_token_basis"] == "stated" and tc["multi_token_chunks"] == 36
    assert (tc["usage_compared"], tc["usage_mismatch"]) == (12, 0)
    assert d["tokens"]["output"] == 12 * 9 and d["tokens"]["counted_by"] == "usage"
    # the same gaps, seen per token: a third of the per-chunk figure
    assert d["itl_per_token_ms"]["p50"] == pytest.approx(d["itl_ms"]["p50"] / 3, rel=0.02)
    assert "ITL/token ms" in r.stdout and "0 of 12 request(s)" in r.stdout


def test_compare_reads_itl_per_token(tmp_path):
    """Two runs of 3 tokens a chunk, 30 ms and 10 ms between chunks: compare has ITL per
    token beside ITL per chunk, from each run's own histogram, a third of it."""
    import json
    import subprocess
    import sys

    paths = []
    for gap in (0.03, 0.01):
        with ScriptedServer(gap_s=gap, tokens_per_chunk=3) as srv:
            r = llm(srv.base, "--continuous-usage")
        assert r.rc == 0, r.stderr
        paths.append(tmp_path / f"{gap}.json")
        paths[-1].write_text(json.dumps(r.json))
    out = subprocess.run([sys.executable, "-m", "tailgate", "compare", *map(str, paths),
                          "--json", "-"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["rows"]}
    before, after = (json.loads(p.read_text()) for p in paths)
    per_token, per_chunk = rows["itl_per_token.p50"], rows["itl.p50"]
    assert (per_token["before"], per_token["after"]) == (before["itl_per_token_ms"]["p50"],
                                                         after["itl_per_token_ms"]["p50"])
    assert per_token["before"] == pytest.approx(per_chunk["before"] / 3, rel=0.02)
    assert per_token["layer"] == "L4" and per_token["significant"] == "yes", per_token


def test_several_tokens_a_chunk_without_counts_is_a_mismatch_on_every_request():
    """The same server without per-chunk usage: the client sees 3 chunks, usage says 9 on
    every request; counted, shown, and the per-token figure says it assumed one."""
    with ScriptedServer(gap_s=0.01, tokens_per_chunk=3) as srv:
        r = llm(srv.base)
    assert r.rc == 0, r.stderr
    tc = r.json["token_check"]
    assert (tc["usage_compared"], tc["usage_mismatch"], tc["usage_mismatch_rate"]) == (12, 12, 1.0)
    assert tc["itl_per_token_basis"] == "assumed_one" and tc["multi_token_chunks"] == 0
    assert tc["mismatch_examples"][0] == {"client": 3, "usage": 9}
    assert "12 of 12 request(s) streamed a token count that disagrees" in r.stdout
    assert any("do not add up to usage.completion_tokens" in w for w in r.json["warnings"])


def test_logprobs_say_a_chunks_tokens_without_continuous_usage():
    with ScriptedServer(gap_s=0.01, tokens_per_chunk=3, logprobs=True) as srv:
        r = llm(srv.base, "--api", "chat")
    tc = r.json["token_check"]
    assert tc["itl_per_token_basis"] == "stated" and tc["usage_mismatch"] == 0
    assert r.json["itl_per_token_ms"]["count"] == 12 * 6


def test_a_server_whose_usage_disagrees_with_what_it_streamed():
    """One token a chunk, but usage claims two more than were streamed."""
    with ScriptedServer(gap_s=0.005, usage_skew=2) as srv:
        r = llm(srv.base, "--output-len", "4")
    tc = r.json["token_check"]
    assert (tc["usage_compared"], tc["usage_mismatch"]) == (12, 12)
    assert tc["mismatch_examples"][0] == {"client": 4, "usage": 6}
    assert r.json["tokens"]["output"] == 12 * 6  # the server's count is what usage reports
    with ScriptedServer(gap_s=0.005) as srv:
        ok = llm(srv.base, "--output-len", "4")
    assert ok.json["token_check"]["usage_mismatch"] == 0
    assert ok.json["itl_per_token_ms"]["count"] == ok.json["itl_ms"]["count"] == 12 * 3


def test_cached_prompt_tokens_give_the_prefix_cache_hit_rate():
    with ScriptedServer(gap_s=0.002, cached_tokens=4) as srv:
        r = llm(srv.base, "--output-len", "2")
        prompts = [len(str(b["prompt"]).split()) for b in srv.bodies]
    pc = r.json["prefix_cache"]
    assert pc["requests_reporting"] == pc["requests_with_hits"] == 12
    assert pc["prompt_tokens"] == sum(prompts) and pc["cached_tokens"] == 12 * 4
    assert pc["hit_rate"] == pytest.approx(48 / sum(prompts), abs=1e-6)
    assert "prefix cache (server's usage): 48 of" in r.stdout
    with ScriptedServer(gap_s=0.002) as srv:  # no cached_tokens reported: no rate
        none = llm(srv.base, "--output-len", "2")
    assert none.json["prefix_cache"]["requests_reporting"] == 0
    assert none.json["prefix_cache"]["hit_rate"] is None


def test_continuous_usage_with_no_usage_is_refused():
    from support.bench_cli import bench

    r = bench("openai+http://127.0.0.1:9/v1", "--model", "m", "--rate", "1", "--requests",
              "1", "--no-usage", "--continuous-usage")
    assert r.rc == 2 and "--continuous-usage" in r.stderr

