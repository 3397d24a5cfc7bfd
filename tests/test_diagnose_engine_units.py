"""The engine's per-request records (pure): the parsers of llama-server's ``timings`` and
TGI's headers, their way through a streamed chunk into the request log, their placing on
tailgate's clock and the attribution of the TTFT tail and ITL spikes to engine phases."""

from __future__ import annotations

import io
import json
from array import array
from dataclasses import replace as dataclasses_replace
from pathlib import Path

import numpy as np
import pytest

from tailgate.bench.recording import _token_columns
from tailgate.bench.result import merge_logs, read_log
from tailgate.diagnose.engine import MAX_SKEW_NS, NO_TOKENS, Requests, analyse, place
from tailgate.llm.engine_records import (
    EngineTimings,
    parse_llamacpp_timings,
    parse_tgi_headers,
)
from tailgate.llm.openai import parse_chunk
from tailgate.model import ParseError

FIX = Path(__file__).parent / "fixtures" / "engine"


def _lines(name: str) -> list[str]:
    """A fixture's lines after its first (which names its source)."""
    lines = (FIX / name).read_text().splitlines()
    assert lines[0].startswith("# source: "), name
    return lines[1:]


# -- the parsers ----------------------------------------------------------------------


def test_llama_server_final_chunk_timings_from_a_real_capture():
    """The last data event of a stream the native llama-server sent (captured): its
    timings, through both of parse_chunk's paths (the typed one and the full rules)."""
    events = [ln[6:] for ln in _lines("llama_server_stream.txt") if ln.startswith("data: {")]
    last = events[-1]
    obj = json.loads(last)
    want = EngineTimings("llama.cpp", obj["timings"]["prompt_n"], obj["timings"]["cache_n"],
                         obj["timings"]["prompt_ms"], obj["timings"]["predicted_n"],
                         obj["timings"]["predicted_ms"])
    assert parse_chunk(last, "chat").timings == want
    # an "error": null sends the chunk through the full rules, which read timings alike
    assert parse_chunk(json.dumps({**obj, "usage": "odd"}), "chat").timings == want
    assert want.predicted_n == 8 and want.prompt_n + want.cache_n > 8
    # the earlier chunks carry none (no timings_per_token asked)
    assert all(parse_chunk(e, "chat").timings is None for e in events[:-1])


@pytest.mark.parametrize("timings, key", [
    ({"prompt_n": -1, "cache_n": 0, "prompt_ms": 1.0, "predicted_n": 1, "predicted_ms": 1.0},
     "timings.prompt_n"),
    ({"prompt_n": 3, "cache_n": True, "prompt_ms": 1.0, "predicted_n": 1, "predicted_ms": 1.0},
     "timings.cache_n"),
    ({"prompt_n": 3, "cache_n": 0, "prompt_ms": "1", "predicted_n": 1, "predicted_ms": 1.0},
     "timings.prompt_ms"),
    ({"prompt_n": 3, "cache_n": 0, "prompt_ms": 1.0, "predicted_n": 1, "predicted_ms": -2},
     "timings.predicted_ms"),
    ({"prompt_n": 3, "cache_n": 0, "prompt_ms": 1e12, "predicted_n": 1, "predicted_ms": 1},
     "timings.prompt_ms"),
    ({"prompt_n": 3, "cache_n": 0, "prompt_ms": 1.0, "predicted_ms": 1.0},
     "timings.predicted_n"),
])
def test_malformed_timings_name_the_key_and_make_no_phase(timings, key):
    with pytest.raises(ParseError, match=key.replace(".", r"\.")):
        parse_llamacpp_timings(timings)
    chunk = parse_chunk(json.dumps({"choices": [], "timings": timings}), "completions")
    assert isinstance(chunk.timings, str) and chunk.timings.startswith(key)


def test_timings_that_are_not_an_object_are_a_reason_not_a_crash():
    chunk = parse_chunk('{"choices": [], "timings": [1, 2]}', "chat")
    assert chunk.timings == "timings: list is not an object"
    assert parse_chunk('{"choices": [], "timings": null}', "chat").timings is None


def test_tgi_headers_from_a_real_capture():
    head = {k: v.strip() for k, _, v in (ln.partition(":") for ln in _lines(
        "tgi_generate_headers.txt")[1:] if ln)}
    t = parse_tgi_headers(head)
    assert (t.engine, t.queue_ms, t.inference_ms, t.prompt_n, t.predicted_n) == \
        ("tgi", 0.0, 110.0, 7, 3)
    assert t.prompt_ms is None and t.predicted_ms is None and t.cache_n is None
    del head["x-queue-time"]
    with pytest.raises(ParseError, match="header x-queue-time: missing"):
        parse_tgi_headers(head)
    with pytest.raises(ParseError, match="header x-inference-time: '1.5s' is not an integer"):
        parse_tgi_headers({**head, "x-queue-time": "0", "x-inference-time": "1.5s"})


# -- the request log ------------------------------------------------------------------


def _row(timings) -> str:
    toks = array("d", [10.0010, 10.0020, 10.0150, 10.0160])
    t = (10.0005, toks, 10.017, 4, 12, array("i", [1, 1, 1, 1]), -1, timings)
    return ("0,7,0.1,0.1,0.1005,10.02,ok,200,900,0,10.0199"
            + _token_columns(t, 0.0, 12) + "\n")


def test_the_log_carries_the_engine_record_and_the_longest_gap(tmp_path):
    rows = [_row(EngineTimings("llama.cpp", 9, 3, 2.5, 4, 14.0)), _row("timings.x: bad"),
            _row(None)]
    part = tmp_path / "p"
    part.write_text("".join(rows))
    out = io.StringIO()
    merge_logs(out, [str(part)], llm=True)
    cols = read_log(out.getvalue())
    assert cols["engine_state"].tolist() == ["ok", "bad", ""]
    assert cols["engine_prompt_n"][0] == 9 and cols["engine_cache_n"][0] == 3
    assert cols["engine_prompt_ms"][0] == 2.5 and cols["engine_predicted_ms"][0] == 14.0
    assert np.isnan(cols["engine_prompt_n"][1:]).all()
    # the longest gap between content chunks: 10.002 -> 10.015
    assert cols["gap_from_s"][0] == pytest.approx(10.002)
    assert cols["gap_to_s"][0] == pytest.approx(10.015)


