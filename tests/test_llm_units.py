"""Pure parts of the LLM load test: SSE framing, OpenAI chunks, workloads, SLOs."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailgate.bench.outcome import OK, TIMEOUT
from tailgate.diagnose.engine import Requests, analyse
from tailgate.llm import workload as wl
from tailgate.llm.accounting import TokenBook, good_slos, llm_block, parse_slo
from tailgate.llm.engine_records import EngineTimings
from tailgate.llm.openai import (
    PLAIN,
    Chunk,
    ChunkError,
    _parse_chunk,
    parse_chunk,
    read_chunk,
    request_body,
)
from tailgate.llm.sse import SSEError, SSEParser, SSETooLarge

FIX = Path(__file__).parent / "fixtures" / "llm"

STREAM = (b": keep-alive\n\n"
          b"data: {\"a\": 1}\n\n"
          b"event: update\r\ndata: line one\r\ndata: line two\r\n\r\n"
          b"id: 7\rdata:no-space\r\r"
          b"data: [DONE]\n\n")
EXPECTED = [('{"a": 1}', "message"), ("line one\nline two", "update"), ("no-space", "message"),
            ("[DONE]", "message")]


def events(parser: SSEParser, pieces: list[bytes]) -> list[tuple[str, str]]:
    out = []
    for p in pieces:
        out += [(e.data, e.event) for e in parser.feed(p)]
    return out


def test_sse_whole_and_byte_at_a_time_agree():
    assert events(SSEParser(), [STREAM]) == EXPECTED
    assert events(SSEParser(), [STREAM[i:i + 1] for i in range(len(STREAM))]) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_sse_any_split_gives_the_same_events(cuts):
    bounds = sorted(set(cuts))
    pieces, prev = [], 0
    for b in [*bounds, len(STREAM)]:
        pieces.append(STREAM[prev:b])
        prev = b
    assert events(SSEParser(), pieces) == EXPECTED


def test_sse_bounds_a_line_that_never_ends_and_rejects_bad_utf8():
    p = SSEParser(max_line=1000)
    with pytest.raises(SSEError):
        p.feed(b"data: " + b"x" * 2000)
    with pytest.raises(SSEError):
        SSEParser().feed(b"data: \xff\xfe\n\n")
    q = SSEParser()
    q.feed(b"data: half")
    assert q.pending


def test_sse_line_limit_holds_whatever_the_read_boundaries():
    """The 1 MiB line bound: a line one byte over it fails whole, in two reads or a byte
    at a time (and costs linear time that way); a line exactly at it passes every way."""
    limit = 1 << 20
    over = b"data: " + b"x" * (limit + 1 - 6) + b"\n\n"
    at = b"data: " + b"x" * (limit - 6) + b"\n\n"
    for line in (over, at):
        splits = {"whole": [line], "halves": [line[:limit // 2], line[limit // 2:]],
                  "bytes": [line[i:i + 1] for i in range(len(line))]}
        for how, pieces in splits.items():
            p = SSEParser()
            if line is over:
                with pytest.raises(SSETooLarge, match="line exceeds 1048576 bytes"):
                    events(p, pieces)
            else:
                assert [len(d) for d, _ in events(p, pieces)] == [limit - 6], how


def test_chunks_of_both_apis_and_usage():
    c = parse_chunk('{"choices":[{"text":" hi","finish_reason":null}]}', "completions")
    assert c.text == " hi" and c.finish_reason is None
    role = parse_chunk('{"choices":[{"delta":{"role":"assistant"}}]}', "chat")
    assert role.text == ""
    d = parse_chunk('{"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}', "chat")
    assert d.text == "x" and d.finish_reason == "stop"
    u = parse_chunk('{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}', "chat")
    assert (u.prompt_tokens, u.completion_tokens) == (5, 9)
    e = parse_chunk('{"error":{"message":"overloaded"}}', "completions")
    assert e.error == "overloaded"
    for bad in ("{not json", "[1,2]", '{"choices": 3}', '{"choices":[{"text": 5}]}'):
        with pytest.raises(ChunkError):
            parse_chunk(bad, "completions")


def _outcome(fn, data, api):
    try:
        return fn(data, api)
    except ChunkError as exc:
        return ("ChunkError", str(exc))


# values of every JSON type, the odd ones included, for any field of a chunk
ODD = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                st.text(max_size=4), st.just([]), st.just({}), st.lists(st.integers(), max_size=3))

def field(good):
    """Usually a good value, at times one of any type."""
    return st.integers(0, 9).flatmap(lambda k: ODD if k == 0 else good)


def _maybe(d: dict, key: str, value) -> dict:
    return {**d, key: value} if value is not None else d


COUNT = field(st.integers(0, 2**40))
MS = field(st.floats(0, 1e5, allow_nan=False))
# llama-server's timings (its last chunk; every chunk with timings_per_token)
TIMINGS = field(st.fixed_dictionaries({}, optional={
    "prompt_n": COUNT, "cache_n": COUNT, "prompt_ms": MS, "predicted_n": COUNT,
    "predicted_ms": MS}))


@st.composite
def chunks(draw):
    """Chunk-shaped objects, usually well formed, with any field of any type at times."""
    choice: dict = {}
    choice = _maybe(choice, "text", draw(field(st.text(max_size=5))))
    choice = _maybe(choice, "delta", draw(field(st.fixed_dictionaries(
        {}, optional={"content": field(st.text(max_size=5)), "role": st.just("assistant")}))))
    choice = _maybe(choice, "finish_reason", draw(field(st.sampled_from(["stop", "length"]))))
    choice = _maybe(choice, "logprobs", draw(field(st.fixed_dictionaries({}, optional={
        "tokens": field(st.lists(st.text(max_size=2), max_size=3)),
        "content": field(st.lists(st.just({}), max_size=3))}))))
    usage = draw(field(st.fixed_dictionaries({}, optional={
        "prompt_tokens": COUNT, "completion_tokens": COUNT,
        "prompt_tokens_details": field(st.fixed_dictionaries(
            {}, optional={"cached_tokens": COUNT}))})))
    obj: dict = {"id": "cmpl-1", "object": "text_completion"}
    obj["choices"] = draw(field(st.lists(field(st.just(choice)), max_size=2)))
    obj = _maybe(obj, "usage", usage)
    if draw(st.integers(0, 2)) == 0:
        obj = _maybe(obj, "timings", draw(TIMINGS))
    if draw(st.integers(0, 9)) == 0:
        obj["error"] = draw(field(st.fixed_dictionaries({"message": st.text(max_size=5)})))
    return obj


@settings(max_examples=500)
@given(chunks(), st.sampled_from(["completions", "chat"]), st.sampled_from(["", "", "", "dup", "nan"]))
def test_the_typed_chunk_decode_gives_the_full_rules_answer(obj, api, twist):
    """parse_chunk's fast typed decode must agree with the rules (_parse_chunk) on every
    payload, including duplicated keys (the last wins) and NaN, which only json reads."""
    text = json.dumps(obj)
    if twist == "dup" and text.startswith('{"id"'):
        text = '{"choices": [{"text": 7}], "usage": "x", ' + text[1:]  # overridden later
    elif twist == "nan":
        text = text.replace("null", "NaN", 1)
    for data in (text, text.encode()):
        assert _outcome(parse_chunk, data, api) == _outcome(_parse_chunk, text, api), text


@st.composite
def near_plain(draw):
    """The usual content chunk, with at times one more field that makes it not plain (each
    of them: a reader that overlooks one calls such a chunk plain)."""
    text = draw(st.text(min_size=1, max_size=3))
    choice: dict = {"index": 0, "text": text, "delta": {"content": text}}
    obj: dict = {"id": "c", "choices": [choice]}
    extra = draw(st.sampled_from(["", "finish_reason", "logprobs", "usage", "timings",
                                  "error"]))
    if extra in ("finish_reason", "logprobs"):
        choice[extra] = draw(st.one_of(st.none(), st.just("stop") if extra == "finish_reason"
                                       else st.just({"tokens": ["a"], "content": [{}]})))
    elif extra == "usage":
        obj["usage"] = draw(st.one_of(st.none(), st.just({}),
                                      st.just({"completion_tokens": 2})))
    elif extra == "timings":
        obj["timings"] = draw(st.one_of(st.none(), TIMINGS))
    elif extra == "error":
        obj["error"] = draw(st.one_of(st.none(), st.just({"message": "x"})))
    return obj


@settings(max_examples=500)
@given(st.one_of(chunks(), near_plain()), st.sampled_from(["completions", "chat"]),
       st.sampled_from(["", "", "dup", "nan"]))
def test_a_chunk_called_plain_is_text_and_nothing_else(obj, api, twist):
    """read_chunk lets the compiled engine's JSON side take a chunk as one token without
    building it: it may answer PLAIN only where the rules give Chunk(text) with some text,
    and otherwise gives the rules' answer, from the same one decode."""
    text = json.dumps(obj)
    if twist == "dup" and text.startswith('{"id"'):
        text = '{"choices": [{"text": 7}], "usage": "x", ' + text[1:]
    elif twist == "nan":
        text = text.replace("null", "NaN", 1)
    want = _outcome(_parse_chunk, text, api)
    plain = isinstance(want, Chunk) and bool(want.text) and want == Chunk(want.text)
    for data in (text, text.encode()):
        # (a plain chunk it does not recognise, e.g. with NaN or an empty usage in it,
        # only takes the rules' way)
        got = _outcome(read_chunk, data, api)
        if got is PLAIN:
            assert plain, text
        else:
            assert got == want, text


