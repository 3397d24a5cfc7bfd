"""The compiled fast engine (bench/fastpath.py + fastloop.c) against real servers: it ends a
schedule early on request, stops with every open request abandoned (never counted twice),
measures the same schedule as the Python reference engine within the floor, and without
the extension the CLI says why (``--engine fast``) or falls back with a note (``auto``).

The fault-server, fault, stall-truth and CLI tests run against both engines too
(``engine`` parameters in test_bench_fault_server/faults/stall/cli)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.fault_server import FaultServer
from support.nginx import Nginx, available
from support.require import require
from tailgate.bench import fastpath
from tailgate.bench.result import RunInfo, build_result
from tailgate.bench.target import parse_target
from tailgate.bench.workers import plan, run_here

pytestmark = pytest.mark.timeout(120)
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(autouse=True, scope="module")
def _needs_the_extension_and_nginx():
    # make test builds it (pip install -e .): a missing build is a defect, not a skip
    require(None if fastpath.UNAVAILABLE is None else fastpath.UNAVAILABLE)
    require(available())


@pytest.fixture(scope="module")
def nginx():
    with Nginx(workers=1) as ng:
        yield ng


def engine_for(url: str, rate: float, duration: float, on_progress=None, **info_opts):
    target = parse_target(url)
    info = RunInfo(target=url, protocol=target.kind, rate=rate, duration_s=duration,
                   workers=1, connections=2, max_connections=64, timeout_s=1.0,
                   engine="fast", **info_opts)
    cfg = plan(info, target)[0]
    eng = fastpath.FastEngine(cfg, on_progress)
    eng.prepare()
    return info, cfg, eng


def run_then(info, eng, after_s: float, action):
    """Run ``eng`` from 50 ms from now, calling ``action`` ``after_s`` into the run;
    (its part, the result JSON)."""
    start = time.monotonic() + 0.05
    timer = threading.Timer(0.05 + after_s, action)
    timer.start()
    part = eng.run(start)
    timer.join()
    return part, build_result(info, [part]).json


def test_end_schedule_dispatches_nothing_more_and_abandons_nothing(nginx):
    info, cfg, eng = engine_for(nginx.url("/"), rate=1000, duration=3.0)
    part, data = run_then(info, eng, 0.5, eng.end_schedule)
    req = data["requests"]
    assert data["accounting"] == {"consistent": True, "problems": []}
    # Ended about half a second in: what was dispatched is what was scheduled.
    assert 100 < req["scheduled"] < cfg.times.size
    assert req["scheduled"] == part.dispatched == req["sent"] == req["ok"]
    assert req["abandoned"] == 0 and data["interrupted"] is False


def test_recording_runs_during_the_run_as_an_idle_task(nginx):
    """In-run recording (histograms, progress) happens in a SCHED_IDLE thread, so it never
    takes the core from the loop thread; the final records still all arrive."""
    seen = []
    info, cfg, eng = engine_for(nginx.url("/"), rate=1000, duration=1.5, on_progress=lambda d:
                                seen.append((os.sched_getscheduler(0),
                                             threading.current_thread().name, d["dispatched"])))
    part = eng.run(time.monotonic() + 0.05)
    data = build_result(info, [part]).json
    assert eng.background is True
    assert len(seen) >= 3, seen  # every 0.25 s while the loop ran
    assert {s[0] for s in seen} == {os.SCHED_IDLE}
    assert {s[1] for s in seen} == {"tailgate-recorder-0"}
    assert sum(s[2] for s in seen) < data["requests"]["scheduled"]  # the rest: at the end
    assert data["accounting"] == {"consistent": True, "problems": []}
    assert data["requests"]["ok"] == data["requests"]["scheduled"] == cfg.times.size
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's thread is untouched


def test_stop_abandons_what_is_open_and_counts_nothing_twice():
    with FaultServer("hang", "http") as srv:  # reads requests, never answers
        info, cfg, eng = engine_for(srv.url, rate=200, duration=2.0)
        _, data = run_then(info, eng, 1.5, eng.stop)
    req = data["requests"]
    assert data["interrupted"] is True
    assert data["accounting"] == {"consistent": True, "problems": []}
    assert req["scheduled"] == cfg.times.size == req["sent"] + req["abandoned"]
    # The first 0.5 s timed out after the 1 s time-out; the rest was open or never due.
    assert 50 < req["errors"]["timeout"] == req["sent"] < 150
    assert req["abandoned"] > 200
    assert srv.received >= req["sent"]


# Responses whose every framing element straddles reads: status line, header block,
# chunk-size lines, chunk data and its CRLF, trailer, Content-Length body.
DRIP = {
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: b\r\n\r\n"
                b"5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\nX-Trailer: t\r\n\r\n"),
    "length": b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
    "interim": (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n"
                b"Content-Length: 3\r\n\r\n"),
}


def drip_server(response: bytes, requests: int) -> tuple[int, threading.Thread, list[int]]:
    """Answers each request on one connection with ``response``, one byte per write,
    1 ms apart (separate reads for the client). Returns (port, thread, [responses sent])."""
    import socket

    ls = socket.create_server(("127.0.0.1", 0))
    sent = [0]

    def serve() -> None:
        conn, _ = ls.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        with conn, ls:
            while sent[0] < requests:
                while b"\r\n\r\n" not in buf:
                    more = conn.recv(4096)
                    if not more:
                        return
                    buf += more
                buf = buf.split(b"\r\n\r\n", 1)[1]
                for i in range(len(response)):
                    conn.sendall(response[i:i + 1])
                    time.sleep(0.001)
                sent[0] += 1

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return ls.getsockname()[1], t, sent


@pytest.mark.parametrize("engine", ["fast", "python"])
@pytest.mark.parametrize("kind", sorted(DRIP))
def test_framing_split_at_every_byte(kind, engine):
    port, thread, sent = drip_server(DRIP[kind], requests=3)
    url = f"http://127.0.0.1:{port}/"
    target = parse_target(url)
    # 3 requests 0.4 s apart on one connection: each response has ended before the next
    info = RunInfo(target=url, protocol="http", rate=2.5, duration_s=1.2, workers=1,
                   connections=1, max_connections=1, timeout_s=1.0, engine=engine)
    data = build_result(info, [run_here(plan(info, target)[0])]).json
    thread.join(timeout=5)
    assert data["generator"]["engine"] == engine
    req = data["requests"]
    assert req["ok"] == req["sent"] == sent[0] == 3, (req, data["connections"])
    assert data["connections"]["opened"] == 1 and data["connections"]["errors"] == {}


@pytest.mark.parametrize("engine", ["fast", "python"])
@pytest.mark.parametrize("framing", ["delimiter", "length"])
def test_tcp_framing_split_at_every_byte(framing, engine):
    """A multi-byte delimiter arriving one byte per read (E, N, D... across reads), or a
    fixed length: each response ends exactly once, at its last byte."""
    response = b"pong E-N-D almost END\r\n"
    port, thread, sent = drip_server(response, requests=3)
    url = f"tcp://127.0.0.1:{port}"
    opts = ({"delimiter": b"END\r\n"} if framing == "delimiter"
            else {"response_length": len(response)})
    target = parse_target(url, payload=b"ping\r\n\r\n", **opts)
    info = RunInfo(target=url, protocol="tcp", rate=2.5, duration_s=1.2, workers=1,
                   connections=1, max_connections=1, timeout_s=1.0, engine=engine)
    data = build_result(info, [run_here(plan(info, target)[0])]).json
    thread.join(timeout=5)
    req = data["requests"]
    assert req["ok"] == req["sent"] == sent[0] == 3, (req, data["connections"])
    assert data["connections"]["opened"] == 1 and data["connections"]["errors"] == {}


BLOCKED = ("import runpy, sys; sys.modules['tailgate.bench.fastloop'] = None; "
           "sys.argv = ['tailgate'] + sys.argv[1:]; runpy.run_module('tailgate', "
           "run_name='__main__')")


def test_without_the_extension_fast_is_a_usage_error_and_auto_falls_back(nginx):
    env_cmd = [sys.executable, "-c", BLOCKED, "bench", nginx.url("/"), "--rate", "100",
               "--duration", "0.3s", "--workers", "1", "--quiet", "--json", "-"]
    bad = subprocess.run([*env_cmd, "--engine", "fast"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2, bad.stderr
    assert "--engine fast" in bad.stderr and "fastloop" in bad.stderr
    assert "Traceback" not in bad.stderr
    ok = subprocess.run(env_cmd, capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert data["generator"]["engine"] == "python"
    assert "fastloop" in data["generator"]["engine_note"]
    assert data["requests"]["ok"] == 30


def test_engine_choice_rules():
    assert fastpath.choose("auto", "http") == "fast"
    assert fastpath.choose("auto", "https") == "fast"
    assert fastpath.choose("auto", "tcp") == "fast"
    assert fastpath.choose("python", "http") == "python"
    assert fastpath.choose("auto", "openai+http") == "fast"
    assert fastpath.choose("auto", "openai+https") == "fast"  # OpenSSL in the loop
    assert fastpath.choose("auto", "grpcs") == "python"
    with pytest.raises(fastpath.EngineUnavailable,
                       match="http://, https://, tcp://, openai\\+http://, openai\\+https:// only"):
        fastpath.choose("fast", "grpc")
    with pytest.raises(fastpath.EngineUnavailable, match="must be one of"):
        fastpath.choose("turbo", "http")


def test_engine_fast_is_refused_for_a_grpc_target():
    r = subprocess.run([sys.executable, "-m", "tailgate", "bench",
                        "grpc://127.0.0.1:9/a.B/C", "--engine", "fast", "--rate", "1",
                        "--duration", "1s"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert ("--engine fast speaks http://, https://, tcp://, openai+http://, openai+https:// "
            "only, not grpc:// targets") in r.stderr


@pytest.mark.parametrize(("engine", "rate", "most_us"),
                         [("fast", 50, 500.0), ("fast", 4000, 1e6 / 4000 / 8),
                          ("python", 50, 0.0)])
def test_polling_before_a_due_time_stays_within_its_bounds(nginx, engine, rate, most_us):
    """The compiled loop polls instead of sleeping for the last part of each wait, as long as
    its own timed wake-ups came late (learnt as it runs): at most 500 µs and at most an
    eighth of the gap between two requests (1/rate, constant arrivals), so polling takes at
    most about an eighth of its core; a due time within 10 µs is always polled for, never
    slept to (so the most it polled is at least that). The Python engine never polls."""
    r = subprocess.run([sys.executable, "-m", "tailgate", "bench", nginx.url("/"), "--rate",
                        str(rate), "--arrival", "constant", "--duration", "1s", "--workers",
                        "1", "--engine", engine, "--quiet", "--json", "-"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["requests"]["ok"] == rate
    spin = data["generator"]["spin_us"]
    if engine == "python":
        assert spin == 0.0
    else:
        assert 10.0 <= spin <= most_us + 0.1, data["generator"]  # (0.1 µs: the JSON's)


def test_the_loop_practises_its_wake_ups_before_the_first_request(nginx):
    """Before the first request (the start's lead time) the loop takes timed wake-ups at
    about the schedule's gaps and learns from them how early to wake (it needs 16 to learn
    anything), so the first requests are not sent with no margin at all."""
    info, cfg, eng = engine_for(nginx.url("/"), rate=1000, duration=0.3)
    part = eng.run(time.monotonic() + 0.3)
    st = eng._c.state()
    assert build_result(info, [part]).json["requests"]["ok"] == cfg.times.size
    assert 16 <= st["practiced"] <= 64, st["practiced"]


@pytest.mark.parametrize("coalesce_s", [0.0, 0.002])
def test_coalesced_requests_share_a_wake_up_and_count_the_wait_as_lateness(nginx, coalesce_s):
    """--coalesce: a due request waits up to the window, so one timed wake-up sends every
    request due within it (about four a wake-up here: 2 ms over gaps of 500 µs), and the
    wait is in its lateness. Without it, each request is woken for, on time."""
    info, cfg, eng = engine_for(nginx.url("/"), rate=2000, duration=1.0,
                                coalesce_s=coalesce_s)
    part = eng.run(time.monotonic() + 0.05)
    st = eng._c.state()
    data = build_result(info, [part]).json
    assert data["requests"]["ok"] == cfg.times.size == 2000
    waits = st["waits"] / cfg.times.size
    late50 = data["lateness_ms"]["p50"]
    if coalesce_s:
        assert waits < 0.5, st["waits"]
        assert late50 > 0.5, late50
    else:
        assert waits > 0.9, st["waits"]
        assert late50 < 0.5, late50


@pytest.mark.parametrize("defer_ns", [0, 2_000_000])
def test_replies_wait_for_the_next_send_when_deferred(nginx, monkeypatch, defer_ns):
    """With DEFER_NS past the gap between two requests the loop sleeps to each send without
    being woken by replies (one wake-up a request, not two) and reads them then; every
    request is still ok and timed by its reply's kernel receive stamp. Without it, replies
    wake the loop (nginx answers long before the next send, 500 µs apart)."""
    monkeypatch.setattr(fastpath, "DEFER_NS", defer_ns)
    info, cfg, eng = engine_for(nginx.url("/"), rate=2000, duration=1.0)
    part = eng.run(time.monotonic() + 0.05)
    st = eng._c.state()
    data = build_result(info, [part]).json
    assert data["requests"]["ok"] == cfg.times.size == 2000
    woken = st["woken"] / cfg.times.size  # waits that replies (or connects) ended
    if defer_ns:
        assert woken < 0.1, st["woken"]
    else:
        assert woken > 0.5, st["woken"]