def test_the_engines_windows_follow_diagnoses_order_of_requests(tmp_path):
    """diagnose.analyse lines requests up in the log's order (those that ended): the
    engine's phases of each, 0 where its record was malformed or missing."""
    from tailgate.diagnose.engine import windows

    part = tmp_path / "p"
    part.write_text("".join([_row(EngineTimings("llama.cpp", 9, 3, 2.5, 4, 14.0)),
                             _row("timings.x: bad"), _row(None),
                             _row(EngineTimings("llama.cpp", 9, 3, 2.5, 4, 14.0))]))
    out = io.StringIO()
    merge_logs(out, [str(part)], llm=True)
    w = windows(out.getvalue(), 100.0)
    base = 100_000_000_000
    placed = [True, False, False, True]
    assert (w.anchor > 0).tolist() == placed
    # E = min(first token read 10.001, last token read 10.016 - decode 14 ms = 10.002)
    assert w.anchor[0] == base + 10_001_000_000
    assert w.prefill_start[0] == w.anchor[0] - 2_500_000
    assert w.decode_end[0] == w.anchor[0] + 14_000_000 and w.sent[0] == base + 100_500_000
    # the phase a wait overlapped most, clipped to it
    a = int(w.anchor[0])
    assert w.phase(0, a - 1_000_000, a + 5_000_000) == ("decode", a, a + 5_000_000)
    assert w.phase(0, a - 2_000_000, a + 500_000) == ("prefill", a - 2_000_000, a)
    assert w.phase(1, a, a + 1) == ("", a, a + 1)
    assert windows(out.getvalue().replace(",ok,", ",error,"), 100.0) is None


def test_a_log_from_before_the_engine_columns_is_still_read():
    from tailgate.bench.engine_types import LLM_LOG_HEADER

    old = LLM_LOG_HEADER[:LLM_LOG_HEADER.index(",gap_from_s")] + "\n"
    cols = read_log(old + "0,1,0.1,0.1,0.1,0.2,ok,200,9,0,0.2,0.15,0.15,0.19,0.2,3,3,5\n")
    assert cols["input_tokens"].tolist() == [5] and "engine_state" not in cols


# -- placing and attributing ----------------------------------------------------------

MS = 1_000_000


def _one_slot(n: int = 400, every: int = 20, long_out: int = 400, short_out: int = 8,
              gap_ms: float = 20.0, prompt: int = 16, cached: int = 0,
              long_prompt_every: int = 0, long_prompt: int = 0,
              slots: int = 1, burst: int = 0) -> Requests:
    """A FIFO engine with ``slots`` slots: prefill 0.01 ms a computed token, decode 0.2 ms a
    token; requests ``gap_ms`` apart (the first ``burst`` at once), every ``every``-th
    generating ``long_out`` tokens (every ``long_prompt_every``-th with a prompt of
    ``long_prompt`` tokens)."""
    free = [0] * slots
    cols: dict[str, list] = {k: [] for k in ("intended", "sent", "first", "last", "end",
                                             "gap_from", "gap_to", "pn", "cn", "pms", "dn",
                                             "dms")}
    for i in range(n):
        t = 1_000 * MS + int(max(i - burst, 0) * gap_ms * MS)
        sent = t + 50_000
        out = long_out if i % every == every - 1 else short_out
        pn = long_prompt if long_prompt_every and i % long_prompt_every == 3 else prompt
        s = min(range(slots), key=lambda k: free[k])
        start = max(sent + 100_000, free[s])
        pre = int(pn * 0.01 * MS)
        e = start + pre
        dec = int((out - 1) * 0.2 * MS)
        free[s] = e + dec
        cols["intended"].append(t)
        cols["sent"].append(sent)
        cols["first"].append(e + 40_000)
        cols["last"].append(e + dec + 40_000)
        cols["end"].append(e + dec + 90_000)
        cols["gap_from"].append(e + 40_000)
        cols["gap_to"].append(e + 40_000 + 200_000)
        cols["pn"].append(pn - cached)
        cols["cn"].append(cached)
        cols["pms"].append(pre / MS)
        cols["dn"].append(out)
        cols["dms"].append(dec / MS)
    a = {k: np.array(v) for k, v in cols.items()}
    return Requests(np.arange(n), a["intended"], a["sent"], a["first"], a["last"], a["end"],
                    a["gap_from"], a["gap_to"], np.full(n, "ok", dtype=object),
                    a["pn"].astype(float), a["cn"].astype(float), a["pms"], a["dn"].astype(
                        float), a["dms"])


def test_records_are_placed_within_their_bound_and_a_foreign_one_is_refused():
    r = _one_slot(n=40)
    ph = place(r)
    assert ph.ok.all()
    # the synthetic engine's first token is 40 us before the client reads it, at both ends:
    # a delay both reads share, which the two-read bound cannot see (it is measured against
    # the server's own log: test_diagnose_engine.py)
    assert np.all(ph.anchor == r.first_token)
    assert np.all(ph.error_ns == 0)
    # a record whose prefill would have begun 60 ms before the request was sent is another
    # request's (or another clock's): refused, saying by how much
    bad = Requests(**{**r.__dict__, "prompt_ms": np.where(np.arange(40) == 5,
                                                          r.prompt_ms + 60.0, r.prompt_ms)})
    ph = place(bad)
    assert not ph.ok[5] and ph.ok.sum() == 39
    assert ph.why[5].startswith("refused: the engine's prefill would have started 59.")
    # two reads of one instant 80 ms apart: refused with that offset
    skew = Requests(**{**r.__dict__, "predicted_ms": np.where(
        np.arange(40) == 6, r.predicted_ms - 80.0, r.predicted_ms)})
    ph = place(skew)
    assert not ph.ok[6] and ph.why[6].endswith("engine's clock -80.0 ms apart")
    assert MAX_SKEW_NS == 50 * MS