def test_the_usual_chunks_are_plain():
    chat = ('{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" a"}}],'
            '"created":1,"id":"c","model":"m","object":"chat.completion.chunk"}')
    done = chat.replace('null,"index"', '"stop","index"')
    assert read_chunk(chat, "chat") is PLAIN
    assert read_chunk(done, "chat") == Chunk(" a", "stop")
    assert read_chunk(chat.replace('" a"', '""'), "chat") == Chunk("")  # no text: role-only
    comp = '{"id":"x","choices":[{"index":0,"text":" t1","finish_reason":null}]}'
    assert read_chunk(comp.encode(), "completions") is PLAIN
    assert read_chunk(comp.replace("}]}", '}],"usage":{"completion_tokens":1}}'),
                      "completions") == Chunk(" t1", completion_tokens=1)
    # llama-server's per-token timings: never plain (the engine's time is kept)
    timed = comp.replace("}]}", '}],"timings":{"prompt_n":3,"cache_n":0,"prompt_ms":1.5,'
                         '"predicted_n":2,"predicted_ms":0.25}}')
    assert read_chunk(timed, "completions") == Chunk(
        " t1", timings=EngineTimings("llama.cpp", 3, 0, 1.5, 2, 0.25))


# a timings key at and around the bounds parse_llamacpp_timings draws (MAX_PHASE_MS = 24 h)
EDGE_COUNT = st.sampled_from([0, 1, 16, -1, 2**63, 2**64 + 1, True, False, 3.0, "3", None])
EDGE_MS = st.one_of(st.floats(0, 1e5), st.floats(8e7, 9e7), st.sampled_from([
    0, 7, -0.0, -1e-9, 86_400_000, 86_400_000.0, 86_400_000.5, 2**70, 1e300, True, "1.5",
    None, [], {}]))


