"""https:// against real TLS servers on loopback: nginx with a certificate the test makes
(trustme), and a small Python TLS server for a delayed handshake and a client
certificate required in the handshake."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections import Counter

import pytest

from support.accounting import accounted, only_error
from support.client_hello import HelloCatcher, parse
from support.nginx import Nginx, available
from support.require import require
from support.tls_certs import Pki
from support.tls_server import TlsServer
from tailgate.bench.result import RunInfo, build_result
from tailgate.bench.target import TargetError, parse_target
from tailgate.bench.tls import TlsError, TlsOptions, client_context
from tailgate.bench.workers import plan, run_here

pytestmark = [pytest.mark.timeout(120)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def locations(pki: Pki, extra: str = "") -> str:
    return f"""
    ssl_certificate {pki.server_cert};
    ssl_certificate_key {pki.server_key};
    {extra}
    location = /    {{ return 200 "hello\\n"; }}
    location = /sni {{ if ($ssl_server_name != "localhost") {{ return 421; }} return 200 "ok\\n"; }}
    """


@pytest.fixture(scope="module")
def nginx(pki):
    require(available())
    with Nginx(locations=locations(pki), listen_options="ssl") as ng:
        yield ng


@pytest.fixture(scope="module")
def nginx_mtls(pki):
    require(available())
    verify = f"ssl_client_certificate {pki.ca}; ssl_verify_client on;"
    with Nginx(locations=locations(pki, verify), listen_options="ssl") as ng:
        yield ng


@pytest.fixture(params=["python", "fast"])
def engine(request):
    """Both engines: OpenSSL in the compiled loop and the stdlib's ssl in the Python one,
    held to the same outcomes, reasons and timings."""
    return request.param


def bench(url: str, tls: TlsOptions | None, engine: str, rate: float = 100,
          duration: float = 0.5, connections: int = 2) -> dict:
    target = parse_target(url, tls=tls)
    info = RunInfo(target=url, protocol=target.scheme, rate=rate, duration_s=duration,
                   workers=1, connections=connections, max_connections=16, timeout_s=2.0,
                   engine=engine)
    data = build_result(info, [run_here(c) for c in plan(info, target)]).json
    assert data["generator"]["engine"] == (engine if engine != "auto" else "python")
    return data


def https(ng: Nginx, path: str = "/") -> str:
    return f"https://127.0.0.1:{ng.port}{path}"


def test_untrusted_certificate_is_a_tls_error_with_the_reason(nginx, engine):
    data = bench(https(nginx), None, engine=engine)  # the system's CAs do not know the test CA
    req = accounted(data)
    assert req["ok"] == 0 and req["errors"]["tls"] == req["sent"] == 50
    kind, reason = only_error(req)
    assert reason == "TLS: certificate verify failed: unable to get local issuer certificate"
    assert data["connections"]["opened"] == 0
    assert data["service_time_ms"]["count"] == 0  # nothing was ever sent
    assert data["connections"]["handshake_ms"]["count"] == 0


def test_insecure_skips_verification(nginx, engine):
    req = accounted(bench(https(nginx), TlsOptions(insecure=True), engine=engine))
    assert req["ok"] == req["sent"] == 50


def test_cacert_verifies_and_handshakes_are_timed_apart(nginx, pki, engine):
    data = bench(https(nginx), TlsOptions(cacert=pki.ca), engine=engine)
    req = accounted(data)
    assert req["ok"] == 50
    conns = data["connections"]
    # every connection opened was timed twice: TCP connect and TLS handshake
    assert conns["connect_ms"]["count"] == conns["handshake_ms"]["count"] == conns["opened"] >= 2
    assert conns["handshake_ms"]["p50"] > 0 and conns["connect_ms"]["p50"] > 0
    assert data["protocol"] == "https"


def test_name_verified_is_the_sni_name(nginx, pki, engine):
    # the certificate is for localhost and 127.0.0.1: a name it lacks fails verification
    req = accounted(bench(https(nginx), TlsOptions(cacert=pki.ca, sni="wrong.example"), engine=engine))
    kind, reason = only_error(req)
    assert kind == "tls" and "Hostname mismatch" in reason and "wrong.example" in reason


def test_sni_is_sent(nginx, pki, engine):
    # nginx answers /sni with 421 unless the client sent SNI "localhost"
    req = accounted(bench(https(nginx, "/sni"), TlsOptions(cacert=pki.ca), engine=engine))
    assert req["errors"]["status_4xx"] == 50  # an IP address is never sent as SNI
    req = accounted(bench(https(nginx, "/sni"), TlsOptions(cacert=pki.ca, sni="localhost"), engine=engine))
    assert req["ok"] == 50


def test_client_certificate(nginx_mtls, pki, engine):
    url = https(nginx_mtls)
    req = accounted(bench(url, TlsOptions(cacert=pki.ca), engine=engine))
    assert req["errors"]["status_4xx"] == 50  # nginx: 400 "No required SSL certificate"
    req = accounted(bench(url, TlsOptions(cacert=pki.ca, cert=pki.client_cert,
                                          key=pki.client_key), engine=engine))
    assert req["ok"] == 50
    req = accounted(bench(url, TlsOptions(cacert=pki.ca, cert=pki.client_combined), engine=engine))
    assert req["ok"] == 50
    req = accounted(bench(url, TlsOptions(cacert=pki.ca, cert=pki.other_client_cert,
                                          key=pki.other_client_key), engine=engine))
    assert req["errors"]["status_4xx"] == 50  # a certificate from a CA nginx does not trust


def refused(req: dict, alert: str) -> None:
    """Every request failed on the server's TLS alert, or on the RST that can overtake it
    (the server closes with our request unread, and Linux then drops the alert)."""
    assert req["ok"] == 0 and req["errors"]["tls"] + req["errors"]["reset"] == req["sent"]
    assert req["errors"]["tls"] >= req["sent"] // 2, req
    assert req["error_examples"]["tls"] == [{"reason": alert, "count": req["errors"]["tls"]}]


def test_client_certificate_required_in_the_handshake(pki, engine):
    with TlsServer(pki.server_cert, pki.server_key, client_ca=pki.ca) as srv:
        req = accounted(bench(srv.url(), TlsOptions(cacert=pki.ca), rate=40, engine=engine))
        refused(req, "TLS: tlsv13 alert certificate required")
        req = accounted(bench(srv.url(), TlsOptions(cacert=pki.ca, cert=pki.other_client_cert,
                                                    key=pki.other_client_key), rate=40, engine=engine))
        refused(req, "TLS: tlsv1 alert unknown ca")
        req = accounted(bench(srv.url(), TlsOptions(cacert=pki.ca, cert=pki.client_cert,
                                                    key=pki.client_key), rate=40, engine=engine))
        assert req["ok"] == req["sent"] == 20


def test_sslkeylogfile_is_honoured_by_both_engines(pki, engine, tmp_path, monkeypatch):
    """SSLKEYLOGFILE (which ssl.create_default_context reads): each connection's TLS 1.3
    secrets, one line each, from either engine (what Wireshark needs to decrypt a capture)."""
    keys = tmp_path / "keys.log"
    monkeypatch.setenv("SSLKEYLOGFILE", str(keys))
    with TlsServer(pki.server_cert, pki.server_key) as srv:  # (Python's: TLS 1.3)
        data = bench(srv.url(), TlsOptions(cacert=pki.ca), engine, rate=20, connections=2)
    assert accounted(data)["ok"] == 10
    labels = Counter(line.split()[0] for line in keys.read_text().splitlines()
                     if not line.startswith("#"))
    opened = data["connections"]["opened"]
    assert opened >= 1 and labels == {label: opened for label in (
        "CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_HANDSHAKE_TRAFFIC_SECRET",
        "CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0", "EXPORTER_SECRET")}


def test_handshake_counts_in_latency_of_who_waited_never_in_service_time(pki, engine):
    delay = 0.2  # the server starts each handshake this long after the TCP accept
    with TlsServer(pki.server_cert, pki.server_key, handshake_delay_s=delay) as srv:
        # no connection opened in advance: the first request waits for connect + handshake
        data = bench(srv.url(), TlsOptions(cacert=pki.ca), rate=20, duration=0.5,
                     connections=0, engine=engine)
    req = accounted(data)
    assert req["ok"] == 10
    conns = data["connections"]
    assert conns["handshake_ms"]["count"] == conns["opened"] >= 1
    assert conns["handshake_ms"]["p50"] >= delay * 1e3  # the delay is in the handshake
    assert conns["connect_ms"]["max"] < delay * 1e3  # and not in the TCP connect
    assert data["latency_ms"]["max"] >= delay * 1e3  # who waited has it in its latency
    assert data["service_time_ms"]["max"] < delay * 1e3  # nobody has it in service time


def test_grpcs_to_a_server_without_http2_is_a_tls_error(nginx, pki):
    # nginx here speaks HTTP/1.1 only: OpenSSL refuses our ALPN "h2" in the handshake
    data = bench(f"grpcs://127.0.0.1:{nginx.port}/a.B/C", TlsOptions(cacert=pki.ca), rate=20, engine="python")
    assert only_error(accounted(data)) == ("tls", "TLS: tlsv1 alert no application protocol")


def test_handshake_past_the_timeout_is_a_tls_error(pki, engine):
    with TlsServer(pki.server_cert, pki.server_key, handshake_delay_s=1.0) as srv:
        target = parse_target(srv.url(), tls=TlsOptions(cacert=pki.ca))
        info = RunInfo(target=srv.url(), protocol="https", rate=10, duration_s=0.5,
                       connections=1, max_connections=8, timeout_s=0.3, engine=engine)
        data = build_result(info, [run_here(c) for c in plan(info, target)]).json
    req = accounted(data)
    assert req["ok"] == 0
    # a request whose connection attempt gave up first is tls; one the sweep reached
    # first (still queued at its time-out) is a timeout
    assert req["errors"]["tls"] + req["errors"]["timeout"] == req["sent"] == 5
    assert req["errors"]["tls"] >= 1
    assert req["error_examples"]["tls"] == [{"reason": "TLS: handshake timed out",
                                             "count": req["errors"]["tls"]}]


def test_a_server_that_closes_in_the_handshake_is_a_tls_error(engine):
    """A server that reads the client hello and closes (FIN): every attempt is tls, in the
    same words on both engines."""
    ls = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):  # (the listener is closed at the end)
            while True:
                conn, _ = ls.accept()
                with conn:
                    conn.recv(65536)

    threading.Thread(target=serve, daemon=True).start()
    try:
        data = bench(f"https://127.0.0.1:{ls.getsockname()[1]}/", TlsOptions(insecure=True),
                     engine, rate=10, connections=0)
    finally:
        ls.close()
    req = accounted(data)
    assert req["errors"]["tls"] == req["sent"] == 5
    assert req["error_examples"]["tls"] == [
        {"reason": "TLS: the server closed the connection during the handshake (EOF)",
         "count": 5}]
    assert data["connections"]["opened"] == 0


def test_tls_options_are_checked(pki, tmp_path):
    with pytest.raises(TargetError, match=r"--insecure --sni does not apply to http:// "
                                          r"targets \(it is for https://, grpcs://"):
        parse_target("http://127.0.0.1:1/", tls=TlsOptions(insecure=True, sni="x"))
    assert parse_target("https://example.test/").port == 443
    t = parse_target("https://127.0.0.1:8443/", tls=TlsOptions(cacert=pki.ca))
    assert t.tls.alpn == ("http/1.1",) and t.scheme == "https" and t.kind == "http"
    with pytest.raises(TlsError, match="--cacert"):
        client_context(TlsOptions(cacert=str(tmp_path / "absent.pem")))
    with pytest.raises(TlsError, match="--cert"):
        client_context(TlsOptions(cert=pki.ca))  # a certificate with no key
    with pytest.raises(TlsError, match="--key needs --cert"):
        client_context(TlsOptions(key=pki.client_key))


def tailgate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "src")}
    return subprocess.run([sys.executable, "-m", "tailgate", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_cli_end_to_end(nginx, pki, tmp_path):
    out = tmp_path / "r.json"
    p = tailgate("bench", https(nginx), "--cacert", pki.ca, "--rate", "200", "--duration",
                 "0.5s", "--workers", "2", "--connections", "2", "--quiet", "--json", str(out))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert accounted(data)["ok"] == 100
    assert data["connections"]["handshake_ms"]["count"] == data["connections"]["opened"]
    assert "TLS handshake p50" in p.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["https://127.0.0.1:1/", "--cacert", "/nonexistent/ca.pem"], "--cacert"),
    (["https://127.0.0.1:1/", "--insecure", "--cacert", "x"], "not both"),
    (["http://127.0.0.1:1/", "--insecure"], "--insecure does not apply to http://"),
    (["tcp://127.0.0.1:1", "--payload", "x", "--delimiter", "y", "--sni", "a"],
     "--sni does not apply to tcp://"),
    (["openai+http://127.0.0.1:1/v1", "--model", "m", "--insecure"],
     "--insecure does not apply to openai+http://"),
])
def test_cli_refuses_what_it_cannot_use(args, message):
    p = tailgate("bench", *args, "--rate", "1", "--duration", "1s", "--quiet")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr


def test_openai_streams_over_tls(pki):
    """openai+https:// goes through the same TLS connection code (a fixed stream from nginx)."""
    require(available())
    chunk = '{"choices":[{"text":"hi","index":0,"finish_reason":"length"}]}'
    loc = locations(pki, f"""location = /v1/completions {{ default_type text/event-stream;
        return 200 'data: {chunk}\\n\\ndata: [DONE]\\n\\n'; }}""")
    with Nginx(locations=loc, listen_options="ssl") as ng:
        url = f"openai+https://127.0.0.1:{ng.port}/v1"
        ok = tailgate("bench", url, "--model", "m", "--cacert", pki.ca, "--rate", "20",
                      "--duration", "0.5s", "--workers", "1", "--quiet", "--json", "-",
                      "--no-usage")
        bad = tailgate("bench", url, "--model", "m", "--rate", "20", "--duration", "0.5s",
                       "--workers", "1", "--quiet", "--json", "-", "--no-usage")
    data = json.loads(ok.stdout)
    assert accounted(data)["ok"] == 10, ok.stderr
    assert data["connections"]["handshake_ms"]["count"] == data["connections"]["opened"]
    kind, reason = only_error(accounted(json.loads(bad.stdout)))
    assert kind == "tls" and "certificate verify failed" in reason