def test_one_slot_short_requests_behind_long_generations_name_queue_wait_first():
    doc, causes, bands = analyse(_one_slot(), 1_000 * MS)
    first = causes[0]
    assert first.claimed and first.cause.key == "engine_queue", [c.sentence for c in causes]
    assert [c.cause.key for c in causes if c.claimed] == ["engine_queue"]
    assert first.time_share > 0.9
    # behind one long decode (400 tokens) each, no other prefill of note
    assert first.extra["decodes"] == pytest.approx(1.0, abs=0.2)
    assert first.extra["decode_tokens"] == pytest.approx(400, rel=0.2)
    assert first.sentence.startswith("TTFT P99: ")
    assert doc["join"]["placed"] == 400 and doc["join"]["refused"] == 0
    assert doc["slowest"][0]["queue_ms"] > 10 * doc["slowest"][0]["prefill_ms"]
    kinds = {b["kind"] for b in bands}
    assert kinds == {"queue", "prefill", "decode"}
    assert all(b["source"] == "engine" and b["end_ms"] > b["start_ms"] for b in bands)


def test_a_queue_every_request_waited_in_is_claimed_as_the_engine_over_capacity():
    """A backlog of 100 requests at the start that the engine, serving each in 1.56 ms with
    one every 1.6 ms, barely drains: every later request waits about as long (the slowest
    1.2x the mean), nearly all its TTFT. The lift rule alone claims nothing; the queue, a
    saturating cause, is named with what it means. A prefill that long in every request
    (its compute, which every request needs) is still not claimed."""
    r = _one_slot(every=10_000, gap_ms=1.6, burst=100)
    _, causes, _ = analyse(r, 1_000 * MS)
    first = causes[0]
    assert first.claimed and first.cause.key == "engine_queue", [c.sentence for c in causes]
    assert first.lift < 1.5 and first.time_share > 0.9, first.sentence
    assert "; a queue every request waited in: more was offered than the engine serves;" in (
        first.sentence)
    assert [c.cause.key for c in causes if c.claimed] == ["engine_queue"]
    # every request's prefill 40 ms, slots enough that none queues: no claim
    _, causes, _ = analyse(_one_slot(every=10_000, prompt=4000, slots=8), 1_000 * MS)
    (p,) = [c for c in causes if c.cause.key == "engine_prefill"]
    assert p.time_share > 0.9 and p.lift < 1.5 and not p.claimed, p.sentence
    assert not any(c.claimed for c in causes), [c.sentence for c in causes]


def test_prefix_misses_are_named_with_token_counts_and_a_cached_prefix_is_not():
    # a long prompt every tenth request, all of it computed, with slots enough not to queue
    r = _one_slot(every=10_000, long_prompt_every=10, long_prompt=4000, slots=4)
    doc, causes, _ = analyse(r, 1_000 * MS)
    first = causes[0]
    assert first.claimed and first.cause.key == "engine_prefill", [c.sentence for c in causes]
    assert first.extra["computed_tokens"] >= 4000 * 4 and first.extra["cached_tokens"] == 0
    assert "prefix-cache misses" in first.sentence
    # the same prompts served from the cache (16 of them computed): no such claim
    cached = _one_slot(every=10_000, long_prompt_every=10, long_prompt=16, slots=4)
    _, causes, _ = analyse(cached, 1_000 * MS)
    assert not any(c.claimed for c in causes), [c.sentence for c in causes]


def test_a_clean_run_claims_nothing_and_no_record_is_unknown():
    _, causes, _ = analyse(_one_slot(every=10_000, slots=4), 1_000 * MS)
    assert not any(c.claimed for c in causes), [c.sentence for c in causes]
    r = _one_slot(n=50)
    none = Requests(**{**r.__dict__, "state": np.full(50, "", dtype=object)})
    doc, causes, bands = analyse(none, 0)
    assert causes == [] and bands == []
    assert doc["unknown"].startswith("the engine sent no per-request record in any of the 50")
    bad = Requests(**{**r.__dict__, "state": np.full(50, "bad", dtype=object)})
    assert analyse(bad, 0)[0]["unknown"] == "every record the engine sent was malformed (50)"


def test_a_prefill_slow_for_the_usual_tokens_is_not_claimed_as_prefill_compute():
    """Every tenth request's prefill took 40 ms for the same 16 tokens as the others (its
    thread held up: a host cause): the prefill is most of their TTFT and 10x its mean, but
    they computed no more than anyone: not claimed, and the sentence says why."""
    r = _one_slot(every=10_000, slots=4)
    slow = np.arange(len(r.ids)) % 10 == 3
    add = np.where(slow, 40 * MS, 0)
    stretched = Requests(**{**r.__dict__, "prompt_ms": r.prompt_ms + add / MS,
                            "first_token": r.first_token + add,
                            "last_token": r.last_token + add, "end": r.end + add,
                            "gap_from": r.gap_from + add, "gap_to": r.gap_to + add})
    _, causes, _ = analyse(stretched, 1_000 * MS)
    (p,) = [c for c in causes if c.cause.key == "engine_prefill"]
    assert not p.claimed and p.extra["computed_lift"] == 1.0, p.sentence
    assert p.sentence.endswith("see the host's causes)"), p.sentence
    assert not any(c.claimed for c in causes), [c.sentence for c in causes]


