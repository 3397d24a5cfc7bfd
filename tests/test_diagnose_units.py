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
from hypothesis import given, settings
from hypothesis import strategies as st

from tailgate.diagnose.counters import (
    Reset,
    Spec,
    bin_series,
    kept_reason,
    read_counters,
    resets,
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


def test_an_engine_counter_that_goes_back_is_a_restart_counted_from_zero():
    """A restarted engine's counters start again from zero: the bin of the reset holds what
    the new process counted (never a negative rate), and the reset is found between the last
    poll of the old process and the first of the new, across polls that could not read it
    (the engine down)."""
    polls = [(0, {"engine.prompt_tokens_total": 500.0, "engine.queue_depth": 1.0}),
             (100 * MS, {"engine.prompt_tokens_total": 700.0}),
             (200 * MS, {}),  # the engine down: /metrics refused
             (300 * MS, {"engine.prompt_tokens_total": 40.0}),
             (400 * MS, {"engine.prompt_tokens_total": 90.0})]
    out = bin_series(polls, 0, 100 * MS, 4)
    assert out["engine.prompt_tokens_total"] == [200.0, 20.0, 20.0, 50.0]
    assert resets(polls) == [Reset(100 * MS, 300 * MS, ("engine.prompt_tokens_total",))]
    # a gauge going down is no reset, nor a counter that only grew
    assert resets(polls[:2]) == [] and resets([(0, {"engine.queue_depth": 3.0}),
                                              (1, {"engine.queue_depth": 0.0})]) == []


def test_only_an_engines_counters_are_searched_for_a_restart():
    polls = [(0, {"psi.cpu.some_total": 9.0}), (100 * MS, {"psi.cpu.some_total": 1.0})]
    assert resets(polls) == []


def test_a_target_pid_gone_or_reused_is_an_exit_of_the_first_poll_that_sees_it(tmp_path):
    """The poller keeps each target's start time: a pid that is gone, or that now names a
    process started later (the pid reused), is the exit, at the first poll that saw it."""
    import subprocess

    from tailgate.diagnose.counters import CounterPoller

    proc = subprocess.Popen(["sleep", "30"])
    try:
        poller = CounterPoller(Host(), Spec((proc.pid,), ()))
        poller.poll()
        assert poller.polls.exits == {}
        proc.kill()
        proc.wait()
        poller.poll()
        (t_gone,) = poller.polls.exits.values()
        assert poller.polls.exits == {proc.pid: poller.polls.rows[-1][0]}
        poller.poll()
        assert poller.polls.exits == {proc.pid: t_gone}  # the first poll that saw it
    finally:
        proc.kill()
        proc.wait()


def _restart_doc() -> dict:
    return {"timeline": {"t0_monotonic_ns": 0, "bin_ms": 100.0,
                         "t_ms": [0.0, 100.0, 200.0, 300.0],
                         "evidence_ms": {"runq": [1.0, 2.0, 0.0, 0.0]},
                         "series": {"switches.voluntary": {"values": [5.0, 6.0, 0.0, 0.0]},
                                    "psi.cpu.some": {"values": [1.0, 1.0, 1.0, 1.0]}},
                         "unknown": {"http://e/metrics": "HTTP 503", "/proc/4242/net/snmp":
                                     "absent", "softirq time": "not probed"}},
            "causes": [{"cause": "runq", "layer": "L2", "sentence": "runq ...",
                        "claimed": False},
                       {"cause": "engine_prefill", "layer": "L4", "sentence": "prefill ...",
                        "claimed": False}],
            "verdict": {"claimed": [], "first": None, "unexplained": "no evidence co-occurs"}}


def test_a_target_that_exited_mid_window_makes_the_requests_after_it_unknown():
    """The pid found gone at 250 ms (last seen at 150 ms), the engine's counter back to zero
    between 150 and 250 ms: the 2 requests ending after 150 ms are unknown to the kernel
    evidence, which the verdict says in place of a clean "nothing claimed"; the probes' bins
    from the exit on are unseen (None), not zero; the engine's own causes are untouched."""
    from tailgate.diagnose.counters import Polls
    from tailgate.diagnose.restart import judge, restart_into

    rows = [(50 * MS, {"engine.prompt_tokens_total": 90.0}),
            (150 * MS, {"engine.prompt_tokens_total": 120.0}),
            (200 * MS, {}),  # /metrics refused while the new process started
            (250 * MS, {"engine.prompt_tokens_total": 10.0})]
    polls = Polls(rows=rows, exits={4242: 250 * MS},
                  failed={"http://e/metrics": [200 * MS], "/proc/4242/net/snmp": [250 * MS]})
    ends = [40 * MS, 100 * MS, 160 * MS, 280 * MS]
    r = judge(polls, ends)
    assert (r.pids, r.seen_ns, r.gone_ns, r.before, r.after) == ((4242,), 150 * MS,
                                                                 250 * MS, 2, 2)
    doc = _restart_doc()
    restart_into(doc, polls, ends)
    note = doc["restart"]["note"]
    assert note.startswith("the target process 4242 exited between 0.15 s and 0.25 s into "
                           "the window (its /metrics counters went back to zero between "
                           "0.15 s and 0.25 s"), note
    assert "the 2 requests in flight then or sent after, so their host causes are unknown" in note
    assert doc["verdict"]["unknown"] == doc["verdict"]["unexplained"] == note
    assert doc["restart"]["between_ms"] == [150.0, 250.0]
    assert doc["restart"]["counter_resets"] == [
        {"between_ms": [150.0, 250.0], "series": ["engine.prompt_tokens_total"]}]
    tl = doc["timeline"]
    assert tl["evidence_ms"]["runq"] == [1.0, 2.0, None, None]
    assert tl["series"]["switches.voluntary"]["values"] == [5.0, 6.0, None, None]
    assert tl["series"]["psi.cpu.some"]["values"] == [1.0] * 4  # the host's: still seen
    assert [m["kind"] for m in tl["marks"]] == ["exit", "counter_reset"]
    # the sources that failed only from the exit on say so, not unknown over the window
    assert tl["unknown"] == {
        "http://e/metrics": "HTTP 503 (only while the engine restarted: 1 poll between "
                            "0.20 s and 0.20 s; read before and after)",
        "/proc/4242/net/snmp": "absent (from 0.25 s on: after the target exited)",
        "softirq time": "not probed"}
    runq, prefill = doc["causes"]
    assert runq["restart_unknown_requests"] == 2 and "(unknown)" in runq["sentence"]
    assert prefill == _restart_doc()["causes"][1]


def test_a_claimed_cause_keeps_its_claim_and_the_verdict_adds_the_unknown():
    from tailgate.diagnose.counters import Polls
    from tailgate.diagnose.restart import restart_into

    doc = _restart_doc()
    doc["verdict"] = {"claimed": ["runq"], "first": "runq", "unexplained": None}
    restart_into(doc, Polls(rows=[(0, {}), (100 * MS, {})], exits={7: 100 * MS}), [50 * MS])
    v = doc["verdict"]
    assert v["first"] == "runq" and v["unexplained"] is None
    assert v["unknown"].startswith("the target process 7 exited between 0.00 s and 0.10 s")
    assert doc["restart"]["requests_after"] == 1


def test_no_exit_and_no_reset_leaves_the_document_as_it_is():
    from tailgate.diagnose.counters import Polls
    from tailgate.diagnose.restart import restart_into

    doc = _restart_doc()
    restart_into(doc, Polls(rows=[(0, {"engine.prompt_tokens_total": 1.0}),
                                  (1, {"engine.prompt_tokens_total": 2.0})]), [0])
    assert doc == _restart_doc()


def _union_by_hand(rows: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union the slow way (sort, then extend or start a group): merge_spans' oracle."""
    out: list[list[int]] = []
    for a, b in sorted(rows, key=lambda r: r[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)), max_size=40),
       st.booleans())