@pytest.mark.parametrize("sni", ["localhost", None], ids=["sni", "ip"])
def test_both_engines_send_the_same_client_hello(pki, sni):
    """The compiled loop's context is made from the settings of the Python engine's
    (tls.context_settings): on whichever Python runs the suite (Debian's offers other suites
    and versions than upstream CPython's defaults), a server sees the same client hello from
    either engine: suites in order, extensions in order, groups, signature algorithms,
    versions, ALPN and SNI (the random, the session id and the key shares differ on every
    connection)."""
    hellos = {}
    for engine in ("python", "fast"):
        with HelloCatcher() as catcher:
            data = bench(f"https://127.0.0.1:{catcher.port}/", TlsOptions(cacert=pki.ca, sni=sni),
                         engine, rate=6, connections=0)
        req = accounted(data)  # (each ends as the catcher closes: test_a_server_that_closes...)
        assert req["sent"] == 3 and req["ok"] == 0, req
        parsed = {parse(r) for r in catcher.records}
        assert len(catcher.records) >= 1 and len(parsed) == 1, (parsed, req)  # the same each time
        hellos[engine] = parsed.pop()
    python, fast = hellos["python"], hellos["fast"]
    assert python.alpn == (b"http/1.1",)
    assert python.sni == ((b"localhost",) if sni else ())  # (an IP address is never sent)
    differ = {f: {"python": getattr(python, f), "fast": getattr(fast, f)}
              for f in python.__dataclass_fields__ if getattr(fast, f) != getattr(python, f)}
    assert not differ