def test_a_wait_with_the_engine_idle_is_held_in_the_server_not_its_queue():
    """Every tenth request reaches the engine 40 ms after it was sent with nothing else in
    the engine (its HTTP thread held up: throttled, or no thread to read it): the wait is
    most of their TTFT, but the engine had no one ahead of it: held, not queued."""
    r = _one_slot(every=10_000, slots=4)
    slow = np.arange(len(r.ids)) % 10 == 3
    add = np.where(slow, 40 * MS, 0)
    held = Requests(**{**r.__dict__, "first_token": r.first_token + add,
                       "last_token": r.last_token + add, "end": r.end + add,
                       "gap_from": r.gap_from + add, "gap_to": r.gap_to + add})
    doc, causes, _ = analyse(held, 1_000 * MS)
    assert [c.cause.key for c in causes if c.claimed] == ["engine_held"], [
        c.sentence for c in causes]
    # (the others' prefills and decodes in those 40 ms, a request every 20 ms: with four
    # slots free no queue, but the engine was not idle for those 1.6 ms each)
    (q,) = [c for c in causes if c.cause.key == "engine_queue"]
    assert not q.claimed and q.time_share < 0.1, q.sentence
    row = doc["slowest"][0]
    assert row["held_ms"] + row["queue_ms"] == pytest.approx(40.14, abs=0.01)
    assert row["queue_ms"] < 4, row
    # behind another request's decode, the same wait is the queue's
    _, causes, _ = analyse(_one_slot(), 1_000 * MS)
    (h,) = [c for c in causes if c.cause.key == "engine_held"]
    assert not h.claimed and h.time_share < 0.05, h.sentence


def _batching(stall: bool = True) -> Requests:
    """Decoders (80 prompt tokens, 64 out at 1 ms a token) every 20 ms on a continuously
    batching engine, every 20th request a 1,500-token prompt prefilled in 100 ms; with
    ``stall``, the decoders in flight when it starts wait for that prefill (one step
    holding their next token): their longest gap is it."""
    n = 200
    rows = []
    longs = []
    for i in range(n):
        t = 1_000 * MS + i * 20 * MS
        long = i % 20 == 10
        pms, out = (100.0, 4) if long else (2.0, 64)
        start = t + MS // 10
        # (one arriving during the long prefill is prefilled after it: one batch at a time)
        start = max([start] + [b for a, b in longs if a <= start < b])
        e = start + int(pms * MS)
        rows.append([t, start, e, pms, out, 1500 if long else 80])
        if long:
            longs.append((start, e))
    cols = {k: [] for k in ("first", "last", "gap_from", "gap_to", "dms")}
    for _t, start, e, _pms, out, _pn in rows:
        dec = (out - 1) * MS
        gap = (e + MS, e + MS + 300_000)
        hit = [(a, b) for a, b in longs if stall and e < a < e + dec and (a, b) != (start, e)]
        if hit:
            gap = hit[0]
            dec += hit[0][1] - hit[0][0]
        cols["first"].append(e + 40_000)
        cols["last"].append(e + dec + 40_000)
        cols["gap_from"].append(gap[0])
        cols["gap_to"].append(gap[1])
        cols["dms"].append(dec / MS)
    r = np.array(rows, dtype=np.float64)
    a = {k: np.array(v) for k, v in cols.items()}
    return Requests(np.arange(n), r[:, 0].astype(np.int64), r[:, 0].astype(np.int64),
                    a["first"], a["last"], a["last"] + 50_000, a["gap_from"], a["gap_to"],
                    np.full(n, "ok", dtype=object), r[:, 5], np.zeros(n), r[:, 3],
                    r[:, 4], a["dms"])


def test_itl_spikes_while_a_long_prompt_prefills_are_named_as_that_prefill():
    _, causes, _ = analyse(_batching(), 1_000 * MS)
    (i,) = [c for c in causes if c.cause.key == "engine_prefill_interference"]
    assert i.claimed and i.time_share > 0.9, i.sentence
    # each spike overlapped one prefill, the long prompt's
    assert i.extra["prefills"] == 1 and i.extra["tokens_per_prefill"] == 1500, i.extra
    assert "each overlapped 1 prefills of 1,500 computed prompt tokens" in i.sentence, i.sentence
    # the same run where the decoders never waited for the prefill: no claim
    _, causes, _ = analyse(_batching(stall=False), 1_000 * MS)
    (i,) = [c for c in causes if c.cause.key == "engine_prefill_interference"]
    assert not i.claimed, i.sentence


def test_a_part_most_of_every_requests_ttft_but_of_fewer_slow_ones_is_not_claimed():
    """Every request waits 3 ms in the server before its prefill (its HTTP thread's own
    handling: most of a small request's TTFT); of the slowest tenth, half waited 9 ms there
    and half had a prefill 6 ms longer for the usual tokens. The wait is longer in the slow requests
    (1.8x its mean) and most of half of them, but it is most of nearly every request: not
    what made these slow."""
    r = _one_slot(every=10_000, slots=4)
    k = np.arange(len(r.ids))
    held = np.where(k % 20 == 3, 9 * MS, 3 * MS)
    pre = np.where(k % 20 == 13, 6 * MS, 0)
    add = held + pre
    shifted = Requests(**{**r.__dict__, "prompt_ms": r.prompt_ms + pre / MS,
                          "first_token": r.first_token + add, "last_token": r.last_token + add,
                          "end": r.end + add, "gap_from": r.gap_from + add,
                          "gap_to": r.gap_to + add})
    _, causes, _ = analyse(shifted, 1_000 * MS)
    (h,) = [c for c in causes if c.cause.key == "engine_held"]
    assert h.lift >= 1.5 and h.tail_cover >= 0.5 and h.time_share >= 0.1, h.sentence
    assert h.all_cover > h.tail_cover and not h.claimed, h.sentence
    assert not any(c.claimed for c in causes), [c.sentence for c in causes]


# -- vLLM's request spans, joined by the request id tailgate sent ----------------------
#
# The spans here are built with the OpenTelemetry protocol classes, with vLLM's span name
# and attribute names (vllm/tracing), from the synthetic engine's own phases, and read back
# through the receiver's decoder (sources/otlp.parse_export); a real vLLM's are joined in
# tests/test_engine_otlp.py.

RUN = 0x0043BEEF
FRONT_NS = 100_000  # _one_slot: the engine takes a request 0.1 ms after it was sent


