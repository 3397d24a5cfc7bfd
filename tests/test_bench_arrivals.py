"""Arrivals users ask for (issue 27): gamma inter-arrivals with a burstiness factor (as
`vllm bench serve --burstiness`), the arrival test adapted to them, and ramps
(`--rate LO..HI`) whose offered rate over time the result records. The schedule and
the test are pure (schedules in, verdicts out); the end of the file runs `tailgate bench`
against nginx on loopback and a scenario file."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.special
import scipy.stats

from support.nginx import Nginx
from support.nginx import available as nginx_available
from support.require import require
from tailgate.bench.arrivals import arrival_test, gamma_cdf, shift_tolerance
from tailgate.bench.schedule import Ramp, arrival_times, parse_ramp
from tailgate.bench.spec import BenchOptions, build
from tailgate.errors import UsageError

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.mark.parametrize("b", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_mean_one_over_rate_and_the_shape_asked(b):
    t = arrival_times(2000, 50.0, "gamma", burstiness=b, seed=3)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(1 / 2000, rel=0.03)
    cv2 = gaps.var() / gaps.mean() ** 2
    assert cv2 == pytest.approx(1 / b, rel=0.1)  # CV² = 1/B: B < 1 burstier than Poisson
    fit = scipy.stats.kstest(gaps, "gamma", args=(b, 0, 1 / (2000 * b)))
    assert fit.pvalue > 0.001


def test_gamma_workers_take_every_nth_arrival_of_one_sequence():
    whole = arrival_times(1000, 5.0, "gamma", burstiness=0.5, seed=7)
    parts = [arrival_times(1000, 5.0, "gamma", worker=k, workers=3, burstiness=0.5, seed=7)
             for k in range(3)]
    assert np.array_equal(np.sort(np.concatenate(parts)), whole)
    assert np.array_equal(parts[1], whole[1::3])
    other = arrival_times(1000, 5.0, "gamma", burstiness=0.5, seed=8)
    assert not np.array_equal(other[:50], whole[:50])
    with pytest.raises(ValueError):
        arrival_times(1000, 1.0, "gamma", burstiness=0.0)


def test_gamma_cdf_and_its_timer_tolerance():
    for a in (0.01, 0.3, 1.0, 2.5, 40.0):
        x = np.concatenate([[0.0], np.logspace(-6, 2.5, 500) * a])
        assert np.max(np.abs(gamma_cdf(a, 1.0)(x) - scipy.special.gammainc(a, x))) < 1e-12
    # shape 1 is the exponential: the tolerance is Poisson's 1 - exp(-λδ)
    lam, delta = 1000.0, 100e-6
    cdf = gamma_cdf(1.0, 1 / lam)
    assert shift_tolerance(cdf, 1.0, 1 / lam, delta) == pytest.approx(-math.expm1(-lam * delta))
    # shape 4: the largest CDF step over a δ window (a fine brute-force grid agrees)
    cdf4 = gamma_cdf(4.0, 1 / (lam * 4))
    x = np.linspace(0, 0.01, 200_001)
    brute = float(np.max(cdf4(x + delta) - cdf4(x)))
    assert shift_tolerance(cdf4, 4.0, 1 / lam, delta) == pytest.approx(brute, rel=1e-3)


def _sends(times: np.ndarray, seed: int, late_s: float = 60e-6) -> np.ndarray:
    """What a generator within the timer's resolution sends: each a little late, in order."""
    rng = np.random.default_rng(seed)
    return np.maximum.accumulate(times + rng.uniform(0, late_s, times.size))


