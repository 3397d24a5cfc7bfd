"""diagnose's per-request accounting (pure): synthetic timelines with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from tailgate.diagnose.accounting import PARTS, account, summarise, syscall_class

US = 1_000


def spans(*rows: tuple[int, int]) -> np.ndarray:
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def one(start: int, end: int, send: int = 0, threads=None, service=None) -> dict[str, int]:
    acc = account(np.array([start]), np.array([end]), np.array([send]), threads or {},
                  service or {})
    return {p: int(v[0]) for p, v in acc.parts.items() if v[0]}


def test_one_thread_is_exact_and_adds_up():
    # 1000 us request: 100 us late, 300 us asleep, 200 us queued, the rest on CPU
    got = one(0, 1000 * US, send=100 * US, threads={7: {
        "sleep": spans((200 * US, 500 * US)), "runq": spans((500 * US, 700 * US))}})
    assert got == {"generator": 100 * US, "sleep": 300 * US, "runq": 200 * US,
                   "on_cpu": 400 * US}


def test_overlapping_evidence_is_not_counted_twice():
    # a futex wait the probe also saw as an off-CPU wait in futex, a stop inside a run-queue
    # wait, and a throttled period over all of them: each instant counted once
    got = one(0, 1000 * US, threads={7: {
        "futex": spans((100 * US, 400 * US)), "blocked_other": spans((100 * US, 450 * US)),
        "runq": spans((500 * US, 900 * US)), "stopped": spans((600 * US, 700 * US))}},
        service={"throttled": spans((850 * US, 950 * US))})
    assert got == {"futex": 300 * US, "blocked_other": 50 * US, "stopped": 100 * US,
                   "runq": 250 * US, "throttled": 100 * US, "on_cpu": 200 * US}
    assert sum(got.values()) == 1000 * US


def test_evidence_outside_the_window_is_clipped():
    got = one(100 * US, 200 * US, threads={7: {"sleep": spans((0, 150 * US))}},
              service={"softirq": spans((190 * US, 400 * US))})
    assert got == {"sleep": 50 * US, "softirq": 10 * US, "on_cpu": 40 * US}


def test_several_candidate_threads_are_apportioned():
    acc = account(np.array([0]), np.array([1000 * US]), None, {
        1: {"sleep": spans((0, 800 * US))},
        2: {"runq": spans((0, 200 * US))},
        # waiting for work the whole window: idle, not a candidate
        3: {"poll": spans((0, 2000 * US))}}, {})
    got = {p: int(v[0]) for p, v in acc.parts.items() if v[0]}
    assert got == {"sleep": 400 * US, "runq": 100 * US, "on_cpu": 500 * US}
    assert acc.apportioned.tolist() == [True] and acc.candidates.tolist() == [2]


def test_apportioning_weighs_threads_by_their_busy_time():
    # thread 2 was woken by a request of its own near the end: 100 us busy against 1000 us
    acc = account(np.array([0]), np.array([1000 * US]), None, {
        1: {"sleep": spans((0, 800 * US))}, 2: {"read": spans((0, 900 * US))}}, {})
    assert acc.parts["sleep"].tolist() == [800_000 * 1000 // 1100]
    assert acc.parts["read"].tolist() == [900_000 * 100 // 1100]
    assert acc.parts["on_cpu"].tolist() == [1_000_000 - 727_272 - 81_818]
    assert acc.candidates.tolist() == [2]


def test_apportioning_rounds_in_whole_nanoseconds_and_still_adds_up():
    acc = account(np.array([0]), np.array([1001]), None, {
        1: {"sleep": spans((0, 1000))}, 2: {"sleep": spans((0, 1))}, 3: {}}, {})
    assert acc.parts["sleep"].tolist() == [333]
    assert sum(acc.parts.values()).tolist() == [1001]


def test_a_window_no_thread_served_is_the_residual():
    got = one(0, 500 * US, send=50 * US,
              threads={1: {"poll": spans((0, 600 * US))}, 2: {"read": spans((0, 600 * US))}})
    assert got == {"generator": 50 * US, "residual": 450 * US}


def test_a_thread_asleep_over_the_whole_window_still_served_it():
    # a single-threaded server asleep in its handler: the request behind it waits for it
    got = one(100 * US, 300 * US, threads={1: {"sleep": spans((0, 5000 * US))}})
    assert got == {"sleep": 200 * US}


def test_a_retransmission_holds_the_minimum_timeout_before_it():
    got = one(0, 300_000 * US, threads={1: {}},
              service={"retransmit": spans((250_000 * US, 250_000 * US))})
    assert got == {"retransmit": 200_000 * US, "on_cpu": 100_000 * US}


def test_syscalls_are_classed():
    assert [syscall_class(n) for n in (0, 45, 1, 232, 35, 230, 202, -1, 9)] == [
        "read", "read", "write", "poll", "sleep", "sleep", "futex", "blocked_other",
        "blocked_other"]


def test_the_part_that_grows_in_the_tail_is_named():
    # 1 request in 50 sleeps 4.9 ms in a 5 ms request; the others are ~100 us on CPU
    n = 1000
    starts = np.arange(n, dtype=np.int64) * 10_000 * US
    lat = 100 * US + np.arange(n, dtype=np.int64)
    slow = np.arange(n) % 50 == 7
    lat[slow] = 5000 * US
    ends = starts + lat
    sleeps = spans(*[(s + 50 * US, s + 4950 * US) for s in starts[slow]])
    acc = account(starts, ends, None, {1: {"sleep": sleeps}}, {})
    s = summarise(acc)
    assert s["grows_most"] == "sleep"
    tail = s["sets"]["p99"]
    assert tail["requests"] == 20 and tail["exact"] == 20 and tail["apportioned"] == 0
    assert tail["parts"]["sleep"]["median_ms"] == 4.9
    assert tail["parts"]["sleep"]["share"] == 0.98
    assert s["sets"]["all"]["parts"]["sleep"]["median_ms"] == 0.0
    # time per request: 4.9 ms in each of the tail's, 20 x 4.9 ms over all 1000
    assert s["growth_ms"]["sleep"] == pytest.approx(4.9 - 20 * 4.9 / 1000, abs=1e-4)
    assert s["growth_ms"]["sleep"] == max(s["growth_ms"].values())
    assert tail["parts"]["residual"]["max_ms"] == 0.0
    assert set(tail["parts"]) == set(PARTS)


def test_a_part_that_fills_every_request_still_grows_most_when_the_tail_is_more_of_it():
    """On CPU is 80 % of a fast request (80 of 100 us) and 90 % of a slow one (4.5 of 5 ms);
    the run queue 5 % and 10 %. In share the run queue grows as much as on CPU (+5 points
    each, and a fresh-root run named it); in time per request on CPU grows by ~4.4 ms, the
    run queue by ~0.4 ms: on CPU is named."""
    n = 1000
    starts = np.arange(n, dtype=np.int64) * 10_000 * US
    lat = np.full(n, 100 * US, dtype=np.int64)
    slow = np.arange(n) % 50 == 7
    lat[slow] = 5000 * US
    ends = starts + lat
    on = spans(*[(s, s + (4500 if k else 80) * US) for s, k in zip(starts, slow, strict=True)])
    rq = spans(*[(s + (4500 if k else 80) * US, s + (5000 if k else 85) * US)
                 for s, k in zip(starts, slow, strict=True)])
    acc = account(starts, ends, None, {1: {"on_cpu": on, "runq": rq}}, {})
    s = summarise(acc)
    assert s["grows_most"] == "on_cpu", s["growth_ms"]
    assert s["growth_ms"]["on_cpu"] > s["growth_ms"]["runq"] > 0
    # the sentence says what decided: time a request, tail against all (20 x 4.5 ms and
    # 980 x 0.095 ms over 1000 requests: a served thread's time not in a wait is on CPU,
    # 95 of a fast request's 100 us), the shares beside
    assert s["sentence"].startswith(
        "in the 20 requests above the P99 (5.000 ms), on_cpu grows most: 4.500 ms a request "
        "against 0.183 ms over all 1000 (90 % of the tail's time, 92 % over all)"), s["sentence"]


def test_offcpu_lines_and_open_waits_parse():
    from tailgate.diagnose.evidence import parse_events, parse_maps
    from tailgate.probes.output import parse_output

    out = parse_output("\n".join([
        '{"type": "printf", "data": "O 7 1000 500000 230\\nO 7 600000 900000 -1\\n'
        'O 7 9 5 0\\n"}',
        '{"type": "map", "data": {"@oc": {"8": 123456}}}',
        '{"type": "map", "data": {"@osc": {"8": 233}}}']))
    ev = parse_events(list(out.printf))
    assert ev.offcpu == [(7, 1000, 500000, 230), (7, 600000, 900000, -1)]
    assert ev.malformed == 1  # it ended before it began
    assert parse_maps(out).open_waits == {8: (123456, 232)}


def test_a_thread_before_the_probe_first_saw_it_is_residual_not_on_cpu():
    got = one(0, 1000 * US, threads={1: {"unseen": spans((0, 300 * US)),
                                         "sleep": spans((300 * US, 900 * US))}})
    assert got == {"residual": 300 * US, "sleep": 600 * US, "on_cpu": 100 * US}
    # alone and unseen the whole window: nothing served it that the probe saw
    assert one(0, 1000 * US, threads={1: {"unseen": spans((0, 2000 * US))}}) == {
        "residual": 1000 * US}


def test_a_wait_begun_before_the_request_was_sent_is_its_transit():
    # blocked in read from before the send until the request arrived; then a read of its own
    got = one(100 * US, 1000 * US,
              threads={1: {"read": spans((0, 300 * US), (400 * US, 600 * US))}})
    assert got == {"in_transit": 200 * US, "read": 200 * US, "on_cpu": 500 * US}


def test_a_final_wait_is_the_replys_transit_for_the_one_thread_that_served():
    got = one(0, 1000 * US, threads={1: {"read": spans((900 * US, 5000 * US))}})
    assert got == {"on_cpu": 900 * US, "in_transit": 100 * US}


def test_another_threads_return_to_waiting_for_work_is_left_out_and_its_parts_scaled():
    # thread 2 served a request of its own (300 us queued, 200 us on CPU), then waited for more
    acc = account(np.array([0]), np.array([1000 * US]), None, {
        1: {"sleep": spans((0, 800 * US))},
        2: {"runq": spans((0, 300 * US)), "read": spans((500 * US, 5000 * US))}}, {})
    got = {p: int(v[0]) for p, v in acc.parts.items() if v[0]}
    # weights 1000 and 500 us busy; thread 2's 500 us scaled to the 1000 us window
    assert got == {"sleep": 533_333, "runq": 200_000, "on_cpu": 266_667}


def test_a_request_ends_at_its_replys_arrival_and_what_follows_is_none_of_it():
    # sent at 100 us, the reply in the kernel at 600 us (its end: bench's latency ends there,
    # the generator's read after it is in none): a wait of the service's thread after the
    # reply arrived is no part of this request
    acc = account(np.array([0]), np.array([600 * US]), np.array([100 * US]), {7: {
        "runq": spans((200 * US, 300 * US)), "sleep": spans((650 * US, 900 * US))}}, {})
    got = {p: int(v[0]) for p, v in acc.parts.items() if v[0]}
    assert got == {"generator": 100 * US, "runq": 100 * US, "on_cpu": 400 * US}
    assert PARTS[0] == "generator" and "generator_read" not in PARTS


def test_diagnose_ends_each_request_where_bench_does(tmp_path):
    """At the reply's kernel receive stamp where the log has one (the compiled engine),
    else at the read: the latency diagnose explains is bench's."""
    from tailgate.bench.engine_types import LOG_HEADER
    from tailgate.diagnose.analyse import _requests

    log = tmp_path / "run.csv"
    log.write_text(LOG_HEADER + "0,0,0.010,0.0101,0.0102,0.0150,ok,200,10,0,0.0120\n"
                                "0,1,0.020,0.0201,0.0202,0.0250,ok,200,10,0,\n")
    starts, ends, sends, reads = _requests({"clock": {"start_monotonic_s": 100.0}}, str(log))
    base = 100_000_000_000
    assert (ends - base).tolist() == [12_000_000, 25_000_000]
    # the generator's read, which finds the reply's connection among the probe's reads
    assert (reads - base).tolist() == [15_000_000, 25_000_000]
    assert (starts - base).tolist() == [10_000_000, 20_000_000]
    assert (sends - base).tolist() == [10_100_000, 20_100_000]