def _spans(r: Requests, skip: frozenset[int] = frozenset(), decode_short_ms: float = 0.0,
           extra: tuple[tuple[str, dict], ...] = (), drop_prefill: frozenset[int] = frozenset()
           ) -> bytes:
    """One OTLP export of a vLLM-shaped ``llm_request`` span per request of ``r`` (but
    ``skip``): its queue (the engine taking it -> its prefill starting), prefill and decode
    as the synthetic engine ran them; the decode reported ``decode_short_ms`` shorter than
    the client saw it (the two reads of the engine's clock then disagree by that much)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from tailgate.sources.otlp import request_uuid

    req = ExportTraceServiceRequest()
    scope = req.resource_spans.add().scope_spans.add()
    rows = []
    for i in range(len(r.ids)):
        if i in skip:
            continue
        e = int(r.first_token[i]) - 40_000  # _one_slot: the client reads 40 us after
        pre_s = r.prompt_ms[i] / 1e3
        start = e - int(r.prompt_ms[i] * MS)
        queue_s = (start - (int(r.sent[i]) + FRONT_NS)) / 1e9
        attrs = {"gen_ai.request.id": "chatcmpl-" + request_uuid(RUN, int(r.ids[i])),
                 "gen_ai.latency.time_in_queue": queue_s,
                 "gen_ai.latency.time_to_first_token": (e - int(r.sent[i])) / 1e9,
                 "gen_ai.latency.e2e": (int(r.end[i]) - int(r.sent[i])) / 1e9,
                 "gen_ai.latency.time_in_model_prefill": pre_s,
                 "gen_ai.latency.time_in_model_decode": (r.predicted_ms[i]
                                                         - decode_short_ms) / 1e3,
                 "gen_ai.latency.time_in_model_inference": pre_s + r.predicted_ms[i] / 1e3,
                 "gen_ai.usage.prompt_tokens": int(r.prompt_n[i] + r.cache_n[i]),
                 "gen_ai.usage.completion_tokens": int(r.predicted_n[i])}
        if i in drop_prefill:
            del attrs["gen_ai.latency.time_in_model_prefill"]
        rows.append(attrs)
    rows.extend(dict(a, **{"gen_ai.request.id": rid}) for rid, a in extra)
    for k, attrs in enumerate(rows):
        sp = scope.spans.add()
        sp.name = "llm_request"
        sp.span_id = (k + 1).to_bytes(8, "big")
        sp.trace_id = (k + 1).to_bytes(16, "big")
        sp.start_time_unix_nano = 1_800_000_000_000_000_000 + k
        sp.end_time_unix_nano = sp.start_time_unix_nano + 1
        for key, v in attrs.items():
            val = (AnyValue(string_value=v) if isinstance(v, str) else
                   AnyValue(int_value=v) if isinstance(v, int) else AnyValue(double_value=v))
            sp.attributes.append(KeyValue(key=key, value=val))
    return req.SerializeToString()


def _received(body: bytes):
    from tailgate.sources.otlp import Received, parse_export

    got = Received()
    got.add(parse_export(body), RUN)
    return got


def test_vllm_spans_are_joined_by_request_id_and_their_stated_queue_is_the_queue():
    """The one-slot engine's requests, their records as vLLM's spans (none from the log):
    each joined by the number in the id tailgate sent; the stated queue is the queue, the
    0.1 ms before the engine took the request is held in the server; the decode reported
    0.3 ms short puts the two reads of the engine's clock 0.3 ms apart: the bound stated.
    Three requests without a span, two spans of another run's ids and one of a number this
    run never sent are counted, and the tail is still queue wait, first."""
    from tailgate.diagnose.engine import VLLM, join_spans
    from tailgate.sources.otlp import request_uuid

    r = _one_slot(n=200)
    bare = Requests(**{**r.__dict__, "state": np.full(200, "", dtype=object)})
    stranger = {"gen_ai.latency.time_in_queue": 0.0,
                "gen_ai.latency.time_in_model_prefill": 0.001,
                "gen_ai.latency.time_in_model_decode": 0.001}
    got = _received(_spans(r, skip=frozenset({3, 50, 199}), decode_short_ms=0.3,
                           extra=(("chatcmpl-" + request_uuid(RUN + 1, 4), stranger),
                                  ("cmpl-not-ours", stranger),
                                  ("chatcmpl-" + request_uuid(RUN, 10_000), stranger))))
    assert got.unknown_ids == 2 and len(got.spans) == 198
    joined, counts = join_spans(bare, got.spans, np.arange(200), got.unknown_ids)
    assert counts.to_json() == {"matched": 197, "missing": 3, "unknown_ids": 3,
                                "not_measured": 0, "malformed": 0}
    assert joined.engine == VLLM and joined.state[3] == "" and joined.state[4] == "ok"
    ph = place(joined)
    assert ph.ok.sum() == 197 and ph.stated[ph.ok].all()
    assert ph.why[3] == "the engine sent no record of it"
    assert np.all(ph.error_ns[ph.ok] == 300_000)  # the 0.3 ms the two reads disagree
    doc, causes, bands = analyse(joined, 1_000 * MS)
    assert doc["engine"] == VLLM and doc["records"] == {"ok": 197, "malformed": 0, "none": 3}
    assert doc["join"]["error_bound_ms"] == {"p50": 0.3, "p99": 0.3, "max": 0.3}
    assert causes[0].claimed and causes[0].cause.key == "engine_queue", [
        c.sentence for c in causes]
    # each slow request's queue is the span's, to the rounding; held the 0.1 ms before it,
    # and the 40 us delivery both reads share (placed later by it: the bound cannot see it)
    spans = {int(k): v for k, v in got.spans.items()}
    for row in doc["slowest"]:
        assert row["queue_ms"] == pytest.approx(spans[row["request"]].queue_s * 1e3, abs=2e-3)
        assert row["held_ms"] == pytest.approx((FRONT_NS + 40_000) / MS, abs=2e-3)
        assert row["prompt_computed"] is None and row["prompt_cached"] is None
        assert row["prompt_tokens"] == spans[row["request"]].prompt_tokens
    (pre,) = [c for c in causes if c.cause.key == "engine_prefill"]
    assert pre.extra["cached_tokens"] is None
    assert "does not say how many came from the prefix cache" in pre.sentence
    assert {b["kind"] for b in bands} == {"held", "queue", "prefill", "decode"}
    # the terminal says what came over OTLP, and "-" where the span does not say
    from rich.console import Console

    from tailgate.report.diagnose_render import engine as render

    doc["otlp"] = {"received": got.to_json(), "join": counts.to_json(),
                   "endpoint": "http://127.0.0.1:4318/v1/traces"}
    con = Console(file=io.StringIO(), width=200)
    render(doc, con)
    text = con.file.getvalue()
    assert ("spans at http://127.0.0.1:4318/v1/traces: 197 joined, 3 requests without one, "
            "3 of ids this run never sent (ignored), 0 malformed, 0 bodies refused, "
            "0 dropped") in text
    row = doc["slowest"][0]
    assert f"{row['decode_ms']:>9.2f}{'-':>9}{'-':>8}{row['generated']:>6}" in text


def test_spans_that_do_not_fit_are_unknown_never_a_phase():
    """A span without its prefill is malformed (no phase from a default); one whose stated
    queue would have begun 60 ms before the request was sent is another clock's: refused
    with the offset; no span at all is unknown with the reason."""
    from tailgate.diagnose.engine import join_spans

    r = _one_slot(n=40)
    bare = Requests(**{**r.__dict__, "state": np.full(40, "", dtype=object)})
    got = _received(_spans(r, drop_prefill=frozenset({7})))
    got.spans[9] = dataclasses_replace(got.spans[9], queue_s=got.spans[9].queue_s + 0.06)
    joined, counts = join_spans(bare, got.spans, np.arange(40))
    assert (counts.matched, counts.malformed, counts.missing) == (39, 1, 0)
    ph = place(joined)
    assert ph.why[7] == "the engine's record of it was malformed"
    # (60 ms, less the 0.1 ms before the engine took it, plus the 40 us delivery)
    assert not ph.ok[9] and ph.why[9] == ("refused: the engine's queue would have started "
                                          "59.9 ms before the request was sent (offset "
                                          "beyond the bound)")
    assert ph.ok.sum() == 38
    none, counts = join_spans(bare, {}, np.arange(40), unknown_ids=5)
    assert counts.to_json() == {"matched": 0, "missing": 40, "unknown_ids": 5,
                                "not_measured": 0, "malformed": 0}
    doc, causes, bands = analyse(none, 0)
    assert causes == [] and bands == []
    assert doc["unknown"].startswith("no request span (vLLM's `llm_request`, SGLang's request "
                                     "root) of any of the 40 requests came to the OTLP "
                                     "receiver")


def test_a_span_is_joined_to_its_request_across_workers(tmp_path):
    """Two load workers deal the run's requests round-robin (bench.workers.plan): worker 1's
    request 0 is the run's request 1, the number its X-Request-Id carries; a span of a
    warm-up request is not measured, not unknown."""
    from tailgate.diagnose.engine import expected_numbers, records
    from tailgate.sources.otlp import Received

    rows = [_row(None).replace("0,7,", f"{w},{j},", 1) for w, j in ((0, 0), (1, 0), (0, 1))]
    rows.append(_row(None).replace("0,7,", "1,1,", 1).replace(",ok,200,900,0,",
                                                                ",ok,200,900,1,"))
    part = tmp_path / "p"
    part.write_text("".join(rows))
    out = io.StringIO()
    merge_logs(out, [str(part)], llm=True)
    text = out.getvalue()
    assert expected_numbers(text, 2) == {0, 1, 2}
    cols = read_log(text)
    r = _one_slot(n=4)
    sp = next(iter(_received(_spans(r)).spans.values()))
    got = Received(spans={1: sp, 3: sp, 9: sp})
    joined, counts = records(cols, 100.0, got, workers=2)
    assert joined.ids.tolist() == [0, 1, 2]
    assert joined.state.tolist() == ["", "ok", ""]
    assert counts.to_json() == {"matched": 1, "missing": 2, "unknown_ids": 1,
                                "not_measured": 1, "malformed": 0}


# -- llama-server's per-token timings (bench --engine-timings per-token) ---------------


def _timed(text: str, prompt_ms, predicted_ms, finish: str | None = None) -> bytes:
    """A /v1/completions chunk as llama-server sends it with timings_per_token."""
    return json.dumps({"choices": [{"text": text, "index": 0, "logprobs": None,
                                    "finish_reason": finish}],
                       "object": "text_completion", "timings": {
                           "cache_n": 0, "prompt_n": 5, "prompt_ms": prompt_ms,
                           "prompt_per_token_ms": 2.0, "predicted_n": 1,
                           "predicted_ms": predicted_ms}}).encode()


def _streams(chunks: list[tuple[int, bytes]]):
    """The compiled engine's JSON side over one request's events (read at ``t`` ns)."""
    from tailgate.bench.fast_sse import EV_DATA, EVENT, Streams

    recs, blob = [], bytearray()
    for t, d in chunks:
        recs.append((0, t, 100, len(blob), len(d), EV_DATA))
        blob += d
    s = Streams(api="completions")
    s.events(np.array(recs, dtype=EVENT).tobytes(), bytes(blob), 0.0)
    return s.open[0]


def test_the_option_asks_for_timings_in_every_chunk_and_only_when_given():
    from tailgate.bench.openai_requests import add_llm_arguments
    from tailgate.llm.openai import request_body

    assert "timings_per_token" not in json.loads(request_body("chat", "m", "hi", 4))
    assert json.loads(request_body("completions", "m", "hi", 4, timings_per_token=True))[
        "timings_per_token"] is True
    import argparse

    p = argparse.ArgumentParser()
    add_llm_arguments(p)
    assert p.parse_args([]).engine_timings == "final"
    assert p.parse_args(["--engine-timings", "per-token"]).engine_timings == "per-token"


def test_per_token_timings_are_kept_beside_each_chunks_read_into_the_log(tmp_path):
    """Each content chunk's prompt_ms + predicted_ms (the engine's time of its token since
    it started the request) is kept beside the chunk's read; the log says the latest the
    engine can have started (the least read - engine time) and the engine's own time
    between the longest gap's two tokens."""
    st = _streams([(1_000_000_000, _timed(" a", 20.0, 0.001)),  # read at 1.000 s
                   (1_010_000_000, _timed(" b", 20.0, 6.0)),  # 1.010 s
                   (1_030_000_000, _timed(" c", 20.0, 11.0)),  # 1.030 s: the longest gap
                   (1_031_000_000, _timed("", 20.0, 11.0, "length"))])  # the final one
    assert st.etok.tolist() == [20.001, 26.0, 31.0]
    toks = st.tokens()
    assert toks[8] is st.etok and toks[7] == EngineTimings("llama.cpp", 5, 0, 20.0, 1, 11.0)
    part = tmp_path / "p"
    part.write_text("0,7,0.1,0.1,0.1005,1.04,ok,200,900,0,1.04"
                    + _token_columns(toks, 0.0, 12) + "\n")
    out = io.StringIO()
    merge_logs(out, [str(part)], llm=True)
    cols = read_log(out.getvalue())
    assert cols["engine_tokens_state"].tolist() == ["ok"]
    assert cols["engine_tokens"][0] == 3
    # min(1.000 - 0.020001, 1.010 - 0.026, 1.030 - 0.031) = 0.979999 (the first)
    assert cols["engine_start_bound_s"][0] == pytest.approx(0.979999, abs=1e-9)
    assert (cols["gap_from_s"][0], cols["gap_to_s"][0]) == (1.01, 1.03)
    assert cols["engine_gap_ms"][0] == 5.0  # 31.0 - 26.0: the engine's part of the 20 ms


