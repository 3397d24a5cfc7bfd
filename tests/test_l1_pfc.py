"""PFC and pause storms (l1.pfc.pause_storm, l1.pfc.config): the drivers' own ethtool -S
names (mlx5 en_stats.c, ice_ethtool.c, bnxt_ethtool.c) read from real published outputs
(tests/fixtures/pfc, each with its provenance), ethtool -a and dcb pfc show in both layouts,
and the checks judged on snapshots built from those parses and on a collected fixture root."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tailgate.baseline import default_baseline
from tailgate.collect import Scope, collect
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.model import Fact, ParseError, Snapshot
from tailgate.sources.ethtool import parse_stats
from tailgate.sources.pfc import parse_dcb_pfc, parse_pause_settings, pause_counters

FIX = Path(__file__).parent / "fixtures" / "pfc"


def text(name: str) -> str:
    return (FIX / name).read_text()


def snap(facts: dict, before: dict | None = None, interval: float = 10.0) -> Snapshot:
    def wrap(d):
        return {k: v if isinstance(v, Fact) else Fact(value=v) for k, v in (d or {}).items()}
    return Snapshot(host={"hostname": "t"}, target={}, interval_s=interval, taken_at=1000.0,
                    facts=wrap(facts), before=wrap(before))


def judge(cid: str, s: Snapshot):
    return run_check(cid, checks()[cid], s, default_baseline().get(cid))


def port(stats: str, pfc: str | None = None, pause: str | None = "ethtool-a-on.txt",
         rdma: list[str] | None = None) -> dict:
    v = pause_counters(parse_stats(text(stats)))
    v.update(link_pause=parse_pause_settings(text(pause)) if pause else None,
             pfc=parse_dcb_pfc(text(pfc)) if pfc else None,
             pfc_source="dcb pfc show" if pfc else None, rdma=rdma or [], unreadable={})
    return v


def facts(v: dict, driver: str = "mlx5_core") -> dict:
    return {"net.pfc": ["eth0"], "net.pfc.eth0": v, "ethtool.info.eth0": {"driver": driver}}


def test_every_pfc_fixture_names_its_source():
    for f in FIX.iterdir():
        assert f.read_text().startswith("# source: "), f.name


def test_driver_names_of_three_families():
    mlx5 = pause_counters(parse_stats(text("ethtool-S-mlx5-prio3-pfc.txt")))
    assert mlx5["prio"]["3"] == {"rx_frames": 1523, "rx_us": 48736, "tx_frames": 2847,
                                 "tx_us": 91104}
    ice = pause_counters(parse_stats(text("ethtool-S-ice-priority.txt")))
    assert sorted(ice["prio"]) == [str(i) for i in range(8)]
    assert ice["prio"]["3"] == {"tx_frames": 0, "rx_frames": 0}  # xoff only; xon is not pause
    glob = pause_counters(parse_stats(text("ethtool-S-mlx5-global-pause.txt")))
    assert glob["global"] == {"rx_frames": 0, "tx_frames": 0, "rx_us": 0, "tx_us": 0}
    assert glob["storm"] == {"tx_pause_storm_warning_events": 0, "tx_pause_storm_error_events": 0}
    # bnxt_ethtool.c names (bnxt_port_stats_arr, bnxt_port_stats_ext_arr)
    bnxt = pause_counters({"rx_pfc_ena_frames_pri3": 7, "pfc_pri3_rx_duration_us": 900,
                           "tx_pfc_ena_frames_pri3": 2, "pfc_pri3_tx_duration_us": 40})
    assert bnxt["prio"]["3"] == {"rx_frames": 7, "rx_us": 900, "tx_frames": 2, "tx_us": 40}


def test_ethtool_a_and_dcb_pfc_both_layouts():
    assert parse_pause_settings(text("ethtool-a-on.txt")) == {"autoneg": True, "rx": True,
                                                              "tx": True}
    neg = parse_pause_settings(text("ethtool-a-negotiated.txt"))
    assert neg == {"autoneg": True, "rx": False, "tx": False, "rx_negotiated": True,
                   "tx_negotiated": True}
    for name in ("dcb-pfc-show-oneline.txt", "dcb-pfc-show-twoline.txt"):
        assert parse_dcb_pfc(text(name)) == {"enabled": [3], "cap": 8}
    with pytest.raises(ParseError, match="no prio-pfc"):
        parse_dcb_pfc("Error: Operation not supported")
    with pytest.raises(ParseError, match="RX: not on/off"):
        parse_pause_settings("Pause parameters for eth0:\nRX: maybe\nTX: on\n")


def test_pause_storm_share_of_the_window():
    before = port("ethtool-S-mlx5-prio3-pfc.txt", "dcb-pfc-show-oneline.txt", rdma=["mlx5_0"])
    after = copy.deepcopy(before)
    after["prio"]["3"]["rx_us"] += 2_500_000  # 2.5 s paused in a 10 s window
    r = judge("l1.pfc.pause_storm", snap(facts(after), facts(before)))[0]
    assert (r.status, r.observed) == ("fail", 0.25)
    assert "priority 3 rx paused 25.0%" in r.reason
    after["prio"]["3"]["rx_us"] -= 2_450_000  # 50 ms: 0.5 %, under the 1 % red line
    r = judge("l1.pfc.pause_storm", snap(facts(after), facts(before)))[0]
    assert r.status == "pass" and "0.50%" in r.reason


def test_storm_watermark_and_frame_only_drivers():
    before = port("ethtool-S-mlx5-global-pause.txt")
    after = copy.deepcopy(before)
    after["storm"]["tx_pause_storm_warning_events"] = 1
    r = judge("l1.pfc.pause_storm", snap(facts(after), facts(before)))[0]
    assert r.status == "fail" and "tx_pause_storm_warning_events +1" in r.reason
    ice = port("ethtool-S-ice-priority.txt")
    hot = copy.deepcopy(ice)
    hot["prio"]["3"]["rx_frames"] = 50_000  # 5000 XOFF/s
    r = judge("l1.pfc.pause_storm", snap(facts(hot, "ice"), facts(ice, "ice")))[0]
    assert r.status == "fail" and "5000 pause (XOFF) frames/s" in r.reason
    r = judge("l1.pfc.pause_storm", snap(facts(ice, "ice"), facts(copy.deepcopy(ice), "ice")))[0]
    assert r.status == "pass" and "counts frames, not time" in r.reason


def test_pfc_config_against_rdma():
    ok = port("ethtool-S-mlx5-prio3-pfc.txt", "dcb-pfc-show-oneline.txt", rdma=["mlx5_0"])
    assert judge("l1.pfc.config", snap(facts(ok)))[0].status == "pass"
    no_rdma = port("ethtool-S-mlx5-prio3-pfc.txt", "dcb-pfc-show-twoline.txt")
    r = judge("l1.pfc.config", snap(facts(no_rdma)))[0]
    assert r.status == "warn" and "no RDMA device" in r.reason
    lossy = port("ethtool-S-mlx5-global-pause.txt", None, pause="ethtool-a-negotiated.txt",
                 rdma=["mlx5_0"])
    lossy["pfc"] = {"enabled": [], "cap": 8}
    r = judge("l1.pfc.config", snap(facts(lossy)))[0]
    assert r.status == "fail" and "RoCE runs lossy" in r.reason
    link = port("ethtool-S-mlx5-global-pause.txt", None, rdma=["mlx5_0"])
    # mlx5 without dcb: the priorities it prints PFC counters for (none: global pause only)
    r = judge("l1.pfc.config", snap(facts(link)))[0]
    assert r.status == "warn" and "link-level pause" in r.reason
    idle = copy.deepcopy(ok)
    idle["traffic"] = {"0": {"rx": 15005729, "tx": 7222593}, "3": {"rx": 0, "tx": 0}}
    r = judge("l1.pfc.config", snap(facts(idle)))[0]
    assert r.status == "warn" and "priority 3, which carries no traffic" in r.reason


def test_collect_over_a_root(tmp_path):
    nic = tmp_path / "sys/class/net/eth0"
    (nic / "device/infiniband/mlx5_0").mkdir(parents=True)
    cmds = tmp_path / "commands"
    cmds.mkdir()
    (cmds / "ethtool_-S_eth0").write_text(text("ethtool-S-mlx5-prio3-pfc.txt"))
    (cmds / "ethtool_-a_eth0").write_text(text("ethtool-a-on.txt"))
    (cmds / "dcb_pfc_show_dev_eth0").write_text(text("dcb-pfc-show-twoline.txt"))
    (cmds / "ethtool_-i_eth0").write_text("driver: mlx5_core\nbus-info: 0000:81:00.0\n")
    s = collect(Host(str(tmp_path)), Scope(ifaces=("eth0",)), 0.6)
    v = s.facts["net.pfc.eth0"].value
    assert v["pfc"]["enabled"] == [3] and v["rdma"] == ["mlx5_0"]
    assert judge("l1.pfc.config", s)[0].status == "pass"
    r = judge("l1.pfc.pause_storm", s)[0]
    assert r.status == "pass" and r.evidence["window_s"] > 0
    (cmds / "dcb_pfc_show_dev_eth0").unlink()
    s = collect(Host(str(tmp_path)), Scope(ifaces=("eth0",)), 0.0)
    assert "dcb pfc show" in s.facts["net.pfc.eth0"].value["unreadable"]


def test_intel_link_flow_control_and_every_i40e_name():
    # e1000e (82574L) and ixgbe print link flow control as rx/tx_flow_control_xoff
    for name in ("ethtool-S-e1000e-82574L.txt", "ethtool-S-ixgbe-flow-control.txt"):
        v = pause_counters(parse_stats(text(name)))
        assert v["global"] == {"rx_frames": 0, "tx_frames": 0}, name
    # i40e_ethtool.c across versions: before the 4.19 rewrite "port.rx_priority_%u_xoff",
    # since i40e_gstrings_pfc_stats "port.rx_priority_%u_xoff_rx" / "port.tx_priority_%u_xoff_tx";
    # link pause "port.link_xoff_rx"; ixgbe with DCB "rx_pb_%u_pxoff"
    old = pause_counters({"port.rx_priority_3_xoff": 5, "port.tx_priority_3_xoff": 6,
                          "port.rx_priority_3_xon": 9})
    new = pause_counters({"port.rx_priority_3_xoff_rx": 5, "port.tx_priority_3_xoff_tx": 6,
                          "port.rx_priority_3_xon_rx": 9, "port.rx_priority_3_xon_2_xoff": 1,
                          "port.link_xoff_rx": 2, "port.link_xoff_tx": 3})
    assert old["prio"]["3"] == new["prio"]["3"] == {"rx_frames": 5, "tx_frames": 6}
    assert new["global"] == {"rx_frames": 2, "tx_frames": 3}
    assert pause_counters({"rx_pb_2_pxoff": 4})["prio"]["2"] == {"rx_frames": 4}
    # a current i40e port in a 24,000 XOFF/s storm fails (it was a skip)
    i40e = pause_counters({f"port.rx_priority_{i}_xoff_rx": 0 for i in range(8)})
    i40e.update(link_pause=None, pfc=None, pfc_source=None, rdma=[], unreadable={})
    hot = copy.deepcopy(i40e)
    hot["prio"]["3"]["rx_frames"] = 240_000
    r = judge("l1.pfc.pause_storm", snap(facts(hot, "i40e"), facts(i40e, "i40e")))[0]
    assert r.status == "fail" and "24000 pause (XOFF) frames/s" in r.reason


def test_no_pause_counters_is_a_skip_only_when_known():
    none = pause_counters({"rx_packets": 1, "tx_packets": 1})
    base = dict(none, link_pause=None, pfc=None, pfc_source=None, rdma=[],
                unreadable={"ethtool -a": "`ethtool -a eth0`: no captured output"})
    r = judge("l1.pfc.pause_storm", snap(facts(base, "virtio_net")))[0]
    assert r.status == "skip" and "virtio_net has no pause counters" in r.reason
    r = judge("l1.pfc.pause_storm", snap(facts(base, "igc")))[0]
    assert r.status == "unknown" and "igc driver prints no pause counter" in r.reason
    on = dict(base, link_pause=parse_pause_settings(text("ethtool-a-on-eth03.txt")))
    r = judge("l1.pfc.pause_storm", snap(facts(on, "igc")))[0]
    assert r.status == "unknown" and "link pause in use" in r.reason
    # RX/TX off but negotiated on: with pause autoneg the negotiated values are in use
    neg = dict(base, link_pause=parse_pause_settings(text("ethtool-a-negotiated.txt")))
    r = judge("l1.pfc.pause_storm", snap(facts(neg, "igc")))[0]
    assert r.status == "unknown" and "link pause in use" in r.reason
    off = dict(base, link_pause=parse_pause_settings(text("ethtool-a-off-e1000.txt")))
    r = judge("l1.pfc.pause_storm", snap(facts(off, "igc")))[0]
    assert r.status == "skip" and "link pause off" in r.reason
