"""Fallbacks are said out loud: when a check judges from a stand-in because the primary
source is missing or unparsable, its reason says what failed and what it used instead,
and a stand-in never turns a parse failure into a silent pass."""

from __future__ import annotations

from pathlib import Path

from tailgate.baseline import default_baseline
from tailgate.judge import checks, judge, run_check
from tailgate.model import Fact, Snapshot
from tailgate.sources.ethtool import parse_stats, phy_counters
from tailgate.sources.ptp import parse_ptp_log

FIX = Path(__file__).parent / "fixtures" / "host"


def fixture(name: str, skip: int = 0) -> str:
    return "\n".join((FIX / name).read_text().splitlines()[1 + skip:]) + "\n"


def snap(facts: dict, before: dict | None = None, interval: float = 10.0, pids=()) -> Snapshot:
    def wrap(d):
        return {k: v if isinstance(v, Fact) else Fact(value=v) for k, v in (d or {}).items()}
    return Snapshot(host={}, target={"pids": list(pids)}, interval_s=interval, taken_at=0.0,
                    facts=wrap(facts), before=wrap(before))


def one(check_id: str, s: Snapshot):
    return run_check(check_id, checks()[check_id], s, default_baseline().get(check_id))


def test_fec_driver_counter_names_why_the_standard_statistics_were_not_used():
    phy = phy_counters(parse_stats(fixture("ethtool-S-mlx5.txt")))
    unparsable = Fact(missing="ethtool -I --show-fec: uncorrectable_blocks: not a count: 'x'")
    facts = {"ethtool.fec": ["eth2"], "ethtool.fec.eth2": unparsable,
             "ethtool.info.eth2": {"driver": "mlx5_core"}, "ethtool.phy.eth2": phy}
    (f,) = one("l1.fec.uncorrectable", snap(facts, before=facts))
    assert f.status == "pass"  # the driver counter did not grow: a judgment, not a default
    assert "standard FEC statistics unreadable (ethtool -I --show-fec: uncorrectable_blocks: " \
           "not a count: 'x')" in f.reason
    assert "used the driver counter rx_symbol_err_phy of `ethtool -S` instead" in f.reason
    assert f.evidence["fallback"].startswith("standard FEC statistics unreadable")
    # the same port with generic statistics: no fallback note
    fec = {"supported": True, "active": "RS", "stats": {
        "uncorrectable_blocks": {"total": 0, "lanes": {}}}}
    facts = {**facts, "ethtool.fec.eth2": fec}
    (f,) = one("l1.fec.uncorrectable", snap(facts, before=facts))
    assert f.status == "pass" and "instead" not in f.reason and "fallback" not in f.evidence


def test_link_recovery_names_the_replay_sources_that_failed():
    devices = {"0000:c1:00.0": {"kind": "gpu", "vendor": "0x10de", "driver": "nvidia",
                                "upstream": ["0000:c0:01.0"]},
               "0000:c0:01.0": {"kind": "upstream", "serves": ["0000:c1:00.0"]}}
    aer = {"counters": {b: {"Rollover": 0, "Timeout": 0, "BadTLP": 0} for b in devices},
           "errors": {}}
    replay = {"counters": {}, "sources": {},
              "errors": {"nvml": "NVML: Driver Not Loaded",
                         "nvidia-smi": "`nvidia-smi -q` timed out after 20 s and was killed"}}
    facts = {"pci.devices": devices, "pci.aer": aer, "pci.replay": replay}
    found = {f.subject: f for f in one("l1.pcie.link_recovery", snap(facts, before=facts))}
    gpu = found["0000:c1:00.0 gpu nvidia"]
    assert gpu.status == "pass"  # AER Rollover/Timeout did not grow
    assert "nvml: NVML: Driver Not Loaded" in gpu.reason and "timed out" in gpu.reason
    assert "nvidia-smi" not in found["0000:c0:01.0 upstream"].reason  # not an NVIDIA GPU
    # NVML failed, nvidia-smi answered: the reason says which one was read
    replay = {"counters": {"0000:c1:00.0": {"replays": 0}},
              "sources": {"0000:c1:00.0": "nvidia-smi -q (Replays Since Reset)"},
              "errors": {"nvml": "NVML: Driver Not Loaded"}}
    facts = {**facts, "pci.replay": replay}
    found = {f.subject: f for f in one("l1.pcie.link_recovery", snap(facts, before=facts))}
    assert "nvml: NVML: Driver Not Loaded; read nvidia-smi -q instead" in \
        found["0000:c1:00.0 gpu nvidia"].reason
    # AER unreadable: the devices judged from replay counters alone say so
    facts = {**facts, "pci.aer": Fact(missing="aer_dev_correctable: permission denied")}
    found = {f.subject: f for f in one("l1.pcie.link_recovery", snap(facts, before=facts))}
    assert "AER unreadable (aer_dev_correctable: permission denied)" in \
        found["0000:c1:00.0 gpu nvidia"].reason


