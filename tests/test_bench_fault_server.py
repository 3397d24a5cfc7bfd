"""Every misbehaviour of tests/support/fault_server against the real client: the client's
``ok`` equals the responses the server completed, its errors are the rest (of the kind the
mode calls for), each ok response was stamped for its own request (the client's test mode
checks it), and bytes nobody asked for are charged to the connection, not a request."""

from __future__ import annotations

from dataclasses import replace

import pytest

from support.accounting import accounted
from support.fault_server import HTTP_MODES, TCP_MODES, FaultServer
from support.tls_certs import Pki
from support.tls_server import OneAnswerTlsServer
from tailgate.bench.conn import Connection
from tailgate.bench.engine import Engine
from tailgate.bench.http1 import Limits
from tailgate.bench.result import RunInfo, build_result
from tailgate.bench.target import parse_target
from tailgate.bench.tls import TlsOptions
from tailgate.bench.workers import plan, run_here

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["python", "fast"])
def engine(request):
    """Every misbehaviour against both engines: the compiled one must match the reference."""
    return request.param

# Small enough that the endless modes hit them at once; far above what the modes send.
LIMITS = Limits(max_header_bytes=64 * 1024, max_body_bytes=1 << 20)
# Generous: on a loaded CI machine a slow answer must not turn into a time-out.
TIMEOUT_S = 2.0


def bench(srv: FaultServer, engine: str, *, rate: float = 20, duration: float = 0.6,
          retry_stale=False, **target_opts) -> dict:
    if srv.mode.endswith("_late"):
        # Its extra bytes come 10 ms after the response: the next request must not be in
        # flight by then (if it were, they would parse as its response and the stamp check
        # would call it a protocol error): 200 ms apart, still 12 requests.
        rate, duration = rate / 4, duration * 4
        srv.last_seq = round(rate * duration) - 1  # its stray would come after the run
    target = parse_target(srv.url, **target_opts)
    info = RunInfo(target=srv.url, protocol=target.kind, rate=rate, duration_s=duration,
                   workers=1, connections=2, max_connections=8, timeout_s=TIMEOUT_S,
                   limits=LIMITS, retry_stale=retry_stale, engine=engine)
    cfg = replace(plan(info, target)[0], check_seq=True)
    data = build_result(info, [run_here(cfg)]).json
    assert data["generator"]["engine"] == engine
    return data


def check(data: dict, srv: FaultServer, kind: str | None) -> dict:
    req = data["requests"]
    assert data["accounting"] == {"consistent": True, "problems": []}, data["accounting"]
    assert req["sent"] == req["scheduled"] == 12 and req["abandoned"] == 0
    assert req["ok"] == srv.completed, (req, srv.completed)
    errors = {k: v for k, v in req["errors"].items() if v}
    assert errors == ({kind: req["sent"] - srv.completed} if kind else {}), req
    if kind:
        assert sum(e["count"] for e in req["error_examples"][kind]) == errors[kind]
        assert kind in "\n".join(data["warnings"]) or req["error_examples"][kind][0]["reason"]
    # Bytes after a complete response: the connection's error, one per extra response.
    assert data["connections"]["errors"].get("protocol", 0) == srv.unsolicited
    return req


@pytest.mark.parametrize("mode", sorted(HTTP_MODES))
def test_http_fault_modes(mode, engine):
    kind, _ = HTTP_MODES[mode]
    with FaultServer(mode, "http") as srv:
        data = bench(srv, engine)
    req = check(data, srv, kind)
    assert srv.received == req["sent"]  # every request reached the server once
    if mode == "wrong_stamp":
        assert req["error_examples"]["protocol"][0]["reason"].startswith(
            "response stamped for request")
    if mode in ("unsolicited", "unsolicited_late"):
        # (the last late one may come after the run ended: the server counts what it sent)
        assert req["ok"] == 12 and srv.unsolicited >= 11
        examples = data["connections"]["error_examples"]["protocol"]
        assert sum(e["count"] for e in examples) == srv.unsolicited
        for e in examples:
            assert e["reason"].endswith("with no request in flight, starting "
                                        "b'HTTP/1.1 200 OK\\r'")
    if mode == "upgrade":
        assert req["error_examples"]["upgrade"][0]["reason"].startswith("101 Switching")
    stale_hint = [w for w in data["warnings"] if "--retry-stale" in w]
    if mode == "stale":  # the way out is named (a server that closes kept-alive connections)
        assert stale_hint == [f"{req['errors']['stale_connection']} request(s) went out on "
                              "kept-alive connections the server had already closed "
                              "(stale_connection): the server closes connections it offered "
                              "to keep; --retry-stale sends each such request again on "
                              "a new connection"]
    else:
        assert stale_hint == []


def test_stale_connections_retried_on_request(engine):
    with FaultServer("stale", "http") as srv:
        data = bench(srv, engine, retry_stale=True)
    req = check(data, srv, None)
    assert req["ok"] == 12 and req["retried"] > 0
    assert srv.received == req["sent"] + req["retried"]  # each retry was a second request
    assert data["config"]["retry_stale"] is True
    assert not [w for w in data["warnings"] if "--retry-stale" in w]