@settings(max_examples=300, deadline=None)
def test_merge_spans_is_the_union_with_or_without_its_instants(rows, keep_instants):
    """One vectorised union serves diagnose's evidence (instants kept: an event at one
    instant still touches a window) and the engine's busy spans (only time counts)."""
    import numpy as np

    from tailgate.spans import merge_spans

    spans = [(a, a + d) for a, d in rows]
    got = merge_spans(np.array(spans, dtype=np.int64).reshape(-1, 2), keep_instants)
    want = _union_by_hand(spans if keep_instants else [(a, b) for a, b in spans if b > a])
    assert [tuple(r) for r in got.tolist()] == want
    assert got.dtype == np.int64 and got.shape == (len(want), 2)


def test_diagnose_help_offers_no_option_it_refuses():
    """diagnose shares bench's load options but writes no HdrHistogram log: its --help does
    not offer --hdr or --hdr-interval (it refuses them, tests/test_diagnose_library.py);
    bench's --help still does."""
    import subprocess
    import sys

    def help_of(*cmd: str) -> str:
        out = subprocess.run([sys.executable, "-m", "tailgate", *cmd, "--help"],
                             capture_output=True, text=True, timeout=60, check=True,
                             env={**os.environ, "COLUMNS": "200"})
        return out.stdout

    diagnose, bench = help_of("diagnose"), help_of("bench")
    assert "--log FILE" in diagnose and "--log FILE" in bench  # (the shared group, both)
    assert "--hdr" not in diagnose
    assert "--hdr FILE" in bench and "--hdr-interval HDR_INTERVAL" in bench