@pytest.mark.parametrize("b,workers", [(0.5, 1), (2.0, 2), (4.0, 1)])
def test_a_gamma_schedule_kept_matches_and_the_wrong_shape_deviates(b, workers):
    rate = 500.0
    sends = [_sends(arrival_times(rate, 20.0, "gamma", worker=k, workers=workers,
                                  burstiness=b, seed=11), k) for k in range(workers)]
    ok = arrival_test("gamma", rate, workers, 0.0, sends, burstiness=b)
    assert ok["verdict"] == "match", ok["statement"]
    assert ok["burstiness"] == b and "gamma arrivals (burstiness" in ok["statement"]
    assert ok["gaps"]["pvalue"] is not None and ok["counts"]["pvalue"] is not None
    # the same sends judged against Poisson, or against another shape, deviate
    wrong = arrival_test("gamma", rate, workers, 0.0, sends, burstiness=1.0 if b != 1 else 3)
    assert wrong["verdict"] == "deviate", wrong["statement"]
    poisson = arrival_test("poisson", rate, workers, 0.0, sends)
    assert poisson["verdict"] == "deviate", poisson["statement"]


def test_a_gamma_generator_that_stalls_deviates():
    """Every send of a 0.3 s window held back to its end (a CPU quota's stall)."""
    t = _sends(arrival_times(500.0, 20.0, "gamma", burstiness=2.0, seed=5), 1)
    t = np.where((t > 8.0) & (t < 8.3), 8.3, t)
    r = arrival_test("gamma", 500.0, 1, 0.0, [t], burstiness=2.0)
    assert r["verdict"] == "deviate" and r["counts"]["pvalue"] < 0.01, r["statement"]


def test_a_ramp_places_arrivals_by_its_rate_over_time():
    ramp = Ramp(100.0, 1000.0, 1.0, 11.0)  # 1 s of warm-up at 100/s, then 10 s up to 1000
    assert float(ramp.cumulative(11.0)) == pytest.approx(100 + 10 * 550)
    u = np.linspace(0, 7000, 1001)
    assert np.allclose(ramp.cumulative(ramp.inverse(u)), u)
    t = arrival_times(ramp.mean_rate, 11.0, "constant", ramp=ramp)
    assert t.size == int(ramp.cumulative(11.0))
    gaps = np.diff(t)
    mid = (t[1:] + t[:-1]) / 2
    # a constant schedule keeps the gap 1/rate(t) all along the ramp
    assert np.allclose(gaps, 1 / ramp.rate_at(mid), rtol=2e-3)
    down = Ramp(1000.0, 100.0, 0.0, 10.0)  # a falling ramp is the same rule
    td = arrival_times(down.mean_rate, 10.0, "poisson", ramp=down, seed=2)
    assert td.size == pytest.approx(5500, rel=0.05)
    assert np.count_nonzero(td < 5.0) == pytest.approx(3875, rel=0.05)  # Λ(5) = 3875
    assert parse_ramp("1k..10k") == (1000.0, 10000.0) and parse_ramp("20k") is None
    with pytest.raises(ValueError):
        parse_ramp("1k..fast")


@pytest.mark.parametrize("arrival", ["constant", "poisson", "gamma"])
def test_a_ramp_kept_matches_in_operational_time_and_an_unramped_test_does_not(arrival):
    ramp = Ramp(200.0, 2000.0, 0.0, 15.0)
    sends = [_sends(arrival_times(ramp.mean_rate, 15.0, arrival, worker=k, workers=2,
                                  burstiness=3.0, seed=4, ramp=ramp), k) for k in range(2)]
    r = arrival_test(arrival, ramp.mean_rate, 2, 0.0, sends, burstiness=3.0, ramp=ramp)
    assert r["verdict"] == "match", r["statement"]
    assert r["ramp"]["to_rps"] == 2000.0 and "ramping 200..2000/s" in r["statement"]
    assert r["counts"]["window_arrivals"] >= 100  # 50 ms at the 2000/s peak
    flat = arrival_test(arrival, ramp.mean_rate, 2, 0.0, sends, burstiness=3.0)
    assert flat["verdict"] == "deviate", flat["statement"]


