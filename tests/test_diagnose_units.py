"""diagnose's pure parts (binning the polled counters and the probe's maps on the window's
clock, parsing the probe's output) and its counter reader on this host's real /proc and a
real HTTP /metrics endpoint serving a captured vLLM scrape."""

from __future__ import annotations

import contextlib
import http.server
import os
import threading
from pathlib import Path

import pytest

from tailgate.diagnose.counters import (
    Spec,
    bin_series,
    kept_reason,
    read_counters,
    series_meta,
    target_cpus,
)
from tailgate.diagnose.evidence import parse_events, parse_maps
from tailgate.diagnose.timeline import rebin
from tailgate.host import Host
from tailgate.probes.output import parse_output

MS = 1_000_000
VLLM = Path(__file__).parent / "fixtures" / "llm" / "vllm_0.32.0_cpu_metrics_real.prom"


def test_a_counter_is_spread_over_the_time_between_its_polls():
    polls = [(0, {"softnet.dropped": 10.0}), (200 * MS, {"softnet.dropped": 30.0}),
             (300 * MS, {"softnet.dropped": 31.0})]
    out = bin_series(polls, 0, 100 * MS, 4)
    assert out["softnet.dropped"] == [10.0, 10.0, 1.0, None]  # the last bin: no poll reached it


def test_psi_is_milliseconds_and_a_reset_adds_nothing():
    polls = [(0, {"psi.cpu.some": 1000.0}), (100 * MS, {"psi.cpu.some": 6000.0}),
             (200 * MS, {"psi.cpu.some": 10.0})]  # a counter that went back: not negative
    assert bin_series(polls, 0, 100 * MS, 2)["psi.cpu.some"] == [5.0, 0.0]
    assert series_meta("psi.cpu.some").unit == "ms"


def test_steal_is_milliseconds_from_clock_ticks():
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    polls = [(0, {"steal.cpu0": 100.0}), (100 * MS, {"steal.cpu0": 103.0})]
    assert bin_series(polls, 0, 100 * MS, 1)["steal.cpu0"] == [3 * tick_ms]
    assert series_meta("steal.cpu0").layer == "L1"


def test_an_engine_gauge_is_the_mean_of_its_polls_in_the_bin():
    polls = [(10 * MS, {"engine.queue_depth": 2.0, "engine.kv_usage": 0.5}),
             (60 * MS, {"engine.queue_depth": 4.0, "engine.kv_usage": 0.7}),
             (260 * MS, {"engine.queue_depth": 1.0, "engine.kv_usage": 0.1})]
    out = bin_series(polls, 0, 100 * MS, 3)
    assert out["engine.queue_depth"] == [3.0, None, 1.0]
    assert out["engine.kv_usage"] == [60.0, None, 10.0]  # a share, shown in %
    assert series_meta("engine.preemptions_total").gauge is False
    assert series_meta("engine.queue_depth").layer == "L4"


def test_probe_bins_are_spread_onto_the_timeline():
    # 20 ms slots 5 = [100, 120) and 6 = [120, 140) ms; 25 ms bins from 110 ms
    out = rebin({5: 20, 6: 40}, 20 * MS, 110 * MS, 25 * MS, 2)
    assert out == [20 * 10 / 20 + 40 * 15 / 20, 40 * 5 / 20]


def test_probe_maps_and_softirq_lines_parse():
    text = "\n".join([
        '{"type": "attached_probes", "data": {"probes": 10}}',
        '{"type": "printf", "data": "Q 3 1 1000 400000\\nR 7 10 300000 1\\nQ 99 1 5 9\\n'
        'R 7 400000 700000 0\\nR 7 800000 900000 2\\n"}',
        '{"type": "map", "data": {"@sw": {"7,1": 5, "7,0": 9, "8,0": 1}}}',
        '{"type": "map", "data": {"@swbin": {"1,50": 5, "0,50": 10}}}',
        '{"type": "map", "data": {"@sirq": {"3,1,50": 123456, "9,0,51": 7}}}'])
    out = parse_output(text)
    ev = parse_events(list(out.printf))
    assert ev.softirqs == [(3, 1, 1000, 400000)]
    assert ev.malformed == 2  # vector 99 is none; a wait neither woken (0) nor preempted (1)
    assert ev.spans("runq").tolist() == [[10, 300000], [400000, 700000]]
    assert ev.spans("runq_preempted").tolist() == [[10, 300000]]
    assert ev.softirq_spans((1,)).tolist() == [[1000, 400000]]
    assert ev.softirq_spans((0,)).tolist() == []
    pm = parse_maps(out)
    assert pm.switches == {7: {"voluntary": 9, "involuntary": 5},
                           8: {"voluntary": 1, "involuntary": 0}}
    assert pm.switch_totals() == {"voluntary": 10, "involuntary": 5}
    assert pm.switch_bins == {"involuntary": {50: 5}, "voluntary": {50: 10}}
    assert pm.softirq_bins == {("NET_RX", 1): {50: 123456}, ("RCU", 0): {51: 7}}