def test_per_token_timings_of_a_real_llama_server_stream_are_each_tokens_engine_time():
    """A chat stream llama-server sent with timings_per_token (captured): every content
    chunk carries its timings (the role chunk none, the final one the last token's again),
    and each content chunk's engine time is its prompt_ms + predicted_ms."""
    from tailgate.bench.fast_sse import EV_DATA, EVENT, Streams

    events = [ln[6:].encode() for ln in _lines("llama_server_stream_per_token.txt")
              if ln.startswith("data: {")]
    objs = [json.loads(e) for e in events]
    content = [o for o in objs if o["choices"][0]["delta"].get("content")]
    assert len(content) == 6 and all("timings" in o for o in content)
    assert "timings" not in objs[0] and objs[-1]["timings"] == content[-1]["timings"]
    want = [o["timings"]["prompt_ms"] + o["timings"]["predicted_ms"] for o in content]
    assert content[0]["timings"]["predicted_ms"] == 0.001  # the first token
    recs, blob = [], bytearray()
    for k, d in enumerate(events):
        recs.append((0, 1_000_000_000 + k * 1_000_000, 100, len(blob), len(d), EV_DATA))
        blob += d
    s = Streams(api="chat")
    s.events(np.array(recs, dtype=EVENT).tobytes(), bytes(blob), 0.0)
    st = s.open[0]
    assert len(st.tok) == 6 and st.etok.tolist() == want