@st.composite
def timed_chunk(draw):
    """llama-server's per-token chunk, its timings whole or with a key at an edge, missing,
    or of another type, beside the keys it also sends (not read)."""
    t = {"prompt_n": 16, "cache_n": 0, "prompt_ms": 3.412, "predicted_n": 4,
         "predicted_ms": 3.125, "prompt_per_second": 4689.3}
    edges = {"prompt_n": EDGE_COUNT, "cache_n": EDGE_COUNT, "predicted_n": EDGE_COUNT,
             "prompt_ms": EDGE_MS, "predicted_ms": EDGE_MS}
    for key in draw(st.lists(st.sampled_from(sorted(edges)), max_size=2, unique=True)):
        if draw(st.integers(0, 5)) == 0:
            t.pop(key)
        else:
            t[key] = draw(edges[key])
    timings = draw(st.one_of(st.just(t), st.just(t), st.just(t), st.just([t]), st.just(None)))
    return {"choices": [{"text": draw(st.text(max_size=2)), "delta": {"content": " a"},
                         "finish_reason": None, "index": 0}],
            "object": "text_completion", "timings": timings}


@settings(max_examples=400)
@given(timed_chunk(), st.sampled_from(["completions", "chat"]))
def test_a_chunks_timings_read_typed_or_by_the_rules_are_the_same(obj, api):
    """The typed decode of llama-server's timings (engine_records.LlamacppTimings) takes
    exactly what parse_llamacpp_timings takes: at every edge (a negative or bool count, a
    duration of 24 h or just past it, a key missing) read_chunk and parse_chunk give the
    rules' answer, its reason worded as the rules word it."""
    text = json.dumps(obj)
    want = _outcome(_parse_chunk, text, api)
    for data in (text, text.encode()):
        assert _outcome(parse_chunk, data, api) == want, text
        got = _outcome(read_chunk, data, api)
        assert got == want or (got is PLAIN and want == Chunk(want.text)), text


