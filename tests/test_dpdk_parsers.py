"""DPDK telemetry parsing and judging on the replies captured from real testpmd runs
(tests/fixtures/dpdk/*.json, see capture.py there), the reply shapes of other releases
derived from DPDK's source, a process exiting mid-read, and fuzzing of every reply."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.dpdk_replay import Replay
from tailgate.baseline import default_baseline
from tailgate.judge import checks, run_check
from tailgate.model import Fact, ParseError, Snapshot, SourceError
from tailgate.sources.dpdk import (
    as_int,
    parse_eal_lcores,
    parse_info,
    parse_link,
    parse_mempool,
    parse_stats,
    parse_xstats,
    read_process,
    valid_prefix,
)

FIX = Path(__file__).parent / "fixtures" / "dpdk"
DPDK_IDS = ("l3.dpdk.rx_overflow", "l3.dpdk.mbuf_exhaustion", "l3.dpdk.queue_spread",
            "l3.dpdk.tx_queue_per_lcore", "l3.dpdk.packet_rate")
# What each real capture must show: the checks that fail, and those that cannot tell (the
# tap and null drivers do not count ring drops); every other check passes or skips.
EXPECTED = {
    "null-io-clean": (set(), {"l3.dpdk.rx_overflow"}),
    "pcap-io-clean": (set(), set()),
    "tap-2q-clean": (set(), {"l3.dpdk.rx_overflow"}),
    "pcap-mbuf-exhaustion": ({"l3.dpdk.mbuf_exhaustion"}, set()),
    "pcap-rx-overflow": ({"l3.dpdk.rx_overflow"}, set()),
    "tap-2q-one-flow": ({"l3.dpdk.queue_spread"}, {"l3.dpdk.rx_overflow"}),
}


def load(name: str) -> dict[str, Any]:
    return json.loads((FIX / f"{name}.json").read_text())


def replay(record: dict[str, Any]) -> dict[str, Any]:
    return read_process("captured", client=Replay(record))


def snapshot(before: dict[str, Any] | Fact, after: dict[str, Any] | Fact, prefix: str = "p",
             interval_s: float = 1.0) -> Snapshot:
    def fact(x):
        return x if isinstance(x, Fact) else Fact(value=x)
    return Snapshot(host={"hostname": "t"}, target={}, interval_s=interval_s, taken_at=0.0,
                    facts={"dpdk": Fact(value=[prefix]), f"dpdk.{prefix}": fact(after)},
                    before={f"dpdk.{prefix}": fact(before)})


def judge_all(snap: Snapshot) -> dict[str, Any]:
    out = {}
    for cid in DPDK_IDS:
        (f,) = run_check(cid, checks()[cid], snap, default_baseline().get(cid))
        out[cid] = f
    return out


def fixture_snapshot(name: str) -> Snapshot:
    doc = load(name)
    a, b = (replay(r) for r in doc["samples"])
    return snapshot(a, b, prefix=name)


# -- the real captures ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture_has_provenance_and_parses(name):
    doc = load(name)
    assert {"captured", "command", "dpdk", "kernel", "traffic"} <= set(doc["provenance"])
    assert "dpdk-testpmd" in doc["provenance"]["command"]
    sample = replay(doc["samples"][1])
    assert sample["version"].startswith("DPDK 22.11") and sample["pid"] > 0
    port = sample["ports"]["0"]
    assert port["stats"]["ipackets"] >= 0 and len(port["stats"]["q_ipackets"]) == 16
    assert port["link"]["status"] in ("UP", "DOWN")
    assert port["info"]["nb_rx_queues"] >= 1 and "mb_pool_0" in sample["mempools"]
    # 22.11 has neither lcore nor ring telemetry: absent with the reason, not empty
    assert sample["lcores"] is None and "before DPDK 23.03" in sample["missing"]["/eal/lcore/list"]
    assert sample["rings"] is None and "/ring/list" in sample["missing"]
    assert "free" not in sample["mempools"]["mb_pool_0"]  # 22.11 reports no fill count
    # virtual devices have no optic: {} from DPDK, absent with the reason here
    assert port["module_eeprom"] is None
    assert "no module EEPROM" in sample["missing"]["/ethdev/module_eeprom,0"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture_fails_only_its_own_check(name):
    found = judge_all(fixture_snapshot(name))
    fails, unknowns = EXPECTED[name]
    assert {cid for cid, f in found.items() if f.status == "fail"} == fails, found
    assert {cid for cid, f in found.items() if f.status == "unknown"} == unknowns, found
    assert all("does not count" in found[cid].reason for cid in unknowns)
    assert all(f.subject.startswith(f"dpdk {name} pid ") for f in found.values())


def test_capture_rates_divide_by_the_counters_own_clock():
    doc = load("null-io-clean")
    f = judge_all(fixture_snapshot("null-io-clean"))["l3.dpdk.packet_rate"]
    a, b = doc["samples"]
    seconds = (sum(b["clock"][:2]) - sum(a["clock"][:2])) / 2
    packets = (b["replies"]["/ethdev/stats,0"]["ipackets"] - a["replies"]["/ethdev/stats,0"]["ipackets"])
    assert f.evidence["rx_packets"] == packets
    assert f.evidence["seconds"] == pytest.approx(seconds, abs=1e-6)
    assert f.observed == pytest.approx(packets / seconds / 1e6, abs=1e-3) and f.observed > 1


# -- other releases' reply shapes (from DPDK's source per LTS tag) ----------------------------------

def as_20_11(record: dict[str, Any]) -> dict[str, Any]:
    """DPDK 20.11 registers only /ethdev/{list,stats,xstats,link_status} and /eal/params."""
    rec = copy.deepcopy(record)
    keep = {"/", "/info", "/help", "/ethdev/list", "/ethdev/stats", "/ethdev/xstats",
            "/ethdev/link_status", "/eal/params", "/eal/app_params"}
    rec["replies"]["/"] = [c for c in rec["replies"]["/"] if c in keep]
    rec["replies"] = {k: v for k, v in rec["replies"].items() if k.split(",")[0] in keep}
    return rec


def as_24_11(record: dict[str, Any], pool_free: int, lcores: dict[int, str]) -> dict[str, Any]:
    """24.11: uint_hex fields as strings, offloads as name lists, mempool fill counts,
    /eal/lcore/* and /ring/*."""
    rec = copy.deepcopy(record)
    r = rec["replies"]
    r["/"] = sorted(set(r["/"]) | {"/eal/lcore/list", "/eal/lcore/info", "/ring/list", "/ring/info"})
    for k in [k for k in r if k.startswith("/ethdev/info,")]:
        info = r[k]
        info["dev_flags"] = hex(info["dev_flags"])
        info["ethdev_rss_hf"] = hex(info["ethdev_rss_hf"])
        info["rx_offloads"], info["tx_offloads"] = ["RSS_HASH"], []
        info["fw_version"] = "1.0"
    pool = r["/mempool/info,mb_pool_0"]
    pool["common_pool_count"], pool["total_cache_count"] = pool_free, 0
    r["/eal/lcore/list"] = sorted(lcores)
    for lc, role in lcores.items():
        r[f"/eal/lcore/info,{lc}"] = {"lcore_id": lc, "socket": 0, "role": role, "cpuset": [lc]}
    r["/ring/list"] = ["MP_mb_pool_0"]
    r["/ring/info,MP_mb_pool_0"] = {"name": "MP_mb_pool_0", "socket": 0, "flags": 0,
                                    "producer_type": "MP", "consumer_type": "MC", "size": 16384,
                                    "mask": "0x3fff", "capacity": 16383, "used_count": pool_free}
    return rec


def test_dpdk_20_11_shapes_judge_what_they_can_and_say_what_they_lack():
    doc = load("tap-2q-one-flow")
    a, b = (replay(as_20_11(r)) for r in doc["samples"])
    assert "info" not in b["ports"]["0"] or b["ports"]["0"].get("info") is None
    assert "before DPDK 21.05" in b["missing"]["/mempool/list"] and b["mempools"] is None
    found = judge_all(snapshot(a, b))
    # the queue count comes from xstats' rx_qN_packets when /ethdev/info is absent
    assert found["l3.dpdk.queue_spread"].status == "fail"
    assert found["l3.dpdk.tx_queue_per_lcore"].status == "pass"
    assert found["l3.dpdk.mbuf_exhaustion"].status == "pass"


def test_dpdk_24_11_shapes_fill_level_lcores_and_rings():
    doc = load("null-io-clean")
    samples = [as_24_11(r, pool_free=100, lcores={0: "RTE", 1: "RTE", 2: "RTE", 3: "RTE"})
               for r in doc["samples"]]
    a, b = (replay(r) for r in samples)
    assert b["mempools"]["mb_pool_0"]["free"] == 100
    assert b["rings"]["MP_mb_pool_0"] == {"size": 16384, "capacity": 16383, "used_count": 100,
                                          "producer_type": "MP", "consumer_type": "MC"}
    assert b["lcores"]["2"]["role"] == "RTE" and b["lcores"]["2"]["cpuset"] == [2]
    found = judge_all(snapshot(a, b))
    mbuf = found["l3.dpdk.mbuf_exhaustion"]
    assert mbuf.status == "warn" and mbuf.evidence["mempools"]["mb_pool_0"]["in_use"] > 0.95
    tx = found["l3.dpdk.tx_queue_per_lcore"]
    # four RTE lcores, main lcore 0 from /eal/params: three forward on one Tx queue
    assert tx.status == "fail" and tx.evidence["forwarding_lcores"] == 3 and tx.observed == 1


def test_24_11_application_rings_are_evidence_of_the_overflow_check():
    doc = load("pcap-rx-overflow")
    samples = [as_24_11(r, pool_free=8000, lcores={0: "RTE", 1: "RTE"}) for r in doc["samples"]]
    for r in samples:
        r["replies"]["/ring/list"].append("worker_ring")
        r["replies"]["/ring/info,worker_ring"] = {"name": "worker_ring", "capacity": 1023,
                                                  "size": 1024, "used_count": 1023}
    f = judge_all(snapshot(*(replay(r) for r in samples)))["l3.dpdk.rx_overflow"]
    assert f.status == "fail" and f.evidence["software_rings_in_use"] == {"worker_ring": 1.0}


def test_two_processes_are_judged_apart():
    snap = fixture_snapshot("pcap-rx-overflow")
    other = fixture_snapshot("tap-2q-one-flow")
    snap.facts.update({k: v for k, v in other.facts.items() if k != "dpdk"})
    snap.before.update(other.before)
    snap.facts["dpdk"] = Fact(value=["pcap-rx-overflow", "tap-2q-one-flow"])
    for cid, fails in (("l3.dpdk.rx_overflow", "pcap-rx-overflow"),
                       ("l3.dpdk.queue_spread", "tap-2q-one-flow")):
        found = run_check(cid, checks()[cid], snap, default_baseline().get(cid))
        assert len(found) == 2
        assert [f.subject.split()[1] for f in found if f.status == "fail"] == [fails]


def test_roomy_24_11_pool_passes():
    doc = load("null-io-clean")
    samples = [as_24_11(r, pool_free=8000, lcores={0: "RTE", 1: "RTE"}) for r in doc["samples"]]
    found = judge_all(snapshot(*(replay(r) for r in samples)))
    assert found["l3.dpdk.mbuf_exhaustion"].status == "pass"
    assert found["l3.dpdk.tx_queue_per_lcore"].status == "pass"


# -- failures: never a pass --------------------------------------------------------------------------

def test_process_exiting_mid_read_is_a_source_error_and_unknown():
    rec = copy.deepcopy(load("tap-2q-clean")["samples"][1])
    del rec["replies"]["/ethdev/xstats,0"]  # the socket closed after /ethdev/stats
    with pytest.raises(SourceError, match="closed"):
        replay(rec)
    a = replay(load("tap-2q-clean")["samples"][0])
    found = judge_all(snapshot(a, Fact(missing="closed mid-read")))
    assert all(f.status == "unknown" and "closed mid-read" in f.reason for f in found.values())


def test_counters_going_backwards_are_unknown():
    doc = load("pcap-rx-overflow")
    a, b = (replay(r) for r in doc["samples"])
    # the counters of t1 read first: every one shrinks over the interval
    a["ports"]["0"]["stats"], b["ports"]["0"]["stats"] = b["ports"]["0"]["stats"], a["ports"]["0"]["stats"]
    found = judge_all(snapshot(a, b))
    assert found["l3.dpdk.rx_overflow"].status == "unknown"
    assert "went backwards" in found["l3.dpdk.rx_overflow"].reason


def test_restarted_process_is_unknown():
    doc = load("null-io-clean")
    a, b = (replay(r) for r in doc["samples"])
    b["pid"] = a["pid"] + 1
    found = judge_all(snapshot(a, b))
    assert all(f.status == "unknown" and "process changed" in f.reason for f in found.values())


def test_no_dpdk_process_is_skip_and_bad_prefix_rejected():
    snap = Snapshot(host={}, target={}, interval_s=1.0, taken_at=0.0, facts={"dpdk": Fact(value=[])})
    assert {f.status for f in judge_all(snap).values()} == {"skip"}
    for bad in ("../etc", "a/b", "", ".."):
        with pytest.raises(ValueError):
            valid_prefix(bad)


# -- small parsers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("params, expected", [
    (["app", "-l", "1-3"], {"lcores": [1, 2, 3], "main": 1}),
    (["app", "-l1,3"], {"lcores": [1, 3], "main": 1}),
    (["app", "-c", "0x6", "--main-lcore", "2"], {"lcores": [1, 2], "main": 2}),
    (["app", "--lcores", "0@0,(1,2)@1"], {"lcores": [0, 1, 2], "main": 0}),
    (["app", "--lcores=0@0,1@1", "--no-huge"], {"lcores": [0, 1], "main": 0}),
    (["app", "--no-huge"], {}),
])
def test_eal_lcores(params, expected):
    got = parse_eal_lcores(params)
    assert {k: got[k] for k in ("lcores", "main") if k in got} == expected
    if "(1,2)@1" in " ".join(params):
        assert got["cpus"] == {"0": [0], "1": [1], "2": [1]}


def test_hex_counters_and_bad_shapes():
    assert as_int("0x40") == 64 and as_int(7) == 7 and as_int(True) is None and as_int("UP") is None
    with pytest.raises(ParseError):
        parse_stats({"ipackets": "lots"})
    with pytest.raises(ParseError):
        parse_link({"speed": 10})
    with pytest.raises(ParseError):
        parse_mempool({"name": "x"})
    assert parse_xstats({"a": 1, "b": "text"}) == {"a": 1}


# -- fuzzing: any reply gives a sample or a SourceError, and no check crashes on a sample ------------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
                    | st.text(max_size=8), lambda c: st.lists(c, max_size=4)
                    | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)


@given(JSON)
def test_parsers_raise_only_parse_error(value):
    for parse in (parse_stats, parse_xstats, parse_info, parse_link, parse_mempool):
        try:
            parse(value)
        except ParseError:
            pass


BASE = load("tap-2q-clean")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzzed_replies_give_a_sample_or_a_reason_and_checks_never_crash(data):
    rec = copy.deepcopy(BASE["samples"][1])
    commands = sorted(rec["replies"])
    for cmd in data.draw(st.lists(st.sampled_from(commands), max_size=4, unique=True)):
        rec["replies"][cmd] = data.draw(JSON)
    try:
        after = replay(rec)
    except SourceError:
        return
    before = replay(BASE["samples"][0])
    for cid, f in judge_all(snapshot(before, after)).items():
        assert f.status != "error", (cid, f.reason)


# -- discovery: runtime directories under XDG_RUNTIME_DIR, stale ones, refusing sockets -----------

def test_xdg_runtime_dir_socket_that_refuses_is_unknown_and_stale_dirs_are_named(tmp_path, monkeypatch):
    import socket

    from tailgate.collect import Scope, collectors, run_collector
    from tailgate.host import Host

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    live = tmp_path / "dpdk" / "tg-refusing"
    live.mkdir(parents=True)
    (tmp_path / "dpdk" / "tg-stale").mkdir()
    # a real SEQPACKET socket bound and never listened on: what an exited process leaves
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(str(live / "dpdk_telemetry.v2"))
    try:
        c = collectors()["dpdk"]
        auto = run_collector(c, Host("/"), Scope())
        assert "tg-refusing" in auto["dpdk"].value and "tg-stale" not in auto["dpdk"].value
        assert "refused" in auto["dpdk.tg-refusing"].missing
        named = run_collector(c, Host("/"), Scope(options={"dpdk": ["tg-stale", "tg-none"]}))
        assert "no dpdk_telemetry.v2" in named["dpdk.tg-stale"].missing
        assert "no runtime directory" in named["dpdk.tg-none"].missing
        assert sorted(named["dpdk"].value) == ["tg-none", "tg-stale"]
    finally:
        s.close()


def test_invalid_dpdk_prefix_is_a_usage_error():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--dpdk", "../etc",
                          "--interval", "0", "--no-history"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 2 and "invalid DPDK file prefix" in out.stderr


ARGS = st.lists(st.sampled_from(["-l", "-c", "--lcores", "--main-lcore", "--master-lcore", "-l1-2",
                                 "--lcores=0@0,(1,2)@1", "0x6", "1-3", "(1,2)@1", "x", "", "-n", "4",
                                 "3-1", "0@0,1@1", "--nb-cores=2"]), max_size=6)


@given(ARGS)
def test_eal_params_parser_raises_only_value_error(params):
    try:
        out = parse_eal_lcores(["app", *params])
    except ValueError:
        return
    if "lcores" in out:
        assert out["lcores"] == sorted(set(out["lcores"]))


@settings(max_examples=60, deadline=None)
@given(ARGS)
def test_any_eal_params_in_a_sample_never_crash_the_lcore_check(params):
    a, b = (replay(r) for r in BASE["samples"])
    a["eal_params"] = b["eal_params"] = ["app", *params]
    (f,) = run_check("l3.dpdk.tx_queue_per_lcore", checks()["l3.dpdk.tx_queue_per_lcore"],
                     snapshot(a, b), {})
    assert f.status in ("pass", "fail", "unknown"), f.reason
