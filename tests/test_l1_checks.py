"""L1 judgments: pure functions of snapshots built from real captures, and fuzzing of whole
fixture roots (malformed outputs become unknown, never a pass)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailgate.baseline import default_baseline
from tailgate.collect import Scope, collect
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.model import Fact, Snapshot
from tailgate.sources.ethtool import (
    parse_driver_info,
    parse_fec,
    parse_module,
    parse_stats,
    parse_timestamping,
    phy_counters,
)
from tailgate.sources.ptp import parse_chrony_tracking, parse_pmc, parse_ptp_log, port_properties, time_status

ROOTS = Path(__file__).parent / "fixtures" / "roots"
FIX = Path(__file__).parent / "fixtures" / "host"


def fixture(name: str, skip: int = 0) -> str:
    """A capture without its provenance line (and ``skip`` more lines: shell prompts)."""
    return "\n".join((FIX / name).read_text().splitlines()[1 + skip:]) + "\n"

L1 = ("l1.fec.uncorrectable", "l1.optics.rx_power", "l1.pcie.bad_tlp", "l1.pcie.link_recovery",
      "l1.cable.copper_in_rack", "l1.clock.ptp")


def snap(facts: dict, before: dict | None = None, interval: float = 5.0,
         earlier: dict | None = None, earlier_at: float | None = None) -> Snapshot:
    def wrap(d):
        return {k: v if isinstance(v, Fact) else Fact(value=v) for k, v in (d or {}).items()}
    return Snapshot(host={"hostname": "t"}, target={}, interval_s=interval, taken_at=1000.0,
                    facts=wrap(facts), before=wrap(before), earlier=wrap(earlier),
                    earlier_at=earlier_at)


def judge(check_id: str, s: Snapshot, **params):
    p = {**default_baseline().get(check_id), **params}
    return run_check(check_id, checks()[check_id], s, p)


# -- FEC -----------------------------------------------------------------------------------------

def fec_facts(fec: dict, phy: dict | None = None, driver: str = "mlx5_core") -> dict:
    return {"ethtool.fec": ["eth2"], "ethtool.fec.eth2": fec,
            "ethtool.info.eth2": {"driver": driver},
            "ethtool.phy.eth2": phy if phy is not None else Fact(missing="no ethtool -S")}


def test_fec_rate_from_history_window_escalates_above_10_per_hour():
    now = parse_fec(fixture("ethtool-I-show-fec.txt", skip=1))
    then = {**now, "stats": {**now["stats"], "uncorrectable_blocks": {"total": 100, "lanes": {}}}}
    s = snap(fec_facts(now), before=fec_facts(now), interval=5.0,
             earlier={"ethtool.fec.eth2": then}, earlier_at=1005.0 - 3600.0)
    (f,) = judge("l1.fec.uncorrectable", s)
    assert f.status == "fail" and f.observed == 45.0  # 45 blocks in exactly one hour
    assert f.evidence["window_s"] == 3600.0 and "since the last stored run" in f.evidence["window"]
    assert "Isolate the port" in f.remedy


def test_fec_few_blocks_fail_without_escalation():
    now = parse_fec(fixture("ethtool-I-show-fec.txt", skip=1))
    then = {**now, "stats": {**now["stats"], "uncorrectable_blocks": {"total": 142, "lanes": {}}}}
    s = snap(fec_facts(now), earlier={"ethtool.fec.eth2": then}, earlier_at=1005.0 - 3600.0)
    (f,) = judge("l1.fec.uncorrectable", s)
    assert f.status == "fail" and f.observed == 3.0 and "Isolate" not in f.remedy


def test_fec_mlx5_driver_counter_when_generic_statistics_are_missing():
    fec = {"supported": True, "configured": ["Auto"], "active": "RS", "stats": {}}
    phy = phy_counters(parse_stats(fixture("ethtool-S-mlx5.txt")))
    grown = {**phy, "rx_symbol_err_phy": phy["rx_symbol_err_phy"] + 2}
    s = snap(fec_facts(fec, grown), before=fec_facts(fec, phy), interval=10.0)
    (f,) = judge("l1.fec.uncorrectable", s)
    assert f.status == "fail" and f.evidence["source"].startswith("ethtool -S rx_symbol_err_phy")
    assert f.observed == 720.0  # 2 in 10 s


def test_fec_bnxt_driver_counter_and_no_growth_passes():
    fec = {"supported": True, "configured": ["Auto"], "active": "RS", "stats": {}}
    phy = {"rx_fec_corrected_blocks": 10, "rx_fec_uncorrectable_blocks": 4}
    s = snap(fec_facts(fec, phy, driver="bnxt_en"), before=fec_facts(fec, phy, driver="bnxt_en"))
    (f,) = judge("l1.fec.uncorrectable", s)
    assert f.status == "pass" and f.observed == 0.0 and "rx_fec_uncorrectable_blocks" in \
        f.evidence["source"]


def test_fec_unknown_driver_without_statistics_is_unknown():
    fec = {"supported": True, "configured": ["Auto"], "active": "RS", "stats": {}}
    (f,) = judge("l1.fec.uncorrectable", snap(fec_facts(fec, {}, driver="ice")))
    assert f.status == "unknown" and "bnxt_en, mlx5_core" in f.reason


def test_fec_first_run_without_interval_is_unknown_not_pass():
    now = parse_fec(fixture("ethtool-I-show-fec.txt", skip=1))
    (f,) = judge("l1.fec.uncorrectable", snap(fec_facts(now), before=fec_facts(now), interval=0.01))
    assert f.status == "unknown" and "no window" in f.reason and f.evidence["total"] == 145


def test_fec_counter_reset_starts_a_new_window():
    now = parse_fec(fixture("ethtool-I-show-fec.txt", skip=1))
    then = {**now, "stats": {**now["stats"], "uncorrectable_blocks": {"total": 9000, "lanes": {}}}}
    s = snap(fec_facts(now), before=fec_facts(now), interval=5.0,
             earlier={"ethtool.fec.eth2": then}, earlier_at=0.0)
    (f,) = judge("l1.fec.uncorrectable", s)
    assert f.status == "pass" and f.evidence["window_s"] == 5.0  # this run's own interval
    assert "went backwards" in f.evidence["window"]


# -- optics and cabling --------------------------------------------------------------------------

def module_facts(module: dict) -> dict:
    return {"ethtool.module": ["eth2"], "ethtool.module.eth2": module,
            "ethtool.info.eth2": {"driver": "mlx5_core"}}


def test_rx_power_pass_fail_and_loss_of_signal():
    good = parse_module(fixture("ethtool-m-qsfp28-optical.txt"))
    (f,) = judge("l1.optics.rx_power", snap(module_facts(good)))
    assert f.status == "pass" and f.observed == -0.36
    dark = {**good, "rx_power": [*good["rx_power"][:3],
                                 {"lane": 4, "mw": 0.0, "dbm": None, "kind": "avg"}]}
    (f,) = judge("l1.optics.rx_power", snap(module_facts(dark)))
    assert f.status == "fail" and "loss of signal" in f.reason and "lane 4" in f.reason
    assert f.observed == "-inf"
    forty = {**good, "rx_power": [{"lane": 1, "mw": 0.0001, "dbm": -40.0, "kind": "avg"}]}
    (f,) = judge("l1.optics.rx_power", snap(module_facts(forty)))
    assert f.status == "fail" and "loss of signal" in f.reason
    (f,) = judge("l1.optics.rx_power", snap(module_facts(good)), limit=0.0)
    assert f.status == "fail" and "lane 1 -0.18 dBm" in f.reason


def test_copper_dac_skips_power_and_passes_cabling():
    dac = parse_module(fixture("ethtool-m-dac.txt", skip=1))
    (f,) = judge("l1.optics.rx_power", snap(module_facts(dac)))
    assert f.status == "skip" and "copper" in f.reason
    (f,) = judge("l1.cable.copper_in_rack", snap(module_facts(dac)))
    assert f.status == "pass" and f.observed == 1.0


def test_optical_module_on_marked_in_rack_link_warns():
    sr4 = parse_module(fixture("ethtool-m-qsfp28-optical.txt"))
    (f,) = judge("l1.cable.copper_in_rack", snap(module_facts(sr4)))
    assert f.status == "skip" and "not an in-rack link" in f.reason
    (f,) = judge("l1.cable.copper_in_rack", snap(module_facts(sr4)), in_rack=["eth2"])
    assert f.status == "warn" and "marked in-rack" in f.reason


def test_short_active_optical_cable_warns_by_length():
    aoc = {**parse_module(fixture("ethtool-m-qsfp28-optical.txt")), "attached_cable": True,
           "cable_length_m": 1.0}
    (f,) = judge("l1.cable.copper_in_rack", snap(module_facts(aoc)))
    assert f.status == "warn" and "1 m optical cable" in f.reason
    (f,) = judge("l1.cable.copper_in_rack", snap(module_facts(aoc)), limit=0.5)
    assert f.status == "skip"


def test_vm_virtio_is_not_applicable_never_pass():
    unsupported = fixture("vm-ethtool-fec-m-unsupported.txt")
    facts = {"ethtool.fec": ["eth0"], "ethtool.fec.eth0": parse_fec(unsupported),
             "ethtool.module": ["eth0"], "ethtool.module.eth0": parse_module(unsupported),
             "ethtool.info.eth0": parse_driver_info(fixture("vm-ethtool-i-virtio.txt")),
             "ethtool.phy.eth0": phy_counters(parse_stats(fixture("vm-ethtool-S-virtio.txt"))),
             "pci.devices": {"0000:00:03.0": {"kind": "nic", "upstream": [], "driver": "virtio-pci",
                                              "aer": False, "amdgpu_replay": False}},
             "pci.aer": {"counters": {}, "errors": {}},
             "pci.replay": {"counters": {}, "sources": {}, "errors": {}}}
    s = snap(facts, before=facts)
    for cid in ("l1.fec.uncorrectable", "l1.optics.rx_power", "l1.cable.copper_in_rack"):
        (f,) = judge(cid, s)
        assert f.status == "skip" and "virtio_net" in f.reason, (cid, f)
    for cid in ("l1.pcie.bad_tlp", "l1.pcie.link_recovery"):
        (f,) = judge(cid, s)
        assert f.status == "unknown" and "0000:00:03.0" in f.reason, (cid, f)


# -- PCIe ----------------------------------------------------------------------------------------

def pci_facts(aer: dict, replay: dict | None = None) -> dict:
    return {"pci.devices": {"0000:81:00.0": {"kind": "nic", "driver": "mlx5_core", "upstream":
                                             ["0000:80:01.0"]},
                            "0000:80:01.0": {"kind": "upstream", "serves": ["0000:81:00.0"]}},
            "pci.aer": {"counters": aer, "errors": {}},
            "pci.replay": replay or {"counters": {}, "sources": {}, "errors": {}}}


def test_aer_rollover_growth_on_the_upstream_port_fails_link_recovery():
    from tailgate.sources.pci import parse_aer
    zero = parse_aer(fixture("aer_dev_correctable.txt"))
    grown = {**zero, "Rollover": 1, "TOTAL_ERR_COR": 1}
    s = snap(pci_facts({"0000:81:00.0": zero, "0000:80:01.0": grown}),
             before=pci_facts({"0000:81:00.0": zero, "0000:80:01.0": zero}))
    results = {f.subject: f for f in judge("l1.pcie.link_recovery", s)}
    up = results["0000:80:01.0 upstream"]
    assert "upstream port of 0000:81:00.0" in up.reason
    assert up.status == "fail" and up.observed == 1.0
    assert "AER Rollover" in up.evidence["stand_ins"][0]
    assert results["0000:81:00.0 nic mlx5_core"].status == "pass"
    bad = {f.subject: f.status for f in judge("l1.pcie.bad_tlp", s)}
    assert set(bad.values()) == {"pass"}


def test_bad_tlp_error_reading_a_device_is_unknown():
    facts = pci_facts({})
    facts["pci.aer"] = {"counters": {}, "errors": {"0000:81:00.0": "parse error: BadTLP x"}}
    (f,) = judge("l1.pcie.bad_tlp", snap(facts, before=facts))
    assert f.status == "unknown" and "BadTLP x" in f.reason


# -- clock ---------------------------------------------------------------------------------------

def ts_facts(hardware: bool) -> dict:
    text = ((ROOTS / "l1l3-clean" / "commands" / "ethtool_-T_eth2").read_text() if hardware
            else fixture("vm-ethtool-T-virtio.txt"))
    return {"ethtool.ts": ["eth0"], "ethtool.ts.eth0": parse_timestamping(text)}


def pmc_fact(status_file: str, ports_file: str | None = None, skip: int = 0) -> dict:
    ports = port_properties(parse_pmc(fixture(ports_file))) if ports_file else []
    return {"ptp.pmc": {"time_status": time_status(parse_pmc(fixture(status_file, skip=skip))),
                        "ports": ports}}


MISSING = {"ptp.log": {"samples": [], "summaries": [], "unavailable": "journalctl: absent"},
           "chrony.tracking": Fact(missing="`chronyc tracking` exited 1: 506 Cannot talk to daemon")}


def test_ptp_offset_of_the_synchronised_port_is_judged():
    facts = {**ts_facts(True), **pmc_fact("pmc-time-status.txt", skip=1), **MISSING}
    f = judge("l1.clock.ptp", snap(facts))[0]
    assert f.status == "fail" and f.observed == 12610 and "exceeds +-5 ns" in f.reason
    f = judge("l1.clock.ptp", snap(facts), limit=20000.0)[0]
    assert f.status == "pass"


def test_ptp_software_timestamping_and_no_grandmaster_fail():
    facts = {**ts_facts(False), **pmc_fact("vm-pmc-time-status-noGM.txt",
                                           "vm-pmc-port-properties-sw.txt"), **MISSING}
    f = judge("l1.clock.ptp", snap(facts))[0]
    assert f.status == "fail" and "software timestamping on lo" in f.reason
    facts = {**ts_facts(True), **pmc_fact("vm-pmc-time-status-noGM.txt"), **MISSING}
    f = judge("l1.clock.ptp", snap(facts))[0]
    assert f.status == "fail" and "no grandmaster" in f.reason


def test_ptp_journal_offsets_and_unlocked_servo():
    none = {"ptp.pmc": Fact(missing="`pmc` is not installed")}
    facts = {**ts_facts(True), **none, **MISSING,
             "ptp.log": parse_ptp_log(fixture("ptp4l-log.txt", skip=1))}
    f = judge("l1.clock.ptp", snap(facts))[0]
    assert f.status == "fail" and f.observed == 725  # worst of the last 10 locked samples
    facts["ptp.log"] = parse_ptp_log(fixture("phc2sys-ptp4l-journal.txt"))
    f = judge("l1.clock.ptp", snap(facts))[0]
    assert f.status == "fail" and "phc2sys s0 (not locked)" in f.reason


def test_chrony_software_ntp_fails_and_phc_is_judged_on_offset():
    base = {**ts_facts(True), "ptp.pmc": Fact(missing="`pmc` is not installed"),
            "ptp.log": Fact(missing="journalctl: absent")}
    ntp = parse_chrony_tracking(fixture("chronyc-tracking.txt", skip=1))
    f = judge("l1.clock.ptp", snap({**base, "chrony.tracking": ntp}))[0]
    assert f.status == "fail" and "software NTP" in f.reason and "pyramid.latt.net" in f.reason
    phc = parse_chrony_tracking(fixture("chronyc-tracking-phc.txt", skip=1))
    f = judge("l1.clock.ptp", snap({**base, "chrony.tracking": phc}))[0]
    assert f.status == "fail" and f.observed == 14.0
    f = judge("l1.clock.ptp", snap({**base, "chrony.tracking": phc}), limit=20.0)[0]
    assert f.status == "pass" and "PHC0" in f.reason
    unsync = parse_chrony_tracking(fixture("vm-chronyc-tracking-unsync.txt"))
    f = judge("l1.clock.ptp", snap({**base, "chrony.tracking": unsync}))[0]
    assert f.status == "fail" and "not synchronised" in f.reason


def test_vm_without_hardware_timestamping_fails_and_nothing_at_all_is_unknown():
    facts = {**ts_facts(False), "ptp.pmc": {"time_status": [], "ports": []}, **MISSING}
    f = judge("l1.clock.ptp", snap(facts))[0]
    assert f.status == "fail" and "eth0: software only" in f.reason
    gone = {"ethtool.ts": Fact(missing="`ethtool` is not installed"),
            "ptp.pmc": Fact(missing="`pmc` is not installed"), **MISSING}
    f = judge("l1.clock.ptp", snap(gone))[0]
    assert f.status == "unknown" and "`pmc` is not installed" in f.reason


# -- fuzzing whole fixture roots -----------------------------------------------------------------

GARBLED = ["commands/ethtool_-I_--show-fec_eth2", "commands/ethtool_-S_eth2",
           "commands/ethtool_-m_eth2", "commands/ethtool_-T_eth2", "commands/ethtool_-i_eth2",
           "commands/nvidia-smi_-q", "commands/pmc_-u_-b_0_GET_TIME_STATUS_NP",
           "commands/pmc_-u_-b_0_GET_PORT_PROPERTIES_NP",
           "sys/devices/pci0000:80/0000:80:01.0/aer_dev_correctable",
           "sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/aer_dev_correctable",
           "sys/devices/pci0000:c0/0000:c0:01.0/aer_dev_correctable",
           "sys/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0/aer_dev_correctable",
           "sys/devices/pci0000:e0/0000:e0:01.0/aer_dev_correctable",
           "sys/devices/pci0000:e0/0000:e0:01.0/0000:e1:00.0/aer_dev_correctable",
           "sys/devices/pci0000:e0/0000:e0:01.0/0000:e1:00.0/pcie_replay_count",
           # and the L3 inputs
           "commands/ethtool_-x_eth2", "commands/tc_-j_qdisc_show_dev_eth2",
           "sys/class/net/eth2/queues/tx-0/xps_cpus", "sys/class/net/eth2/queues/tx-1/xps_cpus"]
L3 = ("l3.rss.symmetric", "l3.xps.per_core_tx", "l3.queue.aqm")


def test_fuzzed_root_never_passes(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzzroot") / "root"
    shutil.copytree(ROOTS / "l1l3-clean", root, symlinks=True)

    # Garbage: never a bare number or CPU mask, which would be a valid single-value file.
    garbage_text = st.text(max_size=300).filter(lambda t: re.search(r"[^0-9a-fA-F,\s]", t))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.function_scoped_fixture])
    @given(st.lists(garbage_text, min_size=len(GARBLED), max_size=len(GARBLED)))
    def run(garbage):
        for rel, text in zip(GARBLED, garbage, strict=True):
            (root / rel).write_text(text)
        s = collect(Host(root), Scope(), 0)
        s.interval_s = 60.0  # a window exists, so nothing is unknown for want of one
        for cid in L1 + L3:
            for f in judge(cid, s):
                assert f.status in ("unknown", "skip"), (cid, f.status, f.reason, garbage)
    run()