def test_a_plain_chunk_among_timed_ones_has_no_engine_time_and_keeps_the_others_aligned():
    plain = b'{"choices":[{"text":" p","index":0,"finish_reason":null}]}'
    st = _streams([(1_000_000_000, _timed(" a", 20.0, 0.001)), (1_001_000_000, plain),
                   (1_002_000_000, _timed(" c", 20.0, 2.0))])
    assert len(st.tok) == 3 and np.isnan(st.etok[1])
    assert [st.etok[0], st.etok[2]] == [20.001, 22.0]


@pytest.mark.parametrize("bad, why", [
    ('"x"', "content chunk 2: timings.predicted_ms: 'x' is not a duration"),
    ("-3", "content chunk 2: timings.predicted_ms: -3 is not a plausible duration"),
    ("1.0", "content chunk 3: the engine's time went back from 21.000 to 20.500 ms"),
])
def test_malformed_per_token_timings_make_the_requests_unknown_with_the_reason(
        tmp_path, bad, why):
    """A chunk whose timings cannot be read (or times that go back) make the request's
    per-token times unknown with the reason: no bound, no gap split; never a crash."""
    second = (_timed(" b", 20.0, 0.0).replace(b'"predicted_ms": 0.0', b'"predicted_ms": '
                                              + bad.encode()))
    st = _streams([(1_000_000_000, _timed(" a", 20.0, 0.001)), (1_010_000_000, second),
                   (1_030_000_000, _timed(" c", 20.0, 0.5))])
    assert len(st.tok) == 3 and st.fail is None  # the stream itself is fine
    part = tmp_path / "p"
    part.write_text("0,7,0.1,0.1,0.1005,1.04,ok,200,900,0,1.04"
                    + _token_columns(st.tokens(), 0.0, 12) + "\n")
    out = io.StringIO()
    merge_logs(out, [str(part)], llm=True)
    cols = read_log(out.getvalue())
    assert cols["engine_tokens_state"].tolist() == ["bad: " + why.replace(",", ";")]
    assert np.isnan(cols["engine_start_bound_s"][0]) and np.isnan(cols["engine_gap_ms"][0])


def _placed_one(start_bound: int, state: str = "ok", gap_engine_ms: float = np.nan
                ) -> Requests:
    """One request: sent at 100 ms, its prefill (10 ms) starting at once, so the engine's
    first token E = 110 ms; its first token read 3 ms after E, the last 2 ms after the
    decode end (20 ms): the first and last reads bound E to within 2 ms."""
    one = lambda v: np.array([v])  # noqa: E731
    return Requests(one(0), one(100 * MS), one(100 * MS), one(113 * MS), one(132 * MS),
                    one(133 * MS), one(115 * MS), one(125 * MS), one("ok"), one(5.0),
                    one(0.0), one(10.0), one(8.0), one(20.0),
                    tokens_state=one(state), start_bound=one(start_bound),
                    gap_engine_ms=one(gap_engine_ms))


