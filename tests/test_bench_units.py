"""The pure parts of the bench: schedule, units, targets, SLOs, outcomes."""

from __future__ import annotations

import numpy as np
import pytest

from tailgate.bench.outcome import KINDS, OK, PROTOCOL, STATUS_4XX, STATUS_5XX, http_outcome
from tailgate.bench.schedule import arrival_times
from tailgate.bench.target import TargetError, parse_target
from tailgate.bench.units import parse_duration, parse_rate, unescape
from tailgate.slo import SloError, evaluate, parse_slo


def test_constant_schedule_is_exact_and_splits_without_gaps_or_overlap():
    whole = arrival_times(1000, 2.0)
    assert whole.size == 2000 and whole[0] == 0.0
    assert np.allclose(np.diff(whole), 1e-3)
    parts = [arrival_times(1000, 2.0, worker=k, workers=3) for k in range(3)]
    assert sum(p.size for p in parts) == 2000
    assert np.array_equal(np.sort(np.concatenate(parts)), whole)


def test_poisson_schedule_has_the_asked_rate_and_exponential_gaps():
    parts = [arrival_times(5000, 4.0, "poisson", worker=k, workers=2, seed=1) for k in range(2)]
    merged = np.sort(np.concatenate(parts))
    n = merged.size
    assert abs(n - 20_000) < 5 * np.sqrt(20_000)  # 5 sigma
    gaps = np.diff(merged)
    assert abs(gaps.mean() - 1 / 5000) < 0.05 / 5000
    # Exponential: coefficient of variation 1 (constant would be 0).
    assert 0.9 < gaps.std() / gaps.mean() < 1.1
    assert merged.min() >= 0 and merged.max() < 4.0
    again = arrival_times(5000, 4.0, "poisson", worker=0, workers=2, seed=1)
    assert np.array_equal(again, parts[0])  # a seed reproduces the schedule


def test_schedule_rejects_nonsense():
    with pytest.raises(ValueError):
        arrival_times(0, 1)
    with pytest.raises(ValueError):
        arrival_times(10, 1, "bursty")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        arrival_times(10, 1, worker=2, workers=2)


