"""`tailgate diagnose openai+http://...` against llama.cpp's native server (the C++
llama-server the Makefile builds; tests/support/llm_server.native_llama_server), with a
known engine-side cause injected by the workload and the server's flags: each named
exactly, from the engine's own record of every request (its ``timings``), on tailgate's
clock. The workloads are Mooncake traces the test writes: exact arrival times, prompt and
output lengths, and prefix sharing by hash id."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from support.cgroups import cpu_cgroup, spent_quota
from support.inspect import diagnose_code
from support.llm_server import MODEL_NAME, native_llama_server
from support.require import require_diagnose_host

pytestmark = pytest.mark.timeout(400)
# the server and the load ahead of the machine's other work: at -10 a CPU shared with six
# ordinary tasks left the server 61 % of it, and its run-queue waits were rightly named
# first (load average 13: runq claimed in three of the scenarios); at -20, 93 %
NICE = -20


@pytest.fixture(autouse=True, scope="module")
def _needs():
    require_diagnose_host()


def _trace(path: Path, rows: list[tuple[float, int, int, list[int]]]) -> Path:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o,
                                        "hash_ids": h}) + "\n" for t, i, o, h in rows))
    return path


def _diagnose(base: str, pid: int, trace: Path, *extra: str) -> dict:
    out = subprocess.run(
        # (the load ahead of the machine's other work too, as the server: a late generator
        # would rightly be named first)
        ["nice", "-n", str(NICE), "taskset", "-c", "0", sys.executable, "-m", "tailgate",
         "diagnose", "openai+" + base,
         "--pid", str(pid), "--model", MODEL_NAME, "--api", "chat", "--workload", "trace",
         "--trace", str(trace), "--retry-stale",
         # connections opened as requests need them, each used at once: llama-server closes
         # one idle for 5 s (its keep-alive), and of the 16 bench opens before a run those
         # still unused then were closed under the requests sent on them (stale: 29 in one
         # 4 s run, one of them stale again when retried)
         "--connections", "0", "--json", "-", *extra],
        capture_output=True, text=True, timeout=300, check=False)
    doc = json.loads(out.stdout)
    trace.with_name("diagnose.json").write_text(out.stdout)  # (kept for a failure's reader)
    assert out.returncode == diagnose_code(doc), out.stderr[-3000:]
    return doc


def _every_record(doc: dict, n: int) -> None:
    """Every request that ended ok carries the engine's record; of the ``n``, at most 2 %
    did not end ok, and those only on a stale connection: llama-server closed a kept-alive
    connection after one response and the load's one retry met another such (seen: 2 of
    200; the load's retry is its own, the compiled loop's)."""
    eng, req = doc["engine"], doc["bench"]["requests"]
    assert eng["records"] == {"ok": req["ok"], "malformed": 0, "none": 0}, eng
    failed = {k: v for k, v in req["errors"].items() if v}
    assert req["ok"] >= 0.98 * n and set(failed) <= {"stale_connection"}, (
        req, req.get("error_examples"))
    assert req["ok"] + sum(failed.values()) == n, req


def _why(doc: dict) -> str:
    return "\n".join(f"{c['claimed']} {c['cause']}: {c['sentence']}" for c in doc["causes"])


def _measure(base: str) -> tuple[float, float]:
    """What the server takes now (the machine is shared, so the workload is sized to it):
    the median of five short requests end to end (a 16-word prompt, 4 tokens), and its
    decode time per token (the median of three streams of 64 tokens, from its timings)."""
    import time

    from tailgate.llm.openai import parse_chunk

    def stream(words: int, tokens: int) -> str:
        body = json.dumps({"model": MODEL_NAME, "max_tokens": tokens, "stream": True,
                           "messages": [{"role": "user", "content": "the water " * words}]})
        req = urllib.request.Request(base + "/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return [ln for ln in r.read().decode().splitlines() if ln.startswith("data: {")][-1]

    import statistics

    shorts = []
    for _ in range(5):
        t0 = time.monotonic()
        stream(8, 4)
        shorts.append((time.monotonic() - t0) * 1e3)
    toks = []
    for _ in range(3):
        t = parse_chunk(stream(8, 64)[6:], "chat").timings
        toks.append(t.predicted_ms / (t.predicted_n - 1))
    return statistics.median(shorts), statistics.median(toks)


def test_one_slot_short_requests_queued_behind_long_generations_name_queue_wait(tmp_path):
    """One slot; one request in twenty generating many tokens and the rest 4 (the issue's
    case, sized to this machine): requests every ten short requests' time, the long one
    decoding for three of those gaps, so the short ones that arrive during it (about three)
    wait in the engine's queue for the only slot; the slot is a quarter busy as measured
    alone. That leaves room for what the run adds: each request waiting for the slot slows
    the decode (its HTTP thread shares the server's CPU; a 377-token decode measured alone
    0.39 ms a token, 0.64 with 20 waiting, 0.85 with 60), and tracing slows it more (0.9-3.6
    ms a token in a run sized for half busy, whose queue then grew to every request: 92 %
    busy, and in one run queue wait was most of every request and not named). Queue
    wait is named first, with what it was behind. No futex: the HTTP thread serving each
    request waits on a condition variable for the engine's thread, and that wait is the
    engine's phase of the request (a chain of two links: futex <- the engine's queue)."""
    with native_llama_server(tmp_path, slots=1, cpu="1", nice=NICE) as (base, proc):
        short, tok = _measure(base)
        gap = 10 * short
        long = max(50, min(1000, round(3 * gap / tok)))
        # (a busy machine slows the client's own short requests more than the server's
        # decode: the long ones, capped, then still decode for three gaps)
        gap = min(gap, long * tok / 3)
        rows = [(i * gap, 16, long if i % 20 == 19 else 4, [i]) for i in range(200)]
        doc = _diagnose(base, proc.pid, _trace(tmp_path / "t.jsonl", rows))
    why = _why(doc) + (f"\na short request {short:.1f} ms, {tok:.2f} ms a token: a request "
                       f"every {gap:.0f} ms, the long ones {long} tokens")
    assert doc["verdict"]["first"] == "engine_queue", why
    assert "futex" not in doc["verdict"]["claimed"], why
    _waits_for_the_engine(doc, "engine_queue")
    (q,) = [c for c in doc["causes"] if c["cause"] == "engine_queue"]
    # 200 requests: fewer than ten above the P99, so the P90's are judged
    assert q["sentence"].startswith("TTFT P90: ") and q["tail_time_share"] > 0.5, why
    assert q["decode_tokens"] >= 0.5 * long, why  # behind a long generation
    eng = doc["engine"]
    _every_record(doc, 200)
    # a record the client's reads cannot hold within 50 ms (its first token read that much
    # later than the engine's decode end says: the server's HTTP thread waiting for a CPU) is
    # refused with its offset, never placed
    join = eng["join"]
    assert join["placed"] + join["refused"] == doc["bench"]["requests"]["ok"], join
    assert all(w.startswith("refused: ") and " ms " in w for w in join["refused_examples"]), join
    slow = eng["slowest"][0]
    assert slow["queue_ms"] > slow["prefill_ms"] and slow["generated"] == 4, slow
    bands = doc["timeline"]["bands"]
    assert {b["kind"] for b in bands if b["source"] == "engine"} >= {"queue", "prefill",
                                                                     "decode"}
    # (beside the chains of the slowest requests, whose last links are engine phases too)
    assert {b["source"] for b in bands} <= {"engine", "chain"}
    # the time accounting shows those waits for what they are, not as futex (a lock)
    acc = doc["accounting"]
    assert acc["labels"]["engine_wait"] == "waits on the engine (futex)"
    every = acc["sets"]["all"]["parts"]
    assert every["engine_wait"]["share"] > every["futex"]["share"], every


def _waits_for_the_engine(doc: dict, phase: str) -> None:
    """The serving threads waited for the engine's thread: those futex waits are chains
    whose last link is the engine's phase (``phase`` among them), on a thread that read no
    request (where the slowest requests' chains, listed with their links, have one: the
    long generations' waits between tokens may all be under the probe's 0.2 ms)."""
    sigs = [s["links"] for s in doc["chains"]["signatures"]]
    assert ["futex", phase] in sigs, sigs
    engine = {ch["links"][1]["tid"] for s in doc["chains"]["slow"] for ch in s["chains"]
              if ch["links"][-1]["kind"].startswith("engine")}
    assert not engine & set(doc["chains"]["serving_pool"]), engine


def _conversations(path: Path, gap_ms: float, convs: int = 10, turns: int = 10) -> Path:
    """Multi-turn conversations, interleaved: turn t of conversation c re-sends its t
    earlier blocks and adds one (hash ids name the blocks: their text is the same each
    time, so a cache that still holds the conversation serves all but the new block)."""
    rows = []
    for t in range(turns):
        for c in range(convs):
            i = t * convs + c
            # (in 512-word blocks; the run scales them by 0.1: 51 words a block, 4 tokens out)
            rows.append((i * gap_ms, 512 * (t + 1), 40, [c * 1000 + k for k in range(t + 1)]))
    return _trace(path, rows)


@pytest.mark.parametrize("fits", [False, True])
def test_prefix_cache_misses_are_named_with_token_counts_only_when_the_cache_is_too_small(
        tmp_path, fits):
    """Ten conversations of ten turns, interleaved, a request every 600 ms. With one slot
    (and llama-server's host-memory prompt cache off: --cache-ram 0) each turn finds the
    slot holding another conversation: its whole history is computed again, and the later
    turns' long prefills make the TTFT tail — named as prefill with its token counts,
    "prefix-cache misses". With a slot per conversation (chosen by prompt similarity) each
    turn computes only its new block: no such claim."""
    slots = 10 if fits else 1
    trace = _conversations(tmp_path / "t.jsonl", 600.0)
    with native_llama_server(tmp_path, slots=slots, ctx=2048, cpu="1", nice=NICE,
                             extra=("--cache-ram", "0")) as (base, proc):
        doc = _diagnose(base, proc.pid, trace, "--trace-token-scale", "0.1")
    why = _why(doc)
    (p,) = [c for c in doc["causes"] if c["cause"] == "engine_prefill"]
    _every_record(doc, 100)
    if fits:
        assert not p["claimed"], why
        assert p["cached_tokens"] > p["computed_tokens"], why
    else:
        assert doc["verdict"]["first"] == "engine_prefill", why
        assert "futex" not in doc["verdict"]["claimed"], why
        _waits_for_the_engine(doc, "engine_prefill")
        assert "prefix-cache misses" in p["sentence"], why
        assert p["computed_tokens"] > 4 * p["cached_tokens"], why



CLEAN_TRIES = 3
QUIET_STEAL_MS_PER_S = 8  # a quiet VM's steal (test_diagnose_scenarios: 0-20 ms in 4 s)


def _disturbed(doc: dict) -> bool:
    """A run the hypervisor disturbed (as test_diagnose_scenarios judges its clean run): only
    a late generator claimed, or only it and run-queue waits, with more steal time on the two
    CPUs than a quiet VM has."""
    got = doc["verdict"]["claimed"]
    stolen = sum(doc["evidence"]["steal_ms"].values())
    window = doc["overhead"]["window_s"]
    return got == ["generator"] or (bool(got) and set(got) <= {"generator", "runq"}
                                    and stolen >= QUIET_STEAL_MS_PER_S * window)


def test_a_clean_run_on_llama_server_claims_nothing(tmp_path):
    """One slot, every request alike (16 words in, 8 tokens out), one every ten short
    requests' time: nothing queues, every prefill computes as many tokens, nothing else
    runs on the server's CPU but the machine's usual work, which the server (niced) is ahead
    of. Nothing is claimed: not the engine's phases, which every request has alike, nor the
    HTTP thread's waits for the engine's thread (futex: they are the engine's phases), and
    diagnose exits 0. A run the hypervisor disturbed (steal time) is run again."""
    with native_llama_server(tmp_path, slots=1, cpu="1", nice=NICE) as (base, proc):
        short, _ = _measure(base)
        rows = [(i * 10 * short, 16, 8, [i]) for i in range(200)]
        trace = _trace(tmp_path / "t.jsonl", rows)
        for attempt in range(1, CLEAN_TRIES + 1):
            doc = _diagnose(base, proc.pid, trace)
            if not _disturbed(doc) or attempt == CLEAN_TRIES:
                break
            print(f"run {attempt}: disturbed (steal ms {doc['evidence']['steal_ms']}): "
                  + _why(doc))
    why = _why(doc) + f"\na short request {short:.1f} ms"
    assert doc["verdict"]["claimed"] == [], why
    assert doc["verdict"]["chain"] is None, why
    _every_record(doc, 200)
    # the engine's phases were measured, and the HTTP thread's waits for them resolved
    _waits_for_the_engine(doc, "engine_decode")
    assert {b["kind"] for b in doc["timeline"]["bands"] if b["source"] == "engine"} >= {
        "prefill", "decode"}


PERIOD_US = 1_000_000  # half of it throttled: waits of up to 500 ms, over anything else here


def test_a_cpu_quota_on_llama_server_is_throttling_beside_the_engines_phases(tmp_path):
    """llama-server in a cgroup whose quota, half of each 1 s period, a busy neighbour spends
    in the first half (support.cgroups.spent_quota; the cgroup's weight raised against the
    machine's other work), so the server is throttled for the second half. Requests arrive
    four a second (Poisson, seeded: the same trace each run), one slot, 8 tokens out, a few
    per cent of the server's share. The verdict names the throttling first; beside it the
    engine's record says where those requests waited: before the engine took them, with the
    engine idle (held, L3), not in its queue (no other request in the engine) nor its
    prefill (no more tokens than any other); no futex."""
    import random

    rng = random.Random(43)
    t, rows = 0.0, []
    for i in range(150):
        rows.append((t, 16, 8, [i]))
        t += rng.expovariate(1 / 250.0)
    trace = _trace(tmp_path / "t.jsonl", rows)
    with native_llama_server(tmp_path, slots=1, cpu="1") as (base, proc), \
            cpu_cgroup(period_us=PERIOD_US) as cg:
        (cg / "cpu.shares").write_text("262144")  # against the ordinary work outside it
        (cg / "cgroup.procs").write_text(str(proc.pid))
        with spent_quota(cg, seconds=240, quota_us=PERIOD_US // 2):
            doc = _diagnose(base, proc.pid, trace)
    why = _why(doc)
    assert doc["verdict"]["first"] == "throttled", why
    claimed = doc["verdict"]["claimed"]
    assert "futex" not in claimed and "engine_queue" not in claimed, why
    assert "engine_prefill" not in claimed, why
    assert "engine_held" in claimed, why
    (held,) = [c for c in doc["causes"] if c["cause"] == "engine_held"]
    assert held["tail_time_share"] > 0.5, why
    _every_record(doc, 150)


def test_itl_spikes_while_a_long_prompt_prefills_are_named_as_that_prefill(tmp_path):
    """Four slots batched continuously, twenty cycles of 800 ms: two decoders (16 words in,
    256 tokens out) at 0 and 5 ms, a long prompt (500 words: about 1,500 tokens, a prefill
    of 100-200 ms here) at 20 ms, while both decode, and seven short requests (8 tokens out)
    from 400 ms on, after them (the server a quarter busy or so: nothing queues; at 400 ms
    cycles a busy machine's server fell behind, 2.3 s of queue). llama-server puts the long
    prompt's tokens in the same batch as the decoders' next tokens, so each decoder waits
    for the whole prefill for its next token: its longest gap between chunks is that
    prefill (40 of the 200 requests). The ITL spikes are named as the other request's
    prefill, with its tokens; the long prompts' own TTFT as their prefill; nothing else."""
    rows = []
    for c in range(20):
        t = c * 800.0
        rows += [(t, 16, 256, [10 * c]), (t + 5, 16, 256, [10 * c + 1]),
                 (t + 20, 500, 4, [10 * c + 2])]
        rows += [(t + 400 + 50 * k, 16, 8, [10 * c + 3 + k]) for k in range(7)]
    with native_llama_server(tmp_path, slots=4, ctx=4096, cpu="1", nice=NICE) as (base, proc):
        _measure(base)  # (warm: the first requests of a fresh server are slow)
        doc = _diagnose(base, proc.pid, _trace(tmp_path / "t.jsonl", rows))
    why = _why(doc)
    assert set(doc["verdict"]["claimed"]) == {"engine_prefill_interference",
                                              "engine_prefill"}, why
    (pre,) = [c for c in doc["causes"] if c["cause"] == "engine_prefill"]
    assert pre["computed_tokens"] > 10 * pre["cached_tokens"], why  # the long prompts' TTFT
    (itl,) = [c for c in doc["causes"] if c["cause"] == "engine_prefill_interference"]
    # the prefills the spikes overlapped were the long prompts' (about 1,500 tokens; the
    # others' about 80): one each, now and then a short one's beside it
    assert itl["tokens_per_prefill"] > 1000 and 1 <= itl["prefills"] < 1.5, why
    assert itl["tail_time_share"] > 0.5, why
    _every_record(doc, 200)


def test_per_token_timings_bound_the_join_by_every_token_and_split_the_gaps(tmp_path):
    """`diagnose --engine-timings per-token`: llama-server sends its timings in every chunk
    (asked in each request's body), every placed request's join is bounded by each of its
    tokens and the bound is stated per request, never wider than its first and last reads
    alone give; each request's longest gap is split into the engine's own time between the
    two tokens and delivery. One slot, 60 requests alike (16 words in, 16 tokens out), one
    every four short requests' time: nothing queues."""
    with native_llama_server(tmp_path, slots=1, cpu="1", nice=NICE) as (base, proc):
        short, _ = _measure(base)
        rows = [(i * 4 * short, 16, 16, [i]) for i in range(60)]
        doc = _diagnose(base, proc.pid, _trace(tmp_path / "t.jsonl", rows),
                        "--engine-timings", "per-token")
    _every_record(doc, 60)
    eng = doc["engine"]
    join = eng["join"]
    placed = join["placed"]
    assert placed >= 55, join  # (a record refused for its offset: a CPU-starved HTTP thread)
    tokens = join["per_token"]
    assert tokens["requests"] == placed and tokens["malformed"] == 0, tokens
    per = join["per_request"]
    assert len(per["request"]) == len(per["bound_ms"]) == placed and all(per["per_token"])
    assert all(b >= 0 for b in per["bound_ms"]), per
    for q in ("p50", "p99", "max"):
        assert tokens["bound_ms"][q] <= tokens["bound_ms_first_last"][q], tokens
    assert join["bound_ms"] == tokens["bound_ms"], join
    for row in eng["slowest"]:
        assert row["join_by"] == "every token" and row["join_bound_ms"] >= 0, row
        assert "per_token_unknown" not in row, row
        # 16 tokens: every request has a longest gap, both its chunks timed by the engine
        assert row["gap_engine_ms"] is not None and row["gap_engine_ms"] >= 0, row
        assert row["gap_delivery_ms"] == pytest.approx(row["gap_ms"] - row["gap_engine_ms"],
                                                       abs=2e-3), row
    (itl,) = [c for c in doc["causes"] if c["cause"] == "engine_prefill_interference"]
    split = itl["gap_split"]
    assert split["with_engine_times"] == split["gaps"] > 0, split
    assert 0 <= split["engine_share"], split
    print(f"join bound per token {tokens['bound_ms']}, first and last token alone "
          f"{tokens['bound_ms_first_last']}; the slow gaps: {split}")