def test_every_tokens_read_narrows_the_joins_bound():
    """Without per-token times E is at most min(first read, last read - decode) = 112 ms:
    2 ms after the earliest it can be (sent + prefill); a token read 0.5 ms after the
    engine made it bounds the start to 100.5 ms, E to 110.5 ms: 0.5 ms."""
    without = place(_placed_one(0, ""))
    assert without.ok[0] and not without.per_token[0]
    assert without.anchor[0] == 112 * MS and without.bound_ns[0] == 2 * MS
    with_ = place(_placed_one(100 * MS + MS // 2))
    assert with_.ok[0] and with_.per_token[0]
    assert with_.anchor[0] == 110 * MS + MS // 2 and with_.bound_ns[0] == MS // 2
    assert with_.bound_first_last_ns[0] == 2 * MS
    # times it could not read: not used, the bound stays the first and last reads'
    bad = place(_placed_one(100 * MS + MS // 2, "bad: content chunk 2: x"))
    assert not bad.per_token[0] and bad.bound_ns[0] == 2 * MS
    # a token read before the engine can have started the request: another clock, refused
    foreign = place(_placed_one(40 * MS))
    assert not foreign.ok[0] and foreign.why[0].startswith(
        "refused: the engine's prefill would have started 60.0 ms before")


def test_the_longest_gap_splits_into_the_engines_time_and_delivery_exactly():
    """Every request's longest gap is 200 us (the one-slot run's); the engine spent 150 us
    of each between the two tokens: 75 % the engine's, 50 us delivery each."""
    r = _one_slot(n=100)
    n = len(r.ids)
    timed = Requests(**{**r.__dict__, "tokens_state": np.full(n, "ok", dtype=object),
                        "start_bound": np.zeros(n, np.int64),
                        "gap_engine_ms": np.full(n, 0.15)})
    doc, causes, _ = analyse(timed, 1_000 * MS)
    (itl,) = [c for c in causes if c.cause.key == "engine_prefill_interference"]
    assert itl.extra["gap_split"] == {"gaps": n, "with_engine_times": n, "engine_ms": 0.15,
                                      "delivery_ms": 0.05, "engine_share": 0.75}
    assert itl.sentence.endswith(
        "; of those gaps the engine itself spent 0.15 ms each between the two tokens (75 %), "
        "delivery (the server's HTTP thread, the network, the client) 0.05 ms (100 of 100 "
        "gaps with the engine's times)")
    row = doc["slowest"][0]
    assert (row["gap_ms"], row["gap_engine_ms"], row["gap_delivery_ms"]) == (0.2, 0.15, 0.05)
    assert "per_token_unknown" not in row
    # without per-token times: unknown, with the reason, in the cause and every row
    doc, causes, _ = analyse(r, 1_000 * MS)
    (itl,) = [c for c in causes if c.cause.key == "engine_prefill_interference"]
    assert itl.extra["gap_split"] == {"gaps": n, "with_engine_times": 0,
                                      "unknown": NO_TOKENS}
    row = doc["slowest"][0]
    assert row["gap_engine_ms"] is None and row["per_token_unknown"] == NO_TOKENS
    assert doc["join"]["per_token"] == {"requests": 0, "malformed": 0, "unknown": NO_TOKENS}
    assert NO_TOKENS == ("the engine sent no per-token timings (llama-server sends them when "
                         "asked: --engine-timings per-token)")
    # another engine's records: the reason true of it, never "ask llama-server"
    other = Requests(**{**r.__dict__, "engine": "TGI (headers)"})
    doc, causes, _ = analyse(other, 1_000 * MS)
    why = ("the engine's records (TGI (headers)) carry no per-token times (per-token timings "
           "come only from llama-server's `timings_per_token`, asked with --engine-timings "
           "per-token)")
    (itl,) = [c for c in causes if c.cause.key == "engine_prefill_interference"]
    assert itl.extra["gap_split"]["unknown"] == why
    assert doc["slowest"][0]["per_token_unknown"] == why
    assert doc["join"]["per_token"]["unknown"] == why
    # malformed ones: their reason, not a split
    bad = Requests(**{**timed.__dict__, "tokens_state": np.full(
        n, "bad: content chunk 2: timings: list is not an object", dtype=object)})
    doc, causes, _ = analyse(bad, 1_000 * MS)
    (itl,) = [c for c in causes if c.cause.key == "engine_prefill_interference"]
    assert itl.extra["gap_split"]["unknown"] == (
        "its per-token timings were malformed: content chunk 2: timings: list is not an "
        "object")
    assert doc["join"]["per_token"]["malformed"] == n


def test_the_joins_bound_is_summarised_in_the_terminal_and_the_html():
    from tailgate.report.diagnose_html import engine_join_section
    from tailgate.report.diagnose_render import join_bound_line

    join = {"placed": 3, "refused": 1, "bound_ms": {"p50": 0.5, "p99": 0.9, "max": 1.0},
            "per_token": {"requests": 2, "malformed": 1,
                          "bound_ms": {"p50": 0.25, "p99": 0.5, "max": 0.5},
                          "bound_ms_first_last": {"p50": 2.0, "p99": 3.0, "max": 3.0}}}
    line = ("join bound (how late the engine's prefill end may be placed) P50 0.500 ms, P99 "
            "0.900 ms, max 1.000 ms; 2 requests bounded by every token (P50 0.250 ms, P99 "
            "0.500 ms; by their first and last token alone P50 2.000 ms, P99 3.000 ms); 1 "
            "with malformed per-token timings")
    assert join_bound_line(join) == line
    assert f"3 placed, 1 refused; {line}".replace("'", "&#x27;") in engine_join_section(
        {"join": join})
    none = {**join, "per_token": {"requests": 0, "malformed": 0, "unknown": NO_TOKENS}}
    assert join_bound_line(none).endswith(f"max 1.000 ms; per-token: unknown ({NO_TOKENS})")
    assert engine_join_section({"unknown": "no records"}) == ""
