"""The Grafana dashboard (contrib/grafana/tailgate.json) cannot drift from the metric names: every
PromQL expression in it (panels and template variables) runs against a real Prometheus that has
scraped a real `serve` with the resident probe, an engine's /metrics, and `tailgate rules`'
recording rules; each must parse and return series with a value (issue 28)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tailgate.baseline import default_baseline
from tailgate.rules import RuleOptions, generate, to_yaml
from test_fleet_prometheus import TAILGATE, free_port, get_json, need, wait_for

DASHBOARD = Path(__file__).parent.parent / "contrib" / "grafana" / "tailgate.json"
VLLM = Path(__file__).parent / "fixtures" / "llm" / "vllm_0.32.0_cpu_metrics_real.prom"
TTFT = re.compile(r"^(vllm:time_to_first_token_seconds_(?:bucket|count|sum)\{[^}]*\}) (\S+)$")
# Grafana's built-ins and the dashboard's variables, as the "All" selection substitutes them
SUBSTITUTE = {"$__rate_interval": "30s", "$job": ".*", "$instance": ".*", "$id": ".*",
              "$engine_job": ".*"}


def panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def expressions(dash: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every query target."""
    return [(p["title"], t["expr"]) for p in panels(dash) for t in p.get("targets", [])]


def substitute(expr: str) -> str:
    for var in sorted(SUBSTITUTE, key=len, reverse=True):
        expr = expr.replace(var, SUBSTITUTE[var])
    assert "$" not in expr, f"an unknown variable in {expr}"
    return expr


def test_the_dashboard_covers_what_the_issue_names():
    dash = json.loads(DASHBOARD.read_text())
    exprs = " ".join(e for _, e in expressions(dash))
    for metric in ("tailgate_layer_failing", "tailgate_finding_status",
                   "tailgate_finding_observed_seconds", "tailgate_red_line_seconds",
                   "tailgate_runqueue_latency_seconds_bucket", "tailgate_probe_up",
                   "tailgate_probe_windows_total", "job:vllm_time_to_first_token_seconds:p99_5m",
                   "instance:tailgate_runqueue_latency_seconds:p999_5m"):
        assert metric in exprs, metric
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "job", "instance", "id", "engine_job"}


class CapturedEngine(BaseHTTPRequestHandler):
    """vLLM's real /metrics capture; its TTFT histogram's counts times the scrape number, so a
    rate() over it has exactly the captured distribution."""

    scrapes = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).scrapes += 1
        n = type(self).scrapes
        lines = []
        for line in VLLM.read_text().splitlines():
            m = TTFT.match(line)
            lines.append(f"{m.group(1)} {float(m.group(2)) * n!r}" if m else line)
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def prometheus_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    total, prev_le, prev_c = buckets[-1][1], 0.0, 0.0
    for le, c in buckets:
        if c >= q * total:
            return prev_le + (le - prev_le) * (q * total - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    raise AssertionError


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        pytest.fail("needs root and bpftrace (make test installs bpftrace; CI runs as root)")
    prometheus = need("prometheus")
    tmp = tmp_path_factory.mktemp("dash")
    engine = ThreadingHTTPServer(("127.0.0.1", 0), CapturedEngine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    port, prom_port = free_port(), free_port()
    procs = [subprocess.Popen([*TAILGATE, "serve", "--listen", f"127.0.0.1:{port}", "--interval",
                               "1", "--probe-window", "2"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    rules = tmp / "tailgate.rules.yml"
    rules.write_text(to_yaml(generate(default_baseline(), RuleOptions())))
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {"job_name": "tailgate", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]},
            {"job_name": "vllm", "static_configs": [
                {"targets": [f"127.0.0.1:{engine.server_address[1]}"]}]}]}))
    procs.append(subprocess.Popen(
        [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    api = f"http://127.0.0.1:{prom_port}/api/v1"
    try:
        # ready: the histogram has grown over a rate window, the recording rules have values
        wait_for(lambda: finite(query(api, "histogram_quantile(0.999, sum by (le) (rate("
                                      "tailgate_runqueue_latency_seconds_bucket[30s])))")),
                 90, "the run-queue histogram to grow in Prometheus")
        wait_for(lambda: finite(query(api, "job:vllm_time_to_first_token_seconds:p99_5m"))
                 and finite(query(api, "instance:tailgate_runqueue_latency_seconds:p999_5m")),
                 60, "the recording rules")
        # an inspection that judged a finished probe window (the run-queue finding's value)
        wait_for(lambda: finite(query(api, 'tailgate_finding_observed_seconds{id='
                                      '"l2.sched.runqlat"}')), 60, "a judged probe window")
        yield api
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        engine.shutdown()


def query(api: str, expr: str) -> list[dict]:
    try:
        doc = get_json(f"{api}/query?query=" + urllib.parse.quote(expr))
    except urllib.error.HTTPError as exc:
        if exc.code == 503:  # Prometheus still starting
            return []
        # 400: the expression does not parse; 422: it cannot be evaluated
        raise AssertionError(f"{expr}: {exc.read().decode()}") from exc
    except OSError:
        return []
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def finite(result: list[dict]) -> list[dict]:
    return [r for r in result if math.isfinite(float(r["value"][1]))]


def test_every_panel_query_returns_series(scraped):
    dash = json.loads(DASHBOARD.read_text())
    empty = []
    for title, expr in expressions(dash):
        if not finite(query(scraped, substitute(expr))):
            empty.append(f"{title}: {expr}")
    assert empty == []


def test_every_template_variable_has_values(scraped):
    dash = json.loads(DASHBOARD.read_text())
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
        assert m, var
        doc = get_json(f"{scraped}/label/{m.group(2)}/values?match[]="
                       + urllib.parse.quote(substitute(m.group(1))))
        assert doc["data"], var["name"]


def test_the_ttft_panel_shows_the_engine_histograms_p99(scraped):
    """The recording rule's P99 over the captured vLLM buckets, as Prometheus interpolates."""
    buckets = []
    for line in VLLM.read_text().splitlines():
        m = re.match(r'vllm:time_to_first_token_seconds_bucket\{.*le="([^"]+)".*\} (\S+)', line)
        if m and m.group(1) != "+Inf":
            buckets.append((float(m.group(1)), float(m.group(2))))
    (got,) = finite(query(scraped, 'job:vllm_time_to_first_token_seconds:p99_5m{job=~".*"}'))
    assert float(got["value"][1]) == pytest.approx(prometheus_quantile(0.99, buckets), rel=1e-6)