@pytest.mark.parametrize(("text", "seconds"), [
    ("10s", 10.0), ("500ms", 0.5), ("2m", 120.0), ("1.5", 1.5), ("250us", 250e-6),
    ("1h", 3600.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "soon", "10 parsecs", "-1s"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_rates_and_escapes():
    assert parse_rate("20k") == 20_000 and parse_rate("1.5M") == 1_500_000
    assert parse_rate("500/s") == 500
    for bad in ("0", "-3", "fast"):
        with pytest.raises(ValueError):
            parse_rate(bad)
    assert unescape(r"PING\r\n") == b"PING\r\n"
    assert unescape(r"\x00\xff") == b"\x00\xff"


def test_http_target_builds_one_keep_alive_request():
    t = parse_target("http://127.0.0.1:8080/a?b=1", method="POST",
                     headers=[("X-Test", "yes")], body=b"hi")
    assert (t.kind, t.host, t.port) == ("http", "127.0.0.1", 8080)
    head, body = t.request.split(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /a?b=1 HTTP/1.1"
    assert "Host: 127.0.0.1:8080" in lines and "X-Test: yes" in lines
    assert "Content-Length: 2" in lines and body == b"hi"
    assert parse_target("http://localhost/").port == 80


@pytest.mark.parametrize(("url", "opts"), [
    ("ftp://x:1/", {}),
    ("https://x/", {"payload": b"a"}),
    ("http://:80/", {}),
    ("http://x:99999/", {}),
    ("tcp://x", {"payload": b"a", "delimiter": b"\n"}),  # no port
    ("tcp://x:1", {"delimiter": b"\n"}),  # no payload
    ("tcp://x:1", {"payload": b"a"}),  # neither delimiter nor length
    ("tcp://x:1", {"payload": b"a", "delimiter": b"\n", "response_length": 3}),
    ("http://x:1/", {"payload": b"a"}),
    ("http://x:1/", {"method": "GE T"}),
    ("http://x:1/", {"headers": [("X", "a\r\nInjected: 1")]}),
])
def test_bad_targets(url, opts):
    with pytest.raises(TargetError):
        parse_target(url, **opts)


def test_http_outcome_classes():
    assert http_outcome(200) == http_outcome(304) == OK
    assert http_outcome(404) == STATUS_4XX and http_outcome(503) == STATUS_5XX
    assert http_outcome(101) == PROTOCOL
    assert KINDS[0] == "ok"


def test_slo_parsing_normalises_units():
    s = parse_slo("p999<5ms")
    assert (s.metric, s.op, s.limit, s.unit) == ("latency.p999", "<", 5.0, "ms")
    assert parse_slo("p99 <= 250us").limit == pytest.approx(0.25)
    assert parse_slo("service.p99<1s").metric == "service.p99"
    assert parse_slo("error_rate<0.1%").limit == pytest.approx(0.001)
    assert parse_slo("error_rate<0.001").limit == pytest.approx(0.001)
    assert parse_slo("rate>=9.9k").limit == 9900
    assert parse_slo("ttft_p99<2s", custom={"ttft_p99": "ms"}).limit == 2000


@pytest.mark.parametrize("bad", ["p999", "p999<5", "p999<5parsec", "p42<5ms", "error_rate<5",
                                 "errors<3ms", "p99=5ms"])
def test_bad_slos(bad):
    with pytest.raises(SloError):
        parse_slo(bad)


def test_slo_evaluation_against_a_result():
    result = {
        "rate": {"achieved": 990.0},
        "requests": {"sent": 1000, "ok": 998, "errors": {"timeout": 2, "connect": 0}},
        "latency_ms": {"p99": 4.0, "p999": 6.0, "count": 1000},
        "service_time_ms": {"p99": 0.5, "count": 1000},
        "lateness_ms": {"count": 0},
    }
    slos = [parse_slo(e) for e in ("p99<5ms", "p999<5ms", "error_rate<0.1%", "errors<=2",
                                   "rate>=980", "service.p99<1ms", "lateness.p99<1ms")]
    got = evaluate(slos, result)
    assert [g["pass"] for g in got] == [True, False, False, True, True, True, False]
    assert got[2]["observed"] == pytest.approx(0.002)
    assert got[-1]["reason"] == "no samples"  # an objective nobody measured is not met
    # a percentile without a confidence interval is not a figure to gate on
    result["latency_ms"]["ci"] = {"p99": {"lo": 3.9, "hi": 4.1, "measurable": True},
                                  "p999": {"lo": None, "hi": None, "measurable": False,
                                           "reason": "needs at least 3,688 samples"}}
    got = evaluate([parse_slo("p99<5ms"), parse_slo("p999<10ms")], result)
    assert [g["pass"] for g in got] == [True, False]
    assert got[1]["reason"] == "not measurable: needs at least 3,688 samples"
    assert got[1]["observed"] == 6.0


def test_progress_merges_worker_messages_into_running_figures():
    from tailgate.bench.progress import Progress
    from tailgate.hist import Histogram

    prog = Progress(rate=1000, duration_s=10, warmup_s=0)
    prog.start = 100.0
    for worker, values in ((0, np.arange(1, 501) * 1000), (1, np.arange(501, 1001) * 1000)):
        h = Histogram()
        h.record(values)
        idx, cnt = h.nonzero()
        prog.update(worker, {"lat_idx": idx, "lat_cnt": cnt, "lat_lo": h.min, "lat_hi": h.max,
                             "outcomes": [490, 0, 10, 0, 0, 0, 0], "dispatched": 500,
                             "open": 4, "queued": 1, "t": 101.0})
    assert prog.latency.total == 1000 and sum(prog.outcomes) == 1000
    whole = Histogram()
    whole.record(np.arange(1, 1001) * 1000)
    assert prog.latency.value_at_percentile(99.9) == whole.value_at_percentile(99.9)
    table = prog.render()
    assert table.row_count == 1 and len(table.columns) == 8
