"""L3 parsers (ethtool -x/-g, tc -j qdisc, XPS masks) on real captures, and the Toeplitz hash:
Microsoft's RSS verification vectors and symmetry proven on random flows and random keys."""

from __future__ import annotations

import ipaddress
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailgate.model import ParseError
from tailgate.sources.ethtool import parse_rings, parse_rss
from tailgate.sources.qdisc import classify, parse_cpulist, parse_cpumask, parse_tc_qdisc
from tailgate.toeplitz import (
    LAYOUTS,
    MICROSOFT_KEY,
    SYMMETRIC_KEY,
    Flow,
    asymmetric_bits,
    counterexample,
    flow_hash,
    random_flow,
    toeplitz_hash,
)

FIX = Path(__file__).parent / "fixtures" / "host"


def fixture(name: str, skip: int = 0) -> str:
    text = (FIX / name).read_text()
    assert text.startswith("# source:"), "fixtures keep their provenance line"
    return "\n".join(text.splitlines()[1 + skip:]) + "\n"


# -- Toeplitz: Microsoft's "Verifying the RSS Hash Calculation" -------------------------------
# https://learn.microsoft.com/windows-hardware/drivers/network/verifying-the-rss-hash-calculation
# (also Intel 82599 datasheet 7.1.2.8.3 and DPDK app/test/test_thash.c). Columns: destination,
# source, then the hash of the addresses only and of addresses plus ports, under MICROSOFT_KEY.
IPV4_VECTORS = [
    ("161.142.100.80", 1766, "66.9.149.187", 2794, 0x323E8FC2, 0x51CCC178),
    ("65.69.140.83", 4739, "199.92.111.2", 14230, 0xD718262A, 0xC626B0EA),
    ("12.22.207.184", 38024, "24.19.198.95", 12898, 0xD2D0A5DE, 0x5C2B394A),
    ("209.142.163.6", 2217, "38.27.205.30", 48228, 0x82989176, 0xAFC7327F),
    ("202.188.127.2", 1303, "153.39.163.191", 44251, 0x5D1809C5, 0x10E828A2),
]
IPV6_VECTORS = [
    ("3ffe:2501:200:3::1", 1766, "3ffe:2501:200:1fff::7", 2794, 0x2CC18CD5, 0x40207D3D),
    ("ff02::1", 4739, "3ffe:501:8::260:97ff:fe40:efab", 14230, 0x0F0C461C, 0xDDE51BBF),
    ("fe80::200:f8ff:fe21:67cf", 38024, "3ffe:1900:4545:3:200:f8ff:fe21:67cf", 44251,
     0x4B61E985, 0x02D1FEEF),
]


@pytest.mark.parametrize("dst,dport,src,sport,h_addr,h_ports", IPV4_VECTORS + IPV6_VECTORS)
def test_microsoft_rss_verification_vectors(dst, dport, src, sport, h_addr, h_ports):
    assert flow_hash(MICROSOFT_KEY, Flow(src, dst)) == h_addr
    assert flow_hash(MICROSOFT_KEY, Flow(src, dst, sport, dport)) == h_ports


def test_key_too_short_is_refused():
    with pytest.raises(ValueError):
        toeplitz_hash(MICROSOFT_KEY[:35], bytes(36))
    with pytest.raises(ValueError):
        asymmetric_bits(MICROSOFT_KEY[:39], "ipv6+ports")


def test_microsoft_default_key_is_not_symmetric_with_a_witness():
    for layout in LAYOUTS:
        assert asymmetric_bits(MICROSOFT_KEY, layout)
        flow = counterexample(MICROSOFT_KEY, layout)
        assert flow is not None
        assert flow_hash(MICROSOFT_KEY, flow) != flow_hash(MICROSOFT_KEY, flow.reversed())


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), layout=st.sampled_from(sorted(LAYOUTS)))
def test_symmetric_key_hashes_both_directions_alike_on_random_flows(seed, layout):
    flow = random_flow(random.Random(seed), layout)
    assert flow_hash(SYMMETRIC_KEY, flow) == flow_hash(SYMMETRIC_KEY, flow.reversed())


