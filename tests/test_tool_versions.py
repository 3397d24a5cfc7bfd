"""Every release's output format: parsers and checks on one fixture per print-code variant.

The fixtures in tests/fixtures/host/versions name on their first line the tool release, the
source file and function they come from, and the other releases that print the same. The
``ethtool -m`` ones were printed by ethtool's own decoders of each release (see
versions/harness/README.md); the others are written from the release's printf calls.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailgate.baseline import default_baseline
from tailgate.collect import Scope, collect
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.model import Fact, ParseError, Snapshot, SourceError
from tailgate.sources.ethtool import (
    ethtool_fec,
    parse_fec,
    parse_module,
    parse_rings,
    parse_rss,
    parse_timestamping,
)
from tailgate.sources.pci import parse_aer, parse_nvidia_smi
from tailgate.sources.ptp import (
    parse_chrony_tracking,
    parse_pmc,
    port_properties,
    ptp_pmc,
    time_status,
)
from tailgate.sources.qdisc import parse_tc_qdisc, parse_tc_qdisc_text, tc_qdisc

VERSIONS = Path(__file__).parent / "fixtures" / "host" / "versions"


def version_fixture(name: str) -> str:
    text = (VERSIONS / name).read_text()
    assert text.startswith("# source: "), "a version fixture starts with its provenance line"
    return text.split("\n", 1)[1]


def test_every_version_fixture_names_its_release_and_source():
    files = sorted(p for p in VERSIONS.iterdir() if p.is_file() and p.suffix == ".txt")
    assert len(files) >= 20
    for path in files:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# source: "), path.name
        # the tool, its release, and where the format comes from
        assert re.match(r"# source: (ethtool|nvidia-smi|Linux|linuxptp|chrony|iproute2) "
                        r"[^ ]*\d", first), path.name
        # the function's source file, or (closed-source nvidia-smi) where the capture is
        assert re.search(r"[\w/-]+\.(c|h|py|txt|md)\b|index id \d+", first), path.name


def snap(facts: dict, before: dict | None = None, interval: float = 5.0) -> Snapshot:
    def wrap(d):
        return {k: v if isinstance(v, Fact) else Fact(value=v) for k, v in (d or {}).items()}
    return Snapshot(host={"hostname": "t"}, target={}, interval_s=interval, taken_at=1000.0,
                    facts=wrap(facts), before=wrap(before))


def judge(check_id: str, s: Snapshot, **params):
    return run_check(check_id, checks()[check_id], s, {**default_baseline().get(check_id), **params})


# -- ethtool --show-fec ---------------------------------------------------------------------------

FEC_WITH_STATS = ["ethtool-I-show-fec-5.13.txt", "ethtool-I-show-fec-5.18.txt",
                  "ethtool-I-show-fec-6.19-lanes.txt", "ethtool-I-show-fec-6.19-nolanes.txt"]


def test_fec_5_13_configured_and_lane_lines():
    fec = parse_fec(version_fixture("ethtool-I-show-fec-5.13.txt"))
    assert fec["configured"] == ["Auto", "RS"] and fec["active"] == "RS"
    assert fec["stats"]["corrected_blocks"] == {"total": 256, "lanes": {"0": 255, "1": 1}}
    assert fec["stats"]["uncorrectable_blocks"] == {"total": 145, "lanes": {"0": 128, "1": 17}}
    assert fec["histogram"] == []


def test_fec_5_18_supported_configured_and_lane_less_corrected_bits():
    fec = parse_fec(version_fixture("ethtool-I-show-fec-5.18.txt"))
    assert fec["configured"] == ["Auto", "RS", "BaseR"]
    assert fec["stats"]["uncorrectable_blocks"] == {
        "total": 3, "lanes": {"0": 0, "1": 0, "2": 3, "3": 0}}
    assert fec["stats"]["corrected_bits"] == {"total": 4100, "lanes": {}}


def test_fec_6_19_per_lane_brackets_and_histogram():
    fec = parse_fec(version_fixture("ethtool-I-show-fec-6.19-lanes.txt"))
    assert fec["stats"]["corrected_blocks"] == {
        "total": 1024, "lanes": {"0": 1000, "1": 20, "2": 4, "3": 0}}
    assert fec["stats"]["uncorrectable_blocks"]["lanes"] == {"0": 0, "1": 0, "2": 3, "3": 0}
    assert [(b["symbol_errors"], b["total"]) for b in fec["histogram"]] == [
        ([0, 0], 987654321), ([1, 3], 1021), ([4, 15], 3)]
    assert fec["histogram"][1]["lanes"] == {"0": 1000, "1": 17, "2": 4, "3": 0}


def test_fec_6_19_lane_less_totals_run_together_on_one_line():
    fec = parse_fec(version_fixture("ethtool-I-show-fec-6.19-nolanes.txt"))
    assert {k: v["total"] for k, v in fec["stats"].items()} == {
        "corrected_blocks": 1024, "uncorrectable_blocks": 3, "corrected_bits": 4100}
    assert [b["total"] for b in fec["histogram"]] == [987654321, 1021, 3]


def test_fec_before_5_13_has_no_statistics():
    fec = parse_fec(version_fixture("ethtool-show-fec-5.0-ioctl.txt"))
    assert fec == {"supported": True, "configured": ["Auto", "RS"], "active": "RS", "stats": {},
                   "histogram": []}


@pytest.mark.parametrize("bad", ["uncorrectable_blocks: 3 [ per_lane: 0, x ]",
                                 "uncorrectable_blocks: three", "    Lane 0: -"])
def test_fec_malformed_values_of_new_formats_are_parse_errors(bad):
    text = version_fixture("ethtool-I-show-fec-6.19-lanes.txt")
    text = text.replace("uncorrectable_blocks: 3 [ per_lane: 0, 0, 3, 0 ]", bad)
    with pytest.raises(ParseError):
        parse_fec(text)


def fec_facts(fec: dict) -> dict:
    return {"ethtool.fec": ["eth2"], "ethtool.fec.eth2": fec,
            "ethtool.info.eth2": {"driver": "ice"},
            "ethtool.phy.eth2": Fact(missing="no ethtool -S")}


@pytest.mark.parametrize("name", FEC_WITH_STATS)
def test_fec_check_judges_every_format(name):
    now = parse_fec(version_fixture(name))
    unc = now["stats"]["uncorrectable_blocks"]["total"]
    then = {**now, "stats": {**now["stats"],
                             "uncorrectable_blocks": {"total": unc - 2, "lanes": {}}}}
    (f,) = judge("l1.fec.uncorrectable", snap(fec_facts(now), before=fec_facts(then)))
    assert f.status == "fail" and f.observed == 1440.0  # 2 blocks in 5 s
    assert f.evidence["source"] == "ethtool -I --show-fec uncorrectable_blocks"
    assert ("fec_histogram" in f.evidence) == ("6.19" in name)
    (f,) = judge("l1.fec.uncorrectable", snap(fec_facts(now), before=fec_facts(now)))
    assert f.status == "pass"


def test_fec_check_without_statistics_is_not_a_pass():
    fec = parse_fec(version_fixture("ethtool-show-fec-5.0-ioctl.txt"))
    (f,) = judge("l1.fec.uncorrectable", snap(fec_facts(fec), before=fec_facts(fec)))
    assert f.status == "unknown" and "no uncorrectable-block counter" in f.reason


# -- ethtool -m ------------------------------------------------------------------------------------

SFF8636 = ["ethtool-m-sff8636-5.16.txt", "ethtool-m-sff8636-6.4.txt", "ethtool-m-sff8636-6.14.txt"]
CMIS_AOC = ["ethtool-m-cmis-aoc-5.16.txt", "ethtool-m-cmis-aoc-6.4.txt",
            "ethtool-m-cmis-aoc-6.14.txt", "ethtool-m-cmis-aoc-7.0.txt"]


@pytest.mark.parametrize("name", SFF8636)
def test_sff8636_every_release_reads_four_lanes(name):
    m = parse_module(version_fixture(name))
    assert m["identifier"] == "0x11 (QSFP28)" and m["media"] == "optical"
    assert m["cable_length_m"] is None and m["part"] == "QSFP-100G-SR4"
    assert [(ln["lane"], ln["dbm"]) for ln in m["rx_power"]] == [
        (1, -0.46), (2, None), (3, -13.01), (4, -0.97)]
    if name.endswith("5.16.txt"):
        assert m["lane_flags"] == {}  # ethtool < 6.4 does not print them
    else:
        assert m["lane_flags"] == {"rx_los": [2], "tx_los": [], "rx_lol": [2, 4], "tx_lol": []}


@pytest.mark.parametrize("name", CMIS_AOC)
def test_cmis_active_optical_cable_every_release(name):
    m = parse_module(version_fixture(name))
    assert m["media"] == "optical" and m["attached_cable"] is True
    assert m["cable_length_m"] == 3.0  # "3.00m" before 6.14, "3.0000m" from 6.14
    assert len(m["rx_power"]) == 8 and m["rx_power"][2]["dbm"] is None
    assert m["rx_power"][5]["dbm"] == -12.01
    assert m["rx_thresholds_dbm"] == {"alarm_high": 5.0, "alarm_low": -14.4,
                                      "warning_high": 4.0, "warning_low": -12.4}
    if not name.endswith("5.16.txt"):
        assert m["lane_flags"]["rx_los"] == [3] and m["lane_flags"]["rx_lol"] == [3, 7]


@pytest.mark.parametrize("name", ["ethtool-m-cmis-dac-6.4.txt", "ethtool-m-cmis-dac-6.14.txt"])
def test_cmis_copper_cable_length(name):
    m = parse_module(version_fixture(name))
    assert m["media"] == "copper" and m["cable_length_m"] == 2.0 and m["rx_power"] == []
    assert m["transmitter_technology"] == "0x0a (Copper cable, unequalized)"


@pytest.mark.parametrize("name", ["ethtool-m-sff8472-6.4.txt", "ethtool-m-sff8472-6.14.txt"])
def test_sff8472_single_lane_every_release(name):
    m = parse_module(version_fixture(name))
    assert [(ln["lane"], ln["dbm"], ln["kind"]) for ln in m["rx_power"]] == [(1, -13.01, "avg")]
    assert m["lane_flags"] == {} and m["rx_thresholds_dbm"]["warning_low"] == -12.4


def test_cmis_longest_cable_code_and_bad_lane_list():
    text = version_fixture("ethtool-m-cmis-dac-6.4.txt").replace(": 2.00m", ": > 6.3km")
    assert parse_module(text)["cable_length_m"] == 6300.0
    text = version_fixture("ethtool-m-cmis-aoc-6.4.txt").replace("[ No, No, Yes,", "[ No, Maybe,")
    with pytest.raises(ParseError, match="Rx loss of signal: not a lane list"):
        parse_module(text)


def test_undecoded_module_hex_dump_is_a_clear_parse_error():
    # ethtool.c dump_hex: the fallback for an identifier this release cannot decode.
    text = "Offset\t\tValues\n------\t\t------\n0x0000:\t\t19 00 00 00 00 00 00 00\n"
    with pytest.raises(ParseError, match="hex dump only"):
        parse_module(text)


def module_facts(module: dict) -> dict:
    return {"ethtool.module": ["eth2"], "ethtool.module.eth2": module,
            "ethtool.info.eth2": {"driver": "mlx5_core"}}


@pytest.mark.parametrize("name", SFF8636)
def test_rx_power_check_names_every_failing_lane_with_its_cause(name):
    (f,) = judge("l1.optics.rx_power", snap(module_facts(parse_module(version_fixture(name)))))
    assert f.status == "fail" and f.observed == "-inf"
    flagged = not name.endswith("5.16.txt")
    assert [ln["lane"] for ln in f.evidence["failing_lanes"]] == [2, 3]
    assert f.evidence["failing_lanes"][0]["causes"] == (["dark", "rx_los", "rx_lol"] if flagged
                                                        else ["dark"])
    assert f.evidence["failing_lanes"][1]["causes"] == ["low"]
    # both kinds named, not only the first one found
    assert "loss of signal (no light) on lane 2 -inf dBm" in f.reason
    assert "below -10 dBm: lane 3 -13.01 dBm" in f.reason
    if flagged:
        assert "(Rx LOS, Rx LOL flagged)" in f.reason and "Rx LOL latched on lane 4" in f.reason
    else:
        assert "flagged" not in f.reason
        assert f.evidence["lane_flags"].startswith("not reported")


@pytest.mark.parametrize("name", CMIS_AOC)
def test_rx_power_check_on_cmis_eight_lanes(name):
    (f,) = judge("l1.optics.rx_power", snap(module_facts(parse_module(version_fixture(name)))))
    assert f.status == "fail"
    assert {ln["lane"]: ln["causes"][0] for ln in f.evidence["failing_lanes"]} == {3: "dark", 6: "low"}
    assert "lane 6 -12.01 dBm" in f.reason and "lane 3 -inf dBm" in f.reason
    if not name.endswith("5.16.txt"):
        assert "Rx LOL latched on lane 7" in f.reason
    (f,) = judge("l1.optics.rx_power", snap(module_facts(parse_module(version_fixture(name)))),
                 limit=-13.0)
    assert f.status == "fail" and "below" not in f.reason  # -12.01 is above -13: only lane 3


def test_latched_flags_on_good_lanes_are_evidence_not_a_failure():
    m = parse_module(version_fixture("ethtool-m-sff8636-6.14.txt"))
    healed = {**m, "rx_power": [{**ln, "dbm": -1.0, "mw": 0.79} for ln in m["rx_power"]]}
    (f,) = judge("l1.optics.rx_power", snap(module_facts(healed)))
    assert f.status == "pass" and f.evidence["failing_lanes"] == []
    assert "Rx LOS latched on lane 2" in f.reason and "Rx LOL latched on lanes 2, 4" in f.reason


def test_sff8472_weak_single_lane_fails_below_the_red_line():
    m = parse_module(version_fixture("ethtool-m-sff8472-6.14.txt"))
    (f,) = judge("l1.optics.rx_power", snap(module_facts(m)))
    assert f.status == "fail" and f.observed == -13.01 and "lane 1 -13.01 dBm" in f.reason
    assert f.evidence["module_rx_thresholds_dbm"]["alarm_low"] == -14.4


@pytest.mark.parametrize("name", CMIS_AOC)
def test_short_cmis_active_optical_cable_warns_in_rack(name):
    (f,) = judge("l1.cable.copper_in_rack",
                 snap(module_facts(parse_module(version_fixture(name)))), limit=5.0)
    assert f.status == "warn" and f.observed == 3.0 and "3 m optical cable" in f.reason
    (f,) = judge("l1.cable.copper_in_rack", snap(module_facts(parse_module(version_fixture(name)))))
    assert f.status == "skip"  # 3 m is over the default 2 m in-rack length


@pytest.mark.parametrize("name", ["ethtool-m-cmis-dac-6.4.txt", "ethtool-m-cmis-dac-6.14.txt"])
def test_cmis_copper_passes_cabling_and_skips_power(name):
    facts = module_facts(parse_module(version_fixture(name)))
    (f,) = judge("l1.cable.copper_in_rack", snap(facts))
    assert f.status == "pass" and f.observed == 2.0
    (f,) = judge("l1.optics.rx_power", snap(facts))
    assert f.status == "skip"


# -- ethtool -x ------------------------------------------------------------------------------------

RSS = ["ethtool-x-5.0-ioctl.txt", "ethtool-x-6.2-netlink.txt", "ethtool-x-6.9-symmetric-xor.txt",
       "ethtool-x-6.14-unknown.txt", "ethtool-x-6.15-symmetric-or-xor.txt"]


@pytest.mark.parametrize("name", RSS)
def test_rss_every_release_reads_table_and_key(name):
    rss = parse_rss(version_fixture(name))
    assert rss["rings"] == 8 and rss["table"] == list(range(8)) * 4
    assert len(bytes.fromhex(rss["key"])) == 40
    assert set(rss["functions"]) == {"toeplitz", "xor", "crc32"}


def rss_facts(name: str) -> dict:
    return {"ethtool.rss": ["eth2"], "ethtool.rss.eth2": parse_rss(version_fixture(name))}


@pytest.mark.parametrize(("name", "status", "observed"), [
    ("ethtool-x-5.0-ioctl.txt", "fail", "asymmetric"),
    ("ethtool-x-6.2-netlink.txt", "pass", "symmetric"),
    ("ethtool-x-6.9-symmetric-xor.txt", "pass", "symmetric-xor"),
    ("ethtool-x-6.15-symmetric-or-xor.txt", "pass", "symmetric-or-xor"),
    ("ethtool-x-6.14-unknown.txt", "unknown", None),
])
def test_rss_check_on_every_release(name, status, observed):
    (f,) = judge("l3.rss.symmetric", snap(rss_facts(name)))
    assert (f.status, f.observed) == (status, observed)
    if status == "unknown":
        assert "0x8" in f.reason and f.evidence["unknown_bits"] == {"functions": "0x8",
                                                                    "transforms": "0x4"}


# -- nvidia-smi -q ---------------------------------------------------------------------------------

NVIDIA = {"nvidia-smi-q-384.69.txt": {"0000:02:00.0": {"replays": 0},
                                      "0000:03:00.0": {"replays": 0}},
          "nvidia-smi-q-462.31.txt": {"0000:01:00.0": {"replays": 0, "replay_rollovers": 0}},
          "nvidia-smi-q-575.57.08.txt": {"0000:01:00.0": {"replays": 0, "replay_rollovers": 0}}}


@pytest.mark.parametrize("name", sorted(NVIDIA))
def test_nvidia_smi_replay_counters_every_driver(name):
    assert parse_nvidia_smi(version_fixture(name)) == NVIDIA[name]


def test_nvidia_smi_four_digit_domain_of_old_drivers():
    text = version_fixture("nvidia-smi-q-384.69.txt").replace("GPU 00000000:03:00.0",
                                                              "GPU 0000:03:00.0")
    assert "0000:03:00.0" in parse_nvidia_smi(text)


def replay_facts(counters: dict) -> dict:
    devices = {bdf: {"kind": "gpu", "driver": "nvidia", "vendor": "0x10de", "upstream": []}
               for bdf in counters}
    return {"pci.devices": devices, "pci.aer": {"counters": {}, "errors": {}},
            "pci.replay": {"counters": counters,
                           "sources": {b: "nvidia-smi -q (Replays Since Reset)" for b in counters},
                           "errors": {}}}


@pytest.mark.parametrize("name", sorted(NVIDIA))
def test_link_recovery_on_every_driver_layout(name):
    now = parse_nvidia_smi(version_fixture(name))
    grown = {b: {k: v + 4 for k, v in c.items() if k == "replays"} | {
        k: v for k, v in c.items() if k != "replays"} for b, c in now.items()}
    results = judge("l1.pcie.link_recovery", snap(replay_facts(grown), before=replay_facts(now)))
    assert [f.status for f in results] == ["fail"] * len(now)
    assert all(f.observed == 4.0 for f in results)
    results = judge("l1.pcie.link_recovery", snap(replay_facts(now), before=replay_facts(now)))
    assert {f.status for f in results} == {"pass"}


# -- AER sysfs files -------------------------------------------------------------------------------

def test_aer_unnamed_status_bit_is_kept_not_dropped():
    aer = parse_aer(version_fixture("aer_dev_correctable-linux-4.19-unnamed-bit.txt"))
    assert aer == {"RxErr": 0, "BadTLP": 3, "BadDLLP": 1, "Rollover": 0, "bit11": 1, "Timeout": 2,
                   "NonFatalErr": 0, "CorrIntErr": 0, "HeaderOF": 0, "TOTAL_ERR_COR": 5}
    text = version_fixture("aer_dev_correctable-linux-4.19-unnamed-bit.txt").replace(
        "dev_cor_errs_bit[11] 1", "dev_cor_errs_bit[11] one")
    with pytest.raises(ParseError, match=r"dev_cor_errs_bit\[11\]: not a count"):
        parse_aer(text)


def test_bad_tlp_and_link_recovery_on_the_unnamed_bit_format():
    then = parse_aer(version_fixture("aer_dev_correctable-linux-4.19-unnamed-bit.txt"))
    now = {**then, "BadTLP": 4, "Timeout": 3, "bit11": 2}
    devices = {"0000:81:00.0": {"kind": "nic", "driver": "mlx5_core", "upstream": []}}

    def facts(aer):
        return {"pci.devices": devices, "pci.aer": {"counters": {"0000:81:00.0": aer},
                                                    "errors": {}},
                "pci.replay": {"counters": {}, "sources": {}, "errors": {}}}
    (f,) = judge("l1.pcie.bad_tlp", snap(facts(now), before=facts(then)))
    assert f.status == "fail" and f.observed == 1.0
    (f,) = judge("l1.pcie.link_recovery", snap(facts(now), before=facts(then)))
    assert f.status == "fail" and f.observed == 1.0  # the Timeout; bit11 is not a recovery


# -- pmc -------------------------------------------------------------------------------------------

def test_pmc_management_error_status_is_an_answer_not_silence():
    responses = parse_pmc(version_fixture("pmc-management-error-status.txt"))
    assert responses == [{"port": "000000.fffe.000000-1", "message": "MANAGEMENT_ERROR_STATUS",
                          "fields": {}, "error": True}]
    assert port_properties(responses) == [] and time_status(responses) == []
    mixed = parse_pmc(version_fixture("pmc-time-status-and-error.txt"))
    assert time_status(mixed) == [{"port": "a0369f.fffe.1c2d3e-1", "master_offset_ns": -3,
                                   "gm_present": True, "gm": "001122.fffe.334455"}]


def fixture_root(tmp_path: Path, files: dict[str, str]) -> Host:
    (tmp_path / "commands").mkdir()
    for name, text in files.items():
        (tmp_path / "commands" / name).write_text(text)
    return Host(tmp_path)


def test_pmc_collector_reports_a_refusing_ptp4l(tmp_path):
    error = version_fixture("pmc-management-error-status.txt").replace("PORT_PROPERTIES_NP",
                                                                       "TIME_STATUS_NP")
    host = fixture_root(tmp_path, {"pmc_-u_-b_0_GET_TIME_STATUS_NP": error})
    with pytest.raises(SourceError, match="MANAGEMENT_ERROR_STATUS"):
        ptp_pmc(host, Scope())


def test_pmc_offset_judged_beside_an_erroring_clock():
    ts = parse_timestamping((Path(__file__).parent / "fixtures" / "roots" / "l1l3-clean" /
                             "commands" / "ethtool_-T_eth2").read_text())
    pmc = {"time_status": time_status(parse_pmc(version_fixture("pmc-time-status-and-error.txt"))),
           "ports": port_properties(parse_pmc(version_fixture("pmc-management-error-status.txt")))}
    facts = {"ethtool.ts": ["eth2"], "ethtool.ts.eth2": ts, "ptp.pmc": pmc,
             "ptp.log": {"samples": [], "summaries": [], "unavailable": "journalctl: absent"},
             "chrony.tracking": Fact(missing="chronyc: absent")}
    (f,) = judge("l1.clock.ptp", snap(facts))
    assert f.status == "pass" and f.observed == -3


# -- chronyc tracking ------------------------------------------------------------------------------

def test_chrony_before_3_0_quad_dotted_reference_ids():
    phc = parse_chrony_tracking(version_fixture("chronyc-tracking-2.0-phc.txt"))
    assert (phc["ref_id"], phc["kind"], phc["ref_name"], phc["offset_ns"]) == (
        "50484330", "phc", "PHC0", -21.0)
    ntp = parse_chrony_tracking(version_fixture("chronyc-tracking-2.0-ntp.txt"))
    assert (ntp["ref_id"], ntp["kind"], ntp["offset_ns"]) == ("C000020B", "ntp", 31625.0)
    unsync = parse_chrony_tracking(version_fixture("chronyc-tracking-2.0-unsync.txt"))
    assert unsync["kind"] == "none" and not unsync["synchronised"]
    with pytest.raises(ParseError, match="bad Reference ID"):
        parse_chrony_tracking(version_fixture("chronyc-tracking-2.0-ntp.txt").replace(
            "192.0.2.11 (", "192.0.2.911 ("))


@pytest.mark.parametrize(("name", "status", "words"), [
    ("chronyc-tracking-2.0-phc.txt", "fail", "exceeds +-5 ns"),
    ("chronyc-tracking-2.0-ntp.txt", "fail", "software NTP"),
    ("chronyc-tracking-2.0-unsync.txt", "fail", "not synchronised"),
])
def test_clock_check_on_chrony_2(name, status, words):
    facts = {"ethtool.ts": Fact(missing="ethtool: absent"), "ptp.pmc": Fact(missing="pmc: absent"),
             "ptp.log": {"samples": [], "summaries": [], "unavailable": "journalctl: absent"},
             "chrony.tracking": parse_chrony_tracking(version_fixture(name))}
    (f,) = judge("l1.clock.ptp", snap(facts))
    assert f.status == status and words in f.reason
    if name.endswith("phc.txt"):
        (f,) = judge("l1.clock.ptp", snap(facts), limit=30.0)
        assert f.status == "pass" and f.observed == -21.0


# -- tc qdisc --------------------------------------------------------------------------------------

def test_tc_text_of_iproute2_before_4_15():
    q = parse_tc_qdisc_text(version_fixture("tc-qdisc-show-iproute2-4.14-text.txt"))
    assert [(x["kind"], x["root"], x["parent"]) for x in q] == [
        ("mq", True, None), ("pfifo_fast", False, ":2"), ("fq_codel", False, ":1")]
    with pytest.raises(ParseError):
        parse_tc_qdisc_text("Option \"-j\" is unknown, try \"tc -help\".\n")
    with pytest.raises(ParseError, match="unreadable"):
        parse_tc_qdisc_text("qdisc mq root\n")


def test_tc_collector_falls_back_to_text_and_the_check_judges_it(tmp_path):
    (tmp_path / "sys" / "class" / "net" / "eth2" / "device").mkdir(parents=True)
    host = fixture_root(tmp_path, {"tc_qdisc_show_dev_eth2":
                                   version_fixture("tc-qdisc-show-iproute2-4.14-text.txt")})
    facts = tc_qdisc(host, Scope(ifaces=("eth2",)))
    assert facts["tc.qdisc.eth2"]["root"] == "mq"
    (f,) = judge("l3.queue.aqm", snap(facts))
    assert f.status == "warn" and "tail-drop FIFO (pfifo_fast)" in f.reason
    # neither form captured: the reason is the -j command's, not the fallback's
    (tmp_path / "commands" / "tc_qdisc_show_dev_eth2").unlink()
    missing = tc_qdisc(host, Scope(ifaces=("eth2",)))["tc.qdisc.eth2"]
    assert isinstance(missing, Fact) and "tc -j qdisc show dev eth2" in missing.missing


def test_tc_text_and_json_agree_on_this_kernel():
    # The real tc of this machine, on loopback (read-only: `show`).
    text = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True,
                          check=True, timeout=10).stdout
    js = subprocess.run(["tc", "-j", "qdisc", "show", "dev", "lo"], capture_output=True,
                        text=True, check=True, timeout=10).stdout
    assert parse_tc_qdisc_text(text) == parse_tc_qdisc(js)


# -- ethtool before 5.10 (no -I) -------------------------------------------------------------------

def test_fec_collector_asks_without_include_statistics_when_refused(tmp_path):
    (tmp_path / "sys" / "class" / "net" / "eth2" / "device").mkdir(parents=True)
    host = fixture_root(tmp_path, {"ethtool_--show-fec_eth2":
                                   version_fixture("ethtool-show-fec-5.0-ioctl.txt")})
    fec = ethtool_fec(host, Scope(ifaces=("eth2",)))["ethtool.fec.eth2"]
    assert fec["supported"] and fec["active"] == "RS" and fec["stats"] == {}


# -- ethtool -T ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ethtool-T-5.8-netlink.txt", "ethtool-T-6.10-stats.txt",
                                  "ethtool-T-6.14-provider.txt", "ethtool-T-7.0-source.txt"])
def test_timestamping_every_release(name):
    ts = parse_timestamping(version_fixture(name))
    assert ts["hardware"] is True and ts["phc_index"] == 4
    assert ts["capabilities"][:3] == ["hardware-transmit", "software-transmit", "hardware-receive"]
    # the 6.10+ statistics block is not read as receive filters
    assert ts["rx_filters"] == (["none", "ptpv2-event"] if "7.0" in name else ["none", "all"])
    assert ts["tx_modes"][:2] == ["off", "on"]


def test_clock_check_sees_hardware_timestamping_in_the_6_14_layout():
    ts = parse_timestamping(version_fixture("ethtool-T-6.14-provider.txt"))
    facts = {"ethtool.ts": ["eth2"], "ethtool.ts.eth2": ts,
             "ptp.pmc": {"time_status": [], "ports": []},
             "ptp.log": {"samples": [], "summaries": [], "unavailable": "journalctl: absent"},
             "chrony.tracking": Fact(missing="chronyc: absent")}
    (f,) = judge("l1.clock.ptp", snap(facts))
    assert f.status == "fail" and "eth2 can timestamp in hardware" in f.reason
    assert f.evidence["interfaces"]["eth2"] == {"hardware": True, "phc_index": 4}


def test_rings_6_15_layout_reads_only_the_four_rings():
    rings = parse_rings(version_fixture("ethtool-g-6.15.txt"))
    assert rings == {"max": {"RX": 8192, "RX Mini": None, "RX Jumbo": None, "TX": 8192},
                     "current": {"RX": 1024, "RX Mini": None, "RX Jumbo": None, "TX": 1024}}


# -- fuzzing the new formats -----------------------------------------------------------------------

FUZZED = {"ethtool-I-show-fec-6.19-lanes.txt": parse_fec,
          "ethtool-I-show-fec-6.19-nolanes.txt": parse_fec,
          "ethtool-I-show-fec-5.18.txt": parse_fec,
          "ethtool-m-cmis-aoc-7.0.txt": parse_module, "ethtool-m-sff8636-6.4.txt": parse_module,
          "ethtool-x-6.14-unknown.txt": parse_rss, "ethtool-T-6.10-stats.txt": parse_timestamping,
          "ethtool-g-6.15.txt": parse_rings,
          "aer_dev_correctable-linux-4.19-unnamed-bit.txt": parse_aer,
          "nvidia-smi-q-384.69.txt": parse_nvidia_smi,
          "pmc-time-status-and-error.txt": lambda t: time_status(parse_pmc(t)),
          "chronyc-tracking-2.0-phc.txt": parse_chrony_tracking,
          "tc-qdisc-show-iproute2-4.14-text.txt": parse_tc_qdisc_text}


@st.composite
def mangled_version(draw) -> tuple[str, str]:
    """A version fixture with lines dropped, duplicated or cut and characters replaced."""
    name = draw(st.sampled_from(sorted(FUZZED)))
    out = []
    for line in version_fixture(name).splitlines():
        op = draw(st.integers(0, 9))
        if op == 0:
            continue
        if op == 1:
            line = line[: draw(st.integers(0, max(len(line), 1)))]
        elif op == 2 and line:
            i = draw(st.integers(0, len(line) - 1))
            line = line[:i] + draw(st.sampled_from(["", ":", "[", "]", ",", "x", "-", " ", "\t",
                                                    "9" * 30, "inf"])) + line[i + 1:]
        elif op == 3:
            out.append(line)
        out.append(line)
    return name, "\n".join(out)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mangled_version())
def test_fuzzed_version_outputs_parse_or_raise_parse_error(case):
    name, text = case
    try:
        FUZZED[name](text)
    except ParseError:
        pass


@pytest.mark.parametrize("name", ["ethtool-m-sff8636-dac-6.4.txt", "ethtool-m-sff8636-dac-6.14.txt"])
def test_sff8636_passive_copper_every_release_is_not_a_dark_optic(name):
    m = parse_module(version_fixture(name))
    assert m["media"] == "copper" and m["cable_length_m"] == 1.0
    assert [ln["dbm"] for ln in m["rx_power"]] == [None] * 4  # a DAC has no light to measure
    facts = module_facts(m)
    (f,) = judge("l1.optics.rx_power", snap(facts))
    assert f.status == "skip" and "copper" in f.reason
    (f,) = judge("l1.cable.copper_in_rack", snap(facts))
    assert f.status == "pass" and f.observed == 1.0


def test_sff8636_ioctl_era_output():
    m = parse_module(version_fixture("ethtool-m-sff8636-5.0-ioctl.txt"))
    assert [(ln["lane"], ln["dbm"]) for ln in m["rx_power"]] == [
        (1, -0.46), (2, None), (3, -13.01), (4, -0.97)]
    assert m["lane_flags"] == {}
    (f,) = judge("l1.optics.rx_power", snap(module_facts(m)))
    assert f.status == "fail" and [ln["lane"] for ln in f.evidence["failing_lanes"]] == [2, 3]


def test_sfp_on_ethtool_5_16_to_5_18_prints_no_diagnostics_and_is_unknown():
    m = parse_module(version_fixture("ethtool-m-sff8472-5.16-no-diagnostics.txt"))
    assert m["media"] == "optical" and m["rx_power"] == [] and m["part"] == "SFP-10G-SR"
    (f,) = judge("l1.optics.rx_power", snap(module_facts(m)))
    assert f.status == "unknown" and "5.16-5.18" in f.reason


def test_cmis_before_5_16_prints_cable_length_but_no_power():
    m = parse_module(version_fixture("ethtool-m-cmis-aoc-5.15-ioctl.txt"))
    assert m["attached_cable"] and m["cable_length_m"] == 3.0 and m["rx_power"] == []
    (f,) = judge("l1.optics.rx_power", snap(module_facts(m)))
    assert f.status == "unknown" and "before 5.16 none for CMIS" in f.reason
    (f,) = judge("l1.cable.copper_in_rack", snap(module_facts(m)), limit=5.0)
    assert f.status == "warn" and f.observed == 3.0


# -- end to end: each release's output in a whole host root, through the collectors -----------------

ROOT_CASES = {
    "ethtool_-I_--show-fec_eth2": ["ethtool-I-show-fec-5.13.txt", "ethtool-I-show-fec-5.18.txt",
                                   "ethtool-I-show-fec-6.19-lanes.txt",
                                   "ethtool-I-show-fec-6.19-nolanes.txt",
                                   "ethtool-show-fec-5.0-ioctl.txt"],
    "ethtool_-m_eth2": ["ethtool-m-sff8636-5.0-ioctl.txt", "ethtool-m-sff8636-5.16.txt",
                        "ethtool-m-sff8636-6.4.txt", "ethtool-m-sff8636-6.14.txt",
                        "ethtool-m-cmis-aoc-6.4.txt", "ethtool-m-cmis-aoc-7.0.txt",
                        "ethtool-m-cmis-dac-6.14.txt", "ethtool-m-sff8472-6.14.txt"],
    "ethtool_-x_eth2": ["ethtool-x-5.0-ioctl.txt", "ethtool-x-6.2-netlink.txt",
                        "ethtool-x-6.9-symmetric-xor.txt", "ethtool-x-6.15-symmetric-or-xor.txt"],
    "ethtool_-T_eth2": ["ethtool-T-5.8-netlink.txt", "ethtool-T-6.14-provider.txt",
                        "ethtool-T-7.0-source.txt"],
    "ethtool_-g_eth2": ["ethtool-g-6.15.txt"],
    "nvidia-smi_-q": ["nvidia-smi-q-384.69.txt", "nvidia-smi-q-575.57.08.txt"],
}
FACT_OF = {"ethtool_-I_--show-fec_eth2": "ethtool.fec.eth2", "ethtool_-m_eth2": "ethtool.module.eth2",
           "ethtool_-x_eth2": "ethtool.rss.eth2", "ethtool_-T_eth2": "ethtool.ts.eth2",
           "ethtool_-g_eth2": "ethtool.rings.eth2", "nvidia-smi_-q": "pci.replay"}


@pytest.mark.parametrize(("command", "name"), [(c, n) for c, ns in ROOT_CASES.items() for n in ns])
def test_each_release_through_the_collectors_of_a_host_root(tmp_path, command, name):
    root = tmp_path / "root"
    shutil.copytree(Path(__file__).parent / "fixtures" / "roots" / "l1l3-clean", root,
                    symlinks=True)
    (root / "commands" / command).write_text(version_fixture(name))
    s = collect(Host(root), Scope(), 0)
    fact = s.fact(FACT_OF[command])
    assert fact.ok, (name, fact.missing)
    if command == "nvidia-smi_-q":
        assert not fact.value["errors"].get("nvidia-smi"), fact.value["errors"]
    s.interval_s = 60.0
    for cid in ("l1.fec.uncorrectable", "l1.optics.rx_power", "l1.cable.copper_in_rack",
                "l1.clock.ptp", "l3.rss.symmetric", "l1.pcie.link_recovery"):
        for f in judge(cid, s):
            assert "parse error" not in (f.reason or ""), (cid, name, f.reason)