def test_ptp_journal_and_chrony_say_that_pmc_failed():
    ts = {"ethtool.ts": ["eth2"], "ethtool.ts.eth2": {"hardware": True, "phc_index": 4}}
    pmc = Fact(missing="pmc -u -b 0 'GET TIME_STATUS_NP': bad master_offset 'x'")
    log = parse_ptp_log(fixture("ptp4l-log.txt", skip=1))
    facts = {**ts, "ptp.pmc": pmc, "ptp.log": log,
             "chrony.tracking": Fact(missing="`chronyc` is not installed")}
    (f,) = one("l1.clock.ptp", snap(facts))
    assert "pmc: pmc -u -b 0 'GET TIME_STATUS_NP': bad master_offset 'x'; PTP from the " \
           "ptp4l/phc2sys journal instead" in f.reason


def test_conn_memory_without_slab_sizes_is_a_lower_bound_never_a_pass():
    status = {"name": "svc", "cpus_allowed": [0], "mems_allowed": [0], "threads": 1,
              "rss_bytes": 30 * 2**20}
    facts = {"kernel.slabinfo": {"sock_inode_cache": 832, "filp": 192},  # no TCP cache line
             "sockets.7": {"connections": 10000, "skmem": [{"rmem_alloc": 0}] * 10000},
             "proc.7.status": status}
    (f,) = [f for f in judge(snap(facts, pids=[7]), default_baseline()) if f.id == "l3.conn.memory"]
    assert f.status == "unknown" and "no size for TCP" in f.reason and "lower bound" in f.reason
    assert f.evidence["not_counted"] == ["TCP"]
    # sockets for which ss printed no skmem: their buffers are not counted either
    facts = {**facts, "kernel.slabinfo": {"TCP": 2368, "sock_inode_cache": 832, "filp": 192},
             "sockets.7": {"connections": 10000, "skmem": [{"rmem_alloc": 0}] * 9999 + [{}]}}
    (f,) = [f for f in judge(snap(facts, pids=[7]), default_baseline()) if f.id == "l3.conn.memory"]
    assert f.status == "unknown" and f.evidence["not_counted"] == ["skmem of 1 of 10000 sockets"]


def test_rss_pass_names_the_layouts_it_could_not_check_and_the_assumed_hash():
    # 16 bytes of the symmetric 6d:5a key: enough for IPv4 (with ports), too short for IPv6;
    # no "RSS hash function:" block, as older ethtool prints it
    rss = {"rings": 4, "table": [0, 1, 2, 3], "key": "6d5a" * 8, "functions": {},
           "transforms": {}}
    facts = {"ethtool.rss": ["eth2"], "ethtool.rss.eth2": rss}
    (f,) = one("l3.rss.symmetric", snap(facts))
    assert f.status == "pass"
    assert "symmetric for ipv4, ipv4+ports flows; not checked: ipv6, ipv6+ports" in f.reason
    assert "hash function not reported by ethtool: judged as Toeplitz" in f.reason
    full = {**rss, "key": "6d5a" * 26, "functions": {"toeplitz": True}}
    (f,) = one("l3.rss.symmetric", snap({**facts, "ethtool.rss.eth2": full}))
    assert f.status == "pass" and "every flow" in f.reason and "judged as" not in f.reason
