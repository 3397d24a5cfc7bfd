"""P95 everywhere (bench tables, SLO, compare, JSON) and mean/median beside the tails of the
LLM figures (issue 25)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from support.nginx import Nginx, available
from support.require import require
from tailgate.bench.result import PERCENTILES, summarize
from tailgate.hist import Histogram
from tailgate.llm import accounting
from tailgate.slo import parse_slo


def hist(samples_ms: np.ndarray) -> Histogram:
    h = Histogram()
    h.record(samples_ms * 1e6)
    return h


def test_bench_summary_has_p95_with_its_interval():
    h = hist(np.random.default_rng(1).exponential(2.0, 50_000))
    s = summarize(h)
    assert list(PERCENTILES)[:4] == ["p50", "p90", "p95", "p99"]
    assert s["p90"] < s["p95"] < s["p99"]
    assert s["p95"] == pytest.approx(min(h.value_at_percentile(95.0), h.max) / 1e6, abs=1e-6)
    ci = s["ci"]["p95"]
    assert ci["measurable"] and ci["lo"] <= s["p95"] <= ci["hi"]


def test_p95_slo_parses_for_every_series():
    assert parse_slo("p95<5ms").metric == "latency.p95"
    assert parse_slo("service.p95<=1ms").metric == "service.p95"
    assert accounting.parse_slo("ttft_p95<2s").metric == "ttft_p95"


def test_llm_summary_has_mean_median_and_p95():
    x = np.random.default_rng(2).lognormal(3.0, 0.4, 10_000)
    h = hist(x)
    s = accounting.summary(h)
    assert s["median"] == s["p50"] and s["p50"] < s["p95"] < s["p99"]
    assert s["mean"] == pytest.approx(x.mean(), rel=2e-3)  # within the histogram's resolution
    empty = accounting.summary(Histogram())
    assert empty["mean"] is None and empty["median"] is None and empty["count"] == 0


def test_bench_cli_prints_and_gates_p95(tmp_path):
    require(available())
    with Nginx(workers=1) as ng:
        r = subprocess.run([sys.executable, "-m", "tailgate", "bench", ng.url("/"), "--rate",
                            "200", "--duration", "1s", "--workers", "1", "--slo", "p95<5s",
                            "--json", str(tmp_path / "b.json")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr + r.stdout
        head = next(line for line in r.stdout.splitlines() if line.split()[:3] == ["p50", "p90", "p95"])
        assert head.split()[3] == "p99"
        doc = json.loads((tmp_path / "b.json").read_text())
        (slo,) = doc["slo"]
        assert slo["expr"] == "p95<5s" and slo["pass"] and slo["observed"] == doc["latency_ms"]["p95"]
        bad = subprocess.run([sys.executable, "-m", "tailgate", "bench", ng.url("/"), "--rate",
                              "100", "--duration", "0.5s", "--workers", "1", "--slo", "p95<1ns",
                              "--quiet"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "SLO failed: p95<1ns" in bad.stdout
    comp = subprocess.run([sys.executable, "-m", "tailgate", "compare", str(tmp_path / "b.json"),
                           str(tmp_path / "b.json"), "--json", "-"],
                          capture_output=True, text=True, timeout=60)
    assert comp.returncode == 0, comp.stderr
    rows = {row["name"]: row for row in json.loads(comp.stdout)["rows"]}
    assert rows["latency.p95"]["before"] == doc["latency_ms"]["p95"]


def test_percentile_names_and_bad_lists():
    from tailgate.bench.units import parse_percentiles, percentile_name

    assert [percentile_name(p) for p in (50, 95, 99.9, 99.99, 99.5, 75, 5, 9.5)] == [
        "p50", "p95", "p999", "p9999", "p995", "p75", "p05", "p095"]
    assert parse_percentiles("50, 99.9,50,75") == [("p50", 50.0), ("p999", 99.9), ("p75", 75.0)]
    for bad in ("50,x", "100", "0.5", "nan", "99.99999"):
        r = subprocess.run([sys.executable, "-m", "tailgate", "bench", "http://127.0.0.1:9/",
                            "--percentiles", bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--percentiles" in r.stderr, (bad, r.stderr)


def test_bench_percentiles_choose_the_columns_and_add_the_rest_to_the_json(tmp_path):
    require(available())
    with Nginx(workers=1) as ng:
        r = subprocess.run([sys.executable, "-m", "tailgate", "bench", ng.url("/"), "--rate",
                            "300", "--duration", "1s", "--workers", "1", "--percentiles",
                            "50,75,95,99.5", "--json", str(tmp_path / "b.json")],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    head = next(line for line in r.stdout.splitlines() if line.split()[:1] == ["p50"])
    assert head.split() == ["p50", "p75", "p95", "p995", "max", "count"]
    doc = json.loads((tmp_path / "b.json").read_text())
    lat = doc["latency_ms"]
    assert lat["p50"] <= lat["p75"] <= lat["p95"] <= lat["p995"] <= lat["max"]
    assert lat["ci"]["p75"]["measurable"] and lat["ci"]["p75"]["lo"] <= lat["p75"] <= lat["ci"]["p75"]["hi"]
    assert "p999" in lat  # the standard keys stay: the JSON is a contract
    row = next(line for line in r.stdout.splitlines() if line.startswith("latency ms"))
    assert f"{lat['p75']:.3f}" in row