def test_llama_servers_per_token_chunk_takes_the_typed_decode_alone(monkeypatch):
    """A chunk with llama-server's timings (every chunk with --engine-timings per-token) is
    read by the one typed decode: neither the generic rules (json, a dict checked key by
    key) nor the timings parser runs for it; a malformed one still does, for its reason."""
    import tailgate.llm.openai as oa

    calls: list[str] = []
    rules, parser = oa._parse_chunk, oa.parse_llamacpp_timings
    monkeypatch.setattr(oa, "_parse_chunk", lambda *a: calls.append("rules") or rules(*a))
    monkeypatch.setattr(oa, "parse_llamacpp_timings",
                        lambda *a: calls.append("parser") or parser(*a))
    timed = ('{"choices":[{"text":" t1","index":0,"logprobs":null,"finish_reason":null}],'
             '"id":"cmpl-1","timings":{"cache_n":0,"prompt_n":16,"prompt_ms":3.412,'
             '"prompt_per_token_ms":0.213,"predicted_n":2,"predicted_ms":1.125}}')
    want = Chunk(" t1", timings=EngineTimings("llama.cpp", 16, 0, 3.412, 2, 1.125))
    assert read_chunk(timed.encode(), "completions") == want
    assert calls == []
    bad = timed.replace('"predicted_n":2', '"predicted_n":-2')
    assert read_chunk(bad, "completions") == Chunk(
        " t1", timings="timings.predicted_n: -2 is not a token count")
    assert calls == ["rules", "parser"]


def test_request_body_asks_for_usage_and_streams():
    body = json.loads(request_body("chat", "m", "hello", 7))
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hello"}] and body["max_tokens"] == 7
    plain = json.loads(request_body("completions", "m", "hello", 7, usage=False))
    assert "stream_options" not in plain and plain["prompt"] == "hello"


def _take(it, n):
    return [next(it) for _ in range(n)]


def test_workloads_are_reproducible_from_a_seed():
    a = _take(wl.independent(3, 50, 10, 0.5), 20)
    b = _take(wl.independent(3, 50, 10, 0.5), 20)
    c = _take(wl.independent(4, 50, 10, 0.5), 20)
    assert a == b and a != c
    for r in a:
        assert 25 <= r.input_words <= 75 and 5 <= r.max_tokens <= 15
        assert len(r.prompt.split()) == r.input_words
    fixed = _take(wl.independent(1, 40, 8), 5)
    assert {r.input_words for r in fixed} == {40} and {r.max_tokens for r in fixed} == {8}
    assert _take(wl.multiturn(5, 3, 4, 30, 10, 6), 12) == _take(wl.multiturn(5, 3, 4, 30, 10, 6), 12)


def test_multiturn_turns_extend_their_conversations_prefix():
    reqs = _take(wl.multiturn(1, conversations=3, turns=4, system_len=20, user_len=8,
                              output_len=5), 12)
    by_conv: dict[int, list] = {}
    for r in reqs:
        by_conv.setdefault(r.conversation, []).append(r)
    assert len(by_conv) == 3
    for turns in by_conv.values():
        assert [t.turn for t in turns] == [0, 1, 2, 3]
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt.prompt.startswith(prev.prompt) and len(nxt.prompt) > len(prev.prompt)
            assert nxt.input_words == prev.input_words + 5 + 8
    # Different conversations do not share their system prompt.
    firsts = [t[0].prompt for t in by_conv.values()]
    assert len({p.split()[1] for p in firsts}) == 3
    chat = _take(wl.multiturn(1, 2, 2, 20, 8, 5, chat=True), 4)
    assert chat[2].prompt[: len(chat[0].prompt)] == chat[0].prompt


