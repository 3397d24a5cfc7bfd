"""Engine /metrics: scraping, parsing and the L4 judgments, on real captured scrapes
(tests/fixtures/llm, from shared/corpus/llm) and real HTTP servers on loopback."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.inspect import gate_code
from tailgate.baseline import default_baseline
from tailgate.collect import Scope, collectors, run_collector
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.llm import engine_metrics as em
from tailgate.llm import specdec
from tailgate.model import Fact, ParseError, Snapshot, SourceError
from tailgate.sources.engine import parse_exposition, parse_memory_stats

FIX = Path(__file__).parent / "fixtures" / "llm"
VLLM = FIX / "vllm_0.32.0_cpu_metrics_real.prom"
VLLM_SPEC = FIX / "vllm_0.32.0_cpu_metrics_real_specdecode_ngram.prom"
SGLANG = FIX / "sglang_metrics_docs_example.prom"
L4 = ("l4.prefix_cache.hit_rate", "l4.prefix_cache.match_time", "l4.memory.fragmentation",
      "l4.specdec.acceptance", "l4.kv.quantization")


def snapshot(scope: Scope, interval: float = 0.0, between=None) -> Snapshot:
    """Run the engine collectors as `inspect` does: counters at t0, all at t1."""
    host = Host("/")
    cs = {n: c for n, c in collectors().items() if n.startswith("engine.")}
    before: dict[str, Fact] = {}
    for c in cs.values():
        if c.counter:
            before.update(run_collector(c, host, scope))
    if between:
        between()
    time.sleep(interval)
    facts: dict[str, Fact] = {}
    for c in cs.values():
        facts.update(run_collector(c, host, scope))
    return Snapshot(host={}, target=scope.to_json(), interval_s=interval, taken_at=0.0,
                    facts=facts, before=before)


def judge(snap: Snapshot) -> dict:
    base = default_baseline()
    reg = checks()
    out = {}
    for cid in L4:
        out[cid] = run_check(cid, reg.get(cid), snap, base.get(cid))
    return out


# -- the parser on real scrapes ----------------------------------------------------


def test_parser_reads_every_real_scrape():
    for path in (VLLM, VLLM_SPEC, SGLANG):
        samples = parse_exposition(path.read_text())
        names = {s[0] for s in samples}
        assert any(n.startswith(("vllm:", "sglang:")) for n in names), path
    vllm = parse_exposition(VLLM.read_text())
    assert em.total(vllm, "vllm:prefix_cache_hits_total") == 14976.0
    assert em.total(vllm, "vllm:prefix_cache_queries_total") == 16130.0


@pytest.mark.parametrize("body", ['{"object": "list", "data": []}',
                                  "<html><body>Not Found</body></html>", "", "Not Found"])
def test_parser_rejects_what_is_not_exposition_format(body):
    with pytest.raises(ParseError):
        parse_exposition(body)


def test_histogram_quantile_stays_inside_its_bucket():
    samples = parse_exposition(VLLM_SPEC.read_text())
    buckets = em.histogram(samples, "vllm:time_to_first_token_seconds")
    assert buckets[-1][1] == 36
    value, lo, hi = em.quantile(buckets, 0.99)
    assert lo <= value <= hi and (lo, hi) == (0.75, 1.0)
    # SGLang's TTFT: most samples are in the +Inf bucket: only a lower bound is known.
    sg = parse_exposition(SGLANG.read_text())
    ev = em.latency_evidence(None, sg)
    assert ev["ttft"]["p50_ms"] is None and ev["ttft"]["p50_bucket_ms"] == [30000.0, None]
    assert ev["ttft"]["p999_ms"] is None and "P999" in ev["warning"]


# -- speculative decoding arithmetic ----------------------------------------------


def test_alpha_inverts_the_expected_tokens_per_step():
    for alpha in (0.0, 0.3, 0.6, 0.8, 0.95):
        for k in (1, 3, 5):
            tau = specdec.expected_tokens_per_step(alpha, k)
            assert abs(specdec.alpha_from_tau(tau, k) - alpha) < 1e-9


def test_acceptance_rate_is_at_most_alpha():
    # With k = 1 the two coincide; with longer drafts the engine's rate falls below alpha.
    s1 = specdec.from_counts(drafts=100, draft_tokens=100, accepted=70)
    assert abs(s1.alpha - 0.7) < 1e-9 and abs(s1.acceptance_rate - 0.7) < 1e-12
    s4 = specdec.from_counts(drafts=100, draft_tokens=400, accepted=200)
    assert s4.acceptance_rate == 0.5 and s4.alpha > 0.5
    assert abs(specdec.expected_tokens_per_step(s4.alpha, 4) - 3.0) < 1e-9


def test_sglang_gauges_give_both_figures():
    # rate 0.6 with 4-token drafts: 2.4 accepted + the bonus token = 3.4 per step.
    s = specdec.from_rate_and_length(0.6, 3.4)
    assert abs(s.draft_length - 4.0) < 1e-9 and s.alpha > 0.6
    with pytest.raises(ValueError):
        specdec.from_rate_and_length(0.0, 1.0)


# -- judgments on real scrapes (a saved scrape: one sample, totals since start) -----


def test_vllm_prefix_cache_and_kv_dtype_from_real_scrape():
    res = judge(snapshot(Scope(options={"engine": str(VLLM)})))
    hit = res["l4.prefix_cache.hit_rate"][0]
    assert hit.status == "pass" and hit.observed == pytest.approx(100 * 14976 / 16130, abs=1e-3)
    assert "since the engine started" in hit.reason
    lat = hit.evidence["engine_latency"]
    assert lat["ttft"]["count"] == 60 and lat["itl"]["metric"] == "vllm:inter_token_latency_seconds"
    kv = res["l4.kv.quantization"][0]
    # vLLM's default KV dtype is a sound default: skipped, failed only when the baseline asks
    assert kv.status == "skip" and kv.observed == "auto" and "require_quantized" in kv.reason
    snap = snapshot(Scope(options={"engine": str(VLLM)}))
    (asked,) = run_check("l4.kv.quantization", checks()["l4.kv.quantization"], snap,
                         {**default_baseline().get("l4.kv.quantization"), "require_quantized": True})
    assert asked.status == "fail" and asked.observed == "auto" and "not quantised" in asked.reason
    assert res["l4.specdec.acceptance"][0].status == "skip"
    assert res["l4.prefix_cache.match_time"][0].status == "unknown"
    frag = res["l4.memory.fragmentation"][0]
    assert frag.status == "unknown" and "--memory-stats" in frag.reason


def test_vllm_ngram_specdec_from_real_scrape():
    res = judge(snapshot(Scope(options={"engine": str(VLLM_SPEC)})))
    f = res["l4.specdec.acceptance"][0]
    assert f.observed == pytest.approx(100 * 1217 / 1449, abs=1e-3)
    assert f.status == "pass"  # 84 % >= 75 %
    ev = f.evidence
    assert ev["drafts"] == 524 and ev["draft_tokens"] == 1449 and ev["accepted_tokens"] == 1217
    assert ev["alpha"] > ev["acceptance_rate"]
    tau = 1 + 1217 / 524
    assert ev["mean_acceptance_length"] == pytest.approx(tau)
    assert specdec.expected_tokens_per_step(ev["alpha"], 1449 / 524) == pytest.approx(tau)
    assert ev["per_position_acceptance"][0] == pytest.approx(471 / 524)
    assert "judged on the engine's acceptance rate" in f.reason


def test_sglang_hit_rate_gauge_fails_and_says_it_is_a_gauge():
    res = judge(snapshot(Scope(options={"engine": str(SGLANG)})))
    f = res["l4.prefix_cache.hit_rate"][0]
    assert f.status == "fail" and f.observed == pytest.approx(0.751, abs=1e-3)
    assert "gauge" in f.reason
    assert res["l4.kv.quantization"][0].status == "unknown"


def test_without_engine_l4_is_skipped():
    res = judge(snapshot(Scope()))
    for cid in L4:
        assert res[cid][0].status == "skip", cid


# -- real HTTP: a live exposition that changes during the window --------------------


def _serve(handler_cls):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return srv


def test_window_is_the_difference_of_two_live_scrapes():
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    reg = CollectorRegistry()
    labels = ["engine", "model_name"]
    hits = Counter("vllm:prefix_cache_hits", "hits", labels, registry=reg)
    queries = Counter("vllm:prefix_cache_queries", "queries", labels, registry=reg)
    # History before the window: a poor hit rate (10 %).
    hits.labels("0", "m").inc(100)
    queries.labels("0", "m").inc(1000)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = generate_latest(reg)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = _serve(H)
    try:
        url = f"http://127.0.0.1:{srv.server_port}/metrics"

        def traffic():  # during the window: 950 of 1000 tokens hit
            hits.labels("0", "m").inc(950)
            queries.labels("0", "m").inc(1000)

        res = judge(snapshot(Scope(options={"engine": url}), interval=0.1, between=traffic))
    finally:
        srv.shutdown()
    f = res["l4.prefix_cache.hit_rate"][0]
    assert f.status == "pass" and f.observed == pytest.approx(95.0)
    assert f.evidence["windowed"] is True and f.evidence["queried_tokens"] == 1000


@pytest.mark.parametrize("hits,queries,kind", [
    ("vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries", "older names"),
    ("sglang:cached_tokens", "sglang:prompt_tokens", "SGLang"),
])
def test_older_vllm_and_sglang_counters_over_a_live_window(hits, queries, kind):
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    reg = CollectorRegistry()
    h = Counter(hits, "hits", ["model_name"], registry=reg)
    q = Counter(queries, "queries", ["model_name"], registry=reg)
    q.labels("m").inc(500)  # before the window: nothing hit

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = generate_latest(reg)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = _serve(H)
    try:
        url = f"http://127.0.0.1:{srv.server_port}/metrics"

        def traffic():
            h.labels("m").inc(300)
            q.labels("m").inc(400)

        res = judge(snapshot(Scope(options={"engine": url}), interval=0.05, between=traffic))
    finally:
        srv.shutdown()
    f = res["l4.prefix_cache.hit_rate"][0]
    assert f.status == "fail" and f.observed == pytest.approx(75.0)
    assert kind in f.reason and f.evidence["windowed"] is True


def _live(reg):
    from prometheus_client import generate_latest

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = generate_latest(reg)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    return _serve(H)


def test_vllm_v0_specdec_counters_give_the_rate_but_no_alpha():
    from prometheus_client import CollectorRegistry, Counter

    reg = CollectorRegistry()
    drafted = Counter("vllm:spec_decode_num_draft_tokens", "d", registry=reg)
    accepted = Counter("vllm:spec_decode_num_accepted_tokens", "a", registry=reg)
    drafted.inc(1000)
    accepted.inc(900)  # history: 90 %
    srv = _live(reg)
    try:
        url = f"http://127.0.0.1:{srv.server_port}/metrics"

        def traffic():  # the window: 60 %
            drafted.inc(500)
            accepted.inc(300)

        res = judge(snapshot(Scope(options={"engine": url}), interval=0.05, between=traffic))
    finally:
        srv.shutdown()
    f = res["l4.specdec.acceptance"][0]
    assert f.status == "fail" and f.observed == pytest.approx(60.0)
    assert f.evidence["alpha"] is None and "not derivable" in f.reason


def test_sglang_specdec_gauges_judged_with_alpha():
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()
    Gauge("sglang:spec_accept_rate", "r", registry=reg).set(0.8)
    Gauge("sglang:spec_accept_length", "l", registry=reg).set(3.4)  # k = 2.4 / 0.8 = 3
    srv = _live(reg)
    try:
        res = judge(snapshot(Scope(options={
            "engine": f"http://127.0.0.1:{srv.server_port}/metrics"})))
    finally:
        srv.shutdown()
    f = res["l4.specdec.acceptance"][0]
    assert f.status == "pass" and f.observed == pytest.approx(80.0)
    assert f.evidence["draft_length"] == pytest.approx(3.0)
    assert specdec.expected_tokens_per_step(f.evidence["alpha"], 3) == pytest.approx(3.4)


def test_unreachable_and_non_prometheus_endpoints_are_unknown():
    class Html(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = 404 if self.path == "/missing" else 200
            body = b"<html><body>hello</body></html>"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = _serve(Html)
    port = srv.server_port
    try:
        html = judge(snapshot(Scope(options={"engine": f"http://127.0.0.1:{port}/metrics"})))
        missing = judge(snapshot(Scope(options={"engine": f"http://127.0.0.1:{port}/missing"})))
    finally:
        srv.shutdown()
        srv.server_close()
    refused = judge(snapshot(Scope(options={"engine": f"http://127.0.0.1:{port}/metrics"})))
    for res, words in ((html, "not Prometheus"), (missing, "HTTP 404"), (refused, "unreachable")):
        for cid in ("l4.prefix_cache.hit_rate", "l4.specdec.acceptance", "l4.kv.quantization"):
            f = res[cid][0]
            assert f.status == "unknown" and words in f.reason, (cid, f.reason)


# -- allocator dump --------------------------------------------------------------


def _stats(reserved: int, allocated: int, inactive: int, requested: int) -> dict:
    # The keys torch.cuda.memory_stats() returns (flat, "<stat>.<pool>.<metric>").
    return {"reserved_bytes.all.current": reserved, "allocated_bytes.all.current": allocated,
            "active_bytes.all.current": allocated, "requested_bytes.all.current": requested,
            "inactive_split_bytes.all.current": inactive, "num_alloc_retries": 0,
            "num_ooms": 0, "reserved_bytes.all.peak": reserved}


def test_fragmentation_formula_and_devices(tmp_path):
    gib = 1 << 30
    dump = {"cuda:0": _stats(40 * gib, 30 * gib, gib // 2, 30 * gib - 4096),
            "cuda:1": _stats(40 * gib, 20 * gib, 4 * gib, 20 * gib)}
    path = tmp_path / "mem.json"
    path.write_text(json.dumps(dump))
    res = judge(snapshot(Scope(options={"memory_stats": str(path)})))
    by_dev = {f.subject: f for f in res["l4.memory.fragmentation"]}
    assert by_dev["cuda:0"].status == "pass" and by_dev["cuda:0"].observed == pytest.approx(1.25)
    assert by_dev["cuda:1"].status == "fail" and by_dev["cuda:1"].observed == pytest.approx(10.0)
    assert by_dev["cuda:1"].evidence["cached_free_pct"] == pytest.approx(50.0)


def test_fragmentation_unknown_for_bad_dumps(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("OrderedDict([('active.all.allocated', 0)])")
    with pytest.raises(ParseError):
        parse_memory_stats(bad.read_text())
    res = judge(snapshot(Scope(options={"memory_stats": str(bad)})))
    assert res["l4.memory.fragmentation"][0].status == "unknown"
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(_stats(0, 0, 0, 0)))
    f = judge(snapshot(Scope(options={"memory_stats": str(empty)})))["l4.memory.fragmentation"][0]
    assert f.status == "unknown" and "holds no memory" in f.reason


# -- the command line ----------------------------------------------------------------


def test_inspect_cli_judges_a_saved_scrape(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tailgate", "inspect", "--engine", str(VLLM_SPEC), "--interval",
         "0", "--json", "-", "--quiet"], check=False, capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert out.returncode == gate_code(report), out.stderr  # the status the report decides
    found = {f["id"]: f for f in report["findings"] if f["layer"] == "L4"}
    assert found["l4.specdec.acceptance"]["status"] == "pass"
    assert report["target"]["engine"] == str(VLLM_SPEC)
    bad = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--engine", "ftp://x"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--engine" in bad.stderr


# -- hostile endpoints: oversized, slow, impossible --------------------------------------------

class _Trickle(threading.Thread):
    """A real server that answers one byte every ``gap`` seconds (the headers too, with
    ``headers=True``) until the client goes; it counts what it sent."""

    def __init__(self, body: bytes, gap: float, headers: bool):
        super().__init__(daemon=True)
        import socket

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.body, self.gap, self.headers, self.sent = body, gap, headers, 0
        self.stop = threading.Event()

    def run(self):
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(65536)
            head = (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                    + str(len(self.body)).encode() + b"\r\n\r\n")
            if not self.headers:
                conn.sendall(head)
            for i in range(len(head) + len(self.body) if self.headers else len(self.body)):
                if self.stop.wait(self.gap):
                    return
                data = (head + self.body) if self.headers else self.body
                try:
                    conn.sendall(data[i:i + 1])
                except OSError:  # the client gave up: what we want
                    return
                self.sent += 1

    def close(self):
        self.stop.set()
        self.join(10)
        self.sock.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("headers", [False, True], ids=["slow-body", "slow-headers"])
def test_a_server_sending_one_byte_at_a_time_meets_one_deadline(headers):
    from tailgate.sources.engine import fetch

    body = VLLM.read_bytes()
    srv = _Trickle(body, gap=0.05, headers=headers)
    srv.start()
    try:
        with pytest.raises(SourceError, match="no complete answer within 1 s"):
            fetch(f"http://127.0.0.1:{srv.port}/metrics", timeout_s=1.0)
    finally:
        srv.close()
    # A per-read time-out of 1 s would have waited for all of it: the deadline cut it short.
    assert 0 < srv.sent < len(body)


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_body_over_the_cap_is_refused_not_cut(declared):
    from tailgate.sources import engine

    # The real scrape, then padding comments past the cap: cut at 16 MiB it would still parse.
    real = VLLM.read_bytes()
    pad = b"# " + b"x" * 1022 + b"\n"
    body = real + pad * ((engine.MAX_BODY - len(real)) // len(pad) + 2)
    assert len(body) > engine.MAX_BODY

    class Big(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            if declared:
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(0, len(body), 1 << 20):
                    part = body[i:i + (1 << 20)]
                    try:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    except OSError:
                        return
                self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *a):
            pass

    srv = _serve(Big)
    try:
        res = judge(snapshot(Scope(options={"engine": f"http://127.0.0.1:{srv.server_port}/m"})))
    finally:
        srv.shutdown()
        srv.server_close()
    for cid in ("l4.prefix_cache.hit_rate", "l4.kv.quantization"):
        f = res[cid][0]
        assert f.status == "unknown" and "16 MiB cap" in f.reason, f.reason


@pytest.mark.parametrize("extra,words", [
    (b"vllm:prefix_cache_hits_total{engine=\"9\",model_name=\"m\"} 1e9\n",
     "vllm:prefix_cache_hits_total"),
    (b"vllm:spec_decode_num_accepted_tokens_total{engine=\"9\",model_name=\"m\"} 1e9\n",
     "vllm:spec_decode_num_accepted_tokens_total"),
    (b"vllm:kv_cache_usage_perc{engine=\"9\",model_name=\"m\"} 1.5\n", "outside [0, 1]"),
    (b"vllm:prefix_cache_queries_total{engine=\"9\",model_name=\"m\"} -5\n", "negative"),
])
def test_impossible_counter_relations_are_unknown_with_the_reason(extra, words):
    body = VLLM_SPEC.read_bytes().replace(b"# EOF\n", b"") + extra

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = _serve(H)
    try:
        res = judge(snapshot(Scope(options={"engine": f"http://127.0.0.1:{srv.server_port}/m"})))
    finally:
        srv.shutdown()
        srv.server_close()
    for cid in ("l4.prefix_cache.hit_rate", "l4.specdec.acceptance"):
        f = res[cid][0]
        assert f.status == "unknown", (cid, f.status, f.reason)
        assert "impossible" in f.reason and words in f.reason, f.reason


def test_the_real_scrapes_hold_nothing_impossible():
    for path in (VLLM, VLLM_SPEC, SGLANG):
        assert em.impossible(parse_exposition(path.read_text())) is None, path


def test_hits_growing_faster_than_queries_between_two_scrapes_is_unknown():
    s0 = [["vllm:prefix_cache_hits_total", {}, 10.0], ["vllm:prefix_cache_queries_total", {}, 100.0]]
    s1 = [["vllm:prefix_cache_hits_total", {}, 90.0], ["vllm:prefix_cache_queries_total", {}, 120.0]]
    assert em.impossible(s0) is None and em.impossible(s1) is None
    assert "grew by 80 but vllm:prefix_cache_queries_total by only 20" in em.impossible_window(s0, s1)
    snap = Snapshot(host={}, target={"engine": "http://e/metrics"}, interval_s=1.0, taken_at=0.0,
                    facts={"engine.metrics": Fact(value={"url": "http://e/metrics", "samples": s1})},
                    before={"engine.metrics": Fact(value={"url": "http://e/metrics", "samples": s0})})
    f = judge(snap)["l4.prefix_cache.hit_rate"][0]
    assert f.status == "unknown" and "impossible counters" in f.reason
