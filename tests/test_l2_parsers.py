"""L2 parsers on real captured files (tests/fixtures/host, copied from shared/corpus) and fuzzing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailgate.model import ParseError
from tailgate.sources.cgroup import parse_cpu_max, parse_cpu_stat, parse_mounts, parse_proc_cgroup
from tailgate.sources.process import parse_io_uring_fdinfo, parse_schedstat, parse_status
from tailgate.sources.procfs import (
    parse_interrupts,
    parse_meminfo,
    parse_net_dev,
    parse_pressure,
    parse_snmp,
    parse_softirqs,
    parse_softnet,
    parse_stat_cpus,
)
from tailgate.sources.records import parse_cpulist, parse_cpumask
from tailgate.sources.sysctl import parse_ints

FIX = Path(__file__).parent / "fixtures" / "host"


def fixture(name: str) -> str:
    text = (FIX / name).read_text()
    assert text.startswith("# source:"), "fixtures keep their provenance line"
    return text


def test_snmp_node_exporter_fixture():
    snmp = parse_snmp(fixture("proc-net-snmp.txt"))
    assert snmp["Ip"]["InReceives"] == 57740232
    assert snmp["Ip"]["OutRequests"] == 55365537
    assert snmp["Icmp"]["OutDestUnreachs"] == 120
    assert {"Ip", "Icmp", "Tcp", "Udp"} <= set(snmp)


def test_snmp_vm_capture_has_tcp_segments():
    snmp = parse_snmp(fixture("vm-proc-net-snmp.txt"))
    assert snmp["Ip"]["Forwarding"] == 2
    assert snmp["Ip"]["InReceives"] == 3459334
    assert snmp["Tcp"]["MaxConn"] == -1  # the one signed field
    assert snmp["Tcp"]["OutSegs"] >= snmp["Tcp"]["RetransSegs"] >= 0


@pytest.mark.parametrize("name", ["proc-net-netstat.txt", "vm-proc-net-netstat.txt"])
def test_netstat(name):
    nst = parse_snmp(fixture(name))
    assert "TcpExt" in nst and "IpExt" in nst
    assert nst["TcpExt"]["SyncookiesSent"] == 0


def test_netstat_old_kernel_values():
    nst = parse_snmp(fixture("proc-net-netstat.txt"))
    assert nst["TcpExt"]["TW"] == 388812


def test_softnet_mixed_row_widths():
    rows = parse_softnet(fixture("proc-net-softnet_stat.txt"))
    assert rows[0] == {"cpu": 0, "processed": 0x358FE3, "dropped": 0x6283, "time_squeeze": 0}
    assert rows[1]["cpu"] == 1 and rows[1]["dropped"] == 0x446 and rows[1]["time_squeeze"] == 0xB1
    assert rows[2]["time_squeeze"] == 0xF0000769  # 11-column row: index falls back to position


def test_softnet_vm_has_cpu_index_column():
    rows = parse_softnet(fixture("vm-proc-net-softnet_stat.txt"))
    assert [r["cpu"] for r in rows] == [0, 1]
    assert rows[0]["processed"] == 0x1A5436 and rows[0]["dropped"] == 0


def test_interrupts_virtio_names():
    irq = parse_interrupts(fixture("vm-proc-interrupts-virtio.txt"))
    assert irq["cpus"] == [0, 1]
    assert irq["irqs"]["38"]["names"] == ["virtio2-input.0"]
    assert irq["irqs"]["38"]["counts"] == [0, 6138]
    assert irq["irqs"]["39"]["names"] == ["virtio2-output.0"]
    assert irq["irqs"]["24"]["names"] == ["ACPI:Ged"]
    assert "LOC" not in irq["irqs"]


def test_interrupts_shared_and_mlx5_names():
    text = ("           CPU0       CPU1\n"
            " 16:          5          0   IO-APIC  16-fasteoi   ehci_hcd:usb1, i801_smbus\n"
            " 98:        100        200   IR-PCI-MSI 1572864-edge      mlx5_comp0@pci:0000:08:00.0\n"
            "NMI:          0          0   Non-maskable interrupts\n")
    irq = parse_interrupts(text)
    assert irq["irqs"]["16"]["names"] == ["ehci_hcd:usb1", "i801_smbus"]
    assert irq["irqs"]["98"]["names"] == ["mlx5_comp0@pci:0000:08:00.0"]


@pytest.mark.parametrize("name", ["proc-softirqs.txt", "vm-proc-softirqs.txt"])
def test_softirqs(name):
    soft = parse_softirqs(fixture(name))
    assert len(soft["NET_RX"]) == 2
    assert "TIMER" in soft


def test_stat_steal_per_cpu():
    cpus = parse_stat_cpus(fixture("vm-proc-stat.txt"))
    assert sorted(cpus) == [0, 1]  # the summed "cpu" line is not a CPU
    assert (cpus[0]["steal"], cpus[1]["steal"]) == (1098, 1125)
    assert cpus[1]["idle"] == 563319


@pytest.mark.parametrize("text, why", [
    ("cpu0 1 2 3 4 5 6 7\n", "7 columns"),  # no steal column: not read as 0
    ("cpu0 1 2 3 4 5 6 7 -8\n", "negative"),
    ("cpu0 1 2 3 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 9\n", "twice"),
    ("cpux 1 2 3 4 5 6 7 8\n", "not a CPU line"),
    ("cpu 1 2 3 4 5 6 7 8\nintr 5\n", "no cpuN lines"),
])
def test_stat_refuses_what_it_cannot_trust(text, why):
    with pytest.raises(ParseError, match=why):
        parse_stat_cpus(text)


def test_softirqs_values():
    assert parse_softirqs(fixture("vm-proc-softirqs.txt"))["TIMER"] == [9827, 11080]
    assert parse_softirqs(fixture("proc-softirqs.txt"))["TIMER"] == [2776180, 247490]


def test_schedstat():
    assert parse_schedstat(fixture("vm-proc-pid-schedstat.txt")) == {
        "run_ns": 204167, "wait_ns": 102224, "timeslices": 2}
    assert parse_schedstat(fixture("proc-pid-schedstat.txt"))["timeslices"] == 79


def test_pressure():
    p = parse_pressure(fixture("vm-proc-pressure-cpu.txt"))
    assert p["some"]["avg10"] == 10.18 and p["some"]["total"] == 82787870
    assert p["full"]["total"] == 0
    old = parse_pressure(fixture("proc-pressure-cpu.txt"))
    assert "full" not in old and old["some"]["avg300"] == 3.85


def test_cgroup_cpu_stat_v1_v2():
    v1 = parse_cpu_stat(fixture("cgroupv1-cpu.stat"))
    assert v1 == {"nr_periods": 7, "nr_throttled": 2, "throttled_time": 127918677}
    v2 = parse_cpu_stat(fixture("cgroupv2-cpu.stat"))
    assert v2["nr_throttled"] == 3 and v2["throttled_usec"] == 139381
    root = parse_cpu_stat(fixture("cgroupv2-cpu.stat-root.txt"))  # carries a shell prompt line
    assert root["usage_usec"] == 8210530646 and root["nr_throttled"] == 0
    vm = parse_cpu_stat(fixture("vm-cgroupv1-cpu.stat"))
    assert vm["nr_bursts"] == 0 and vm["throttled_time"] == 0
    no_ctrl = parse_cpu_stat(fixture("vm-cgroupv2-root-cpu.stat"))
    assert "nr_throttled" not in no_ctrl and no_ctrl["usage_usec"] == 352480341


def test_cpu_stat_garbage_is_an_error_not_an_empty_pass():
    with pytest.raises(ParseError):
        parse_cpu_stat("hello world\n")
    with pytest.raises(ParseError):
        parse_cpu_stat("nr_periods x\n")


def test_cpu_max_and_mounts():
    assert parse_cpu_max("max 100000\n") == (None, 100000)
    assert parse_cpu_max("10000 100000") == (10000, 100000)
    mounts = parse_mounts("cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
                          "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\nproc /proc proc rw 0 0\n")
    assert mounts == [("/sys/fs/cgroup/cpu", "cgroup", ["rw", "relatime", "cpu"]),
                      ("/sys/fs/cgroup/unified", "cgroup2", ["rw"])]
    assert parse_proc_cgroup("1:cpu,cpuacct:/a/b\n0::/svc\n") == {
        "cpu": "/a/b", "cpuacct": "/a/b", "": "/svc"}


def test_io_uring_fdinfo_sqpoll_and_not():
    sq = parse_io_uring_fdinfo(fixture("vm-io_uring-fdinfo-sqpoll.txt"))
    assert sq == {"sqpoll": True, "sq_thread": 12002, "sq_thread_cpu": 1, "user_bufs": 2,
                  "user_files": 1}
    nosq = parse_io_uring_fdinfo(fixture("vm-io_uring-fdinfo-nosqpoll.txt"))
    assert nosq["sqpoll"] is False and nosq["sq_thread"] == -1 and nosq["user_bufs"] == 2
    with pytest.raises(ParseError):
        parse_io_uring_fdinfo("pos:\t0\nflags:\t02\n")  # an ordinary file's fdinfo


def test_cpulist_and_mask():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert parse_cpumask("00000000,0000000f") == [0, 1, 2, 3]
    assert parse_cpumask("00000001,00000000") == [32]
    with pytest.raises(ParseError):
        parse_cpulist("3-1")


def test_status_and_meminfo():
    st = parse_status("Name:\tnginx\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n")
    assert st["Name"] == "nginx" and st["Cpus_allowed_list"] == "0-1"
    mem = parse_meminfo("MemTotal:       24576000 kB\nHugePages_Total:       0\n")
    assert mem["MemTotal"] == 24576000 * 1024 and mem["HugePages_Total"] == 0


def test_net_dev():
    text = ("Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets "
            "errs drop fifo colls carrier compressed\n"
            "    lo: 1000 10 0 0 0 0 0 0 1000 10 0 0 0 0 0 0\n"
            "  eth0: 5000 50 1 2 3 0 0 0 7000 70 0 4 0 0 0 0\n")
    dev = parse_net_dev(text)
    assert dev["eth0"]["rx_packets"] == 50 and dev["eth0"]["rx_drop"] == 2
    assert dev["eth0"]["tx_drop"] == 4 and dev["lo"]["tx_bytes"] == 1000


def test_sysctl_capture_values():
    knobs = dict(line.split(" = ", 1) for line in fixture("vm-sysctl-net.txt").splitlines()[1:])
    assert parse_ints(knobs["net.ipv4.tcp_mem"], 3) == [287901, 383868, 575802]
    assert parse_ints(knobs["net.ipv4.tcp_rmem"], 3)[2] == 33554432


# -- fuzzing: any input either parses or raises ParseError (which becomes `unknown`) -----------

PARSERS = [parse_snmp, parse_softnet, parse_net_dev, parse_meminfo, parse_pressure,
           parse_interrupts, parse_softirqs, parse_schedstat, parse_status, parse_cpu_stat,
           parse_cpu_max, parse_io_uring_fdinfo, parse_cpulist, parse_cpumask, parse_stat_cpus]
CORPUS = [fixture(n) for n in sorted(p.name for p in FIX.iterdir() if p.is_file())]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300),
       st.sampled_from(PARSERS))
def test_fuzz_random_text(text, parser):
    try:
        parser(text)
    except ParseError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CORPUS), st.integers(min_value=0), st.text(max_size=8),
       st.sampled_from(PARSERS))
def test_fuzz_mutated_corpus(text, pos, insert, parser):
    pos %= len(text) + 1
    mutated = text[:pos] + insert + text[pos + len(insert):]
    try:
        parser(mutated)
    except ParseError:
        pass


def test_softnet_rows_shorter_than_any_kernel_prints_are_refused():
    # prometheus/procfs' fixture holds a 9-column row (2.6 kernels): the shortest there is
    assert len(parse_softnet(fixture("proc-net-softnet_stat.txt"))) == 5
    short = "0000000a 00000000 00000001 00000000\n"
    with pytest.raises(ParseError, match="every kernel prints at least 9"):
        parse_softnet(short)


def test_interrupts_arm64_level_edge_column_and_old_x86_without_hwirq():
    arm = parse_interrupts(fixture("proc-interrupts-arm64-gicv3.txt"))
    assert arm["cpus"] == [0, 1, 2, 3]
    assert arm["irqs"]["58"]["names"] == ["eth0"]  # "GICv3  59 Level     eth0"
    assert arm["irqs"]["123"]["names"] == ["eth1-0"]  # "ITS-MSI 524288 Edge      eth1-0"
    assert arm["irqs"]["121"]["names"] == ["PCIe PME"]  # a name with a space
    xen = parse_interrupts(fixture("proc-interrupts-arm64-xen-lines.txt"))
    assert xen["irqs"]["35"]["names"] == ["hvc_console"]  # "xen-dyn  Edge  -virq  hvc_console"
    assert xen["irqs"]["42"]["names"] == ["evtchn:xenstored"]
    assert xen["irqs"]["37"]["names"] == ["nvme0q0"] and "IPI0" not in xen["irqs"]
    old = parse_interrupts(fixture("proc-interrupts-x86-xtpic-2004.txt"))
    assert old["irqs"]["0"]["names"] == ["timer"]
    assert old["irqs"]["5"]["names"] == ["ehci_hcd", "eth0", "VIA8233"]  # shared: every name
    assert old["irqs"]["10"]["names"] == ["uhci_hcd", "uhci_hcd", "ohci1394", "eth1"]
    # the current x86 layout still reads (chip, "hwirq-edge", names)
    vm = parse_interrupts(fixture("vm-proc-interrupts-virtio.txt"))
    assert vm["irqs"]["24"]["names"] == ["ACPI:Ged"]