def test_mooncake_replay_shares_text_where_the_trace_shares_hash_ids():
    entries = wl.parse_mooncake((FIX / "mooncake_conversation_head.jsonl").read_text())
    assert len(entries) == 200
    scale = 1 / 16  # 512-token blocks become 32 words
    reqs = list(wl.trace(entries, seed=9, token_scale=scale))
    block = 32
    assert reqs[0].offset_s == 0.0
    assert all(b.offset_s >= a.offset_s for a, b in zip(reqs, reqs[1:], strict=False))
    words = [r.prompt.split() for r in reqs]
    for i in range(len(entries)):
        assert len(words[i]) == reqs[i].input_words == max(1, round(entries[i].input_length * scale))
    checked = 0
    for i in range(60):
        for j in range(i + 1, 60):
            hi, hj = entries[i].hash_ids, entries[j].hash_ids
            k = 0
            while k < min(len(hi), len(hj)) and hi[k] == hj[k]:
                k += 1
            full = min(k * block, len(words[i]), len(words[j]))
            assert words[i][:full] == words[j][:full]
            if k == 0 and hi and hj:  # different first blocks: different text
                assert words[i][:block] != words[j][:block]
            checked += k > 0
    assert checked > 0  # the real trace does share prefixes (hash id 0 in many requests)
    again = list(wl.trace(entries, seed=9, token_scale=scale))
    assert [r.prompt for r in again] == [r.prompt for r in reqs]


def test_mooncake_parse_errors_name_the_line():
    with pytest.raises(ValueError, match="line 2"):
        wl.parse_mooncake('{"timestamp":0,"input_length":5,"output_length":1,"hash_ids":[1]}\n'
                          '{"timestamp":0}\n')


