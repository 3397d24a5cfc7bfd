"""Distributed bench, scenarios and fleet inspection on a real two-node Ray cluster (issue 13).

The head runs in the host namespace, the second node in a network namespace the
test made (veth), so each generator has its own source address; nginx listens on
the host end of the veth and is reached by both. The tests share one cluster
(Ray is heavy on two cores) and run in file order: the last ones kill the
namespace node's raylet.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from support.inspect import fleet_code
from support.nginx import Nginx
from support.nginx import available as nginx_available
from support.raycluster import RayCluster, env
from support.raycluster import available as ray_available
from support.require import require
from support.signals import sigint_default
from tailgate.hist import decode

TAILGATE = [sys.executable, "-m", "tailgate"]


@pytest.fixture(scope="module")
def cluster():
    require(ray_available())
    require(nginx_available())
    with RayCluster() as rc, Nginx(address=rc.veth.host_ip) as ng:
        rc.nginx = ng
        yield rc


def tailgate(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*TAILGATE, *argv], env=env(), capture_output=True, text=True,
                          timeout=timeout)


def test_bench_on_two_nodes_merges_exactly(cluster, tmp_path):
    out = tmp_path / "r.json"
    r = tailgate("bench", cluster.nginx.url("/"), "--rate", "400", "--duration", "3s",
                 "--connections", "4", "--ray", cluster.address, "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    nodes = d["nodes"]
    # one generator per node, each with its own address (the namespace node's is the veth's)
    assert sorted(n["address"] for n in nodes) == sorted([cluster.veth.host_ip,
                                                          cluster.veth.ns_ip])
    assert all(n["status"] == "ok" and n["workers"] == 1 for n in nodes)
    # the merged histogram is the sum of the per-node ones, bucket for bucket
    total = decode(d["histograms"]["latency"])
    parts = [decode(n["histograms"]["latency"]) for n in nodes]
    assert all(p.total > 0 for p in parts)
    assert np.array_equal(total.counts, parts[0].counts + parts[1].counts)
    # the whole schedule was run: 400/s x 3 s, split evenly, every request accounted for
    q = d["requests"]
    assert q["scheduled"] == 1200 == q["sent"] + q["abandoned"] + q["lost"]
    assert q["lost"] == 0 and q["ok"] == 1200
    assert d["accounting"]["consistent"], d["accounting"]
    assert d["rate"]["achieved"] == pytest.approx(400, rel=0.01)
    for n in nodes:
        # the "go" reached every node before the agreed start (1 s ahead of the last ready)
        assert 0 < n["start_margin_ms"] < 1000
        assert n["requests"]["scheduled"] == 600 == n["requests"]["sent"]
        assert n["rate"]["target"] == pytest.approx(200, rel=0.01)
        assert n["rate"]["achieved"] == pytest.approx(200, rel=0.02)
    assert "per node:" in r.stdout and cluster.veth.ns_ip in r.stdout


def test_ray_judges_a_spec_as_one_host_does(cluster, tmp_path):
    """The SLOs of tests/test_bench_slo_paths.py through --ray: the same verdict of each
    (20 requests over two nodes cannot bound a P99.99 either) and every request counted."""
    from test_bench_slo_paths import SLOS, WANT, verdicts

    out = tmp_path / "r.json"
    r = tailgate("bench", cluster.nginx.url("/"), "--rate", "20", "--duration", "1s",
                 "--connections", "2", *[x for s in SLOS for x in ("--slo", s)],
                 "--ray", cluster.address, "--json", str(out))
    d = json.loads(out.read_text())
    assert r.returncode == 1, r.stderr[-3000:]
    assert (d["requests"]["sent"], d["requests"]["ok"], d["requests"]["lost"]) == (20, 20, 0)
    assert verdicts(d["slo"]) == WANT, d["slo"]


def web_and_sessions(cluster, duration: str) -> str:
    """A scenario's first two targets: HTTP requests and TCP sessions to the cluster's nginx
    (the sessions' keys last, so a caller can add an SLO to them)."""
    ng = cluster.nginx
    return f"""\
defaults:
  duration: {duration}
  connections: 2
targets:
  - name: web
    url: {ng.url("/")}
    rate: 200
    slo: ["error_rate<1%"]
  - name: sessions
    url: tcp://{cluster.veth.host_ip}:{ng.port}
    rate: 100
    payload: "GET /tcp HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"
    delimiter: "pong\\n"
"""


def test_scenario_on_ray_reports_each_target_and_one_verdict(cluster, tmp_path):
    scenario = tmp_path / "peak.yaml"
    scenario.write_text(web_and_sessions(cluster, "2s") + '    slo: ["p50<1us"]\n')
    out = tmp_path / "s.json"
    r = tailgate("bench", "--scenario", str(scenario), "--ray", cluster.address,
                 "--per-node", "2", "--json", str(out))
    d = json.loads(out.read_text())
    # the impossible SLO of one target fails the mixed peak (exit 1), the other holds
    assert r.returncode == 1, r.stderr[-3000:]
    assert d["status"] == "fail" and d["failed"] == [{"target": "sessions", "expr": "p50<1us"}]
    web, sessions = d["targets"]
    assert (web["name"], web["protocol"], sessions["name"], sessions["protocol"]) == \
        ("web", "http", "sessions", "tcp")
    assert web["requests"]["ok"] == 400 and sessions["requests"]["ok"] == 200
    for t in (web, sessions):
        assert len(t["nodes"]) == 2 and t["requests"]["lost"] == 0
        assert [n["workers"] for n in t["nodes"]] == [2, 2] and t["generator"]["workers"] == 4
        assert sum(n["requests"]["sent"] for n in t["nodes"]) == t["requests"]["sent"]
    assert "== target web ==" in r.stdout and "mixed peak (2 targets): FAIL" in r.stdout


def test_inspect_fleet_collects_every_node(cluster, tmp_path):
    out, junit, page = tmp_path / "fleet.json", tmp_path / "fleet.xml", tmp_path / "f.html"
    r = tailgate("inspect", "--ray", cluster.address, "--interval", "0.5", "--no-history",
                 "--json", str(out), "--junit", str(junit), "--html", str(page))
    view = json.loads(out.read_text())
    assert r.returncode == fleet_code(view), r.stderr[-3000:]  # what the hosts' reports decide
    assert view["hosts_total"] == 2 and view["hosts_unreachable"] == 0
    assert sorted(h["address"] for h in view["hosts"]) == sorted(
        [cluster.veth.host_ip, cluster.veth.ns_ip])
    # judged centrally, one report per host; the fleet's layer rows agree with them
    assert len(view["reports"]) == 2
    for layer, row in view["layers"].items():
        failing = sorted(rep["address"] for rep in view["reports"] if any(
            f["layer"] == layer and f["status"] == "fail" for f in rep["report"]["findings"]))
        assert sorted(row["failing"]) == failing and row["failing_hosts"] == len(failing)
    firsts = [h["first_failing_layer"] for h in view["hosts"] if h["first_failing_layer"]]
    assert view["first_failing_layer"] == (min(firsts) if firsts else None)
    # cross-node clock skew: every node's PTP offset (none here: no ptp4l on the VM, so
    # unknown with each node's reason) and the driver's round-trip reading of each node's
    # clock. Both nodes share this machine's CLOCK_REALTIME, so each reading lies within
    # half its round trip.
    skew = view["clock_skew"]
    assert sorted(r["address"] for r in skew["hosts"]) == sorted(
        [cluster.veth.host_ip, cluster.veth.ns_ip])
    assert skew["round_trip"]["nodes"] == 2
    for row in skew["hosts"]:
        rt = row["round_trip"]
        assert rt["rtt_ns"] > 0 and abs(rt["offset_ns"]) <= rt["rtt_ns"] // 2 + 1
    assert skew["round_trip"]["status"] == "pass"
    if skew["ptp"]["nodes_with_offset"] < 2:
        assert skew["ptp"]["status"] == "unknown" and "2 are needed" in skew["ptp"]["reason"]
    assert "cross-node clock skew (red line +-5 ns)" in r.stdout
    assert (r.returncode == 1) == any(h["status"] == "fail" for h in view["hosts"])
    assert "lowest failing layer of the fleet" in r.stdout
    assert f"tailgate.{cluster.veth.ns_ip}.L2" in junit.read_text()
    assert f"<section id='h-{cluster.veth.ns_ip}'>" in page.read_text()


def test_inspect_fleet_slow_nodes_are_unknown_not_a_stall(cluster, tmp_path):
    out = tmp_path / "fleet.json"
    t0 = time.monotonic()
    # the collection takes 20 s (its interval); each node has 3 s
    r = tailgate("inspect", "--ray", cluster.address, "--interval", "20", "--no-history",
                 "--node-timeout", "3", "--fail-on", "unknown", "--json", str(out))
    took = time.monotonic() - t0
    view = json.loads(out.read_text())
    assert r.returncode == 1, r.stderr[-3000:]
    assert view["status"] == "incomplete" and view["hosts_unreachable"] == 2
    assert all(h["status"] == "unknown" and "no snapshot within 3 s" in h["reason"]
               for h in view["hosts"])
    assert took < 20, "the fleet run waited for the slow nodes"


def test_llm_streams_from_two_nodes(cluster, tmp_path):
    """openai+ targets run on the bench's one engine (issue 12), so on Ray as any protocol."""
    from support.llm_server import MODEL_NAME, llama_cpp_available, llama_server

    argv = ["--model", MODEL_NAME, "--rate", "2", "--duration", "3s", "--input-len", "16",
            "--output-len", "8", "--ray", cluster.address]
    require(llama_cpp_available())
    out = tmp_path / "llm.json"
    with llama_server(tmp_path, host=cluster.veth.host_ip) as url:
        r = tailgate("bench", url.replace("http://", "openai+http://"), *argv,
                     "--slo", "ttft_p99<10s", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["requests"]["ok"] == 6 and d["requests"]["lost"] == 0
    assert [n["requests"]["sent"] for n in d["nodes"]] == [3, 3]
    total = decode(d["histograms"]["latency"])
    parts = [decode(n["histograms"]["latency"]) for n in d["nodes"]]
    assert np.array_equal(total.counts, parts[0].counts + parts[1].counts)
    # every node's share streamed on the compiled loop ("fast" only when all parts were)
    assert d["generator"]["engine"] == "fast", d["generator"]


def test_mixed_peak_of_http_tcp_and_llm_streams_on_two_nodes(cluster, tmp_path):
    """The mixed peak of issue 27 on a cluster: HTTP, TCP sessions and OpenAI streams at
    once from both nodes, each node's share of each target on the compiled loop, and the
    merged figures the sum of the nodes' (histograms bucket for bucket, requests)."""
    from support.llm_server import MODEL_NAME, llama_cpp_available, llama_server

    require(llama_cpp_available())
    scenario, out = tmp_path / "peak.yaml", tmp_path / "peak.json"
    with llama_server(tmp_path, host=cluster.veth.host_ip) as url:
        scenario.write_text(web_and_sessions(cluster, "3s") + f"""\
  - name: chat
    url: {url.replace("http://", "openai+http://")}
    rate: 2
    model: {MODEL_NAME}
    input_len: 16
    output_len: 8
    slo: ["ttft_p99<10s"]
""")
        r = tailgate("bench", "--scenario", str(scenario), "--ray", cluster.address,
                     "--json", str(out), timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    d = json.loads(out.read_text())
    web, sessions, chat = d["targets"]
    assert [t["protocol"] for t in (web, sessions)] == ["http", "tcp"]
    assert chat["protocol"].startswith("openai"), chat["protocol"]
    assert [t["requests"]["ok"] for t in (web, sessions, chat)] == [600, 300, 6]
    for t in (web, sessions, chat):
        assert t["generator"]["engine"] == "fast", (t["name"], t["generator"])
        assert len(t["nodes"]) == 2 and t["requests"]["lost"] == 0
        assert sum(n["requests"]["sent"] for n in t["nodes"]) == t["requests"]["sent"]
        total = decode(t["histograms"]["latency"])
        parts = [decode(n["histograms"]["latency"]) for n in t["nodes"]]
        assert np.array_equal(total.counts, parts[0].counts + parts[1].counts), t["name"]
    assert d["status"] == "pass" and "mixed peak (3 targets): PASS" in r.stdout


def start_ray_bench(cluster, out: Path, duration: str) -> subprocess.Popen:
    """A 200/s bench over the cluster, started; returns once the namespace node's load
    worker has run its share for 3 s."""
    p = subprocess.Popen([*TAILGATE, "bench", cluster.nginx.url("/"), "--rate", "200",
                          "--duration", duration, "--connections", "2", "--ray",
                          cluster.address, "--json", str(out)], env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=sigint_default)
    deadline = time.monotonic() + 60
    while not cluster.ns_pids("ray::LoadWorker") and time.monotonic() < deadline:
        time.sleep(0.2)
    if not cluster.ns_pids("ray::LoadWorker"):
        p.kill()
        p.wait()
        raise AssertionError("no load worker appeared on the node")
    time.sleep(3.0)
    return p


def test_ctrl_c_stops_every_node_and_keeps_what_they_measured(cluster, tmp_path):
    out = tmp_path / "r.json"
    p = start_ray_bench(cluster, out, "30s")
    try:
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, stderr[-3000:]
    d = json.loads(out.read_text())
    q = d["requests"]
    assert d["interrupted"] and "[INTERRUPTED]" in stdout
    # both nodes stopped and reported: nothing lost, the rest of the schedule abandoned
    assert [n["status"] for n in d["nodes"]] == ["ok", "ok"] and q["lost"] == 0
    assert all(n["requests"]["sent"] > 0 for n in d["nodes"])
    assert q["scheduled"] == 6000 == q["sent"] + q["abandoned"] and q["sent"] < 6000
    assert d["accounting"]["consistent"], d["accounting"]


def test_lost_node_mid_run_is_counted_as_lost(cluster, tmp_path):
    out = tmp_path / "r.json"
    p = start_ray_bench(cluster, out, "6s")
    try:
        # the namespace node's load worker has run its share for 3 s: then its raylet dies
        assert cluster.kill_node_raylet(), "no raylet in the namespace"
        stdout, stderr = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, stderr[-3000:]
    d = json.loads(out.read_text())
    q = d["requests"]
    lost = [n for n in d["nodes"] if n["status"] == "lost"]
    assert [n["address"] for n in lost] == [cluster.veth.ns_ip]
    # the node owed half the schedule: all of it is lost (nothing it measured came back)
    assert lost[0]["requests"]["lost"] == 600 == q["lost"]
    assert q["scheduled"] == 1200 == q["sent"] + q["abandoned"] + q["lost"]
    assert d["accounting"]["consistent"], d["accounting"]
    assert q["sent"] == 600
    assert any(f"node {cluster.veth.ns_ip}" in w and "lost" in w for w in d["warnings"])
    assert "LOST" in stdout

