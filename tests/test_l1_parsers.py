"""L1 parsers on real captures (tests/fixtures/host, copied from shared/corpus with their
provenance line) and fuzzing: malformed input is a ParseError or a value, never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailgate.model import ParseError
from tailgate.sources.ethtool import (
    parse_driver_info,
    parse_fec,
    parse_module,
    parse_rx_power,
    parse_stats,
    parse_timestamping,
    phy_counters,
)
from tailgate.sources.pci import parse_aer, parse_int_file, parse_nvidia_smi
from tailgate.sources.ptp import (
    parse_chrony_tracking,
    parse_pmc,
    parse_ptp_log,
    port_properties,
    time_status,
)

FIX = Path(__file__).parent / "fixtures" / "host"


def fixture(name: str, skip: int = 0) -> str:
    """The capture without its provenance line (and ``skip`` more lines: shell prompts)."""
    text = (FIX / name).read_text()
    assert text.startswith("# source:"), "fixtures keep their provenance line"
    return "\n".join(text.splitlines()[1 + skip:]) + "\n"


# -- ethtool --show-fec / -S ---------------------------------------------------------------------

def test_fec_generic_statistics_with_lanes():
    fec = parse_fec(fixture("ethtool-I-show-fec.txt", skip=1))
    assert fec["supported"] and fec["active"] == "None" and fec["configured"] == ["None"]
    assert fec["stats"]["corrected_blocks"] == {"total": 256, "lanes": {"0": 255, "1": 1}}
    assert fec["stats"]["uncorrectable_blocks"] == {"total": 145, "lanes": {"0": 128, "1": 17}}


def test_fec_and_module_unsupported_on_virtio():
    text = fixture("vm-ethtool-fec-m-unsupported.txt")
    assert parse_fec(text) == {"supported": False,
                               "reason": "ethtool --show-fec: Operation not supported"}
    assert parse_module(text)["supported"] is False


def test_fec_malformed_count_is_a_parse_error():
    text = fixture("ethtool-I-show-fec.txt", skip=1).replace("uncorrectable_blocks: 145",
                                                             "uncorrectable_blocks: lots")
    with pytest.raises(ParseError, match="uncorrectable_blocks"):
        parse_fec(text)


def test_mlx5_stats_keep_fec_and_pcie_counters():
    stats = parse_stats(fixture("ethtool-S-mlx5.txt"))
    assert stats["rx_packets"] == 1226 and stats["rx_vport_unicast_packets"] == 11935233
    phy = phy_counters(stats)
    assert phy["rx_symbol_err_phy"] == 386  # uncorrected by FEC (mlx5's stand-in)
    assert phy["rx_corrected_bits_phy"] == 17750739
    assert phy["rx_err_lane_3_phy"] == 17722623
    assert phy["tx_pci_signal_integrity"] == 2 and phy["rx_pci_signal_integrity"] == 0
    assert "rx_packets" not in phy


def test_mlx5_lane_errors_cx6dx_and_cx7():
    cx6 = parse_stats(fixture("ethtool-S-mlx5-lane-errors-cx6dx.txt", skip=1))
    assert cx6["rx_symbol_err_phy"] == 13115284 and cx6["rx_crc_errors_phy"] == 13147323
    assert [cx6[f"rx_err_lane_{i}_phy"] for i in range(4)] == [13115284] * 4
    cx7 = parse_stats(fixture("ethtool-S-mlx5-lane-errors-cx7.txt"))
    assert [cx7[f"rx_err_lane_{i}_phy"] for i in range(4)] == [6, 2, 190, 0]
    assert cx7["rx_corrected_bits_phy"] == 198


def test_mlx5_pci_signal_integrity():
    text = fixture("ethtool-S-mlx5-pci-counters.txt")
    assert parse_driver_info(text.split("[root@host ~]# ethtool -S")[0])["driver"] == "mlx5_core"
    stats = parse_stats(text.split("| grep pci")[1])
    assert stats == {"rx_pci_signal_integrity": 1, "tx_pci_signal_integrity": 1471,
                     "outbound_pci_stalled_rd": 0, "outbound_pci_stalled_wr": 0,
                     "outbound_pci_stalled_rd_events": 0, "outbound_pci_stalled_wr_events": 0}


def test_virtio_stats_and_driver_info():
    stats = parse_stats(fixture("vm-ethtool-S-virtio.txt"))
    assert stats["rx_kicks"] == 2213 and stats["tx0_kicks"] == 4752
    assert phy_counters(stats) == {}
    info = parse_driver_info(fixture("vm-ethtool-i-virtio.txt"))
    assert info["driver"] == "virtio_net" and info["bus-info"] == "0000:00:03.0"
    assert info["supports-eeprom-access"] == "no" and info["firmware-version"] == ""


# -- ethtool -m ----------------------------------------------------------------------------------

def test_module_sff8636_optical_four_lanes():
    m = parse_module(fixture("ethtool-m-qsfp28-optical.txt"))
    assert m["identifier"] == "0x11 (QSFP28)" and m["part"] == "FTLC9551REPM"
    assert m["media"] == "optical" and m["transmitter_technology"] == "0x00 (850 nm VCSEL)"
    assert m["attached_cable"] is False and m["cable_length_m"] is None  # a transceiver
    assert [(ln["lane"], ln["mw"], ln["dbm"]) for ln in m["rx_power"]] == [
        (1, 0.9603, -0.18), (2, 0.921, -0.36), (3, 1.0281, 0.12), (4, 1.022, 0.09)]


def test_module_sff8636_elided_outputs():
    swp = parse_module(fixture("ethtool-m-qsfp28-optical-swp13.txt", skip=1))
    assert [ln["dbm"] for ln in swp["rx_power"]] == [-0.34, -0.40, -0.36, -0.60]
    head = parse_module(fixture("ethtool-m-qsfp28-optical-lldpd-head.txt", skip=1))
    assert head["media"] == "optical" and head["vendor"] == "FS" and head["rx_power"] == []
    assert head["lengths"]["OM3 50um"] == "70m"


def test_module_dac_is_copper_with_length():
    m = parse_module(fixture("ethtool-m-dac.txt", skip=1))
    assert m["media"] == "copper" and m["attached_cable"] is True
    assert m["cable_length_m"] == 1.0 and m["part"] == "MCP1600-E001"
    assert m["transmitter_technology"] == "0xa0 (Copper cable unequalized)"
    assert m["rx_power"] == []


def test_module_cmis_copper_and_new_field_spelling():
    # ethtool's CMIS decoder prints "(Copper cable, unequalized)" and a space before
    # "(Channel N)"; both must read like the SFF-8636 forms.
    text = fixture("ethtool-m-dac.txt", skip=1).replace("Copper cable unequalized",
                                                        "Copper cable, unequalized")
    assert parse_module(text)["media"] == "copper"
    lines = fixture("ethtool-m-qsfp28-optical.txt").replace("power(Channel", "power (Channel")
    assert len(parse_module(lines)["rx_power"]) == 4


def test_sff8472_rx_power_including_loss_of_signal():
    readings = parse_rx_power(fixture("ethtool-m-sfp-optical-rx-power.txt"))
    assert [(r["mw"], r["dbm"]) for r in readings] == [(0.573, -2.42), (0.0001, -40.0), (0.0, None)]
    assert all(r["lane"] == 1 and r["kind"] == "avg" for r in readings)


def test_module_bad_power_value_is_a_parse_error():
    text = fixture("ethtool-m-qsfp28-optical.txt").replace("0.9603 mW / -0.18 dBm", "n/a")
    with pytest.raises(ParseError, match="not a power reading"):
        parse_module(text)


# -- ethtool -T ----------------------------------------------------------------------------------

def test_timestamping_virtio_is_software_only():
    ts = parse_timestamping(fixture("vm-ethtool-T-virtio.txt"))
    assert ts == {"capabilities": ["software-transmit", "software-receive",
                                   "software-system-clock"],
                  "phc_index": None, "tx_modes": [], "rx_filters": [], "hardware": False}


def test_timestamping_hardware_mlx5_fixture():
    root = Path(__file__).parent / "fixtures" / "roots" / "l1l3-clean"
    ts = parse_timestamping((root / "commands" / "ethtool_-T_eth2").read_text())
    assert ts["hardware"] and ts["phc_index"] == 4
    assert ts["tx_modes"] == ["off", "on"] and ts["rx_filters"] == ["none", "all"]


# -- PCIe ----------------------------------------------------------------------------------------

def test_aer_current_format():
    assert parse_aer(fixture("aer_dev_correctable.txt")) == {
        "RxErr": 0, "BadTLP": 0, "BadDLLP": 0, "Rollover": 0, "Timeout": 0, "NonFatalErr": 0,
        "CorrIntErr": 0, "HeaderOF": 0, "TOTAL_ERR_COR": 0}
    nz = parse_aer(fixture("aer_dev_correctable-synthetic-nonzero.txt"))
    assert (nz["BadTLP"], nz["Rollover"], nz["Timeout"], nz["TOTAL_ERR_COR"]) == (2, 4, 5, 9)


def test_aer_old_long_names_normalised():
    old = parse_aer(fixture("aer_dev_correctable-kernel-doc-oldformat.txt", skip=1))
    assert old == {"RxErr": 2, "BadTLP": 0, "BadDLLP": 0, "Rollover": 0, "Timeout": 0,
                   "NonFatalErr": 0, "CorrIntErr": 0, "HeaderOF": 0, "TOTAL_ERR_COR": 2}


def test_aer_fatal_file_is_not_a_correctable_file():
    with pytest.raises(ParseError, match="no known counter"):
        parse_aer(fixture("aer_dev_fatal_nonfatal.txt"))


def test_aer_dmesg_lines_are_not_sysfs_counters():
    # The dmesg form names BadTLP only as text; it must not be read as a count.
    with pytest.raises(ParseError):
        parse_aer(fixture("aer-dmesg-correctable.txt"))


def test_aer_bad_count_is_a_parse_error():
    with pytest.raises(ParseError, match="BadTLP"):
        parse_aer(fixture("aer_dev_correctable.txt").replace("BadTLP 0", "BadTLP x"))


def test_single_integer_files():
    assert parse_int_file(fixture("amdgpu-pcie_replay_count.txt"), "pcie_replay_count") == 0
    assert parse_int_file(fixture("aer_rootport_total_err_cor.txt"), "total") == 0
    with pytest.raises(ParseError):
        parse_int_file("-1\n", "pcie_replay_count")


def test_nvidia_smi_replays():
    assert parse_nvidia_smi(fixture("nvidia-smi-q-pcie.txt")) == {
        "0000:00:04.0": {"replays": 0, "replay_rollovers": 0}}
    older = fixture("nvidia-smi-q-pcie.txt").replace("Replays Since Reset", "Replays since reset")
    assert parse_nvidia_smi(older)["0000:00:04.0"]["replays"] == 0
    with pytest.raises(ParseError):
        parse_nvidia_smi("No devices were found\n")


# -- clocks --------------------------------------------------------------------------------------

def test_pmc_boundary_clock_two_responses():
    status = time_status(parse_pmc(fixture("pmc-time-status.txt", skip=1)))
    assert status == [
        {"port": "7cfe90.fffe.f56dfc-0", "master_offset_ns": 12610, "gm_present": True,
         "gm": "000200.fffe.000005"},
        {"port": "000200.fffe.000005-1", "master_offset_ns": 0, "gm_present": False,
         "gm": "000200.fffe.000005"}]


def test_pmc_vm_no_grandmaster_and_software_timestamping():
    status = time_status(parse_pmc(fixture("vm-pmc-time-status-noGM.txt")))
    assert status == [{"port": "000000.fffe.000000-0", "master_offset_ns": 0,
                       "gm_present": False, "gm": "000000.fffe.000000"}]
    responses = parse_pmc(fixture("vm-pmc-time-status-noGM.txt"))
    assert [r["message"] for r in responses] == ["TIME_STATUS_NP", "PORT_DATA_SET",
                                                 "CURRENT_DATA_SET", "PARENT_DATA_SET"]
    assert responses[1]["fields"]["portState"] == "MASTER"
    ports = port_properties(parse_pmc(fixture("vm-pmc-port-properties-sw.txt")))
    assert ports == [{"port": "000000.fffe.000000-1", "state": "LISTENING",
                      "timestamping": "SOFTWARE", "interface": "lo"}]


def test_pmc_without_daemon_has_no_response():
    assert parse_pmc("sending: GET TIME_STATUS_NP\n") == []


def test_pmc_bad_offset_is_a_parse_error():
    text = fixture("pmc-time-status.txt", skip=1).replace("12610", "12.6us")
    with pytest.raises(ParseError, match="master_offset"):
        time_status(parse_pmc(text))


def test_ptp4l_log_servo_states():
    log = parse_ptp_log(fixture("ptp4l-log.txt", skip=1))
    offsets = [(s["offset_ns"], s["state"]) for s in log["samples"]]
    assert offsets[:3] == [(-2413, "s0"), (-2413, "s2"), (-2411, "s2")]
    assert offsets[-1] == (-4, "s2") and len(offsets) == 15
    assert log["samples"][0]["delay_ns"] == 86 and log["samples"][2]["freq_ppb"] == -2284


def test_phc2sys_and_ptp4l_journal_lines():
    log = parse_ptp_log(fixture("phc2sys-ptp4l-journal.txt"))
    phc = [s["offset_ns"] for s in log["samples"] if s["prog"] == "phc2sys"]
    ptp = [s["offset_ns"] for s in log["samples"] if s["prog"] == "ptp4l"]
    assert phc == [-23, 15, 40, 25, -35, -62] and ptp == [-5, 1, -1, -1, 2, -1]
    assert log["samples"][-1]["state"] == "s0"
    assert log["summaries"] == [{"prog": "ptp4l", "rms_ns": 53, "max_ns": 74}]


def test_ptp4l_log_without_grandmaster_has_no_samples():
    assert parse_ptp_log(fixture("vm-ptp4l-log-noGM.txt")) == {"samples": [], "summaries": []}


def test_chrony_phc_reference():
    c = parse_chrony_tracking(fixture("chronyc-tracking-phc.txt", skip=1))
    assert (c["kind"], c["ref_name"], c["stratum"], c["offset_ns"]) == ("phc", "PHC0", 1, 14.0)
    assert c["synchronised"]


def test_chrony_network_ntp():
    c = parse_chrony_tracking(fixture("chronyc-tracking.txt", skip=1))
    assert (c["kind"], c["ref_name"], c["ref_id"]) == ("ntp", "pyramid.latt.net", "C7E9ECE2")
    assert c["offset_ns"] == -31625.0 and c["stratum"] == 3


def test_chrony_unsynchronised_vm():
    c = parse_chrony_tracking(fixture("vm-chronyc-tracking-unsync.txt"))
    assert c["kind"] == "none" and not c["synchronised"] and c["leap"] == "Not synchronised"


# -- fuzzing -------------------------------------------------------------------------------------

PARSERS = [parse_fec, parse_module, parse_rx_power, parse_stats, parse_timestamping,
           parse_driver_info, parse_aer, parse_nvidia_smi, parse_pmc, parse_ptp_log,
           parse_chrony_tracking, lambda t: time_status(parse_pmc(t))]
SEEDS = ["ethtool-I-show-fec.txt", "ethtool-m-qsfp28-optical.txt", "ethtool-m-dac.txt",
         "ethtool-S-mlx5-lane-errors-cx7.txt", "vm-ethtool-T-virtio.txt",
         "aer_dev_correctable-synthetic-nonzero.txt", "nvidia-smi-q-pcie.txt",
         "pmc-time-status.txt", "ptp4l-log.txt", "chronyc-tracking.txt"]


@st.composite
def mangled(draw) -> str:
    """A real capture with lines dropped, duplicated or cut, and characters replaced."""
    lines = fixture(draw(st.sampled_from(SEEDS))).splitlines()
    out = []
    for line in lines:
        op = draw(st.integers(0, 9))
        if op == 0:
            continue
        if op == 1:
            line = line[: draw(st.integers(0, max(len(line), 1)))]
        elif op == 2 and line:
            i = draw(st.integers(0, len(line) - 1))
            line = line[:i] + draw(st.sampled_from(["", ":", "x", "-", " ", "\t", "9" * 30, "\0"])) \
                + line[i + 1:]
        elif op == 3:
            out.append(line)
        out.append(line)
    return "\n".join(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(mangled(), st.text(max_size=400)), which=st.integers(0, len(PARSERS) - 1))
def test_fuzzed_outputs_parse_or_raise_parse_error(text, which):
    try:
        PARSERS[which](text)
    except ParseError:
        pass
