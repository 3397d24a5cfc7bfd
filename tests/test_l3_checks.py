"""L3 judgments (RSS symmetry, XPS, AQM): pure functions on real captures, and the real kernel:
a veth with four transmit queues in a network namespace the test creates and removes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from support.inspect import gate_code
from tailgate.baseline import default_baseline
from tailgate.judge import checks, run_check
from tailgate.model import Fact, Snapshot
from tailgate.sources.ethtool import parse_rings, parse_rss
from tailgate.sources.qdisc import classify, parse_tc_qdisc
from tailgate.toeplitz import MICROSOFT_KEY, SYMMETRIC_KEY

FIX = Path(__file__).parent / "fixtures" / "host"


def fixture(name: str, skip: int = 0) -> str:
    return "\n".join((FIX / name).read_text().splitlines()[1 + skip:]) + "\n"


def snap(facts: dict) -> Snapshot:
    return Snapshot(host={"hostname": "t"}, target={}, interval_s=1.0, taken_at=0.0,
                    facts={k: v if isinstance(v, Fact) else Fact(value=v) for k, v in facts.items()})


def judge(check_id: str, s: Snapshot, **params):
    return run_check(check_id, checks()[check_id], s, {**default_baseline().get(check_id), **params})


# -- RSS -----------------------------------------------------------------------------------------

def rss_fact(rss: dict) -> dict:
    return {"ethtool.rss": ["eth2"], "ethtool.rss.eth2": rss}


def base_rss(key: bytes | None, **over) -> dict:
    rss = {"rings": 12, "table": list(range(12)), "key": key.hex() if key else None,
           "functions": {"toeplitz": True, "xor": False, "crc32": False}, "transforms": {}}
    return {**rss, **over}


def test_symmetric_key_passes_with_random_flows_checked():
    (f,) = judge("l3.rss.symmetric", snap(rss_fact(base_rss(SYMMETRIC_KEY + SYMMETRIC_KEY[:12]))))
    assert f.status == "pass"
    assert all(v["symmetric"] and v["random_flows_checked"] > 0
               for v in f.evidence["layouts"].values())


def test_real_i40e_key_is_asymmetric_with_a_counterexample():
    rss = parse_rss(fixture("ethtool-x-rss.txt", skip=1).split("--- ")[0])
    (f,) = judge("l3.rss.symmetric", snap(rss_fact(rss)))
    assert f.status == "fail" and f.observed == "asymmetric"
    ex = f.evidence["layouts"]["ipv4+ports"]["counterexample"]
    assert ex["hash"] != ex["reverse_hash"]
    assert "not reported" in f.evidence["note"]  # old ethtool: no hash-function lines


def test_symmetric_xor_transformation_passes_any_key():
    rss = base_rss(MICROSOFT_KEY, transforms={"symmetric-xor": True})
    (f,) = judge("l3.rss.symmetric", snap(rss_fact(rss)))
    assert f.status == "pass" and f.observed == "symmetric-xor"


def test_other_hash_functions():
    xor = base_rss(MICROSOFT_KEY, functions={"toeplitz": False, "xor": True, "crc32": False})
    assert judge("l3.rss.symmetric", snap(rss_fact(xor)))[0].status == "warn"
    crc = base_rss(MICROSOFT_KEY, functions={"toeplitz": False, "xor": False, "crc32": True})
    assert judge("l3.rss.symmetric", snap(rss_fact(crc)))[0].status == "fail"


def test_virtio_single_ring_skips_and_hidden_key_is_unknown():
    vm = parse_rss(fixture("vm-ethtool-x-virtio.txt"))
    (f,) = judge("l3.rss.symmetric", snap(rss_fact(vm)))
    assert f.status == "skip" and "one RX ring" in f.reason
    (f,) = judge("l3.rss.symmetric", snap(rss_fact({**vm, "rings": 4})))
    assert f.status == "unknown" and "does not expose the RSS key" in f.reason


def test_short_key_is_unknown():
    (f,) = judge("l3.rss.symmetric", snap(rss_fact(base_rss(SYMMETRIC_KEY[:8]))))
    assert f.status == "unknown" and "too short" in f.reason


# -- XPS -----------------------------------------------------------------------------------------

def xps_fact(queues: dict, online: list[int]) -> dict:
    return {"xps": ["eth2"], "xps.eth2": {"queues": queues, "online": online}}


def test_xps_node_exporter_fixture_unconfigured_fails():
    masks = {f"tx-{q}": [] for q in range(4)}  # all-zero xps_cpus in the fixture
    (f,) = judge("l3.xps.per_core_tx", snap(xps_fact(masks, list(range(4)))))
    assert f.status == "fail" and "not configured" in f.reason


def test_xps_exclusive_shared_and_unmapped():
    ok = {"tx-0": [0], "tx-1": [1], "tx-2": [2], "tx-3": [3]}
    assert judge("l3.xps.per_core_tx", snap(xps_fact(ok, [0, 1, 2, 3])))[0].status == "pass"
    shared = {"tx-0": [0, 1], "tx-1": [2], "tx-2": [3], "tx-3": []}
    (f,) = judge("l3.xps.per_core_tx", snap(xps_fact(shared, [0, 1, 2, 3])))
    assert f.status == "fail" and "tx-0: 0,1" in f.reason
    twice = {"tx-0": [0], "tx-1": [0, 1]}
    (f,) = judge("l3.xps.per_core_tx", snap(xps_fact(twice, [0, 1, 2])))
    assert f.status == "fail" and "2 map to no transmit queue" in f.reason and "0: tx-0, tx-1" in f.reason


def test_single_queue_device():
    (f,) = judge("l3.xps.per_core_tx", snap(xps_fact({"tx-0": None}, [0, 1])))
    assert f.status == "warn" and "shared by all 2 CPUs" in f.reason
    (f,) = judge("l3.xps.per_core_tx", snap(xps_fact({"tx-0": None, "tx-1": None}, [0, 1])))
    assert f.status == "unknown"


# -- AQM -----------------------------------------------------------------------------------------

def aqm_facts(tc_text: str) -> dict:
    return {"tc.qdisc": ["eth0"], "tc.qdisc.eth0": classify(parse_tc_qdisc(tc_text)),
            "ethtool.rings.eth0": parse_rings(fixture("vm-ethtool-g-virtio.txt"))}


def test_pfifo_fast_warns_with_ring_sizes_as_evidence():
    (f,) = judge("l3.queue.aqm", snap(aqm_facts(fixture("vm-tc-qdisc-pfifo_fast.txt"))))
    assert f.status == "warn" and "tail-drop" in f.reason
    assert f.evidence["rings"]["current"]["TX"] == 256 and f.evidence["root"] == "pfifo_fast"


def test_fq_codel_leaves_pass():
    text = fixture("vm-tc-qdisc-mq.txt").replace("pfifo_fast", "fq_codel")
    (f,) = judge("l3.queue.aqm", snap(aqm_facts(text)))
    assert f.status == "pass" and f.observed == "fq_codel"


def test_unknown_qdisc_kind_warns_and_missing_is_unknown():
    text = '[{"kind":"sfq","handle":"1:","root":true}]'
    (f,) = judge("l3.queue.aqm", snap(aqm_facts(text)))
    assert f.status == "warn" and "not an active queue management" in f.reason
    facts = {"tc.qdisc": ["eth0"], "tc.qdisc.eth0": Fact(missing="`tc` is not installed")}
    assert judge("l3.queue.aqm", snap(facts))[0].status == "unknown"


# -- the real kernel: a veth in a namespace ------------------------------------------------------

def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout


@pytest.fixture
def netns():
    name = f"tg-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "add", "va", "numtxqueues", "4", "numrxqueues", "4",
           "type", "veth", "peer", "name", "vb")
        sh("ip", "-n", name, "link", "set", "va", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


def inspect_in(ns: str) -> dict[str, dict]:
    proc = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "tailgate", "inspect",
                           "--iface", "va", "--interval", "0", "--no-history", "--json", "-"],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    rep = json.loads(proc.stdout)
    assert proc.returncode == gate_code(rep), proc.stderr  # the exit status the report decides
    return {f["id"]: f for f in rep["findings"]
            if f["id"] in ("l3.xps.per_core_tx", "l3.queue.aqm", "l3.rss.symmetric")}


def write_in(ns: str, path: str, value: str) -> None:
    sh("ip", "netns", "exec", ns, "sh", "-c", f"echo {value} > {path}")


@pytest.mark.integration
def test_live_veth_xps_and_qdisc(netns):
    cpus = os.cpu_count() or 1
    # No qdisc (veth default noqueue) and XPS unset: both are judged on the real kernel files.
    found = inspect_in(netns)
    assert found["l3.queue.aqm"]["status"] == "warn" and "noqueue" in found["l3.queue.aqm"]["reason"]
    xps = found["l3.xps.per_core_tx"]
    assert xps["status"] == "fail" and "not configured" in xps["reason"]
    assert sorted(xps["evidence"]["xps_cpus"]) == ["tx-0", "tx-1", "tx-2", "tx-3"]

    # mq with its default pfifo_fast leaves: tail drop, judged per leaf.
    sh("ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", "va", "root", "handle", "1:", "mq")
    # One queue per CPU (up to four): exclusive ownership passes.
    for cpu in range(min(cpus, 4)):
        write_in(netns, f"/sys/class/net/va/queues/tx-{cpu}/xps_cpus", f"{1 << cpu:x}")
    found = inspect_in(netns)
    aqm = found["l3.queue.aqm"]
    assert aqm["status"] == "warn" and aqm["evidence"]["root"] == "mq"
    assert len(aqm["evidence"]["leaves"]) == 4
    if cpus <= 4:
        assert found["l3.xps.per_core_tx"]["status"] == "pass", found["l3.xps.per_core_tx"]
    # Two CPUs on one queue: shared, fails.
    if cpus >= 2:
        write_in(netns, "/sys/class/net/va/queues/tx-0/xps_cpus", "3")
        found = inspect_in(netns)
        assert found["l3.xps.per_core_tx"]["status"] == "fail"
        assert "shared by several CPUs" in found["l3.xps.per_core_tx"]["reason"]