@settings(max_examples=100, deadline=None)
@given(pattern=st.binary(min_size=2, max_size=2), seed=st.integers(0, 2**32),
       layout=st.sampled_from(sorted(LAYOUTS)))
def test_any_16bit_periodic_key_is_symmetric(pattern, seed, layout):
    # Not just 6d5a: every key repeating a 16-bit pattern has equal windows at each source
    # bit and its destination twin (the fields sit 32/128 and 16 bits apart).
    key = pattern * 20
    assert asymmetric_bits(key, layout) == []
    flow = random_flow(random.Random(seed), layout)
    assert flow_hash(key, flow) == flow_hash(key, flow.reversed())


def _one_bit_flow(layout: str, bit: int) -> Flow:
    """A flow whose src XOR dst has exactly input bit ``bit`` set (a source-field bit)."""
    v6 = layout.startswith("ipv6")
    alen = 128 if v6 else 32
    make = ipaddress.IPv6Address if v6 else ipaddress.IPv4Address
    if bit < alen:
        return Flow(str(make(0)), str(make(1 << (alen - 1 - bit))),
                    0 if layout.endswith("ports") else None, 0 if layout.endswith("ports") else None)
    pbit = bit - 2 * alen
    return Flow(str(make(0)), str(make(0)), 0, 1 << (15 - pbit))


@settings(max_examples=60, deadline=None)
@given(key=st.binary(min_size=40, max_size=52), layout=st.sampled_from(sorted(LAYOUTS)))
def test_exact_symmetry_criterion_matches_brute_force_hashing(key, layout):
    # For every source-field bit, flip it in src vs dst: the two directions hash differently
    # exactly when the criterion lists that bit. Linearity makes this a complete proof.
    bad = set(asymmetric_bits(key, layout))
    for src_off, _dst_off, length in LAYOUTS[layout]:
        for b in range(length * 8):
            bit = src_off * 8 + b
            flow = _one_bit_flow(layout, bit)
            differs = flow_hash(key, flow) != flow_hash(key, flow.reversed())
            assert differs == (bit in bad), (layout, bit)


# -- ethtool -x ----------------------------------------------------------------------------------

def _rss_sections() -> list[str]:
    return fixture("ethtool-x-rss.txt", skip=1).split("--- ")


def test_rss_i40e_52_byte_key_and_table():
    rss = parse_rss(_rss_sections()[0])
    assert rss["rings"] == 12 and len(bytes.fromhex(rss["key"])) == 52
    assert rss["key"].startswith("605666398e704602") and rss["key"].endswith("4603076a")
    assert rss["table"][:12] == list(range(12)) and len(rss["table"]) == 48  # '...' elided
    assert rss["functions"] == {} and rss["transforms"] == {}


def test_rss_kernel_doc_40_byte_key():
    rss = parse_rss(_rss_sections()[1])
    assert rss["rings"] == 8 and rss["table"] == list(range(8))
    assert rss["key"] == "8450f400a815d1a7e97f1d6035c74725429774ca56bbb6a1d843e3c90cfd1755c23a4d69edf14289"


def test_rss_ethtool_6_8_trailer_with_symmetric_xor():
    # The trailer ethtool >= 6.8 prints after the key, appended to a real table and key.
    header_and_key = _rss_sections()[1].split("\n", 1)[1]
    trailer = "\n".join(_rss_sections()[2].splitlines()[1:])
    rss = parse_rss(header_and_key + trailer)
    assert rss["functions"] == {"toeplitz": True, "xor": False, "crc32": False}
    assert rss["transforms"] == {"symmetric-xor": True}
    assert rss["key"].startswith("8450f400")


def test_rss_virtio_without_key():
    rss = parse_rss(fixture("vm-ethtool-x-virtio.txt"))
    assert rss == {"rings": 1, "table": [], "key": None,
                   "functions": {"toeplitz": True, "xor": False, "crc32": False}, "transforms": {},
                   "unknown_bits": {}}


def test_rss_without_header_is_a_parse_error():
    with pytest.raises(ParseError):
        parse_rss("RSS hash key:\n6d:5a\n")


# -- ethtool -g, tc, XPS -------------------------------------------------------------------------

