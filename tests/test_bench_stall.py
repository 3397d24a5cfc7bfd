"""The coordinated-omission test: stall a real nginx with SIGSTOP at known moments.

For an open-loop constant schedule the true latency of the request due at
``t`` is known without measuring it: if ``t`` falls inside a stall
``[a, b)`` the request cannot be answered before ``b``, so its latency is
``b - t`` (plus the server's normal service time, tens of microseconds here,
far below the tolerance); outside every stall it is that normal service time.
Latencies inside one stall are therefore spread evenly over ``(0, b - a]`` —
the distribution a closed-loop tool misses (it sends nothing while stalled).
tailgate's P99 and P999 must match the distribution computed from the stall
windows the test itself timed, within 5 %.

With new connections capped (``max_connections=2``) the requests due during
the stall wait in tailgate's own queue: their latency (from the intended
start) still follows the truth, while their service time (from the actual
send) stays small — the figure a closed-loop tool would have reported.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from support.nginx import Nginx, available
from support.require import require
from tailgate.bench.result import RunInfo, build_result
from tailgate.bench.target import parse_target
from tailgate.bench.workers import plan, run_workers
from tailgate.hist import Histogram


@pytest.fixture(autouse=True, scope="module")
def _needs_nginx():
    require(available())

RATE = 500.0
DURATION = 8.0
STALLS = ((2.0, 0.5), (5.0, 0.5))  # (offset from the start, length) in seconds


def stall_worker(pid: int, start: float, windows: list[tuple[float, float]]) -> None:
    """SIGSTOP/SIGCONT ``pid`` at the planned offsets; record when each really happened."""
    for offset, length in STALLS:
        time.sleep(max(start + offset - time.monotonic(), 0.0))
        os.kill(pid, signal.SIGSTOP)
        a = time.monotonic()
        time.sleep(length)
        b0 = time.monotonic()
        os.kill(pid, signal.SIGCONT)
        windows.append((a, b0))


def true_latency_ns(times: np.ndarray, start: float,
                    windows: list[tuple[float, float]]) -> np.ndarray:
    due = start + times
    lat = np.zeros_like(due)
    for a, b in windows:
        inside = (due >= a) & (due < b)
        lat[inside] = b - due[inside]
    return lat * 1e9


def run_with_stalls(ng: Nginx, max_connections: int, engine: str):
    target = parse_target(ng.url("/"))
    info = RunInfo(target=ng.url("/"), protocol="http", rate=RATE, duration_s=DURATION,
                   workers=1, connections=2, max_connections=max_connections, timeout_s=3.0,
                   engine=engine)
    cfgs = plan(info, target)
    (pid,) = ng.worker_pids()
    windows: list[tuple[float, float]] = []
    threads = []

    def on_start(start: float) -> None:
        t = threading.Thread(target=stall_worker, args=(pid, start, windows), daemon=True)
        t.start()
        threads.append((t, start))

    try:
        parts, interrupted, missing = run_workers(cfgs, on_start=on_start)
    finally:
        os.kill(pid, signal.SIGCONT)
    thread, start = threads[0]
    thread.join(timeout=5)
    assert not interrupted and not missing and len(windows) == len(STALLS)
    result = build_result(info, parts)
    assert result.json["generator"]["engine"] == engine
    truth = Histogram()
    truth.record(true_latency_ns(cfgs[0].times, start, windows))
    return result, truth


def close(observed: float, expected: float, rel: float = 0.05) -> bool:
    return abs(observed - expected) <= rel * expected


@pytest.fixture(params=["python", "fast"])
def engine(request):
    """The stall truth holds for both engines: the compiled fast path and the reference."""
    return request.param


@pytest.fixture(scope="module")
def nginx():
    with Nginx(workers=1) as ng:
        yield ng


def test_open_loop_tail_matches_the_stall_arithmetic(nginx, engine):
    result, truth = run_with_stalls(nginx, max_connections=1024, engine=engine)
    req = result.json["requests"]
    assert req["sent"] == req["scheduled"] == int(RATE * DURATION)
    assert req["ok"] == req["sent"], req["errors"]
    assert result.latency.total == truth.total
    for p in (99.0, 99.9):
        ours, true = result.latency.value_at_percentile(p), truth.value_at_percentile(p)
        print(f"P{p}: tailgate {ours / 1e6:.3f} ms, truth {true / 1e6:.3f} ms, "
              f"error {100 * (ours - true) / true:+.2f} %")
        assert close(ours, true), (p, ours, true)
    # Open connections grew to carry the burst instead of queueing it.
    assert result.json["connections"]["max_open"] > 2


def test_capped_connections_latency_keeps_the_stall_service_time_hides_it(nginx, engine):
    result, truth = run_with_stalls(nginx, max_connections=2, engine=engine)
    req = result.json["requests"]
    assert req["ok"] == req["sent"] == int(RATE * DURATION)
    assert result.json["connections"]["max_open"] <= 2
    assert req["queued"] > 0
    lat99 = result.latency.value_at_percentile(99.0)
    svc99 = result.service.value_at_percentile(99.0)
    true99 = truth.value_at_percentile(99.0)
    print(f"capped: latency P99 {lat99 / 1e6:.3f} ms (truth {true99 / 1e6:.3f} ms), "
          f"service-time P99 {svc99 / 1e6:.3f} ms")
    assert close(lat99, true99)
    # Only the two requests on the wire per stall saw it in their service time.
    assert svc99 < lat99 / 10
    assert any("--max-connections reached" in w for w in result.json["warnings"])
