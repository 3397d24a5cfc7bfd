"""The pure parts of tailgate.bench.collective: sizes, formulas, patterns, analysis, SLOs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailgate.bench.collective.analyze import RankTimes, SizeRun, analyze, clock_offsets
from tailgate.bench.collective.pattern import PERIOD, contribution_row, count_wrong, expected_row
from tailgate.bench.collective.result import evaluate_slos, exit_status, parse_slo
from tailgate.bench.collective.spec import (
    DTYPES,
    bus_factor,
    busbw_gbps,
    element_count,
    format_size,
    parse_size,
    parse_sizes,
)
from tailgate.hist import decode
from tailgate.report.collective_render import summary_text


def test_sizes_follow_the_one_size_rule():
    assert parse_sizes("8B..1GiB")[:3] == [8, 16, 32] and parse_sizes("8B..1GiB")[-1] == 1 << 30
    assert len(parse_sizes("8B..1GiB")) == 28
    assert parse_sizes("1KiB..1MiB:4") == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert parse_sizes("64KiB,1MiB,64KiB") == [65536, 1 << 20]
    # K/M/G are powers of 1000 here as in bench and plan (tailgate.units)
    assert parse_sizes("64K,64KB") == [64000] and parse_size("1GB") == 10**9
    assert parse_size("1GiB") == parse_size("1gi") == 1 << 30 and parse_size("12") == 12
    assert [format_size(n) for n in (8, 1024, 1536, 1 << 30)] == ["8B", "1KiB", "1536B", "1GiB"]
    for n in (8, 1024, 1536, 1 << 30, 3 << 20):  # what is printed reads back as the same size
        assert parse_size(format_size(n)) == n


@pytest.mark.parametrize("text,message", [
    ("", "not a size"), ("1KB..8B", "empty size range"), ("8B..1MB:1", "factor"),
    ("8B..1MB:x", "factor"), ("0", "at least 1 byte"), ("32GB", "over 16 GiB"),
    ("1TB", "over 16 GiB"), ("1B..1GB:1", "factor"), ("1e400", "implausibly large"),
])
def test_bad_sizes_are_refused_with_the_reason(text, message):
    with pytest.raises(ValueError, match=message):
        parse_sizes(text)


def test_element_counts_and_bus_factors():
    assert element_count(8, DTYPES["float32"]) == 2 and element_count(6, DTYPES["bfloat16"]) == 3
    with pytest.raises(ValueError, match="holds no float64"):
        element_count(4, DTYPES["float64"])
    assert bus_factor("allreduce", 8) == 1.75 and bus_factor("allgather", 4) == 0.75
    assert bus_factor("broadcast", 64) == 1.0 and bus_factor("allreduce", 1) == 0.0
    # nccl-tests issue #107's arithmetic: 1 GB in 1 s over 2 ranks is 1 GB/s of bus bandwidth
    assert busbw_gbps("allreduce", 10**9, 1.0, 2) == 1.0
    with pytest.raises(ValueError):
        bus_factor("allreduce", 0)


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 8, 64])
def test_patterns_reduce_exactly_in_every_dtype(op, ranks):
    exact = expected_row(ranks, op)
    rows = [contribution_row(r, op) for r in range(ranks)]
    for dtype in ("float32", "float64", "int32") if op != "prod" else ("float32", "float64"):
        got = np.array(rows, dtype=dtype)
        red = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](got, axis=0)
        assert np.array_equal(red.astype(np.float64), exact)
    # bfloat16 keeps 8 significant bits: every value and partial result here fits
    assert np.all(np.abs(exact) <= 256) or op == "prod"
    if ranks > 1:  # a missing contribution is visible somewhere in every row
        assert not np.array_equal(expected_row(ranks - 1, op), exact) or op in ("min", "max")


def test_count_wrong_sees_every_kind_of_damage():
    row = expected_row(4, "sum")
    good = np.resize(row, 1000).astype(np.float32)
    assert count_wrong(good, row) == 0
    bad = good.copy()
    bad[[3, 500, 999]] += 1
    assert count_wrong(bad, row) == 3
    bad = good.copy()
    bad[-5:] = np.nan  # a stale or unwritten tail (not a multiple of the period)
    assert count_wrong(bad, row) == 5
    assert count_wrong(good[:PERIOD - 3], row) == 0


def _run(enter, leave, nbytes=1024):
    ranks = [RankTimes(r, "h", np.array(e, dtype=np.int64), np.array(x, dtype=np.int64), 0)
             for r, (e, x) in enumerate(zip(enter, leave, strict=True))]
    return SizeRun("allreduce", nbytes, nbytes // 4, "float32", "sum", "out_of_place", ranks)


def test_latency_is_the_slowest_rank_and_the_late_arrival_is_the_straggler():
    # 200 iterations of 10 us; at iteration 50 rank 2 arrives 5 ms late: ranks 0, 1 wait.
    n_it, step = 200, 100_000
    t = np.arange(n_it, dtype=np.int64) * step
    enter = [t.copy(), t.copy(), t.copy()]
    leave = [t + 10_000, t + 10_000, t + 10_000]
    enter[2][50] += 5_000_000
    for r in range(3):
        leave[r][50] = enter[2][50] + 10_000
    block, hist = analyze(_run(enter, leave))
    assert hist.total == 200 and block["iterations"] == 200
    again = decode(block["histogram_ns"])
    assert np.array_equal(again.counts, hist.counts)  # the JSON carries the exact histogram
    lat = block["latency_ms"]
    assert lat["max"] == pytest.approx(5.010) and lat["p50"] == pytest.approx(0.010, rel=1e-3)
    assert lat["p999"] == pytest.approx(5.010, rel=1e-3)  # 1 in 200: the P999
    mean_s = (199 * 10_000 + 5_010_000) / 200 / 1e9
    assert block["time_us"] == pytest.approx(mean_s * 1e6)
    assert block["algbw_gbps"] == pytest.approx(1024 / 1e9 / mean_s, rel=1e-4)
    assert block["busbw_gbps"] == pytest.approx(block["algbw_gbps"] * 4 / 3, rel=1e-4)
    st_ = block["straggler"]
    assert st_["rank"] == 2 and st_["tail_ms"] == pytest.approx(5.010) and st_["share"] > 0.99
    assert [p["max_us"] for p in block["per_rank"]] == [5010.0, 5010.0, 10.0]


def test_a_rank_always_served_last_is_not_a_straggler():
    # The algorithm releases rank 1 2 us after rank 0 every time: a carried lag, no growth.
    n_it, step = 300, 100_000
    t = np.arange(n_it, dtype=np.int64) * step
    enter = [t.copy(), t + 2_000]
    leave = [t + 10_000, t + 12_000]
    enter[0][100] += 3_000_000  # rank 0 stalls once, between iterations
    leave[0][100] = leave[1][100] = enter[0][100] + 10_000
    block, _ = analyze(_run(enter, leave))
    assert block["straggler"]["rank"] == 0
    assert block["per_rank"][1]["last_arrivals"] == 299  # arrived last, caused nothing


def test_inconsistent_timings_are_refused():
    with pytest.raises(ValueError, match="different numbers of iterations"):
        analyze(_run([[0, 1], [0]], [[1, 2], [1]]))
    with pytest.raises(ValueError, match="left an iteration before it entered"):
        analyze(_run([[10]], [[5]]))


def test_clock_offsets_from_barrier_exits():
    base = np.arange(9, dtype=np.int64) * 1_000_000
    jitter = np.array([0, 3_000, -2_000, 1_000, 0, -1_000, 2_000, 0, 500])
    samples = np.stack([base, base + 7_000_000_000 + jitter])
    offsets, err = clock_offsets(samples)
    assert offsets[0] == 0 and abs(offsets[1] - 7_000_000_000) <= 1_000
    assert 2 <= err <= 4


def test_slos_hold_only_if_they_hold_at_every_size():
    sizes = [{"bytes": 8, "placement": "out_of_place", "busbw_gbps": 1.0, "algbw_gbps": 1.0,
              "wrong": 0, "latency_ms": {"p999": 2.0, "count": 100}},
             {"bytes": 1024, "placement": "out_of_place", "busbw_gbps": 9.0, "algbw_gbps": 9.0,
              "wrong": 0, "latency_ms": {"p999": 7.0, "count": 100}}]
    res = evaluate_slos([parse_slo("p999<5ms"), parse_slo("busbw>=0.5"),
                         parse_slo("busbw>=5")], sizes)
    assert [r["pass"] for r in res] == [False, True, False]
    assert res[0]["observed"] == 7.0 and res[2]["observed"] == 1.0
    assert [r["pass"] for r in res[0]["per_size"]] == [True, False]
    doc = {"collective": "allreduce", "source": "tailgate", "ranks": 2, "sizes": [
        {**s, "count": 2, "iterations": 100, "time_us": 1.0, "straggler": None} for s in sizes],
        "slo": res}
    assert exit_status(doc) == 1
    assert "SLO p999<5ms: FAIL (worst 7 ms) at 1KiB" in summary_text(doc)
    with pytest.raises(ValueError, match="collectives: "):
        parse_slo("goodput>5")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 50), st.data())
def test_analysis_invariants(ranks, iters, data):
    starts = data.draw(st.lists(st.lists(st.integers(0, 10**9), min_size=iters, max_size=iters),
                                min_size=ranks, max_size=ranks))
    lens = data.draw(st.lists(st.lists(st.integers(0, 10**8), min_size=iters, max_size=iters),
                              min_size=ranks, max_size=ranks))
    enter = [np.array(s) for s in starts]
    leave = [np.array(s) + np.array(d) for s, d in zip(starts, lens, strict=True)]
    block, hist = analyze(_run(enter, leave))
    longest = max(max(d) for d in lens)
    assert hist.total == iters and hist.max == longest
    assert sum(p["last_arrivals"] for p in block["per_rank"]) == iters
    assert sum(p["tail_iterations"] for p in block["per_rank"]) == max(1, iters // 100)
    if ranks > 1:
        assert block["straggler"]["rank"] in range(ranks)
