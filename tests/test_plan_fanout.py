"""`tailgate plan fanout`: exact fan-out/hop/hedge distributions checked by Monte Carlo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tailgate.hist import Histogram, merged, parse_log
from tailgate.plan import fanout

HLOG = Path(__file__).parent / "fixtures" / "hdr" / "jHiccup-2.0.7S.logV2.hlog"


def lognormal_leaf(seed: int = 5, n: int = 200_000) -> fanout.Dist:
    """A service-like leaf: 1 ms median, a heavy log-normal tail (recorded in ns)."""
    rng = np.random.default_rng(seed)
    h = Histogram()
    h.record(np.rint(1e6 * rng.lognormal(0.0, 0.6, n)).astype(np.int64))
    return fanout.Dist.from_histogram(h)


def real_leaf() -> fanout.Dist:
    """Java HdrHistogram/jHiccup's own log: 20 intervals of real stall measurements."""
    _, ivs = parse_log(HLOG.read_text())
    return fanout.Dist.from_histogram(merged((iv.histogram for iv in ivs), ivs[0].histogram.spec))


def assert_bracketed(dist: fanout.Dist, sims: np.ndarray, qs=(0.5, 0.9, 0.99, 0.999)):
    """Each computed quantile lies between the simulated quantiles at q -/+ 4 binomial
    standard errors, widened by 1 % for the 3-digit buckets of rebinned hops."""
    n = sims.size
    for q in qs:
        se = np.sqrt(q * (1 - q) / n)
        lo = np.quantile(sims, max(q - 4 * se, 0), method="inverted_cdf")
        hi = np.quantile(sims, min(q + 4 * se, 1), method="inverted_cdf")
        v = dist.quantile(q)
        assert lo * 0.99 <= v <= hi * 1.01, (q, lo, v, hi)


def test_fan_out_is_the_leaf_quantile_at_q_to_the_1_over_n():
    leaf = lognormal_leaf()
    d = fanout.fan_out(leaf, 100)
    for q in (0.5, 0.9, 0.99):
        assert d.quantile(q) == leaf.quantile(q ** (1 / 100))
    # Dean & Barroso's point: at fan-out 100 the median request waits about a leaf P99
    assert leaf.quantile(0.99) == pytest.approx(d.quantile(0.37), rel=0.02)
    # the histogram's own percentiles are kept exactly
    h = Histogram()
    h.record(np.arange(1, 10_001) * 1000)
    dist = fanout.Dist.from_histogram(h)
    for p in (50, 99, 99.9):
        assert dist.quantile(p / 100) == h.value_at_percentile(p)


@pytest.mark.parametrize("leaf_fn", [lognormal_leaf, real_leaf], ids=["lognormal", "jhiccup"])
def test_plan_matches_monte_carlo(leaf_fn):
    leaf = leaf_fn()
    rng = np.random.default_rng(42)
    for fan, hops, hedge_q in ((100, 1, None), (20, 3, None), (50, 2, 0.95)):
        delay = None if hedge_q is None else leaf.quantile(hedge_q)
        res = fanout.plan(leaf, fan, hops, delay)
        sims = fanout.monte_carlo(leaf, fan, hops, delay, 40_000, rng)
        assert_bracketed(res.end_to_end, sims)
        assert res.end_to_end.mean() == pytest.approx(sims.mean(), rel=0.02)


def test_hedging_cuts_the_tail_at_a_known_extra_load():
    leaf = lognormal_leaf()
    d95 = leaf.quantile(0.95)
    hedged, extra = fanout.hedge(leaf, d95)
    assert extra == pytest.approx(0.05, abs=0.002)
    assert hedged.quantile(0.999) < leaf.quantile(0.999) * 0.8
    assert hedged.quantile(0.5) == leaf.quantile(0.5)  # the body is untouched
    assert hedged.probs.sum() == pytest.approx(1.0)


def test_convolution_adds_means_exactly():
    a, b = lognormal_leaf(1, 20_000), lognormal_leaf(2, 20_000)
    c = fanout.convolve(a, b)
    assert c.mean() == pytest.approx(a.mean() + b.mean(), rel=1e-9)
    assert c.values.size < a.values.size * b.values.size  # rebinned, not n*m points


def test_bad_input():
    with pytest.raises(ValueError):
        fanout.fan_out(lognormal_leaf(), 0)
    with pytest.raises(ValueError, match="empty"):
        fanout.Dist.from_histogram(Histogram())
    with pytest.raises(ValueError, match="max"):
        fanout.from_percentiles({"p50": 1.0})
    with pytest.raises(ValueError, match="ascending"):
        fanout.from_percentiles({"p50": 5.0, "p90": 1.0, "max": 6.0})
    # a bench's p9999 may pass its exact max by under one bucket: accepted, kept in order
    d = fanout.from_percentiles({"p50": 1.0, "p9999": 2.001, "max": 2.0})
    assert d.quantile(1.0) == 2.001


