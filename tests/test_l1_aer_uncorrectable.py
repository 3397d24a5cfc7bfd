"""Fatal and non-fatal AER (l1.pcie.aer_uncorrectable): the real aer_dev_fatal/aer_dev_nonfatal
capture (procfs testdata, current short names), the kernel's long names (the strings of
include/ras/ras_event.h), and the check's red line: any growth fails, per device and port."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tailgate.baseline import default_baseline
from tailgate.collect import Scope, collect
from tailgate.host import Host
from tailgate.judge import checks, run_check
from tailgate.model import Fact, ParseError, Snapshot
from tailgate.sources.pci import parse_aer_uncorrectable

FIX = Path(__file__).parent / "fixtures" / "host" / "aer_dev_fatal_nonfatal.txt"


def halves() -> tuple[str, str]:
    body = FIX.read_text().split("\n", 1)[1]
    fatal, nonfatal = body.split("# --- aer_dev_nonfatal\n")
    return fatal, nonfatal


def snap(facts: dict, before: dict | None = None, interval: float = 5.0) -> Snapshot:
    def wrap(d):
        return {k: v if isinstance(v, Fact) else Fact(value=v) for k, v in (d or {}).items()}
    return Snapshot(host={"hostname": "t"}, target={}, interval_s=interval, taken_at=1000.0,
                    facts=wrap(facts), before=wrap(before))


def judge(s: Snapshot):
    cid = "l1.pcie.aer_uncorrectable"
    return run_check(cid, checks()[cid], s, default_baseline().get(cid))


DEVICES = {"0000:81:00.0": {"kind": "gpu", "driver": "nvidia", "upstream": ["0000:80:01.0"]},
           "0000:80:01.0": {"kind": "upstream", "serves": ["0000:81:00.0"], "upstream": []}}


def facts(counts: dict) -> dict:
    return {"pci.devices": DEVICES, "pci.aer_uncorrectable": {"counters": counts, "errors": {}}}


def test_real_capture_short_names():
    fatal, nonfatal = halves()
    f = parse_aer_uncorrectable(fatal, "aer_dev_fatal")
    n = parse_aer_uncorrectable(nonfatal, "aer_dev_nonfatal")
    assert f["TOTAL_ERR_FATAL"] == 0 and n["TOTAL_ERR_NONFATAL"] == 0
    assert {"CmpltTO", "MalfTLP", "UnsupReq", "PoisonTLPBlocked"} <= set(f)


def test_kernel_long_names_and_unnamed_bits():
    text = ("Undefined 0\nData Link Protocol Error 0\nCompletion Timeout 3\n"
            "Unsupported Request Error 1\ndev_nonfatal_errs_bit[27] 2\nTOTAL_ERR_NONFATAL 6\n")
    got = parse_aer_uncorrectable(text, "aer_dev_nonfatal")
    assert got == {"Undefined": 0, "DLP": 0, "CmpltTO": 3, "UnsupReq": 1, "bit27": 2,
                   "TOTAL_ERR_NONFATAL": 6}
    with pytest.raises(ParseError, match="CmpltTO: not a count"):
        parse_aer_uncorrectable("CmpltTO -1\nTOTAL_ERR_FATAL 0\n", "aer_dev_fatal")
    with pytest.raises(ParseError, match="no known counter"):
        parse_aer_uncorrectable("RxErr 0\nBadTLP 0\n", "aer_dev_fatal")  # a correctable file


def test_growth_on_the_device_and_its_port_fails_and_names_the_error():
    fatal, nonfatal = halves()
    zero = {"fatal": parse_aer_uncorrectable(fatal, "f"),
            "nonfatal": parse_aer_uncorrectable(nonfatal, "n")}
    before = {b: copy.deepcopy(zero) for b in DEVICES}
    after = copy.deepcopy(before)
    after["0000:80:01.0"]["nonfatal"]["CmpltTO"] += 2
    after["0000:80:01.0"]["nonfatal"]["TOTAL_ERR_NONFATAL"] += 2
    res = {r.subject: r for r in judge(snap(facts(after), facts(before)))}
    port = res["0000:80:01.0 upstream"]
    assert port.status == "fail" and port.observed == 2.0
    assert "nonfatal/CmpltTO +2" in port.reason and "upstream port of 0000:81:00.0" in port.reason
    assert res["0000:81:00.0 gpu nvidia"].status == "pass"
    after["0000:81:00.0"]["fatal"]["SDES"] += 1
    after["0000:81:00.0"]["fatal"]["TOTAL_ERR_FATAL"] += 1
    gpu = {r.subject: r for r in judge(snap(facts(after), facts(before)))}["0000:81:00.0 gpu nvidia"]
    assert gpu.status == "fail" and "(fatal)" in gpu.reason and "fatal/SDES +1" in gpu.reason


def test_without_window_counts_since_boot_warn_zero_counts_are_unknown():
    fatal, nonfatal = halves()
    zero = {"fatal": parse_aer_uncorrectable(fatal, "f"),
            "nonfatal": parse_aer_uncorrectable(nonfatal, "n")}
    res = judge(snap(facts({"0000:81:00.0": zero}), interval=0.0))
    assert [r.status for r in res] == ["unknown"]
    seen = copy.deepcopy(zero)
    seen["fatal"]["TOTAL_ERR_FATAL"] = 4
    res = judge(snap(facts({"0000:81:00.0": seen}), interval=0.0))
    assert res[0].status == "warn" and "'fatal': 4" in res[0].reason


def test_collect_reads_both_files_under_a_root(tmp_path):
    fatal, nonfatal = halves()
    dev = tmp_path / "sys/bus/pci/devices/0000:81:00.0"
    dev.mkdir(parents=True)
    (dev / "class").write_text("0x030200\n")
    (dev / "vendor").write_text("0x1002\n")
    (dev / "aer_dev_correctable").write_text("RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n")
    (dev / "aer_dev_fatal").write_text(fatal)
    (dev / "aer_dev_nonfatal").write_text(nonfatal)
    s = collect(Host(str(tmp_path)), Scope(), 0.6)
    counts = s.facts["pci.aer_uncorrectable"].value["counters"]["0000:81:00.0"]
    assert counts["nonfatal"]["TOTAL_ERR_NONFATAL"] == 0
    assert [r.status for r in judge(s)] == ["pass"]
    (dev / "aer_dev_nonfatal").unlink()
    s = collect(Host(str(tmp_path)), Scope(), 0.0)
    r = judge(s)[0]
    assert r.status == "unknown" and "aer_dev_nonfatal" in r.reason


def test_since_boot_errors_stay_in_the_evidence_and_warn_when_a_window_exists():
    fatal, nonfatal = halves()
    f = parse_aer_uncorrectable(fatal.replace("SDES 0", "SDES 28").replace(
        "TOTAL_ERR_FATAL 0", "TOTAL_ERR_FATAL 28"), "aer_dev_fatal")
    n = parse_aer_uncorrectable(nonfatal, "aer_dev_nonfatal")
    counts = {"0000:81:00.0": {"fatal": f, "nonfatal": n}}
    # a 1 s window with nothing new: the 28 fatal errors of this boot are not forgotten
    s = snap(facts(counts), facts(copy.deepcopy(counts)), interval=1.0)
    r = {x.subject: x for x in judge(s)}["0000:81:00.0 gpu nvidia"]
    assert r.status == "warn" and "since boot: {'fatal': 28}" in r.reason
    assert r.evidence["since_boot"] == {"fatal": 28, "nonfatal": 0}
    assert r.evidence["named_since_boot"] == {"fatal/SDES": 28}
    # without a window the same counts warn too: one decision either way
    r = {x.subject: x for x in judge(snap(facts(counts)))}["0000:81:00.0 gpu nvidia"]
    assert r.status == "warn" and "28" in r.reason


def test_a_file_without_its_total_line_counts_its_own_errors_only():
    fatal, nonfatal = halves()
    f = parse_aer_uncorrectable(fatal.replace("TOTAL_ERR_FATAL 0", "TOTAL_ERR_FATAL 7"),
                                "aer_dev_fatal")
    no_total = nonfatal.replace("TOTAL_ERR_NONFATAL 0\n", "")
    n0 = parse_aer_uncorrectable(no_total, "aer_dev_nonfatal")
    n1 = parse_aer_uncorrectable(no_total.replace("CmpltTO 0", "CmpltTO 2"), "aer_dev_nonfatal")
    before = {"0000:81:00.0": {"fatal": f, "nonfatal": n0}}
    f1 = parse_aer_uncorrectable(fatal.replace("TOTAL_ERR_FATAL 0", "TOTAL_ERR_FATAL 8")
                                 .replace("SDES 0", "SDES 1"), "aer_dev_fatal")
    after = {"0000:81:00.0": {"fatal": f1, "nonfatal": n1}}
    r = {x.subject: x for x in judge(snap(facts(after), facts(before)))}["0000:81:00.0 gpu nvidia"]
    assert r.evidence["since_boot"] == {"fatal": 8, "nonfatal": 2}
    # fatal +1 by its total line, nonfatal +2 by its named counters: 3, neither dropped
    assert (r.status, r.observed) == ("fail", 3) and "nonfatal/CmpltTO +2" in r.reason