def test_counters_of_this_host():
    host = Host("/")
    pid = os.getpid()
    cpus = target_cpus(host, (pid,))
    assert cpus == tuple(sorted(os.sched_getaffinity(0)))
    values, errors = read_counters(host, Spec((pid,), cpus[:1], load_cpus=cpus[-1:]))
    assert errors == {}
    for name in ("psi.cpu.some", "psi.io.full", "softnet.dropped", "softnet.time_squeeze",
                 "tcp.retrans_segs", f"steal.cpu{cpus[0]}", f"steal.cpu{cpus[-1]}",
                 *(f"irq.cpu{c}" for c in cpus[:1]),
                 *(f"softirq.NET_RX.cpu{c}" for c in cpus[:1])):
        assert name in values, sorted(values)


def test_an_unreadable_source_is_unknown_with_its_reason_not_zero():
    host = Host("/")
    values, errors = read_counters(host, Spec((os.getpid(),), (0,), ("/nonexistent/cg",),
                                              engine_url="http://127.0.0.1:9/metrics"))
    assert "cgroup.nr_throttled" not in values and "engine.queue_depth" not in values
    assert "/nonexistent/cg/cpu.stat" in errors
    assert "unreachable" in errors["http://127.0.0.1:9/metrics"]


@contextlib.contextmanager
def serving(body: bytes):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.timeout(30)
def test_an_engines_metrics_endpoint_is_polled():
    with serving(VLLM.read_bytes()) as url:
        values, errors = read_counters(Host("/"), Spec((), (), engine_url=url))
    assert errors == {}
    assert {"engine.queue_depth", "engine.running", "engine.kv_usage",
            "engine.preemptions_total"} <= set(values)


@pytest.mark.timeout(30)
def test_metrics_without_an_engines_series_are_unknown():
    with serving(b"# TYPE up gauge\nup 1\n") as url:
        values, errors = read_counters(Host("/"), Spec((), (), engine_url=url))
    assert not any(k.startswith("engine.") for k in values)
    assert "no queue, KV-cache or preemption series" in errors[url]


def test_the_attached_line_is_no_event_and_no_malformed_line():
    """diagnose.bt's BEGIN line (the load waits for it) is neither an event nor counted as a
    malformed one; any other stray text still is."""
    from tailgate.diagnose.evidence import ATTACHED, parse_events

    ev = parse_events([f"{ATTACHED}\nO 7 100 200 0\nnonsense\n"])
    assert ev.offcpu == [(7, 100, 200, 0)] and ev.malformed == 1


def test_an_answer_is_kept_over_a_time_out_as_the_reason():
    late = "http://h/metrics: no complete answer within 2 s"
    nope = "http://h/metrics: HTTP 404 Not Found"
    assert kept_reason(None, late) == late
    assert kept_reason(late, nope) == nope  # the engine answered: that is why
    assert kept_reason(nope, late) == nope  # the first answer stands
    assert kept_reason(late, late) == late
    assert kept_reason("a", "b") == "a"


def test_throttled_time_summed_over_cpus_is_bounded_by_the_poll_gap():
    """cpu.stat's throttled time is the sum over the cgroup's CPUs: 20 ms of it in a 5 ms
    poll (four CPUs throttled together) is a throttled interval of at most those 5 ms."""
    from tailgate.diagnose.evidence import CounterPolls

    ms = 1_000_000
    polls = CounterPolls(cgroups={"/sys/fs/cgroup/svc": [
        (100 * ms, 0, 0), (105 * ms, 4, 20 * ms), (110 * ms, 5, 22 * ms), (115 * ms, 5, 22 * ms)]})
    assert polls.throttle_spans().tolist() == [[100 * ms, 105 * ms], [108 * ms, 110 * ms]]