def cli(*argv):
    return subprocess.run([sys.executable, "-m", "tailgate", "plan", "fanout", *argv],
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_hdr_log_and_bench_json(tmp_path):
    r = cli("--from", str(HLOG), "--fanout", "100", "--hedge-after", "p95", "--json", "-")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    leaf = real_leaf()
    res = fanout.plan(leaf, 100, 1, leaf.quantile(0.95))
    assert data["percentiles"]["p99"]["end_to_end_ms"] == pytest.approx(
        res.end_to_end.quantile(0.99) / 1e6)
    assert data["hedge"]["extra_load"] == pytest.approx(res.hedge_extra_load)
    p999 = leaf.quantile(0.999)
    assert data["leaf_p999_is_end_to_end_quantile"] == pytest.approx(
        float(res.end_to_end.cdf(p999)))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"tailgate_bench": 1, "latency_ms": {
        "p50": 1.0, "p90": 2.0, "p99": 5.0, "p999": 9.0, "p9999": 20.0, "max": 25.0,
        "mean": 1.2, "count": 100000}}))
    r = cli("--from", str(bench), "--fanout", "10")
    assert r.returncode == 0, r.stderr
    assert "bench JSON percentiles" in r.stdout
    # fan-out 10: P90 end to end is the leaf's 0.9**0.1 = 0.9895 quantile -> the p99 step
    assert " 5.000" in r.stdout.splitlines()[4]
    (tmp_path / "bad.json").write_text("{}")
    r = cli("--from", str(tmp_path / "bad.json"), "--fanout", "10")
    assert r.returncode == 2 and "latency_ms" in r.stderr
    r = cli("--from", str(tmp_path / "none.hlog"))
    assert r.returncode == 2 and "cannot read" in r.stderr


@pytest.mark.integration
def test_fanout_from_a_real_bench_run_against_nginx(tmp_path):
    """tailgate bench measures nginx on loopback (bounded: 1,000 requests in 2 s) and
    writes its HdrHistogram log; plan fanout reads it, and its exact answer agrees with
    a Monte Carlo over the same histogram."""
    from support.nginx import Nginx, available
    from support.require import require

    require(available())
    hlog = tmp_path / "leaf.hlog"
    with Nginx(workers=1) as ng:
        r = subprocess.run([sys.executable, "-m", "tailgate", "bench", ng.url("/"), "--rate",
                            "500", "--duration", "2s", "--workers", "1", "--connections", "4",
                            "--hdr", str(hlog), "--json", str(tmp_path / "bench.json")],
                           capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    r = cli("--from", str(hlog), "--fanout", "100", "--hops", "2", "--hedge-after", "p95",
            "--monte-carlo", "20000", "--json", "-")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    _, ivs = parse_log(hlog.read_text())
    leaf = fanout.Dist.from_histogram(merged((iv.histogram for iv in ivs),
                                             ivs[0].histogram.spec))
    assert data["input"] == f"histogram of {sum(iv.histogram.total for iv in ivs):,} samples"
    res = fanout.plan(leaf, 100, 2, leaf.quantile(0.95))
    sims = fanout.monte_carlo(leaf, 100, 2, leaf.quantile(0.95), 20_000,
                              np.random.default_rng(3))
    assert_bracketed(res.end_to_end, sims, qs=(0.5, 0.9, 0.99))
    p = data["percentiles"]
    assert p["p50"]["end_to_end_ms"] == pytest.approx(res.end_to_end.quantile(0.5) / 1e6)
    assert p["p50"]["end_to_end_ms"] > 2 * p["p50"]["leaf_ms"]  # two hops of 100-way max
    # the bench JSON's percentile table gives a coarser, upper-bound answer
    r = cli("--from", str(tmp_path / "bench.json"), "--fanout", "100", "--json", "-")
    assert r.returncode == 0, r.stderr
    coarse = json.loads(r.stdout)["percentiles"]["p50"]["end_to_end_ms"]
    assert coarse >= fanout.fan_out(leaf, 100).quantile(0.5) / 1e6 * 0.99


def test_hedge_after_a_percentile_the_table_lacks_is_refused_not_read_as_p99(tmp_path):
    bench = tmp_path / "bench.json"
    table = {"p50": 1.0, "p90": 2.0, "p99": 5.0, "p999": 9.0, "p9999": 20.0, "max": 25.0}
    bench.write_text(json.dumps({"tailgate_bench": 1, "latency_ms": table}))
    r = cli("--from", str(bench), "--fanout", "10", "--hedge-after", "p95")
    assert r.returncode == 2 and "has no p95 (it would read as the next row up)" in r.stderr
    assert "p50, p90, p99, p99.9, p99.99, max" in r.stderr
    # a row it has works, and hedges at that row's value
    r = cli("--from", str(bench), "--fanout", "10", "--hedge-after", "p99", "--json", "-")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hedge"]["after_ms"] == pytest.approx(5.0)
    # a bench that wrote its P95 (issue 25) hedges at P95 itself
    bench.write_text(json.dumps({"tailgate_bench": 1, "latency_ms": {**table, "p95": 3.0}}))
    r = cli("--from", str(bench), "--fanout", "10", "--hedge-after", "p95", "--json", "-")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hedge"]["after_ms"] == pytest.approx(3.0)
    r = cli("--from", str(bench), "--fanout", "10", "--hedge-after", "p99.9", "--json", "-")
    assert r.returncode == 0 and json.loads(r.stdout)["hedge"]["after_ms"] == pytest.approx(9.0)
    r = cli("--from", str(bench), "--fanout", "10", "--hedge-after", "pxx")
    assert r.returncode == 2 and "a percentile (p95, p99, p99.9) or a time" in r.stderr