def test_slo_expressions_use_the_bench_grammar():
    s = parse_slo("ttft_p999<2s")
    assert (s.metric, s.op, s.limit, s.unit) == ("ttft_p999", "<", 2000.0, "ms")
    assert parse_slo("itl_p99<=50ms").limit == pytest.approx(50.0)
    assert parse_slo("error_rate<1%").limit == pytest.approx(0.01)
    assert parse_slo("goodput_rps>=5").limit == 5.0
    assert parse_slo("p99<3s").metric == "latency.p99"  # bench's plain form: the request latency
    for bad in ("ttft_p42<1s", "ttft_p99<soon", "ttft_p99<5", "error_rate<"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_token_book_derives_ttft_itl_tpot_e2e_and_goodput_from_a_batch():
    """tailgate.llm.accounting on a hand-made batch (times in s, start 100): an ok request
    with usage, an ok one counted by chunks, a time-out after one token, a time-out with
    none, a status error and a warm-up request."""
    import numpy as np

    from tailgate.bench.outcome import CODE, OK, TIMEOUT
    from tailgate.llm.accounting import TokenBook, good_slos, llm_block

    start = 100.0
    intended = start + np.array([1.0, 2.0, 3.0, 4.0, 5.0, 0.1])
    end = start + np.array([1.5, 2.4, 5.0, 6.0, 5.01, 0.3])
    out = np.array([OK, OK, TIMEOUT, TIMEOUT, CODE["status_5xx"], OK])
    measured = np.array([True, True, True, True, True, False])
    toks = [
        (101.05, [101.1, 101.2, 101.4], 101.45, 3, 7),  # ok, usage: 3 out, 7 in
        (102.1, [102.3, 102.5], 102.55, -1, -1),  # ok, no usage: 2 chunks, 5 words
        (103.2, [103.5], float("nan"), -1, -1),  # timed out after one token
        (float("nan"), [], float("nan"), -1, -1),  # timed out with none
        (float("nan"), [], float("nan"), -1, -1),  # HTTP 500
        (100.15, [100.2, 100.25], 100.3, 2, 4),  # warm-up
    ]
    nominal = np.array([9, 5, 5, 5, 5, 4])
    book = TokenBook()
    slos = good_slos([parse_slo("ttft_p99<200ms"), parse_slo("error_rate<1%")])
    book.record(intended, end, out, measured, toks, nominal, start, 1.0, None, slos, OK, TIMEOUT)
    h = book.hists
    assert h["ttft"].total == 4  # 2 ok + 2 time-outs (one at its time-out)
    assert h["e2e"].total == 4 and h["tpot"].total == 2 and h["first_chunk"].total == 2
    assert h["itl"].total == 3  # 2 gaps + 1 gap; the time-out's lone token has none
    assert h["ttft"].max == pytest.approx(2.0e9, rel=1e-3)  # no token by the time-out: 2 s
    assert h["tpot"].min == pytest.approx(0.175e9, rel=1e-3)  # (0.45 - 0.1) / (3 - 1)
    assert h["tpot"].max == pytest.approx(0.25e9, rel=1e-3)  # (0.55 - 0.3) / (2 - 1)
    assert (book.ok, book.output, book.input, book.usage_out, book.warmup_ok) == (2, 5, 12, 1, 1)
    assert book.good == 1  # TTFT 100 ms and 300 ms: only the first meets 200 ms
    assert book.last_end_s == pytest.approx(6.0)
    block = llm_block(book, 1.0)
    assert block["tokens"] == {"input": 12, "output": 5, "counted_by": "chunks",
                               "input_counted_by": "workload"}
    assert block["throughput"]["goodput_rps"] == pytest.approx(1 / 5.0)
    assert block["metrics"]["ttft_max"] == pytest.approx(2000.0, rel=1e-3)


def _engine_book(rows, start: float = 100.0) -> TokenBook:
    """A book of ok requests ``(intended = sent, [content chunk times], EngineTimings)``."""
    n = len(rows)
    toks = [(times[0], array("d", times), times[-1], len(times), 5, array("i", [-1] * len(times)),
             -1, e) for _, times, e in rows]
    sent = np.array([r[0] for r in rows])
    book = TokenBook()
    book.record(sent.copy(), np.array([r[1][-1] for r in rows]), np.array([OK] * n),
                np.ones(n, dtype=bool), toks, np.full(n, 5), start, 0.0, None, (), OK,
                TIMEOUT, sends=sent)
    return book


# one slot: A is prefilled 101.010-101.110 and decoded to 101.510; B, sent at 101.200, waits
# for it (310 ms behind A's work), then 20 ms with the engine idle (its HTTP thread not yet
# handing it over), is prefilled 101.530-101.550 and decoded to 101.650; C's record would
# start its prefill 400 ms before it was sent: another clock's, refused
_A = (101.0, [101.11, 101.21, 101.31, 101.41, 101.51],
      EngineTimings("llama.cpp", 16, 0, 100.0, 5, 400.0))
_B = (101.2, [101.55, 101.6, 101.65], EngineTimings("llama.cpp", 4, 0, 20.0, 3, 100.0))
_C = (103.0, [103.1], EngineTimings("llama.cpp", 4, 0, 500.0, 1, 0.0))


def test_the_engines_queue_row_leaves_out_the_time_it_was_held_in_the_server():
    """The engine_queue row is each request's wait while the engine worked on another's
    request; the wait with the engine idle is engine_held's, and the generator's lateness
    and the first token's delivery are neither (before, engine_queue was TTFT less the
    prefill: A 10 ms, B 330 ms, C 0, all held time counted as queue)."""
    block = llm_block(_engine_book([_A, _B, _C]), 0.0)
    q, held = block["engine_queue_ms"], block["engine_held_ms"]
    assert (q["count"], held["count"]) == (2, 2)
    assert (q["max"], held["max"]) == (pytest.approx(310.0, rel=1e-3),
                                       pytest.approx(20.0, rel=1e-3))
    assert q["p50"] == 0.0 and held["p50"] == pytest.approx(10.0, rel=1e-3)
    assert block["engine_prefill_ms"]["count"] == 3  # (a duration: refused or not)
    assert {k: block["engine_wait"][k] for k in ("split", "refused", "left_out")} == {
        "split": 2, "refused": 1, "left_out": 0}
    # two workers' books (one host's clock): A's work still holds B up
    merged = _engine_book([_A])
    merged.add(_engine_book([_B]))
    again = llm_block(merged, 0.0)
    assert again["engine_queue_ms"]["max"] == q["max"]
    assert again["engine_held_ms"]["max"] == held["max"]
    # diagnose's per-request table splits the same waits alike
    ns = [[round(x * 1e9) for x in (r[0], r[0], r[1][0], r[1][-1], r[1][-1])] for r in (_A, _B)]
    c = np.array(ns, dtype=np.int64).T
    e = [_A[2], _B[2]]
    r = Requests(np.arange(2), c[0], c[1], c[2], c[3], c[4], np.zeros(2, np.int64),
                 np.zeros(2, np.int64), np.array(["ok", "ok"], dtype=object),
                 np.array([x.prompt_n for x in e], float), np.array([0.0, 0.0]),
                 np.array([x.prompt_ms for x in e]), np.array([x.predicted_n for x in e], float),
                 np.array([x.predicted_ms for x in e]))
    doc, _, _ = analyse(r, int(100e9))
    rows = {row["request"]: (row["queue_ms"], row["held_ms"]) for row in doc["slowest"]}
    assert rows == {0: (0.0, 10.0), 1: (310.0, 20.0)}


def test_the_token_accounting_gives_the_core_back_at_every_request_and_changes_nothing():
    """TokenBook.record calls ``breathe`` (the recorder's Breather) for every request of a
    take in each of its per-request loops and between its steps, so an idle-policy recorder
    holding the generator's core hands it back within one request's work (a take was 5-9 ms
    of CPU at 1,000 streams, the loop waiting behind it); and the figures are the same."""
    n = 60
    rows = [(100.0 + i * 0.05, [100.0 + i * 0.05 + 0.1 + k * 0.02 for k in range(5)],
             EngineTimings("llama.cpp", 16, 0, 80.0, 5, 80.0)) for i in range(n)]
    slos = good_slos([parse_slo("itl_p99<30ms"), parse_slo("ttft_p99<200ms")])

    def book_of(breathe=None) -> TokenBook:
        toks = [(t[0], array("d", t), t[-1], len(t), 5, array("i", [-1] * len(t)), -1, e)
                for _, t, e in rows]
        sent = np.array([r[0] for r in rows])
        book = TokenBook()
        kw = {} if breathe is None else {"breathe": breathe}
        book.record(sent.copy(), np.array([r[1][-1] for r in rows]), np.array([OK] * n),
                    np.ones(n, dtype=bool), toks, np.full(n, 5), 100.0, 0.0, 1.0, slos, OK,
                    TIMEOUT, rids=np.arange(n), sends=sent, **kw)
        return book

    calls = []
    breathing, plain = book_of(lambda: calls.append(1)), book_of()
    # a breath per request in each of the three per-request loops (token states, the ITL
    # SLO's per-request percentile, the recent ok requests), and between the steps
    assert len(calls) >= 3 * n + 10
    assert llm_block(breathing, 3.0) == llm_block(plain, 3.0)
    assert breathing.good == plain.good == n


def test_per_token_times_place_the_engines_wait_by_every_token():
    """B's per-token times (the engine's ms since it started B, at each chunk): its second
    token, read at 101.600, was made 75 ms after the start, so the engine started B by
    101.525 (not 101.530, as its first and last reads alone say): its prefill began 5 ms
    sooner, and of its wait 15 ms, not 20, was held with the engine idle."""
    book = TokenBook()
    rows = [_A, _B]
    toks = [(t[0], array("d", t), t[-1], len(t), 5, array("i", [-1] * len(t)), -1, e)
            for _, t, e in rows]
    toks[1] = (*toks[1], array("d", [20.001, 75.0, 120.0]))
    sent = np.array([r[0] for r in rows])
    book.record(sent.copy(), np.array([r[1][-1] for r in rows]), np.array([OK] * 2),
                np.ones(2, dtype=bool), toks, np.full(2, 5), 100.0, 0.0, None, (), OK,
                TIMEOUT, sends=sent)
    block = llm_block(book, 0.0)
    assert block["engine_queue_ms"]["max"] == pytest.approx(310.0, rel=1e-3)
    assert block["engine_held_ms"]["max"] == pytest.approx(15.0, rel=1e-3)
