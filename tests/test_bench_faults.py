"""Faults against real servers: every request accounted for, the run ends on time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from support.accounting import accounted
from support.nginx import Nginx, available, free_port
from support.require import require
from tailgate.bench.result import RunInfo, build_result
from tailgate.bench.target import parse_target
from tailgate.bench.workers import plan, run_here, run_workers

# The run must end on its own (duration + time-out): a hang fails by this time-out.
pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(autouse=True, scope="module")
def _needs_nginx():
    require(available())


@pytest.fixture(params=["python", "fast"])
def engine(request):
    """Both engines: the compiled fast path and the Python reference."""
    return request.param


def bench(url: str, rate: float, duration: float, engine: str, timeout: float = 1.0,
          workers: int = 1, max_connections: int = 64, in_process: bool = True, on_start=None,
          **target_opts):
    target = parse_target(url, **target_opts)
    info = RunInfo(target=url, protocol=target.kind, rate=rate, duration_s=duration,
                   workers=workers, connections=2, max_connections=max_connections,
                   timeout_s=timeout, engine=engine)
    cfgs = plan(info, target)
    if in_process and workers == 1 and on_start is None:
        parts = [run_here(cfgs[0])]
    else:
        parts, interrupted, missing = run_workers(cfgs, on_start=on_start)
        assert not interrupted and not missing
    data = build_result(info, parts).json
    assert data["generator"]["engine"] == engine
    return data


def test_port_nobody_listens_on_gives_connect_errors(engine):
    url = f"http://127.0.0.1:{free_port()}/"
    data = bench(url, rate=200, duration=1.0, engine=engine)
    req = accounted(data)
    assert req["errors"]["connect"] == req["sent"] == 200
    assert data["service_time_ms"]["count"] == 0  # nothing ever reached a wire
    assert data["connections"]["connect_failures"] >= 200


def test_connect_errors_of_several_workers_are_summed_by_reason(engine):
    url = f"http://127.0.0.1:{free_port()}/"
    data = bench(url, rate=200, duration=1.0, engine=engine, workers=2, in_process=False)
    req = accounted(data)
    assert req["errors"]["connect"] == 200
    (ex,) = req["error_examples"]["connect"]  # one reason, both workers' counts summed
    assert ex["count"] == 200 and "refused" in ex["reason"].lower()
    (attempts,) = data["generator"]["connect_errors"]
    assert attempts["reason"] == ex["reason"]
    assert attempts["count"] == data["connections"]["connect_failures"] >= 200


@pytest.fixture(scope="module")
def nginx():
    with Nginx(workers=1) as ng:
        yield ng


@pytest.mark.parametrize(("path", "kind"), [("/500", "status_5xx"), ("/404", "status_4xx")])
def test_error_statuses_are_counted_by_class(nginx, path, kind, engine):
    data = bench(nginx.url(path), rate=300, duration=1.0, engine=engine)
    req = accounted(data)
    assert req["errors"][kind] == req["sent"] == 300 and req["ok"] == 0
    # They are answers: they have a service time.
    assert data["service_time_ms"]["count"] == 300


def test_server_slower_than_the_time_out_gives_time_outs_at_the_time_out(engine):
    with Nginx(workers=1) as ng:
        (pid,) = ng.worker_pids()
        os.kill(pid, signal.SIGSTOP)  # accepts (kernel backlog) but never answers
        try:
            data = bench(ng.url("/"), rate=100, duration=1.0, engine=engine, timeout=0.3)
        finally:
            os.kill(pid, signal.SIGCONT)
    req = accounted(data)
    assert req["errors"]["timeout"] == req["sent"] == 100
    lat = data["latency_ms"]
    # Recorded at the time-out, never dropped: every latency is 300 ms (bucket precision).
    assert 299.0 <= lat["p50"] <= 301.0 and 299.0 <= lat["max"] <= 301.0


def test_server_killed_mid_run_gives_errors_not_a_crash(engine):
    with Nginx(workers=1) as ng:
        killer = threading.Timer(0.0, lambda: None)

        def on_start(start: float) -> None:
            nonlocal killer
            killer = threading.Timer(max(start + 1.0 - time.monotonic(), 0.0), ng.kill)
            killer.start()

        data = bench(ng.url("/"), rate=300, duration=2.5, engine=engine, timeout=1.0, on_start=on_start)
        killer.join()
    req = accounted(data)
    assert req["ok"] > 100  # the first second was served
    # The rest failed as connection errors (a request already on a kept-alive connection
    # when the server died is a stale_connection).
    after = req["errors"]["connect"] + req["errors"]["reset"] + req["errors"]["stale_connection"]
    assert after > 100
    assert req["ok"] + after + req["errors"]["timeout"] == req["sent"] == 750


def test_tcp_delimiter_and_length_against_nginx(nginx, engine):
    payload = b"GET /tcp HTTP/1.1\r\nHost: x\r\n\r\n"
    url = f"tcp://127.0.0.1:{nginx.port}"
    data = bench(url, rate=300, duration=1.0, engine=engine, payload=payload, delimiter=b"pong\n")
    req = accounted(data)
    assert req["ok"] == 300
    import socket

    with socket.create_connection(("127.0.0.1", nginx.port)) as s:
        s.sendall(payload)
        buf = b""
        while not buf.endswith(b"pong\n"):
            buf += s.recv(4096)
    data = bench(url, rate=300, duration=1.0, engine=engine, payload=payload, response_length=len(buf))
    assert accounted(data)["ok"] == 300
    # One byte short: every response is complete (and timed) one byte early; the byte
    # after it is the connection's protocol error, never the next request's.
    data = bench(url, rate=100, duration=1.0, engine=engine, payload=payload, response_length=len(buf) - 1)
    req = accounted(data)
    assert req["ok"] == 100
    assert data["connections"]["errors"] == {"protocol": 100}
    (ex,) = data["connections"]["error_examples"]["protocol"]
    assert ex["count"] == 100 and "1 byte(s) after the complete response" in ex["reason"]


def test_two_workers_split_the_schedule_and_merge_exactly(nginx, engine):
    data = bench(nginx.url("/"), rate=400, duration=1.5, engine=engine, workers=2, in_process=False)
    req = accounted(data)
    assert req["ok"] == 600
    assert data["generator"]["workers"] == 2


@pytest.mark.parametrize("arrival", ["constant", "poisson"])
def test_batched_dispatch_at_high_rate_never_sends_early(nginx, tmp_path, arrival, engine):
    """Above 1/MIN_TICK_S per worker the timer ticks and sends in batches: each request
    still leaves at or after its intended time, and every one is accounted."""
    from tailgate.bench.engine import MIN_TICK_S
    from tailgate.bench.engine_types import EngineConfig
    from tailgate.bench.result import merge_logs, read_log
    from tailgate.bench.schedule import arrival_times

    rate = 2.0 / MIN_TICK_S  # two requests per tick
    part = tmp_path / "log.part"
    cfg = EngineConfig(target=parse_target(nginx.url("/")),
                       times=arrival_times(rate, 0.5, arrival), connections=8,
                       max_connections=256, timeout_s=2.0, log_path=str(part), engine=engine)
    res = run_here(cfg)
    assert sum(res.counts) == res.scheduled == cfg.times.size
    with open(tmp_path / "log.csv", "w") as f:
        merge_logs(f, [str(part)])
    cols = read_log((tmp_path / "log.csv").read_text())
    assert cols["id"].size == cfg.times.size
    assert np.all(cols["dispatch_s"] >= cols["intended_s"] - 1e-9)  # 9-decimal log
    wire = ~np.isnan(cols["send_s"])  # a request that timed out queued was never sent
    assert np.all(cols["send_s"][wire] >= cols["dispatch_s"][wire])


def test_a_run_in_which_nothing_succeeded_exits_1_without_an_slo_and_says_why():
    url = f"http://127.0.0.1:{free_port()}/"
    r = subprocess.run([sys.executable, "-m", "tailgate", "bench", url, "--rate", "50",
                        "--duration", "0.5s", "--workers", "1", "--quiet", "--json", "-"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    sent = json.loads(r.stdout)["requests"]["sent"]
    assert f"tailgate bench: no request succeeded ({sent:,} sent: {sent:,} connect; e.g. " \
           in r.stderr and "refused" in r.stderr.lower()
