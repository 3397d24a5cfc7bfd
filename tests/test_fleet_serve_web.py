"""`serve --web.config.file` (issue 28): TLS, basic auth (bcrypt) and headers in the
exporter-toolkit format, proven with a real Prometheus scraping over TLS with basic auth and
with a client certificate; scrapes without credentials are refused."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml

from support.inspect import gate_code
from support.tls_certs import Pki
from tailgate.fleet.web import BasicAuth, WebConfigError, load_web_config
from test_fleet_prometheus import free_port, get_json, need, wait_for

TAILGATE = [sys.executable, "-m", "tailgate"]
PASSWORD = "correct horse battery staple"


def hashed(password: str = PASSWORD, rounds: int = 10) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- the file -------------------------------------------------------------------------------------

def test_a_full_config_loads_with_paths_relative_to_the_file(tmp_path):
    pki = Pki(tmp_path)
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n"
        "  cert_file: server.pem\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n"
        "  min_version: TLS13\n"
        "http_server_config:\n  http2: false\n"
        "  headers:\n    X-Content-Type-Options: nosniff\n    X-Frame-Options: ''\n"
        f"basic_auth_users:\n  prometheus: {hashed(rounds=4)}\n")
    web = load_web_config(str(tmp_path / "web.yml"))
    assert web.tls.cert_file == pki.server_cert and web.tls.client_ca_file == pki.ca
    assert web.tls.context().minimum_version == ssl.TLSVersion.TLSv1_3
    assert web.tls.context().verify_mode == ssl.CERT_REQUIRED
    assert web.headers == (("X-Content-Type-Options", "nosniff"),)  # blank: unset
    assert list(web.users) == ["prometheus"] and web.missing_protection() == []


@pytest.mark.parametrize(("text", "line", "words"), [
    ("tls_server_config:\n  cert_file: server.pem\n  key_fil: server.key\n", 3,
     "key tls_server_config.key_fil: unknown key"),
    ("tls_server_config:\n  cert_file: server.pem\n", 1, "tls_server_config.key_file: missing"),
    ("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n"
     "  min_version: TLS14\n", 4, "min_version: 'TLS14' is not one of"),
    ("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n"
     "  client_auth_type: RequireAnyClientCert\n  client_ca_file: ca.pem\n", 4,
     "nobody verifies"),
    ("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n"
     "  client_auth_type: RequireAndVerifyClientCert\n", 4, "needs client_ca_file"),
    ("tls_server_config:\n  cert_file: server.pem\n  key_file: nothere.key\n", 3,
     "key tls_server_config.key_file:"),
    ("tls_server_config:\n  cert_file: ca.pem\n  key_file: server.key\n", 2,
     "key tls_server_config: cannot use"),  # the key does not match the certificate
    ("basic_auth_users:\n  alice: hunter2\n", 2, "key basic_auth_users.alice: not a bcrypt hash"),
    ("http_server_config:\n  headers:\n    Server: tailgate\n", 3,
     "key http_server_config.headers.Server: unknown key"),
    ("rate_limit:\n  interval: 1s\n", 1, "key rate_limit: not supported"),
    ("basic_auth_users: [alice]\n", 1, "basic_auth_users: expected a mapping"),
    ("tls_server_config:\n  cert_file: [a\n", 3, "malformed YAML"),
])
def test_a_bad_config_names_file_line_and_key(tmp_path, text, line, words):
    Pki(tmp_path)
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError) as info:
        load_web_config(str(path))
    assert str(info.value).startswith(f"{path}:{line}: "), info.value
    assert words in str(info.value), info.value


def test_cli_exits_2_with_the_line_before_it_listens(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  alice: '$2b$10$tooshort'\n")
    proc = subprocess.run([*TAILGATE, "serve", "--web.config.file", str(path), "--listen",
                           f"127.0.0.1:{free_port()}", "--probe", ""], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"{path}:2: key basic_auth_users.alice: not a bcrypt hash" in proc.stderr


def test_basic_auth_checks_bcrypt_and_caches_only_successes():
    auth = BasicAuth({"prometheus": hashed(rounds=4).encode(),
                      # htpasswd writes $2y$: the same algorithm as $2b$
                      "ops": hashed("s3cret", rounds=4).replace("$2b$", "$2y$", 1).encode()})
    assert auth.check(basic("prometheus", PASSWORD))
    assert auth.check(basic("ops", "s3cret"))
    assert len(auth._ok) == 2
    for bad in (basic("prometheus", "wrong"), basic("nobody", PASSWORD), basic("ops", PASSWORD),
                "Basic !!!notbase64", "Bearer abc", "", None,
                "Basic " + base64.b64encode(b"no-colon").decode()):
        assert not auth.check(bad), bad
    assert len(auth._ok) == 2


def test_a_wide_address_needs_protection_or_the_explicit_flag(tmp_path):
    """0.0.0.0 in a network namespace of its own (nothing outside can reach it)."""
    refused = subprocess.run([*TAILGATE, "serve", "--listen", "0.0.0.0:9860", "--probe", ""],
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2
    assert "without TLS and authentication" in refused.stderr and "--insecure-listen" in \
        refused.stderr
    pki = Pki(tmp_path)
    tls_only = tmp_path / "tls.yml"
    tls_only.write_text(yaml.safe_dump({"tls_server_config": {
        "cert_file": pki.server_cert, "key_file": pki.server_key}}))
    refused = subprocess.run([*TAILGATE, "serve", "--listen", "0.0.0.0:9860", "--probe", "",
                              "--web.config.file", str(tls_only)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "without authentication" in refused.stderr, refused.stderr
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("unshare (util-linux) not installed")
    proc = subprocess.Popen([unshare, "--net", "--", *TAILGATE, "serve", "--listen",
                             "0.0.0.0:9860", "--insecure-listen", "--probe", "",
                             "--interval", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        first = proc.stdout.readline()
        assert "metrics on http://0.0.0.0:9860/metrics" in first, first
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "WARNING: 0.0.0.0:9860 is served without TLS and authentication" in err, err


# -- live: serve behind TLS, scraped by a real Prometheus -----------------------------------------

def start_serve(port: int, web: Path) -> subprocess.Popen:
    return subprocess.Popen([*TAILGATE, "serve", "--listen", f"127.0.0.1:{port}",
                             "--web.config.file", str(web), "--interval", "1", "--probe", ""],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """Two `serve`s: TLS + basic auth, and TLS + client certificates; and a Prometheus with
    five jobs: the right credentials for each, none, a wrong password, a stranger's cert."""
    prometheus = need("prometheus")
    tmp = tmp_path_factory.mktemp("web")
    pki = Pki(tmp)
    tls = {"cert_file": pki.server_cert, "key_file": pki.server_key}
    (tmp / "basic.yml").write_text(yaml.safe_dump({
        "tls_server_config": tls,
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff",
                                           "Strict-Transport-Security": "max-age=31536000"}},
        "basic_auth_users": {"prometheus": hashed()}}))
    (tmp / "mtls.yml").write_text(yaml.safe_dump({"tls_server_config": {
        **tls, "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": pki.ca}}))
    basic_port, mtls_port, prom_port = free_port(), free_port(), free_port()
    procs = [start_serve(basic_port, tmp / "basic.yml"), start_serve(mtls_port, tmp / "mtls.yml")]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert "metrics on https://" in line, (line, p.stderr.read() if p.poll() else "")

        def job(name, port, **extra):
            return {"job_name": name, "scheme": "https", "scrape_interval": "1s",
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"]}], **extra}

        ca = {"ca_file": pki.ca}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [
            job("basic", basic_port, tls_config=ca,
                basic_auth={"username": "prometheus", "password": PASSWORD}),
            job("mtls", mtls_port, tls_config={**ca, "cert_file": pki.client_cert,
                                               "key_file": pki.client_key}),
            job("no_credentials", basic_port, tls_config=ca),
            job("wrong_password", basic_port, tls_config=ca,
                basic_auth={"username": "prometheus", "password": "guess"}),
            job("stranger_cert", mtls_port, tls_config={
                **ca, "cert_file": pki.other_client_cert, "key_file": pki.other_client_key}),
        ]}))
        server = subprocess.Popen(
            [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(server)
        yield {"pki": pki, "basic": basic_port, "mtls": mtls_port,
               "api": f"http://127.0.0.1:{prom_port}/api/v1"}
    finally:
        stop(procs)


def targets(api: str) -> dict[str, dict]:
    try:
        active = get_json(f"{api}/targets")["data"]["activeTargets"]
    except OSError:
        return {}
    return {t["labels"]["job"]: t for t in active if t["health"] != "unknown"}


def test_prometheus_scrapes_over_tls_with_basic_auth_and_client_certs(secured):
    api = secured["api"]
    wait_for(lambda: len(targets(api)) == 5, 60, "Prometheus to scrape all five jobs")

    def up() -> dict[str, float]:
        res = get_json(f"{api}/query?query=" + urllib.parse.quote("up"))["data"]["result"]
        return {r["metric"]["job"]: float(r["value"][1]) for r in res}

    expected = {"basic": 1.0, "mtls": 1.0, "no_credentials": 0.0, "wrong_password": 0.0,
                "stranger_cert": 0.0}
    # one scrape can time out on a loaded 2-core host (a 1 s interval is its time-out, and the
    # first right password and every wrong one cost a bcrypt): wait for the state, then check
    # that the refused jobs were refused for the right reason
    got = wait_for(lambda: (u := up()) == expected and u, 60, f"up == {expected}")
    assert got == expected
    jobs = targets(api)
    assert "401 Unauthorized" in jobs["no_credentials"]["lastError"], jobs["no_credentials"]
    assert "401 Unauthorized" in jobs["wrong_password"]["lastError"]
    assert jobs["stranger_cert"]["lastError"], jobs["stranger_cert"]  # the handshake refused
    # and what was scraped is tailgate's: the verdict, over both secured paths
    res = get_json(f"{api}/query?query=" + urllib.parse.quote(
        "count by (job) (tailgate_verdict)"))["data"]["result"]
    assert {r["metric"]["job"] for r in res} == {"basic", "mtls"}


def https(secured, port: int, headers: dict[str, str] | None = None,
          cert: tuple[str, str] | None = None):
    ctx = ssl.create_default_context(cafile=secured["pki"].ca)
    if cert:
        ctx.load_cert_chain(*cert)
    req = urllib.request.Request(f"https://127.0.0.1:{port}/metrics", headers=headers or {})
    return urllib.request.urlopen(req, timeout=10, context=ctx)  # noqa: S310 - loopback


def test_wrong_credentials_get_401_with_no_detail(secured):
    bodies = set()
    for headers in ({}, {"Authorization": basic("prometheus", "guess")},
                    {"Authorization": basic("root", PASSWORD)}):
        with pytest.raises(urllib.error.HTTPError) as info:
            https(secured, secured["basic"], headers)
        err = info.value
        assert err.code == 401 and err.headers["WWW-Authenticate"] == "Basic"
        assert err.headers["X-Content-Type-Options"] == "nosniff"
        bodies.add(err.read())
    assert bodies == {b"Unauthorized\n"}  # the same answer whatever was wrong
    with https(secured, secured["basic"], {"Authorization": basic("prometheus", PASSWORD)}) as r:
        assert r.status == 200 and b"tailgate_verdict" in r.read()
        assert r.headers["Strict-Transport-Security"] == "max-age=31536000"
    # plain HTTP to the TLS port gets no metrics
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{secured['basic']}/metrics", timeout=10)


def test_client_certificate_is_required_and_verified(secured):
    pki = secured["pki"]
    with https(secured, secured["mtls"], cert=(pki.client_cert, pki.client_key)) as r:
        assert r.status == 200 and b"tailgate_verdict" in r.read()
    for cert in (None, (pki.other_client_cert, pki.other_client_key)):
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            with https(secured, secured["mtls"], cert=cert) as r:
                r.read()
    # the server survived the refused handshakes
    time.sleep(0.2)
    with https(secured, secured["mtls"], cert=(pki.client_cert, pki.client_key)) as r:
        assert r.status == 200


# -- serve --root ---------------------------------------------------------------------------------

ROOTS = Path(__file__).parent / "fixtures" / "roots"


def serve_once(*args: str) -> dict[str, list]:
    from test_fleet_prometheus import families

    proc = subprocess.run([*TAILGATE, "serve", "--once", "--interval", "0.2", *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return families(proc.stdout)


def statuses(fams: dict[str, list]) -> dict[str, tuple[str, str]]:
    return {s.labels["id"]: (s.labels["status"], s.labels["subject"])
            for s in fams["tailgate_finding_status"] if s.value == 1}


def test_serve_root_reads_the_fixture_root_as_inspect_root_does():
    from test_l2_root import EXPECTED

    got = statuses(serve_once("--root", str(ROOTS / "vm-l2"), "--probe", ""))
    assert {k: v for k, v in got.items() if k.startswith("l2.")} == EXPECTED
    # a whole host root of L1/L3 captures (mlx5 NIC, GPUs, PTP): every finding, every subject,
    # as `inspect --root` judges it
    root = ROOTS / "l1l3-clean"
    proc = subprocess.run([*TAILGATE, "inspect", "--root", str(root), "--interval", "0",
                           "--no-history", "--json", "-"], capture_output=True, text=True,
                          timeout=60, check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == gate_code(report), proc.stderr  # the status the report decides
    by_inspect = {(f["id"], f["status"], f["subject"]) for f in report["findings"]}
    fams = serve_once("--root", str(root), "--probe", "")
    by_serve = {(s.labels["id"], s.labels["status"], s.labels["subject"])
                for s in fams["tailgate_finding_status"] if s.value == 1}
    assert by_serve == by_inspect
    assert {("l1.optics.rx_power", "pass", "eth2"), ("l3.rss.symmetric", "pass", "eth2"),
            ("l1.clock.ptp", "pass", "host")} <= by_serve


def test_serve_root_probes_still_see_the_live_kernel():
    """A root changes where files and captured commands are read; eBPF sees the running kernel
    (a container's --root /host), so the resident probe measures it."""
    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        pytest.fail("needs root and bpftrace (make test installs bpftrace; CI runs as root)")
    fams = serve_once("--root", str(ROOTS / "vm-l2"), "--probe-window", "1")
    assert [s.value for s in fams["tailgate_probe_up"]] == [1.0]
    count = [s.value for s in fams["tailgate_runqueue_latency_seconds"]
             if s.name.endswith("_count")]
    assert count[0] > 0
    assert statuses(fams)["l2.sched.runqlat"][0] in ("pass", "fail")  # measured, not unknown


def test_serve_root_must_be_a_directory(tmp_path):
    proc = subprocess.run([*TAILGATE, "serve", "--once", "--root", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "not a directory" in proc.stderr


# -- the systemd unit -----------------------------------------------------------------------------

def test_the_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze not installed (Debian `systemd`)")
    unit = (Path(__file__).parent.parent / "contrib" / "tailgate-serve.service").read_text()
    exe = shutil.which("tailgate") or str(Path(sys.executable).with_name("tailgate"))
    assert "ExecStart=/usr/local/bin/tailgate serve " in unit
    # verify checks that ExecStart's binary exists: point it at this installation's
    (tmp_path / "tailgate-serve.service").write_text(unit.replace("/usr/local/bin/tailgate", exe))
    proc = subprocess.run([analyze, "verify", str(tmp_path / "tailgate-serve.service")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # no warning about the unit itself (unknown directive, bad value, missing binary)
    ours = [line for line in (proc.stdout + proc.stderr).splitlines()
            if "tailgate-serve.service" in line]
    assert ours == [], ours
    for needed in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ReadOnlyPaths=/",
                   "CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_SYS_ADMIN"):
        assert needed in unit


def test_the_shipped_example_config_is_valid_but_its_placeholder_hash_is_refused(tmp_path):
    pki = Pki(tmp_path)
    example = (Path(__file__).parent.parent / "contrib" / "container" / "web.yml.example")
    text = (example.read_text().replace("/etc/tailgate/tls/server.pem", pki.server_cert)
            .replace("/etc/tailgate/tls/server.key", pki.server_key))
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError, match=r":\d+: key basic_auth_users.prometheus: not a "
                                             "bcrypt hash"):
        load_web_config(str(path))  # copied unchanged, it cannot be deployed
    path.write_text(re.sub(r"\$2y\$10\$\S+", hashed(rounds=4), text))
    web = load_web_config(str(path))
    assert web.tls is not None and list(web.users) == ["prometheus"]
    assert ("X-Content-Type-Options", "nosniff") in web.headers
    proc = subprocess.run([*TAILGATE, "serve", "--once", "--web.config.file", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "needs a port to serve" in proc.stderr
