"""Cross-node clock skew in the fleet view (pure): every node's l1.clock.ptp finding, judged
by the real check on the real pmc TIME_STATUS_NP capture (offsets edited per node), the
spread and |a|+|b| bound of the offsets to the master, and the round-trip reading."""

from __future__ import annotations

from pathlib import Path

from tailgate.baseline import default_baseline
from tailgate.fleet.clock import clock_skew
from tailgate.fleet.cluster import Node
from tailgate.fleet.inspect import HostReport, fleet_view
from tailgate.judge import checks, run_check
from tailgate.model import Fact, Snapshot
from tailgate.report.fleet_render import fleet_text
from tailgate.safe import strict_json
from tailgate.sources.ethtool import parse_timestamping
from tailgate.sources.ptp import parse_pmc, time_status
from tailgate.verdict import build_report

HOST = Path(__file__).parent / "fixtures" / "host"
ROOTS = Path(__file__).parent / "fixtures" / "roots"


def node_report(name: str, offsets: tuple[int, int], gm: str = "000200.fffe.000005"):
    """A host whose ptp4l reports ``offsets`` on its two ports (the real pmc capture, values
    edited), judged by the real l1.clock.ptp check."""
    text = "\n".join((HOST / "pmc-time-status.txt").read_text().splitlines()[2:])
    text = text.replace("master_offset              12610", f"master_offset              {offsets[0]}")
    text = text.replace("master_offset              0", f"master_offset              {offsets[1]}")
    text = text.replace("000200.fffe.000005", gm)
    facts = {"ethtool.ts": ["eth0"], "ethtool.ts.eth0": parse_timestamping(
                 (ROOTS / "l1l3-clean" / "commands" / "ethtool_-T_eth2").read_text()),
             "ptp.pmc": {"time_status": time_status(parse_pmc(text)), "ports": []},
             "ptp.log": {"samples": [], "summaries": [], "unavailable": "journalctl: absent"},
             "chrony.tracking": Fact(missing="chronyc: absent")}
    snap = Snapshot(host={"hostname": name}, target={}, interval_s=1.0, taken_at=0.0,
                    facts={k: v if isinstance(v, Fact) else Fact(value=v) for k, v in facts.items()})
    cid = "l1.clock.ptp"
    findings = run_check(cid, checks()[cid], snap, default_baseline().get(cid))
    return build_report(snap, findings, frozenset())


def hosts(*offsets, gms=None) -> list[HostReport]:
    gms = gms or ["000200.fffe.000005"] * len(offsets)
    return [HostReport(Node(f"n{i}", f"10.0.0.{i + 1}"), node_report(f"h{i}", o, g))
            for i, (o, g) in enumerate(zip(offsets, gms, strict=True))]


def test_each_node_within_5ns_but_the_pair_beyond_fails():
    # +3 ns and -4 ns to the same master: each host passes its own red line ...
    hs = hosts((3, 0), (-4, 0))
    assert [h.report.findings[0].status for h in hs] == ["pass", "pass"]
    skew = clock_skew(hs)
    # ... but the two can be 7 ns apart: the fleet's red line fails
    assert skew["ptp"]["spread_ns"] == 7 and skew["ptp"]["bound_ns"] == 7
    assert skew["status"] == "fail" and "|a| + |b|" in skew["ptp"]["reason"]
    assert [r["offset_to_master_ns"] for r in skew["hosts"]] == [3, -4]


def test_close_offsets_pass_and_the_bound_is_named():
    skew = clock_skew(hosts((2, 0), (-1, 1), (1, 0)))
    assert skew["ptp"]["bound_ns"] == 3 and skew["ptp"]["spread_ns"] == 3
    assert skew["status"] == "pass" and skew["ptp"]["grandmaster"] == "000200.fffe.000005"


def test_different_grandmasters_or_one_node_are_unknown():
    skew = clock_skew(hosts((1, 0), (1, 0), gms=["000200.fffe.000005", "000200.fffe.000009"]))
    assert skew["status"] == "unknown" and "different grandmasters" in skew["ptp"]["reason"]
    one = hosts((1, 0))
    one.append(HostReport(Node("n9", "10.0.0.9"), None, "no snapshot within 3 s"))
    skew = clock_skew(one)
    assert skew["status"] == "unknown" and "1 of 2 node(s)" in skew["ptp"]["reason"]
    assert "10.0.0.9: no snapshot within 3 s" in skew["ptp"]["reason"]


def test_round_trip_reading_catches_a_grossly_wrong_clock():
    hs = hosts((2, 0), (-1, 0))
    good = {"n0": {"offset_ns": 40_000, "rtt_ns": 400_000, "samples": 5},
            "n1": {"offset_ns": -3_000, "rtt_ns": 300_000, "samples": 5}}
    skew = clock_skew(hs, good)
    assert skew["round_trip"]["status"] == "pass" and skew["status"] == "pass"
    assert "cannot resolve +-5 ns" in skew["round_trip"]["reason"]
    bad = {**good, "n1": {"offset_ns": -2_000_000, "rtt_ns": 300_000, "samples": 5}}
    skew = clock_skew(hs, bad)
    assert skew["status"] == "fail" and "10.0.0.2's clock differs" in skew["round_trip"]["reason"]


def test_fleet_view_and_text_carry_the_skew():
    view = fleet_view(hosts((3, 0), (-4, 0)))
    strict_json(view)  # the document stays valid JSON
    assert view["clock_skew"]["status"] == "fail"
    text = fleet_text(view)
    assert "cross-node clock skew (red line +-5 ns): FAIL" in text
    assert "10.0.0.2" in text and "offset to master -4 ns" in text
