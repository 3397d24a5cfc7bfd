"""The statistics behind --confidence, the arrival test and the stationarity test, checked
against scipy (a test-only dependency) and by simulation with fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as st

from tailgate.bench.arrivals import arrival_test
from tailgate.bench.confidence import (
    ConfidenceWatch,
    chi2_sf,
    exceedance_shift,
    exponential_cdf,
    judge_targets,
    kolmogorov_sf,
    ks_constant,
    ks_test,
    mann_kendall,
    order_statistic_ranks,
    parse_targets,
    quantile_ci,
    samples_needed,
    targets_met,
)
from tailgate.bench.stationarity import stationarity_test
from tailgate.hist import Histogram


@pytest.mark.parametrize("n", [5, 50, 367, 368, 1000, 3688, 3689, 5000, 12345, 1_000_000])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999, 0.9999])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_ranks_are_scipys_binomial_bounds(n, q, level):
    bd, a = st.binom(n, q), (1 - level) / 2
    r, s = int(bd.ppf(a)), int(bd.isf(a)) + 1
    assert order_statistic_ranks(n, q, level) == (r if r >= 1 else None, s if s <= n else None)


def test_interval_over_a_histogram_is_scipys_quantile_test_interval():
    # Integers below 2048 are recorded exactly (3 significant digits), so the
    # histogram's order statistics are the samples' own.
    rng = np.random.default_rng(7)
    for n in (400, 2_000, 20_000):
        x = rng.integers(1, 2047, size=n)
        h = Histogram()
        h.record(x)
        for p in (50.0, 90.0, 99.0, 99.9):
            ci = quantile_ci(h, p)
            ref = st.quantile_test(x, q=0, p=p / 100).confidence_interval(0.95)
            if math.isnan(ref.high) or math.isnan(ref.low):
                assert not ci.measurable, (n, p)
                continue
            assert (ci.lo, ci.hi) == (ref.low, ref.high), (n, p)


def test_95_percent_interval_covers_the_true_p99_in_95_percent_of_runs():
    rng = np.random.default_rng(12345)
    true_p99 = math.exp(math.log(100e3) + 0.5 * st.norm.ppf(0.99))  # lognormal, ns
    runs, covered, widths = 600, 0, []
    for _ in range(runs):
        h = Histogram()
        h.record(rng.lognormal(math.log(100e3), 0.5, size=2_000))
        ci = quantile_ci(h, 99.0)
        assert ci.measurable
        covered += ci.lo <= true_p99 <= ci.hi
        widths.append(ci.width)
    rate = covered / runs
    print(f"coverage {rate:.3f} over {runs} runs; median width {np.median(widths) / 1e3:.1f} us")
    # exact order-statistic intervals are conservative: >= 95 % up to sampling noise
    # (sd 0.9 % over 600 runs), and the bucket rounding only widens them a little
    assert 0.93 <= rate <= 0.99


def test_tail_percentile_from_too_few_samples_is_not_measurable():
    h = Histogram()
    h.record(np.random.default_rng(1).exponential(1e5, size=5_000))
    ci = quantile_ci(h, 99.99)
    assert not ci.measurable and ci.lo is None and ci.hi is None
    assert "36,887" in ci.reason and "5,000" in ci.reason
    assert quantile_ci(h, 99.9).measurable
    assert samples_needed(0.99) == 368 and samples_needed(0.999) == 3688
    assert not quantile_ci(Histogram(), 50.0).measurable


def test_interval_narrows_with_samples_and_brackets_the_estimate():
    rng = np.random.default_rng(3)
    small, big = Histogram(), Histogram()
    small.record(rng.exponential(1e5, size=2_000))
    big.record(rng.exponential(1e5, size=200_000))
    a, b = quantile_ci(small, 99.0), quantile_ci(big, 99.0)
    assert b.width < a.width / 4
    est = big.value_at_percentile(99.0)
    assert b.lo <= est <= b.hi


def test_confidence_targets_parse_and_judge():
    ts = parse_targets("p99=10us@95%, p999=5%@99%,p50=1ms")
    assert [(t.name, t.level, t.width_ns, t.relative) for t in ts] == [
        ("p99", 0.95, 10e3, None), ("p999", 0.99, None, 0.05), ("p50", 0.95, 1e6, None)]
    for bad in ("p98=1ms", "p99", "p99=1ms@100%", "p99=0us", "p99=1furlong", ""):
        with pytest.raises(ValueError):
            parse_targets(bad)
    rng = np.random.default_rng(5)
    h = Histogram()
    h.record(rng.exponential(1e5, size=100_000))  # P99 ~ 460 us; its CI ~ +-15 us
    assert targets_met(parse_targets("p99=100us"), h)
    assert not targets_met(parse_targets("p99=1us"), h)
    few = Histogram()
    few.record(rng.exponential(1e5, size=30_000))  # P99.99 needs 36,887
    assert not targets_met(parse_targets("p9999=100ms"), few)  # not measurable: never met


def test_kolmogorov_distribution_and_ks_statistic_match_scipy():
    for x in (0.05, 0.3, 0.7, 0.99, 1.0, 1.3, 2.0, 3.5):
        assert kolmogorov_sf(x) == pytest.approx(st.kstwobign.sf(x), abs=1e-12)
    rng = np.random.default_rng(11)
    for sample, rate in ((rng.exponential(1e-3, 3_000), 1e3),
                         (rng.exponential(1.2e-3, 3_000), 1e3),
                         (rng.exponential(1e-3, 50), 1e3)):
        ours = ks_test(sample, exponential_cdf(rate))
        ref = st.kstest(sample, "expon", args=(0, 1 / rate), method="asymp")
        assert ours.statistic == pytest.approx(ref.statistic, rel=1e-12)
        assert ours.pvalue == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)


def test_ks_false_alarm_rate_is_the_level_and_a_wrong_rate_is_caught():
    rng = np.random.default_rng(2024)
    p = [ks_test(rng.exponential(1e-3, 1_000), exponential_cdf(1e3)).pvalue for _ in range(400)]
    assert 0.02 <= np.mean(np.array(p) < 0.05) <= 0.09
    assert ks_test(rng.exponential(1.1e-3, 20_000), exponential_cdf(1e3)).pvalue < 1e-6


def test_ks_tolerance_forgives_jitter_within_the_timer_resolution_only():
    rng = np.random.default_rng(8)
    times = np.cumsum(rng.exponential(1e-3, 20_000))
    jitter = 50e-6
    sent = times + rng.uniform(0, jitter, times.size)  # every send <= 50 us late
    gaps = np.diff(sent)
    strict = ks_test(gaps, exponential_cdf(1e3))
    tol = -math.expm1(-1e3 * jitter)
    forgiving = ks_test(gaps, exponential_cdf(1e3), tolerance=tol)
    assert forgiving.pvalue > 0.05 and forgiving.statistic == strict.statistic
    # a throttled generator: it runs every 5 ms and sends what is due back to back
    held = np.ceil(times / 5e-3) * 5e-3 + np.arange(times.size) * 1e-9
    burst = ks_test(np.diff(held), exponential_cdf(1e3), tolerance=tol)
    assert burst.pvalue < 1e-6


def test_constant_gap_within_tolerance_passes_and_batches_do_not():
    rng = np.random.default_rng(4)
    gap, tol = 1e-3, 20e-6
    sent = np.arange(5_000) * gap + rng.uniform(0, tol, 5_000)
    clean = ks_constant(np.diff(sent), gap, tol)
    assert clean.statistic == 0.0 and clean.pvalue == 1.0
    batched = sent.copy()
    batched[1::4] += 0.9e-3  # every 4th send late: one gap long, the next short
    bad = ks_constant(np.diff(np.sort(batched)), gap, tol)
    assert bad.statistic == pytest.approx(0.25, abs=0.01) and bad.pvalue < 1e-6


def test_mann_kendall_matches_kendalls_tau_and_finds_a_trend():
    rng = np.random.default_rng(6)
    for y in (rng.normal(size=25), rng.normal(size=25) + np.linspace(0, 2, 25),
              np.round(rng.normal(size=40), 1)):  # ties
        ours = mann_kendall(y)
        ref = st.kendalltau(np.arange(y.size), y, method="asymptotic")
        assert ours.pvalue == pytest.approx(ref.pvalue, rel=1e-9)
    assert mann_kendall(np.linspace(1, 2, 20) + rng.normal(0, 0.05, 20)).pvalue < 1e-4


def test_exceedance_shift_flags_a_heavier_tail_only():
    rng = np.random.default_rng(9)
    a, same, worse = Histogram(), Histogram(), Histogram()
    a.record(rng.exponential(1e5, 20_000))
    same.record(rng.exponential(1e5, 20_000))
    worse.record(np.concatenate([rng.exponential(1e5, 19_000), rng.uniform(1e6, 3e8, 1_000)]))
    assert exceedance_shift(a, same, 99.0).pvalue > 0.001
    sh = exceedance_shift(a, worse, 99.0)
    assert sh.pvalue < 1e-9 and sh.share_b > 5 * sh.share_a


def test_chi2_approximation_is_close_to_scipy_where_it_is_used():
    for dof in (5, 20, 60, 400, 5000):
        for q in (0.5, 0.9, 0.99, 0.999):
            x = st.chi2.ppf(q, dof)
            assert chi2_sf(x, dof) == pytest.approx(1 - q, abs=0.003), (dof, q)


def _poisson_sends(rate: float, seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.2)))
    return t[t < seconds]


def test_arrival_test_verdicts_on_synthetic_sends():
    ok = _poisson_sends(1000, 5.0, 1) + np.random.default_rng(2).uniform(0, 60e-6, 1)
    a = arrival_test("poisson", 1000, 1, 0.0, [ok])
    assert a["verdict"] == "match" and a["statement"].startswith("arrivals match Poisson"), a
    # the worker got the CPU 5 ms in every 100 ms: sends wait for it
    t = _poisson_sends(1000, 5.0, 3)
    throttled = np.maximum(t, np.floor(t / 0.1) * 0.1 + 0.095) + np.arange(t.size) * 1e-7
    b = arrival_test("poisson", 1000, 1, 0.0, [np.sort(throttled)])
    assert b["verdict"] == "deviate", b
    assert "the generator could not keep the schedule" in b["statement"]
    # steady but slow: 20 % behind, with gaps too small for the gap test to judge
    slow = np.arange(0, 2.0, 1 / 40_000)
    c = arrival_test("constant", 50_000, 1, 0.0, [slow], tick_s=200e-6)
    assert c["gaps"]["pvalue"] is None and "resolution" in c["gaps"]["reason"]
    assert c["verdict"] == "deviate" and c["counts"]["pvalue"] < 1e-9
    # two workers, each its share of a constant schedule, within the timer's resolution
    w = [np.arange(k, 4000, 2) / 1000 + 30e-6 for k in range(2)]
    assert arrival_test("constant", 1000, 2, 0.0, w)["verdict"] == "match"
    assert arrival_test("poisson", 1000, 1, 0.0, [np.array([0.1])])["verdict"] == "unknown"


def test_poisson_arrivals_are_judged_over_all_workers_however_the_schedule_was_shared():
    """Every 2nd request of one Poisson schedule (how --requests, traces and LLM workloads
    are shared) has Erlang-2 gaps per worker: judged per worker against the exponential at
    rate/2 it read "deviate" for a generator that kept its schedule exactly."""
    t = _poisson_sends(200, 60.0, 5) + 20e-6
    split = [t[k::2] for k in range(2)]
    one = arrival_test("poisson", 200, 2, 0.0, split)
    assert one["verdict"] == "match", one
    assert one["samples"] == t.size
    # each worker its own Poisson stream at rate/2 (the default schedules): also one process
    own = [_poisson_sends(100, 60.0, seed) for seed in (6, 7)]
    assert arrival_test("poisson", 200, 2, 0.0, own)["verdict"] == "match"
    # the gaps of one worker alone are not exponential at rate/2 (what was judged before)
    alone = arrival_test("poisson", 100, 1, 0.0, [split[0]])
    assert alone["gaps"]["pvalue"] < 1e-6, alone
    # a worker whose kept sends end early (MAX_ARRIVALS): judged where both were kept
    stalled = [split[0], split[1][split[1] < 30.0]]
    merged = arrival_test("poisson", 200, 2, 0.0, stalled)
    assert merged["verdict"] == "match" and merged["samples"] == split[0].size + stalled[1].size
    # a worker that falls to a quarter of its share halfway through: seen merged
    half = [split[0], np.concatenate([split[1][split[1] < 30.0], split[1][split[1] >= 30.0][::4]])]
    assert arrival_test("poisson", 200, 2, 0.0, half)["verdict"] == "deviate"


def test_stationarity_test_on_synthetic_intervals():
    rng = np.random.default_rng(10)

    def hist(values):
        h = Histogram()
        h.record(values)
        return h

    steady = {k: hist(rng.exponential(1e5, 500)) for k in range(20)}
    s = stationarity_test(steady, 0.2)
    assert s["verdict"] == "stationary" and s["trend"]["intervals"] == 20, s
    stalled = dict(steady)
    stalled[15] = hist(np.concatenate([rng.exponential(1e5, 350), rng.uniform(1e6, 3e8, 150)]))
    s = stationarity_test(stalled, 0.2)
    assert s["verdict"] == "drifted" and "second half" in s["statement"], s
    rising = {k: hist(rng.exponential(1e5 * (1 + k / 5), 500)) for k in range(20)}
    s = stationarity_test(rising, 0.2)
    assert s["verdict"] == "drifted" and s["trend"]["pvalue"] < 1e-3
    assert stationarity_test({0: steady[0]}, 0.2)["verdict"] == "unknown"


def _msg(h: Histogram, t: float) -> dict:
    idx, cnt = h.nonzero()
    return {"lat_idx": idx, "lat_cnt": cnt, "lat_lo": h.min, "lat_hi": h.max, "t": t}


def test_watch_waits_for_every_worker_and_two_rounds_and_final_judgement_counts():
    rng = np.random.default_rng(21)
    targets = parse_targets("p50=10%")
    watch = ConfidenceWatch(targets, Histogram().spec, warmup_s=1.0, workers=2)
    watch.start = 100.0
    chunks = []
    for _ in range(6):
        h = Histogram()
        h.record(rng.exponential(1e5, 2_000))
        chunks.append(h)
    watch.update(0, _msg(chunks[0], 101.5))
    assert not watch.reached()  # worker 1 not heard yet
    watch.update(1, _msg(chunks[1], 101.6))
    assert not watch.reached()  # met once: one more round
    watch.update(0, _msg(chunks[2], 101.8))
    watch.update(1, _msg(chunks[3], 101.9))
    assert watch.reached() and watch.after_s == pytest.approx(0.9)
    # the final histogram (with the slow requests that were in flight) decides
    final = Histogram()
    for h in chunks[:4]:
        final.add(h)
    ok = judge_targets(targets, final, watch.after_s, 10.0)
    assert ok["reached"] and ok["after_s"] == 0.9
    final.record(rng.uniform(1e6, 1e7, 8_000))
    late = judge_targets(targets, final, watch.after_s, 10.0)
    assert not late["reached"] and late["after_s"] is None and late["stopped_after_s"] == 0.9
    # never seen met while running but met at the end: reached at the ceiling
    done = Histogram()
    for h in chunks:
        done.add(h)
    assert judge_targets(targets, done, None, 10.0)["after_s"] == 10.0