def test_rings_virtio():
    assert parse_rings(fixture("vm-ethtool-g-virtio.txt")) == {
        "max": {"RX": 256, "RX Mini": None, "RX Jumbo": None, "TX": 256},
        "current": {"RX": 256, "RX Mini": None, "RX Jumbo": None, "TX": 256}}
    with pytest.raises(ParseError):
        parse_rings(fixture("vm-ethtool-g-virtio.txt").replace("TX:\t\t256\nRX Buf", "TX:\t\tbig\nRX Buf"))


def test_tc_pfifo_fast_root_is_tail_drop():
    q = classify(parse_tc_qdisc(fixture("vm-tc-qdisc-pfifo_fast.txt")))
    assert q == {"root": "pfifo_fast",
                 "leaves": [{"kind": "pfifo_fast", "parent": None, "class": "tail-drop"}]}


def test_tc_mq_leaves_are_judged_and_clsact_ignored():
    q = classify(parse_tc_qdisc(fixture("vm-tc-qdisc-mq.txt")))
    assert q["root"] == "mq" and [leaf["parent"] for leaf in q["leaves"]] == ["1:4", "1:3", "1:2", "1:1"]
    assert {leaf["class"] for leaf in q["leaves"]} == {"tail-drop"}
    q = classify(parse_tc_qdisc(fixture("vm-tc-qdisc-mq-tbf-clsact.txt")))
    assert sorted(leaf["kind"] for leaf in q["leaves"]) == ["pfifo_fast"] * 3 + ["tbf"]


def test_tc_aqm_leaves_and_classful_without_leaves():
    text = fixture("vm-tc-qdisc-mq.txt").replace("pfifo_fast", "fq_codel")
    assert {leaf["class"] for leaf in classify(parse_tc_qdisc(text))["leaves"]} == {"aqm"}
    q = classify([{"kind": "htb", "handle": "1:", "parent": None, "root": True}])
    assert q["leaves"][0]["kind"] == "pfifo (default)" and q["leaves"][0]["class"] == "tail-drop"


@pytest.mark.parametrize("text", ["", "not json", "{}", '[{"handle":"0:"}]', "[1]", '[{"kind": 3}]'])
def test_tc_malformed_is_a_parse_error(text):
    with pytest.raises(ParseError):
        classify(parse_tc_qdisc(text))


def test_xps_masks_from_node_exporter_sysfs_fixture():
    lines = [ln.split(": ", 1) for ln in fixture("sysfs-nic-queues-xps-rps-numa.txt").splitlines()
             if "/xps_cpus: " in ln]
    assert [p.split("/")[-2] for p, _ in lines] == ["tx-0", "tx-1", "tx-2", "tx-3"]
    assert all(parse_cpumask(mask) == [] for _, mask in lines)  # XPS not configured there


def test_cpumask_and_cpulist():
    assert parse_cpumask("00000000,00000003") == [0, 1]
    assert parse_cpumask("1,00000000") == [32]
    assert parse_cpumask("f0") == [4, 5, 6, 7]
    assert parse_cpulist("0-3,8") == [0, 1, 2, 3, 8] and parse_cpulist("") == []
    for bad in ("", "xyz", "0x1", "1,,2", "123456789"):
        with pytest.raises(ParseError):
            parse_cpumask(bad)
    with pytest.raises(ParseError):
        parse_cpulist("0-")


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300), which=st.integers(0, 3))
def test_fuzzed_l3_outputs_parse_or_raise_parse_error(text, which):
    parser = [parse_rss, parse_rings, lambda t: classify(parse_tc_qdisc(t)), parse_cpumask][which]
    try:
        parser(text)
    except ParseError:
        pass


def test_one_parser_per_cpu_format():
    """A cpulist and a hex cpumask each have one parser (sources/records.py), which the
    process, netdev and qdisc sources share."""
    from tailgate.sources import netdev, process, qdisc, records

    assert qdisc.parse_cpumask is netdev.parse_cpumask is records.parse_cpumask
    assert qdisc.parse_cpulist is process.parse_cpulist is netdev.parse_cpulist \
        is records.parse_cpulist