def test_the_spec_takes_a_ramp_and_burstiness_and_refuses_what_does_not_fit():
    spec = build(BenchOptions(target="http://127.0.0.1:9/", rate="1k..3k", duration="4s",
                              warmup="1s", arrival="gamma", burstiness=0.5))
    info = spec.info
    assert info.rate == 2000.0 and info.burstiness == 0.5
    assert info.ramp == Ramp(1000.0, 3000.0, 1.0, 5.0)
    cfg = info.config_json()
    assert cfg["ramp"]["from_rps"] == 1000.0 and cfg["burstiness"] == 0.5
    for kw, msg in [
        ({"rate": "1k..3k", "requests": 10}, "a ramp runs over --duration"),
        ({"rate": "1k", "duration": "1s", "burstiness": 2.0}, "--burstiness is the shape"),
        ({"rate": "1k", "duration": "1s", "arrival": "gamma", "burstiness": 0.0},
         "--burstiness must be between"),
        ({"rate": "0..3k", "duration": "1s"}, "rate must be positive"),
        ({"rate": "1k..x", "duration": "1s"}, "x"),
    ]:
        with pytest.raises(UsageError, match=msg):
            build(BenchOptions(target="http://127.0.0.1:9/", **kw))


def tailgate(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailgate", *argv], capture_output=True,
                          text=True, timeout=timeout,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin:/usr/sbin"})


def test_a_gamma_ramp_against_nginx_records_the_offered_rate_over_time(tmp_path):
    require(nginx_available())
    out = tmp_path / "r.json"
    with Nginx() as ng:
        r = tailgate("bench", f"http://127.0.0.1:{ng.port}/", "--rate", "100..600",
                     "--duration", "4s", "--arrival", "gamma", "--burstiness", "0.5",
                     "--workers", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    d = json.loads(out.read_text())
    assert d["config"]["arrival"] == "gamma" and d["config"]["burstiness"] == 0.5
    assert d["config"]["ramp"]["from_rps"] == 100.0 and d["rate"]["target"] == 350.0
    off = d["offered"]
    # without --hdr, 20..100 intervals over the run: 4 s in 0.2 s steps
    assert off["ramp"]["to_rps"] == 600.0 and off["interval_s"] == pytest.approx(0.2)
    assert len(off["t_s"]) == 20 and off["t_s"][1] == pytest.approx(0.2)
    target = np.array(off["target_rps"])
    # the ramp's mean over each interval: 100 + 125/s · (its middle)
    assert target == pytest.approx(100 + 125 * (np.array(off["t_s"]) + 0.1))
    assert sum(off["sent_rps"]) * off["interval_s"] == d["requests"]["sent"]
    sent = np.array(off["sent_rps"])
    # what was sent follows the ramp (bursty gamma: compare halves, not intervals)
    assert sent[10:].sum() > 1.5 * sent[:10].sum()
    assert d["arrivals"]["distribution"] == "gamma" and d["arrivals"]["ramp"] is not None
    assert "ramp 100..600/s over the measured part" in r.stdout
    assert "gamma (burstiness 0.5) 100..600 req/s (mean 350)" in r.stdout


def test_a_scenario_takes_gamma_burstiness_and_a_ramp_and_names_a_bad_value(tmp_path):
    from tailgate.bench.scenario import parse_scenario, target_args

    text = ("targets:\n  - url: http://127.0.0.1:9/\n    rate: 1k..2k\n    duration: 2s\n"
            "    arrival: gamma\n    burstiness: 0.25\n")
    (t,) = parse_scenario(text, "s.yaml")
    import argparse

    ns = target_args(argparse.Namespace(workers=None, rate=None, slo=[], target=None), t)
    assert (ns.rate, ns.arrival, ns.burstiness) == ("1k..2k", "gamma", 0.25)
    f = tmp_path / "bad.yaml"
    f.write_text(text.replace("0.25", "0"))
    r = tailgate("bench", "--scenario", str(f))
    assert r.returncode == 2 and f"{f}:6: target 'http://127.0.0.1:9/', key burstiness:" \
        in r.stderr, r.stderr
    f.write_text(text.replace("1k..2k", "1k..lots"))
    r = tailgate("bench", "--scenario", str(f))
    assert r.returncode == 2 and f"{f}:3:" in r.stderr and "key rate" in r.stderr, r.stderr
    f.write_text(text.replace("gamma", "weibull"))
    r = tailgate("bench", "--scenario", str(f))
    assert r.returncode == 2 and "key arrival" in r.stderr and "gamma" in r.stderr, r.stderr
