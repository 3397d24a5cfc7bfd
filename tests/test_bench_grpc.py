"""grpc:// and grpcs:// against a real grpcio server, and an h2 server that breaks the
protocol on purpose (RST_STREAM, GOAWAY, missing grpc-status, cut messages)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.accounting import accounted
from support.accounting import only_error as _only_error
from support.grpc_servers import SLEEP_S, Counter, H2Misbehaving, grpcio_server
from support.tls_certs import Pki
from tailgate.bench.engine_types import LOG_HEADER
from tailgate.bench.grpc import CallReader
from tailgate.bench.http1 import FramingError, Limits
from tailgate.bench.outcome import GRPC_STATUS, OK, PROTOCOL
from tailgate.bench.result import RunInfo, build_result, read_log
from tailgate.bench.target import TargetError, grpc_frame, parse_target
from tailgate.bench.tls import TlsOptions
from tailgate.bench.workers import plan, run_here

pytestmark = [pytest.mark.timeout(120)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def only_error(req: dict) -> tuple[str, str]:
    return _only_error(req, every_request=True)  # each run here ends every request alike


@pytest.fixture(scope="module")
def server():
    srv, port = grpcio_server()
    yield port
    srv.stop(0)


def bench(url: str, body: bytes = b"hello", rate: float = 100, duration: float = 0.5,
          connections: int = 2, tls: TlsOptions | None = None, log: str | None = None,
          limits: Limits | None = None, headers=(), max_connections: int = 32,
          timeout: float = 2.0) -> dict:
    target = parse_target(url, body=body, tls=tls, headers=list(headers))
    info = RunInfo(target=url, protocol=target.scheme, rate=rate, duration_s=duration,
                   workers=1, connections=connections, max_connections=max_connections,
                   timeout_s=timeout,
                   limits=limits or Limits())
    cfgs = plan(info, target, [log] if log else None)
    return build_result(info, [run_here(c) for c in cfgs]).json


def test_unary_calls_succeed(server):
    data = bench(f"grpc://127.0.0.1:{server}/test.Svc/Echo")
    req = accounted(data)
    assert req["ok"] == req["sent"] == 50
    assert data["protocol"] == "grpc"
    assert data["connections"]["connect_ms"]["count"] == data["connections"]["opened"]
    assert "handshake_ms" not in data["connections"]  # cleartext h2c


def test_non_zero_grpc_status_is_an_error_with_its_code(server, tmp_path):
    log = str(tmp_path / "log.csv")
    req = accounted(bench(f"grpc://127.0.0.1:{server}/test.Svc/Fail", log=log))
    assert only_error(req) == ("grpc_status", "grpc-status 5 NOT_FOUND: no such thing")
    with open(log, encoding="ascii") as f:
        cols = read_log(LOG_HEADER + f.read())  # a worker's part: rows without the header
    assert set(cols["outcome"]) == {"grpc_status"} and set(cols["status"].tolist()) == {5}


def test_unknown_method_is_unimplemented(server):
    req = accounted(bench(f"grpc://127.0.0.1:{server}/test.Svc/Nope"))
    kind, reason = only_error(req)
    assert kind == "grpc_status" and reason.startswith("grpc-status 12 UNIMPLEMENTED")


def test_latency_agrees_with_the_servers_sleep(server):
    data = bench(f"grpc://127.0.0.1:{server}/test.Svc/Sleep", rate=20, duration=1.0)
    req = accounted(data)
    assert req["ok"] == 20
    ms = SLEEP_S * 1e3
    for key in ("service_time_ms", "latency_ms"):
        assert ms <= data[key]["p50"] <= ms * 1.5, (key, data[key])
        assert data[key]["max"] >= ms


def test_call_slower_than_the_timeout_is_a_timeout(server):
    # a connection ready for each of the 10 calls: none waits for one (a loaded machine
    # opens connections slowly, and a call that waited would time out queued instead)
    data = bench(f"grpc://127.0.0.1:{server}/test.Svc/Sleep", rate=20, duration=0.5,
                 timeout=SLEEP_S / 2, connections=10)
    req = accounted(data)
    kind, reason = only_error(req)
    assert kind == "timeout" and "no complete response" in reason
    assert data["latency_ms"]["max"] == pytest.approx(SLEEP_S / 2 * 1e3, rel=0.01)


def test_large_messages_both_ways_pass_flow_control(server):
    counter = Counter()
    srv, port = grpcio_server(counter=counter)
    try:
        big = bytes(range(256)) * 4096  # 1 MiB: 16 times HTTP/2's initial 64 KiB window
        req = accounted(bench(f"grpc://127.0.0.1:{port}/test.Svc/Count", body=big, rate=20,
                              headers=[("X-Tenant", "blue")]))
        assert req["ok"] == 10 and counter.calls == 10 and counter.bytes == 10 * len(big)
        assert counter.metadata["x-tenant"] == "blue"  # -H is call metadata
    finally:
        srv.stop(0)
    data = bench(f"grpc://127.0.0.1:{server}/test.Svc/Echo", body=big, rate=20)
    assert accounted(data)["ok"] == 10  # a 1 MiB answer, every call


def test_response_larger_than_the_limit_is_too_large(server):
    req = accounted(bench(f"grpc://127.0.0.1:{server}/test.Svc/Echo", body=b"x" * 1000,
                          rate=20, limits=Limits(max_body_bytes=100)))
    assert only_error(req) == ("too_large", "gRPC message of 1000 bytes (limit 100)")


def test_grpcs_verifies_and_times_the_handshake(tmp_path):
    pki = Pki(tmp_path)
    srv, port = grpcio_server(tls=(pki.server_cert, pki.server_key))
    try:
        url = f"grpcs://127.0.0.1:{port}/test.Svc/Echo"
        data = bench(url, tls=TlsOptions(cacert=pki.ca))
        req = accounted(data)
        assert req["ok"] == 50 and data["protocol"] == "grpcs"
        assert data["connections"]["handshake_ms"]["count"] == data["connections"]["opened"]
        kind, reason = only_error(accounted(bench(url)))
        assert kind == "tls" and "certificate verify failed" in reason
    finally:
        srv.stop(0)


@pytest.fixture(scope="module")
def bad():
    with H2Misbehaving() as srv:
        yield srv


@pytest.mark.parametrize(("method", "kind", "reason"), [
    ("Reset", "reset", "RST_STREAM CANCEL on the call"),
    ("GoAway", "reset", "GOAWAY ENHANCE_YOUR_CALM: too many calls"),
    ("NoStatus", "protocol", "the response ended without grpc-status"),
    ("Http503", "status_5xx", "HTTP 503 to a gRPC call"),
    ("TwoMessages", "protocol", "a unary response with 2 messages"),
    ("Cut", "protocol", "the stream ended inside a gRPC message"),
    ("Html", "protocol", "content-type 'text/html', not application/grpc"),
])
def test_broken_answers_are_errors_with_reasons(bad, method, kind, reason):
    req = accounted(bench(bad.url(method), rate=40))
    assert only_error(req) == (kind, reason)


def test_header_list_over_the_limit_is_too_large(bad):
    assert accounted(bench(bad.url("BigHeaders"), rate=40))["ok"] == 20
    req = accounted(bench(bad.url("BigHeaders"), rate=40, limits=Limits(max_header_bytes=1024)))
    kind, reason = only_error(req)
    assert kind == "too_large" and "1024" in reason, reason


def test_stream_reset_keeps_the_connection_goaway_retires_it(bad):
    # one connection at most: a call that closes it makes the next call open another
    def one_conn(method: str) -> tuple[dict, int]:
        data = bench(bad.url(method), rate=10, connections=1, max_connections=1)
        return accounted(data), data["connections"]["opened"]

    req, opened = one_conn("Reset")
    assert req["errors"]["reset"] == 5 and opened == 1  # RST_STREAM ends the call only
    req, opened = one_conn("Graceful")
    assert req["ok"] == 5 and opened == 5  # GOAWAY NO_ERROR: the call completes, the
    req, opened = one_conn("Ok")           # connection is not reused
    assert req["ok"] == 5 and opened == 1


def test_call_reader_frames_byte_by_byte():
    body = grpc_frame(b"hello")
    for chunks in ([body], [body[i:i + 1] for i in range(len(body))]):
        r = CallReader(1 << 20)
        r.headers([(b":status", b"200"), (b"content-type", b"application/grpc+proto")])
        for c in chunks:
            r.data(c)
        assert r.messages == 1
        r.trailers([(b"grpc-status", b"0")])
        assert r.end() == (OK, 0, "")
    r = CallReader(1 << 20)
    r.headers([(b":status", b"200"), (b"content-type", b"application/grpc"),
               (b"grpc-status", b"14"), (b"grpc-message", b"down%20for%20maintenance")])
    assert r.end() == (GRPC_STATUS, 14, "grpc-status 14 UNAVAILABLE: down for maintenance")
    r = CallReader(1 << 20)
    with pytest.raises(FramingError, match="flag 7"):
        r.data(b"\x07\x00\x00\x00\x01x")
    r = CallReader(1 << 20)
    r.headers([(b":status", b"200"), (b"content-type", b"application/grpc")])
    r.trailers([(b"grpc-status", b"abc")])
    assert r.end()[0] == GRPC_STATUS  # a malformed code is not OK
    r = CallReader(1 << 20)
    r.headers([(b":status", b"200"), (b"content-type", b"application/grpc")])
    assert r.end() == (PROTOCOL, 0, "the response ended without grpc-status")


def test_grpc_targets_are_checked():
    t = parse_target("grpc://127.0.0.1:50051/helloworld.Greeter/SayHello", body=b"\x0a\x01x",
                     headers=[("X-Tenant", "a")])
    assert (t.kind, t.scheme, t.path, t.tls) == ("grpc", "grpc", "/helloworld.Greeter/SayHello",
                                                 None)
    assert t.request == b"\x00\x00\x00\x00\x03\x0a\x01x" and t.metadata == (("x-tenant", "a"),)
    assert parse_target("grpcs://h/a.B/C").tls.alpn == ("h2",)
    assert parse_target("grpcs://h/a.B/C").port == 443
    for url, opts in [("grpc://h/a.B/C", {}),  # cleartext gRPC has no default port
                      ("grpc://h:1/", {}), ("grpc://h:1/a.B", {}), ("grpc://h:1/a.B/C/D", {}),
                      ("grpc://h:1/a.B/C", {"method": "PUT"}),
                      ("grpc://h:1/a.B/C", {"headers": [("content-type", "x")]}),
                      ("grpc://h:1/a.B/C", {"headers": [("te", "x")]}),
                      ("grpc://h:1/a.B/C", {"headers": [("x-a", "\x00")]}),
                      ("grpc://h:1/a.B/C", {"headers": [("x-a", "\u20ac")]}),
                      ("grpc://h:1/a.B/C", {"payload": b"x"}),
                      ("grpc://h:1/a.B/C", {"tls": TlsOptions(insecure=True)})]:
        with pytest.raises(TargetError):
            parse_target(url, **opts)


def test_cli_end_to_end(server, tmp_path):
    msg = tmp_path / "req.bin"
    msg.write_bytes(b"\x0a\x05world")  # a serialized message: field 1, "world"
    out, log = tmp_path / "r.json", tmp_path / "log.csv"
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "src")}
    p = subprocess.run(
        [sys.executable, "-m", "tailgate", "bench", f"grpc://127.0.0.1:{server}/test.Svc/Fail",
         "--body-file", str(msg), "--rate", "100", "--duration", "0.5s", "--workers", "2",
         "--quiet", "--json", str(out), "--log", str(log), "--slo", "error_rate<1%"],
        capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1, p.stderr  # every call failed: the SLO fails
    data = json.loads(out.read_text())
    assert only_error(accounted(data)) == ("grpc_status", "grpc-status 5 NOT_FOUND: no such thing")
    cols = read_log(log.read_text())
    assert len(cols["status"]) == 50 and set(cols["status"].tolist()) == {5}
    assert "grpc_status: grpc-status 5 NOT_FOUND: no such thing (x50)" in p.stdout