def test_a_stale_retry_goes_on_a_new_connection(engine, tmp_path):
    """Every reused connection is stale (the server answers one request per connection,
    then closes it 40 ms later), and a new connection takes 0.4 s (the TLS handshake
    starts that long after the accept). Three requests 100 ms apart on two connections:
    r2 goes on A once A answered r0 (t 250 ms); A closes at 290, so r2's retry waits for
    a new connection C (ready near 690); B answers r1 at 350 and is free then, but it is
    reused and closes too: the retry must wait for C. (Before the fix B took it, and r2
    ended stale_connection.)"""
    pki = Pki(tmp_path)
    with OneAnswerTlsServer(pki.server_cert, pki.server_key, handshake_delay_s=0.4,
                            answer_delay_s=0.25, close_after_s=0.04) as srv:
        target = parse_target(srv.url(), tls=TlsOptions(cacert=pki.ca))
        info = RunInfo(target=srv.url(), protocol="https", rate=10, duration_s=0.3,
                       workers=1, connections=2, max_connections=2, timeout_s=3.0,
                       retry_stale=True, engine=engine)
        data = build_result(info, [run_here(c) for c in plan(info, target)]).json
    assert data["generator"]["engine"] == engine
    req = accounted(data)
    assert (req["sent"], req["ok"], req["retried"]) == (3, 3, 1), req
    # r2 twice (on A, then on C), each other request once; one answer per connection
    assert (srv.received, srv.answered, data["connections"]["opened"]) == (4, 3, 3)
    # r2's latency runs from its intended time (200 ms): through A's close and C's
    # handshake to C's answer (t >= 290 + 400 + 250)
    assert data["latency_ms"]["max"] >= 740


@pytest.mark.parametrize("mode", sorted(TCP_MODES))
def test_tcp_fault_modes(mode, engine):
    kind, _ = TCP_MODES[mode]
    with FaultServer(mode, "tcp") as srv:
        data = bench(srv, engine, payload=b"ping\n", delimiter=b"\n")
    req = check(data, srv, kind)
    assert srv.received == req["sent"]
    if mode in ("extra_same_write", "extra_late"):
        # The response was still timed: its latency is that of the response, not a time-out.
        assert req["ok"] == 12 and data["latency_ms"]["max"] < TIMEOUT_S * 1000 * 0.99


def test_a_connection_is_never_idle_twice():
    target = parse_target("http://127.0.0.1:9/")
    info = RunInfo(target=target.url, protocol="http", rate=10, duration_s=0.1)
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        engine = Engine(plan(info, target)[0], loop)
        conn = Connection(engine, b"")
        engine._ready(conn, 0.0)
        assert engine.idle == [conn] and conn.idle
        with pytest.raises(AssertionError, match="freed twice"):
            engine._ready(conn, 0.0)
        assert engine.idle == [conn]
    finally:
        loop.close()


def test_cli_reports_each_kind_once_with_examples_and_no_traceback(engine):
    import json
    import subprocess
    import sys

    with FaultServer("upgrade", "http") as srv:
        out = subprocess.run([sys.executable, "-m", "tailgate", "bench", srv.url, "--rate", "20",
                              "--duration", "0.5s", "--workers", "1", "--timeout", "1s",
                              "--engine", engine, "--quiet", "--json", "-"], capture_output=True, text=True,
                             timeout=60, check=False)
    assert out.returncode == 1, out.stderr  # no request succeeded: a failed run, SLO or not
    assert "no request succeeded (10 sent: 10 upgrade" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "Fatal error" not in out.stderr, out.stderr
    data = json.loads(out.stdout)
    assert data["requests"]["errors"]["upgrade"] == data["requests"]["sent"] == 10
    assert data["requests"]["ok"] == 0
    # The summary (on stderr with --json -) names the kind with an example reason, once.
    line = ("  upgrade: 101 Switching Protocols (to websocket) without an upgrade request (x10)")
    assert out.stderr.count(line) == 1, out.stderr
    assert "errors: upgrade 10" in out.stderr


def test_a_bookkeeping_error_shows_in_the_accounting(engine):
    with FaultServer("ok", "http") as srv:
        target = parse_target(srv.url)
        info = RunInfo(target=srv.url, protocol="http", rate=20, duration_s=0.3, workers=1,
                       connections=1, timeout_s=TIMEOUT_S, engine=engine)
        part = run_here(plan(info, target)[0])
    good = build_result(info, [part]).json
    assert good["accounting"]["consistent"] and good["requests"]["sent"] == 6
    part.sent += 1  # as if one request had been counted twice
    bad = build_result(info, [part]).json
    assert bad["accounting"]["consistent"] is False
    assert bad["accounting"]["problems"] == ["scheduled 6 != sent 7 + abandoned 0",
                                             "sent 7 != ok 6 + errors 0",
                                             "latency count 6 != sent 7"]
    assert any(w.startswith("accounting does not add up") for w in bad["warnings"])


def test_cli_limits_and_retry_flags_reach_the_run(engine):
    import json
    import subprocess
    import sys

    with FaultServer("endless_header", "http") as srv:
        out = subprocess.run([sys.executable, "-m", "tailgate", "bench", srv.url, "--rate", "10",
                              "--duration", "0.3s", "--workers", "1", "--timeout", "2s",
                              "--max-header-bytes", "64KiB", "--retry-stale", "--quiet",
                              "--engine", engine,
                              "--json", "-"], capture_output=True, text=True, timeout=60,
                             check=False)
    assert out.returncode == 1, out.stderr  # every request too_large: none succeeded
    data = json.loads(out.stdout)
    assert data["config"]["limits"]["max_header_bytes"] == 65536
    assert data["config"]["retry_stale"] is True
    assert not [w for w in data["warnings"] if "--retry-stale" in w]
    assert data["requests"]["error_examples"]["too_large"] == [
        {"reason": "header block exceeds 65536 bytes", "count": 3}]
    bad = subprocess.run([sys.executable, "-m", "tailgate", "bench", srv.url, "--rate", "1",
                          "--duration", "1s", "--max-body-bytes", "10"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--max-body-bytes must be at least 64 bytes" in bad.stderr