def test_a_compiled_loop_on_another_openssl_is_refused_for_tls_only(monkeypatch):
    """Its settings are copied from Python's SSLContext, whose option bits mean what they say
    only to Python's OpenSSL: on another one, TLS targets run on the Python engine (auto) or
    are refused with the reason (fast); plaintext ones keep the compiled loop."""
    import ssl
    import types

    from tailgate.bench import fastpath

    require(fastpath.UNAVAILABLE)  # (None: built)
    assert fastpath.TLS_UNAVAILABLE is None  # this build runs Python's own OpenSSL
    other = fastpath.tls_unavailable(types.SimpleNamespace(
        OPENSSL_VERSION_NUMBER=ssl.OPENSSL_VERSION_NUMBER + 0x10))
    assert other is not None and f"{ssl.OPENSSL_VERSION_NUMBER:#x}" in other
    monkeypatch.setattr(fastpath, "TLS_UNAVAILABLE", other)
    assert fastpath.choose("auto", "https") == fastpath.choose("auto", "openai+https") == "python"
    assert fastpath.fallback_note("auto", "https") == f"ran the python engine: {other}"
    with pytest.raises(fastpath.EngineUnavailable, match="would not speak the same TLS"):
        fastpath.choose("fast", "https")
    assert fastpath.choose("auto", "http") == fastpath.choose("fast", "http") == "fast"
