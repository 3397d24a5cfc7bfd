"""Probe internals without a kernel: bucket arithmetic, bpftrace's JSON lines (real captured
outputs in fixtures/probes), the analyses, parameter validation, and the checks' judgments."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailgate.collect import Scope
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.model import Fact, ParseError, Snapshot
from tailgate.probes import PROBES, Request, analyze, driver, loglin
from tailgate.probes.output import parse_output, split_key
from tailgate.sources.probes import plan

FIX = Path(__file__).parent / "fixtures" / "probes"


def fixture(name: str):
    return parse_output((FIX / f"{name}.jsonl").read_text(encoding="utf-8"))


# -- log-linear buckets --------------------------------------------------------------------

def test_buckets_tile_the_line_without_gaps():
    prev_high = 0
    for key in range(0, 64 * 40):
        low, high = loglin.bucket_bounds(key)
        assert low == prev_high, key
        assert loglin.bucket_key(low) == key and loglin.bucket_key(high - 1) == key
        assert high - low == 1 if low < 128 else (high - low) / low <= 1 / 64
        prev_high = high


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=3000),
       st.sampled_from([0.5, 0.9, 0.99, 0.999, 1.0]))
def test_quantile_from_buckets_within_one_percent_of_exact(samples, q):
    buckets: dict[int, int] = {}
    for s in samples:
        buckets[loglin.bucket_key(s)] = buckets.get(loglin.bucket_key(s), 0) + 1
    est = loglin.quantile(buckets, q, max(samples))
    exact = loglin.exact_quantile(samples, q)
    assert abs(est - exact) <= exact / 128 + 0.5  # half a bucket (+ half a ns below 128 ns)


def test_empty_histogram_has_no_quantiles():
    s = loglin.summarize({}, None)
    assert s["count"] == 0 and s["p999"] is None and s["max"] is None and s["buckets"] == []


def test_negative_values_are_rejected():
    with pytest.raises(ValueError):
        loglin.bucket_key(-1)


# -- bpftrace JSON lines -------------------------------------------------------------------

def test_parse_output_reads_maps_printf_and_attach_count():
    out = parse_output('{"type": "attached_probes", "data": {"probes": 3}}\n\n'
                       '{"type": "printf", "data": "hello 7\\n"}\n'
                       '{"type": "map", "data": {"@sw": {"77,kdamond.0": 2, "11,a,b": 3}}}\n'
                       '{"type": "map", "data": {"@m": 7283}}\n'
                       '{"type": "lost_events", "data": {"events": 5}}\n'
                       'WARNING: something\n')
    assert out.attached == 3 and out.printf == ("hello 7\n",) and out.lost_events == 5
    assert out.scalar("@m") == 7283 and out.map("@missing") == {}
    assert split_key("11,a,b", 2) == ["11", "a,b"]  # a comm with a comma stays whole
    assert out.other == ("WARNING: something",)


def test_duplicate_keys_add_up():
    out = fixture("malloc")
    # malloc, calloc and realloc return into one function: three usym keys print alike.
    assert len(out.map("@callers")) == 1
    assert sum(out.map("@callers").values()) == sum(out.map("@calls").values())


@pytest.mark.parametrize("bad", ['{"type": "map", "data": {"@x": ', '{"data": 1}',
                                 '{"type": "map", "data": 3}',
                                 '{"type": "attached_probes", "data": {}}',
                                 '{"type": "lost_events", "data": "x"}'])
def test_malformed_output_is_a_parse_error(bad):
    with pytest.raises(ParseError):
        parse_output(bad)


def test_malformed_map_keys_are_parse_errors():
    out = parse_output('{"type": "map", "data": {"@lat": {"notanumber,12": 1}}}')
    with pytest.raises(ParseError):
        analyze.runqlat(out, pids=(1,))
    out = parse_output('{"type": "map", "data": {"@lat": {"12": 1}}}')
    with pytest.raises(ParseError):
        analyze.runqlat(out)


# -- analyses of real captured outputs -----------------------------------------------------

def test_runqlat_host_summary():
    s = analyze.runqlat(fixture("runqlat-host"))
    assert s["probe"] == "runqlat" and s["unit"] == "us" and s["scope"] == "host"
    assert s["count"] == sum(b["count"] for b in s["buckets"]) > 0
    assert s["p50"] <= s["p90"] <= s["p99"] <= s["p999"] <= s["max"]
    assert s["p999"] > 500  # captured with 3 spin loops on 2 vCPUs


def test_runqlat_per_process_summary():
    s = analyze.runqlat(fixture("runqlat-pids"), pids=(1, 2))
    procs = s["processes"]
    assert procs["1"]["count"] == 0 and procs["1"]["p999"] is None  # asked for, not seen
    spinners = {k: v for k, v in procs.items() if v["count"]}
    assert len(spinners) == 3 and all(v["p999"] > 1000 for v in spinners.values())
    assert s["count"] == sum(v["count"] for v in procs.values())


def test_switches_offcpu_futex():
    sw = analyze.switches(fixture("switches"))
    assert sw["involuntary"] > 0 and all(r["comm"] == "spin" for r in sw["processes"].values())
    off = analyze.offcpu(fixture("offcpu"))
    assert any(r["preempted_count"] > 0 for r in off["processes"].values())
    fx = analyze.futex(fixture("futex"))
    (pid, proc), = fx["processes"].items()
    assert proc["count"] > 0 and len(proc["threads"]) >= 2
    assert proc["count"] == sum(t["waits"] for t in proc["threads"].values())


def test_mmsg_tells_batched_from_single():
    procs = list(analyze.mmsg(fixture("mmsg"))["processes"].values())
    batched = [r for r in procs if r["recvmmsg"]]
    single = [r for r in procs if r["single_recv"]]
    assert len(batched) == 1 and len(single) == 1
    assert batched[0]["batch"] == 32.0 and batched[0]["send_batch"] == 32.0
    assert single[0]["batch"] == 1.0 and single[0]["recvmmsg"] == 0


def test_malloc_names_the_allocating_loop():
    s = analyze.malloc(fixture("malloc"), pids=(1,), duration_s=1.0)
    rows = {k: v for k, v in s["processes"].items() if v["calls"]}
    (row,) = rows.values()
    assert set(row["functions"]) == {"malloc", "calloc", "realloc"}
    assert "handle_request_alloc" in row["callers"] and row["per_s"] == row["calls"]
    assert s["processes"]["1"]["calls"] == 0


def test_sockopt_names_the_pinning_process():
    s = analyze.sockopt(fixture("sockopt"))
    (pinning,) = s["pinning"]
    row = s["processes"][str(pinning)]
    assert row["bytes"] == 65536 and row["locked_sockets"] > 0
    others = [r for p, r in s["processes"].items() if p != str(pinning)]
    assert any(r["autotuned_adjustments"] > 0 and not r["tcp_pinned"] for r in others)


def test_softirq_per_cpu():
    s = analyze.softirq(fixture("softirq"), duration_s=1.0)
    assert s["cpus"] and all(0 <= c["share"] <= 1 for c in s["cpus"].values())


def test_keep_selects_processes_after_the_fact():
    out = fixture("runqlat-pids")
    pids = sorted({int(k.split(",")[0]) for k in out.map("@lat")})
    s = analyze.runqlat(out, keep=frozenset(pids[:1]))
    assert list(s["processes"]) == [str(pids[0])]


# -- validation: only integers reach a program ---------------------------------------------

@pytest.mark.parametrize("pids", [("1; rm -rf /",), ("$1",), (-3,), (0,), ("12a",)])
def test_pids_must_be_integers(pids):
    with pytest.raises(ValueError):
        Request("runqlat", 1.0, pids).validate()


def test_params_are_integers_and_slots_never_match_pid_0():
    run = Request("futex", 2.5, (42, 7)).validate()
    assert run.params() == ["2500", "0", "42", "7"] + ["42"] * 6
    assert Request("runqlat", 1, ()).validate().params() == ["1000", "0"] + ["0"] * 8
    assert Request("runqlat", 1, (5,)).validate().mode == 1
    assert all(p.isdigit() for p in run.argv()[4:])


@pytest.mark.parametrize("req", [
    Request("runqlat", 0), Request("runqlat", 10**6), Request("nope", 1),
    Request("malloc", 1), Request("softirq", 1, (3,)), Request("runqlat", 1, tuple(range(1, 10))),
    Request("futex", 1, raw=True)])
def test_invalid_requests(req):
    with pytest.raises(ValueError):
        req.validate()


def test_every_probe_ships_its_program_with_a_header():
    for name in PROBES:
        text = driver.program_text(name)
        assert text.startswith(f"/*\n * {name}.bt - ") and "Overhead" in text
        assert "interval:ms:$1" in text  # ends itself


def test_unavailable_reasons(tmp_path):
    live = Host("/")
    assert "host root" in driver.unavailable(Host(tmp_path))
    assert "needs root (running as uid 1000)" in driver.unavailable(live, euid=1000)
    assert "not installed" in driver.unavailable(live, euid=0, which=lambda _: None)
    reason = driver.unavailable(live, euid=0, which=lambda _: "/usr/bin/bpftrace",
                                tracefs_dirs=(str(tmp_path),))
    assert "tracefs is not mounted" in reason and "mount -t tracefs" in reason


def test_plan_for_inspect():
    window = {"probe_window": 2.0}
    p = plan(Scope(options=window))
    assert isinstance(p["malloc"], str) and "--pid" in p["malloc"]
    assert p["runqlat"].pids == () and p["runqlat"].keep is None
    p = plan(Scope(pids=(5, 6), options=window))
    assert p["malloc"].pids == (5, 6) and p["runqlat"].validate().mode == 1
    p = plan(Scope(cgroup="/x", options=window), cgroup_pids=frozenset(range(100, 120)))
    assert p["runqlat"].keep == frozenset(range(100, 120)) and p["runqlat"].pids == ()
    assert isinstance(p["malloc"], str)


# -- checks ----------------------------------------------------------------------------------

def snap(facts: dict, before: dict | None = None, pids=(), interval=1.0) -> Snapshot:
    return Snapshot(host={}, target={"pids": list(pids)}, interval_s=interval, taken_at=0.0,
                    facts={k: v if isinstance(v, Fact) else Fact(value=v)
                           for k, v in facts.items()},
                    before={k: Fact(value=v) for k, v in (before or {}).items()})


def judge(check_id, s, params):
    return run_check(check_id, checks()[check_id], s, params)


def test_runqlat_without_probe_is_unknown_with_proc_context():
    s = snap({"probe.runqlat": Fact(missing="no probe window"),
              "pressure.cpu": {"some": {"avg10": 12.5, "avg60": 3.0, "avg300": 1.0, "total": 9}},
              "proc.42.schedstat": {"run_ns": 9_000_000, "wait_ns": 4_000_000,
                                    "timeslices": 120}},
             before={"proc.42.schedstat": {"run_ns": 1_000_000, "wait_ns": 2_000_000,
                                           "timeslices": 20}}, pids=(42,))
    (f,) = judge("l2.sched.runqlat", s, {"limit": 500.0})
    assert f.status == "unknown" and f.observed is None and "no probe window" in f.reason
    assert f.evidence["psi_cpu_some_avg10"] == 12.5
    assert f.evidence["pid 42"]["mean_wait_per_timeslice_us"] == 20.0  # 2 ms / 100 slices


def test_runqlat_judged_on_the_probe_p999():
    fail = analyze.runqlat(fixture("runqlat-host"))
    (f,) = judge("l2.sched.runqlat", snap({"probe.runqlat": fail}), {"limit": 500.0})
    assert f.status == "fail" and f.observed == fail["p999"]
    ok = {**fail, "p999": 120.0, "count": 5000}
    (f,) = judge("l2.sched.runqlat", snap({"probe.runqlat": ok}), {"limit": 500.0})
    assert f.status == "pass"
    (f,) = judge("l2.sched.runqlat", snap({"probe.runqlat": ok}), {"limit": 100.0})
    assert f.status == "fail"


def test_runqlat_per_process_findings():
    s = analyze.runqlat(fixture("runqlat-pids"), pids=(1,))
    found = judge("l2.sched.runqlat", snap({"probe.runqlat": s}), {"limit": 500.0})
    by = {f.subject: f.status for f in found}
    assert by["pid 1"] == "unknown" and list(by.values()).count("fail") == 3


def test_rcvbuf_lock_check():
    s = analyze.sockopt(fixture("sockopt"))
    (f,) = judge("l2.tcp.rcvbuf_lock", snap({"probe.sockopt": s}), {"limit": 0})
    assert f.status == "fail" and f.observed == 1 and str(s["pinning"][0]) in f.reason
    clean = analyze.sockopt(parse_output(""))
    (f,) = judge("l2.tcp.rcvbuf_lock", snap({"probe.sockopt": clean}), {"limit": 0})
    assert f.status == "pass"
    (f,) = judge("l2.tcp.rcvbuf_lock", snap({"probe.sockopt": Fact(missing="not root")}), {})
    assert f.status == "unknown" and "not root" in f.reason


def test_syscall_batching_check():
    s = {**analyze.mmsg(fixture("mmsg")), "duration_s": 1.0}
    found = judge("l2.net.syscall_batching", snap({"probe.mmsg": s}),
                  {"limit": 32.0, "min_calls_per_s": 100.0})
    assert sorted(f.status for f in found) == ["fail", "pass"]
    assert {f.observed for f in found} == {1.0, 32.0}
    quiet = analyze.mmsg(parse_output(""))
    (f,) = judge("l2.net.syscall_batching", snap({"probe.mmsg": quiet}), {"limit": 32.0})
    assert f.status == "skip"


def test_alloc_hot_path_check():
    # An output of the old libc-only program says nothing of the allocators it watched:
    # its allocating process fails, its quiet one is unknown, never a pass.
    s = analyze.malloc(fixture("malloc"), pids=(1,), duration_s=1.0)
    found = judge("l3.alloc.hot_path", snap({"probe.malloc": s}), {"limit": 0.0})
    statuses = sorted(f.status for f in found)
    assert statuses == ["fail", "unknown"]
    bad = next(f for f in found if f.status == "fail")
    assert "handle_request_alloc" in bad.reason and bad.observed > 0
    quiet = next(f for f in found if f.status == "unknown")
    assert "which allocators" in quiet.reason


def test_snapshot_with_probe_facts_round_trips_json():
    s = snap({"probe.runqlat": analyze.runqlat(fixture("runqlat-host"))})
    back = Snapshot.from_json(json.loads(json.dumps(s.to_json())))
    (f,) = judge("l2.sched.runqlat", back, {"limit": 500.0})
    assert f.status == "fail" and math.isfinite(f.observed)
