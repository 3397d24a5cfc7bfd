"""L2 judgments: pure checks on snapshots built from real captured values."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailgate.baseline import Baseline, default_baseline
from tailgate.judge import judge
from tailgate.model import Fact, Snapshot
from tailgate.sources.procfs import parse_snmp, parse_softnet

FIX = Path(__file__).parent / "fixtures" / "host"
BASE = default_baseline()


def snap(facts: dict, before: dict | None = None, interval: float = 5.0, **target) -> Snapshot:
    return Snapshot(host={"hostname": "t"}, target={"pids": [], **target}, interval_s=interval,
                    taken_at=0.0, facts={k: v if isinstance(v, Fact) else Fact(value=v)
                                         for k, v in facts.items()},
                    before={k: Fact(value=v) for k, v in (before or {}).items()})


def findings(s: Snapshot, check_id: str):
    return [f for f in judge(s, BASE) if f.id == check_id]


def one(s: Snapshot, check_id: str):
    (f,) = findings(s, check_id)
    return f


def bump(snmp: dict, proto: str, **inc) -> dict:
    out = {k: dict(v) for k, v in snmp.items()}
    for key, n in inc.items():
        out[proto][key] += n
    return out


SNMP = parse_snmp((FIX / "vm-proc-net-snmp.txt").read_text())
SOFTNET = parse_softnet((FIX / "vm-proc-net-softnet_stat.txt").read_text())
DEV = {"eth0": {"rx_packets": 1000, "tx_packets": 1000, "rx_drop": 0, "tx_drop": 0,
                "rx_fifo": 0, "tx_fifo": 0}}


def dev_after(rx: int, tx: int, drops: int = 0) -> dict:
    return {"eth0": {**DEV["eth0"], "rx_packets": 1000 + rx, "tx_packets": 1000 + tx,
                     "rx_drop": drops}}


def test_retransmit_rate_fail_and_pass():
    bad = snap({"net.snmp": bump(SNMP, "Tcp", OutSegs=10000, RetransSegs=5)}, {"net.snmp": SNMP})
    f = one(bad, "l2.net.retransmit_rate")
    assert f.status == "fail" and f.observed == 0.05 and f.evidence["RetransSegs"] == 5
    good = snap({"net.snmp": bump(SNMP, "Tcp", OutSegs=10000)}, {"net.snmp": SNMP})
    assert one(good, "l2.net.retransmit_rate").status == "pass"


def test_retransmit_without_traffic_is_unknown_not_pass():
    s = snap({"net.snmp": SNMP}, {"net.snmp": SNMP})
    f = one(s, "l2.net.retransmit_rate")
    assert f.status == "unknown" and "no TCP segments" in f.reason


def test_rates_need_an_interval():
    s = snap({"net.snmp": bump(SNMP, "Tcp", OutSegs=10)}, {"net.snmp": SNMP}, interval=0.0)
    f = one(s, "l2.net.retransmit_rate")
    assert f.status == "unknown" and "interval" in f.reason


def test_drop_rate_counts_every_stage():
    soft_after = [dict(r) for r in SOFTNET]
    soft_after[1]["dropped"] += 1
    facts = {"net.snmp": bump(SNMP, "Ip", InDiscards=1), "net.softnet": soft_after,
             "net.dev": dev_after(10000, 9999, drops=1)}
    before = {"net.snmp": SNMP, "net.softnet": SOFTNET, "net.dev": DEV}
    f = one(snap(facts, before), "l2.net.drop_rate")
    assert f.status == "fail"
    assert f.evidence["packets"] == 19999
    assert f.evidence["interface_drops"] == 1 and f.evidence["softnet_backlog_drops"] == 1
    assert f.evidence["ip_in_discards"] == 1
    assert abs(f.observed - 100 * 3 / 19999) < 1e-5


def test_drop_rate_clean_passes():
    facts = {"net.snmp": SNMP, "net.softnet": SOFTNET, "net.dev": dev_after(500000, 500000)}
    before = {"net.snmp": SNMP, "net.softnet": SOFTNET, "net.dev": DEV}
    f = one(snap(facts, before), "l2.net.drop_rate")
    assert f.status == "pass" and f.observed == 0


def test_missing_counter_is_unknown_with_the_reason():
    s = snap({"net.snmp": Fact(missing="/proc/net/snmp: permission denied (run as root)")},
             {"net.snmp": SNMP})
    f = one(s, "l2.net.retransmit_rate")
    assert f.status == "unknown" and "permission denied" in f.reason


def test_congestion_control():
    k = "sysctl.net.ipv4.tcp_congestion_control"
    a = "sysctl.net.ipv4.tcp_available_congestion_control"
    cubic = one(snap({k: "cubic", a: "reno bbr cubic"}), "l2.net.congestion_control")
    assert cubic.status == "fail" and "bbr is available" in cubic.reason
    v1 = one(snap({k: "bbr", a: "reno bbr cubic",
                   "kernel.tcp_bbr": {"version": None, "source": "modinfo tcp_bbr"}}),
             "l2.net.congestion_control")
    assert v1.status == "warn" and v1.observed == "bbr v1"  # the red line is BBRv3
    assert "modinfo tcp_bbr: no module version" in v1.reason and "BBRv3" in v1.remedy
    v2 = one(snap({k: "bbr", a: "bbr", "kernel.tcp_bbr": {"version": "2", "source": "x"}}),
             "l2.net.congestion_control")
    assert v2.status == "warn" and v2.observed == "bbr v2"
    v3 = one(snap({k: "bbr", a: "bbr", "kernel.tcp_bbr": {"version": "3", "source": "x"}}),
             "l2.net.congestion_control")
    assert v3.status == "pass" and v3.observed == "bbr v3"
    unread = one(snap({k: "bbr", a: "bbr",
                       "kernel.tcp_bbr": Fact(missing="modinfo: Module tcp_bbr not found")}),
                 "l2.net.congestion_control")
    assert unread.status == "unknown" and "Module tcp_bbr not found" in unread.reason


def test_bbr_version_sources_on_a_host_root(tmp_path):
    from tailgate.collect import Scope
    from tailgate.host import Host
    from tailgate.model import SourceError
    from tailgate.sources.sysctl import tcp_bbr

    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.1.0-18-amd64\n")
    host = Host(tmp_path)
    with pytest.raises(SourceError, match="tcp_bbr version is not readable: "
                       "/sys/module/tcp_bbr/version: absent; .*modules.builtin.modinfo: absent"):
        tcp_bbr(host, Scope())
    mods = tmp_path / "lib/modules/6.1.0-18-amd64"
    mods.mkdir(parents=True)
    # built in: the kernel's own modules.builtin.modinfo (NUL-separated module.key=value)
    (mods / "modules.builtin.modinfo").write_text(
        "ext4.license=GPL\0tcp_bbr.description=TCP BBR (Bottleneck Bandwidth and RTT)\0"
        "tcp_bbr.license=Dual BSD/GPL\0tcp_bbr.version=3\0")
    assert tcp_bbr(host, Scope())["version"] == "3"
    (tmp_path / "sys/module/tcp_bbr").mkdir(parents=True)  # loaded module, no version file
    assert tcp_bbr(host, Scope()) == {
        "version": None, "source": "/sys/module/tcp_bbr (loaded, no version attribute)"}


def test_mem_sizing_rule():
    gib = 2**30
    base = {"sysctl.net.ipv4.tcp_rmem": "4096\t131072\t6291456", "hw.page_size": 4096}

    def judge_mem(tcp_mem_max_pages: int, total: int):
        return one(snap({**base, "sysctl.net.ipv4.tcp_mem": f"1 2 {tcp_mem_max_pages}",
                         "proc.meminfo": {"MemTotal": total}}), "l2.tcp.mem_sizing")

    assert judge_mem(gib // 4096 * 2, 24 * gib).status == "pass"  # 2 GiB of 24
    over = judge_mem(gib // 4096 * 12, 24 * gib)  # half of RAM
    assert over.status == "fail" and over.observed == 50.0
    tiny = judge_mem(1000, 24 * gib)
    assert tiny.status == "warn"
    few = one(snap({**base, "sysctl.net.ipv4.tcp_rmem": "4096 131072 268435456",
                    "sysctl.net.ipv4.tcp_mem": f"1 2 {gib // 4096 * 2}",
                    "proc.meminfo": {"MemTotal": 24 * gib}}), "l2.tcp.mem_sizing")
    assert few.status == "warn" and "sockets can reach" in few.reason


def test_moderate_rcvbuf():
    k = "sysctl.net.ipv4.tcp_moderate_rcvbuf"
    assert one(snap({k: "1"}), "l2.tcp.moderate_rcvbuf").status == "pass"
    assert one(snap({k: "0"}), "l2.tcp.moderate_rcvbuf").status == "fail"
    assert one(snap({k: "x"}), "l2.tcp.moderate_rcvbuf").status == "unknown"


def _cg(nr_throttled: int, t_ns: int, quota: int | None) -> dict:
    return {"path": "/sys/fs/cgroup/cpu/svc", "version": 1, "quota_us": quota,
            "period_us": 100000,
            "stat": {"nr_periods": 50 + nr_throttled, "nr_throttled": nr_throttled,
                     "throttled_time": t_ns}}


def test_cgroup_throttling_growth_fails_quota_warns():
    grew = snap({"cgroup.target": _cg(12, 900_000_000, 10000)},
                {"cgroup.target": _cg(2, 100_000_000, 10000)})
    f = one(grew, "l2.cgroup.throttling")
    assert f.status == "fail" and f.observed == 10
    assert f.evidence["throttled_ms_in_interval"] == 800.0
    quiet = snap({"cgroup.target": _cg(2, 0, 10000)}, {"cgroup.target": _cg(2, 0, 10000)})
    assert one(quiet, "l2.cgroup.throttling").status == "warn"
    free = snap({"cgroup.target": _cg(0, 0, None)}, {"cgroup.target": _cg(0, 0, None)})
    assert one(free, "l2.cgroup.throttling").status == "pass"
    assert one(snap({}), "l2.cgroup.throttling").status == "skip"


def _nic(numa: int, local: list[int], irq_cpus: dict[str, list[int]]) -> dict:
    return {"iface": "eth0", "virtual": False, "device": "0000:08:00.0", "pci": "0000:08:00.0",
            "driver": "mlx5_core", "numa_node": numa, "local_cpus": local,
            "irqs": [int(i) for i in irq_cpus], "irq_affinity": irq_cpus,
            "irq_names": {i: [f"mlx5_comp{i}@pci:0000:08:00.0"] for i in irq_cpus}}


def _proc(cpus: list[int], mems: list[int]) -> dict:
    return {"name": "svc", "cpus_allowed": cpus, "mems_allowed": mems, "threads": 4}


def test_numa_affinity_two_nodes():
    base = {"nic": ["eth0"], "numa.nodes": [0, 1],
            "nic.eth0": _nic(1, list(range(8, 16)), {"98": [8]})}
    remote = one(snap({**base, "proc.7.status": _proc(list(range(0, 16)), [0, 1])}, pids=[7]),
                 "l2.numa.affinity")
    assert remote.status == "fail" and remote.observed == "0-7"
    local = one(snap({**base, "proc.7.status": _proc([9, 10], [1])}, pids=[7]),
                "l2.numa.affinity")
    assert local.status == "pass"
    # CPUs local, the cpuset allows both nodes: where memory comes from is the policy's say
    mem = one(snap({**base, "proc.7.status": _proc([9, 10], [0, 1])}, pids=[7]),
              "l2.numa.affinity")
    assert mem.status == "unknown" and "memory policy is unknown" in mem.reason


NUMA_MAPS = {  # mpol_to_str() spellings, as /proc/PID/numa_maps prints them
    "bind:1": ("pass", ""), "bind=static:1": ("pass", ""), "default": ("pass", ""),
    "local": ("pass", ""), "prefer:1": ("pass", ""), "interleave:0-1": ("warn", "0"),
    "weighted interleave:0-1": ("warn", "0"), "prefer (many):0-1": ("warn", "0"),
    "bind:0": ("fail", "0"), "prefer:0": ("fail", "0"),
}


@pytest.mark.parametrize("policy", sorted(NUMA_MAPS))
def test_numa_affinity_follows_the_memory_policy_in_force(policy):
    from tailgate.sources.process import parse_numa_maps

    text = (f"7f00c0000000 {policy} anon=2048 dirty=2048 N1=2048 kernelpagesize_kB=4\n"
            f"55e906e31000 {policy} file=/usr/bin/svc mapped=2 mapmax=2 N0=2 kernelpagesize_kB=4\n")
    maps = parse_numa_maps(text)
    assert maps["resident_bytes"] == {"1": 2048 * 4096, "0": 2 * 4096}
    base = {"nic": ["eth0"], "numa.nodes": [0, 1], "nic.eth0": _nic(1, list(range(8, 16)), {"98": [8]}),
            "proc.7.status": _proc([9, 10], [0, 1]), "proc.7.numa_maps": maps}
    f = one(snap(base, pids=[7]), "l2.numa.affinity")
    status, observed = NUMA_MAPS[policy]
    assert (f.status, f.observed if status != "pass" else "") == (status, observed), f.reason
    assert f.evidence["memory_policies"] == {policy: 2}


def test_numa_maps_parse_errors():
    from tailgate.model import ParseError
    from tailgate.sources.process import parse_numa_maps

    with pytest.raises(ParseError, match="not a mapping line"):
        parse_numa_maps("garbage\n")
    with pytest.raises(ParseError, match="malformed cpu"):
        parse_numa_maps("7f00c0000000 bind:x anon=1 N0=1\n")


def test_gpu_locality_of_the_gpus_the_service_holds():
    gpu = {"kind": "gpu", "class": "0x030200", "vendor": "0x10de", "upstream": [],
           "numa_node": 1, "local_cpus": list(range(8, 16))}
    base = {"nic": [], "numa.nodes": [0, 1], "pci.devices": {"0000:c1:00.0": gpu},
            "proc.7.status": _proc([2, 3], [0]),
            "proc.7.gpus": {"gpus": ["0000:c1:00.0"], "unresolved": []}}
    f = one(snap(base, pids=[7]), "l2.numa.affinity")
    assert f.status == "fail" and f.subject == "pid 7 / GPU 0000:c1:00.0" and f.observed == "2-3"
    f = one(snap({**base, "proc.7.status": _proc([9], [1])}, pids=[7]), "l2.numa.affinity")
    assert f.status == "pass"
    f = one(snap({**base, "proc.7.gpus": Fact(missing="pid 7: /proc/7/fd: permission denied")},
                 pids=[7]), "l2.numa.affinity")
    assert f.status == "unknown" and "which GPUs it uses is unknown" in f.reason
    none = one(snap({**base, "proc.7.gpus": {"gpus": [], "unresolved": []}}, pids=[7]),
               "l2.numa.affinity")
    assert none.status == "skip"


NO_HT = {str(c): [c] for c in range(4)}
NO_RPS = {"rps_cpus": {"rx-0": [], "rx-1": []}, "rps_flow_cnt": {"rx-0": 0, "rx-1": 0}}


def test_irq_isolation():
    base = {"nic": ["eth0"], "numa.nodes": [0], "cpu.siblings": NO_HT, "rps.eth0": NO_RPS,
            "nic.eth0": _nic(0, [0, 1, 2, 3], {"98": [0], "99": [1]})}
    shared = one(snap({**base, "proc.7.status": _proc([1, 2, 3], [0])}, pids=[7]),
                 "l2.irq.isolation")
    assert shared.status == "fail" and shared.observed == "1"
    apart = one(snap({**base, "proc.7.status": _proc([2, 3], [0])}, pids=[7]),
                "l2.irq.isolation")
    assert apart.status == "pass" and "no RPS" in apart.reason
    gone = one(snap({**base, "proc.7.status": Fact(missing="pid 7: absent")}, pids=[7]),
               "l2.irq.isolation")
    assert gone.status == "unknown" and "absent" in gone.reason


def test_irq_isolation_is_physical_hyperthread_siblings_and_rps_count():
    # 2 cores x 2 threads, Linux numbering: CPU 0 and 2 share a core, CPU 1 and 3 the other.
    ht = {"0": [0, 2], "1": [1, 3], "2": [0, 2], "3": [1, 3]}
    base = {"nic": ["eth0"], "numa.nodes": [0], "cpu.siblings": ht, "rps.eth0": NO_RPS,
            "nic.eth0": _nic(0, [0, 1, 2, 3], {"98": [0]}), "proc.7.status": _proc([2], [0])}
    f = one(snap(base, pids=[7]), "l2.irq.isolation")
    assert f.status == "fail" and f.observed == "0"
    assert "hyperthread siblings of the service's CPUs" in f.reason
    assert f.evidence["service_core_siblings"] == "0"
    # IRQs on another core, but RPS steers softirq work of rx-1 onto the service's CPU
    rps = {"rps_cpus": {"rx-0": [], "rx-1": [2, 3]}, "rps_flow_cnt": {"rx-0": 0, "rx-1": 4096}}
    moved = {**base, "nic.eth0": _nic(0, [0, 1, 2, 3], {"98": [1]}), "rps.eth0": rps}
    f = one(snap(moved, pids=[7]), "l2.irq.isolation")
    assert f.status == "fail" and "RPS/RFS softirqs may run on the service's CPUs 2" in f.reason
    assert f.evidence["rps_cpus"] == "2-3" and f.evidence["rps_flow_cnt"]["rx-1"] == 4096
    # IRQs and RPS on core 1 (CPUs 1 and 3), the service on core 0 (CPUs 0 and 2): isolated
    apart = {**moved, "rps.eth0": {**rps, "rps_cpus": {"rx-0": [3], "rx-1": [1]}},
             "proc.7.status": _proc([0, 2], [0])}
    f = one(snap(apart, pids=[7]), "l2.irq.isolation")
    assert f.status == "pass" and "RPS on 1,3" in f.reason


def test_irq_isolation_unconfirmed_is_unknown_not_pass():
    base = {"nic": ["eth0"], "numa.nodes": [0], "nic.eth0": _nic(0, [0, 1, 2, 3], {"98": [1]}),
            "proc.7.status": _proc([2], [0]), "rps.eth0": NO_RPS,
            "cpu.siblings": Fact(missing="/sys/devices/system/cpu: permission denied")}
    f = one(snap(base, pids=[7]), "l2.irq.isolation")
    assert f.status == "unknown" and "hyperthread siblings unknown" in f.reason
    f = one(snap({**base, "cpu.siblings": NO_HT, "rps.eth0": Fact(missing="queues: absent")},
                 pids=[7]), "l2.irq.isolation")
    assert f.status == "unknown" and "RPS masks of eth0 unreadable" in f.reason
    # a direct overlap fails whatever could not be read
    f = one(snap({**base, "proc.7.status": _proc([1], [0])}, pids=[7]), "l2.irq.isolation")
    assert f.status == "fail"


def test_topology_and_rps_sources_on_real_sysfs(tmp_path):
    from tailgate.host import Host
    from tailgate.sources.netdev import rps_map
    from tailgate.sources.topology import cpu_siblings

    live = cpu_siblings(Host("/"))  # this VM's real topology
    assert set(live) == {str(c) for c in range(len(live))} and all(int(c) in s for c, s in live.items())
    # layout and mask format of corpus sysfs-nic-queues-xps-rps-numa.txt
    for cpu, sib in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        d = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(sib + "\n")
    (tmp_path / "sys/devices/system/cpu/cpu4").mkdir()  # offline: no topology
    assert cpu_siblings(Host(tmp_path)) == {"0": [0, 2], "1": [1, 3], "2": [0, 2], "3": [1, 3]}
    q = tmp_path / "sys/class/net/ens10f0/queues"
    for n, mask in ((0, "00000000,00000000"), (1, "00000000,0000000c")):
        (q / f"rx-{n}").mkdir(parents=True)
        (q / f"rx-{n}" / "rps_cpus").write_text(mask + "\n")
        (q / f"rx-{n}" / "rps_flow_cnt").write_text("0\n")
    (q / "tx-0").mkdir()
    assert rps_map(Host(tmp_path), "ens10f0") == {
        "rps_cpus": {"rx-0": [], "rx-1": [2, 3]}, "rps_flow_cnt": {"rx-0": 0, "rx-1": 0}}


def test_io_uring_judgment():
    ring = {"fd": 3, "sqpoll": True, "sq_thread": 12, "sq_thread_cpu": 1, "user_bufs": 2,
            "user_files": 1}
    good = one(snap({"proc.7.io_uring": [ring]}, pids=[7]), "l2.io.io_uring")
    assert good.status == "pass"
    nosq = one(snap({"proc.7.io_uring": [{**ring, "sqpoll": False}]}, pids=[7]), "l2.io.io_uring")
    assert nosq.status == "warn" and "SQPOLL" in nosq.reason
    none = one(snap({"proc.7.io_uring": []}, pids=[7]), "l2.io.io_uring")
    # epoll (nginx's default) is not a fault: skipped unless the baseline asks for rings
    assert none.status == "skip" and "epoll" in none.reason
    base = default_baseline()
    asked = Baseline({**base.params, "l2.io.io_uring": {"require_ring": True}})
    (gated,) = [f for f in judge(snap({"proc.7.io_uring": []}, pids=[7]), asked)
                if f.id == "l2.io.io_uring"]
    assert gated.status == "warn" and "every I/O is a syscall" in gated.reason
    assert one(snap({}), "l2.io.io_uring").status == "skip"


def test_every_catalog_id_appears_even_on_an_empty_snapshot():
    from tailgate.baseline import catalog

    ids = {f.id for f in judge(snap({}), BASE)}
    assert ids == set(catalog())
