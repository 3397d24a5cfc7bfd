"""Hostile input, round two (issue 24): a record that appears twice, digits that are not
ASCII. Each case breaks one file of the merged hostile root (tests/support/hostile.py)
and runs ``tailgate inspect`` on it: the findings that read the file are ``unknown``
naming the file and the record, the required id is unmet (exit 1), nothing is an error."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from support.hostile import PID, build_root
from tailgate.cli import main
from tailgate.model import ParseError
from tailgate.sources import ethtool, pci, procfs, ptp
from tailgate.sources.records import is_uint, loads_unique, put

AER = "sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/aer_dev_correctable"


def inspect(root: Path, *args: str) -> tuple[int, dict]:
    out = root.parent / "report.json"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["inspect", "--root", str(root), "--no-history", "--quiet",
                   "--pid", str(PID), "--cgroup", "/sys/fs/cgroup/svc", "--json", str(out),
                   *(args if "--interval" in args else ("--interval", "0", *args))])
    assert err.getvalue() == "", err.getvalue()
    return rc, json.loads(out.read_text())


def findings(report: dict, cid: str) -> list[dict]:
    got = [f for f in report["findings"] if f["id"] == cid]
    assert got, f"no finding {cid}"
    return got


def _dup_net_dev(text: str) -> str:
    """The lo line again, its rx_drop (4th counter) raised: which one is true?"""
    lo = next(ln for ln in text.splitlines() if ln.strip().startswith("lo:"))
    name, _, rest = lo.partition(":")
    cols = rest.split()
    cols[3] = str(int(cols[3]) + 5)
    return text + f"{name}: " + " ".join(cols) + "\n"


def _dup_pmc(text: str) -> str:
    """The same port answers twice: once 3 ns off, once 900 ms off."""
    block = text[text.index("\t7cfe90"):]
    return text + block.replace("master_offset              3",
                                "master_offset              900000000")


def _raised(text: str) -> str:
    """Every standalone number + 1000: the counters grew during the interval."""
    return re.sub(r"(?<![\w.:-])([0-9]+)(?![\w.:])", lambda m: str(int(m.group(1)) + 1000),
                  text)


JOURNAL = ("commands/journalctl_-q_--no-pager_-o_short_--since_-5min_-t_ptp4l_-t_phc2sys")
# file, how to break it, the finding, its subject (prefix), what its reason must name, and
# the status the broken input decides. Counters are sampled twice (the file's numbers grow
# in between) and judged from the saved snapshot; pmc is read once, alone.
DUPLICATES = {
    "net-dev": ("proc/net/dev", _dup_net_dev, "l2.net.drop_rate", "host",
                ["/proc/net/dev", "interface: 'lo' appears twice"], "unknown"),
    "aer": (AER, lambda t: t + "BadTLP 9\n", "l1.pcie.bad_tlp", "0000:81:00.0",
            ["0000:81:00.0/aer_dev_correctable", "'BadTLP' appears twice"], "unknown"),
    "snmp": ("proc/net/snmp", lambda t: t + "Tcp: RetransSegs\nTcp: 1\n",
             "l2.net.retransmit_rate", "host", ["/proc/net/snmp", "'Tcp' appears twice"],
             "unknown"),
    "cpu-stat": ("sys/fs/cgroup/svc/cpu.stat", lambda t: t + "nr_throttled 99999\n",
                 "l2.cgroup.throttling", "",
                 ["cpu.stat", "'nr_throttled' appears twice"], "unknown"),
    # mlx5: the driver's own counter stands in for the refused statistics, said out loud
    # (tests/test_fallbacks.py); it did not grow: a pass that names what was refused.
    "fec": ("commands/ethtool_-I_--show-fec_eth2", lambda t: t + "  uncorrectable_blocks: 0\n",
            "l1.fec.uncorrectable", "eth2",
            ["standard FEC statistics unreadable (`ethtool -I --show-fec eth2`",
             "'uncorrectable_blocks' appears twice", "used the driver counter"], "pass"),
    "pmc": ("commands/pmc_-u_-b_0_GET_TIME_STATUS_NP", _dup_pmc, "l1.clock.ptp", "host",
            ["pmc", "'7cfe90.fffe.f56dfc-0' appears twice"], "unknown"),
}


def _two_samples(root: Path, path: Path, broken, tmp_path: Path) -> Path:
    from tailgate.collect import Scope, collect
    from tailgate.host import Host
    from tailgate.safe import strict_json

    scope = Scope(pids=(PID,), cgroup="/sys/fs/cgroup/svc")
    saved = path.read_text()
    before = collect(Host(root), scope, 0)
    grown = _raised(saved)
    path.write_text(broken(grown) if broken else grown)
    after = collect(Host(root), scope, 0)
    path.write_text(saved)
    after.before, after.interval_s = before.facts, 5.0
    out = tmp_path / f"snap-{'broken' if broken else 'clean'}.json"
    out.write_text(strict_json(after.to_json()))
    return out


def inspect_from(snap: Path, *args: str) -> tuple[int, dict]:
    out = snap.with_suffix(".report.json")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["inspect", "--quiet", "--from", str(snap), "--json", str(out), *args])
    assert err.getvalue() == "", err.getvalue()
    return rc, json.loads(out.read_text())


@pytest.mark.parametrize("case", sorted(DUPLICATES))
def test_a_record_twice_is_a_broken_source(case, tmp_path):
    rel, broken, cid, subject, named, status = DUPLICATES[case]
    root = build_root(tmp_path / "root")
    path = root / rel

    def run(breaker):
        if case == "pmc":  # pmc alone: neither the journal nor chrony to judge from
            (root / JOURNAL).unlink(missing_ok=True)
            (root / "commands/chronyc_tracking").unlink(missing_ok=True)
            if breaker:
                path.write_text(breaker(path.read_text()))
            return inspect(root, "--interval", "0", "--require", cid)
        return inspect_from(_two_samples(root, path, breaker, tmp_path), "--require", cid)

    _, clean = run(None)
    was = [f for f in findings(clean, cid) if f["subject"].startswith(subject)]
    assert was and all(f["status"] in ("pass", "fail") for f in was), was
    rc, report = run(broken)
    got = [f for f in findings(report, cid) if f["subject"].startswith(subject)]
    assert got and {f["status"] for f in got} == {status}, got
    reason = " ".join(f["reason"] for f in got)
    for text in named:
        assert text in reason, reason
    assert "different values" in reason
    assert report["verdict"]["counts"].get("error", 0) == 0
    if status == "unknown":
        assert rc == 1 and cid in [u["id"] for u in report["verdict"]["unmet_required"]]


def test_the_same_line_twice_is_not_a_conflict():
    text = "RxErr 0\nBadTLP 3\nBadTLP 3\nTOTAL_ERR_COR 3\n"
    assert pci.parse_aer(text)["BadTLP"] == 3


def test_every_line_parser_refuses_a_record_twice():
    """One rule, in every parser that builds a mapping from lines (unit level)."""
    cases = [
        (procfs.parse_meminfo, "MemTotal: 100 kB\nMemFree: 5 kB\nMemFree: 6 kB\n", "'MemFree'"),
        (procfs.parse_pressure, "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"
         "some avg10=9.00 avg60=0.00 avg300=0.00 total=1\n", "'some'"),
        (procfs.parse_interrupts, "   CPU0\n 1: 5 IO-APIC 1-edge i8042\n"
         " 1: 6 IO-APIC 1-edge i8042\n", "'1'"),
        (procfs.parse_softirqs, "  CPU0\nNET_RX: 1\nNET_RX: 2\n", "'NET_RX'"),
        (ethtool.parse_stats, "NIC statistics:\n     rx_symbol_err_phy: 0\n"
         "     rx_symbol_err_phy: 7\n", "'rx_symbol_err_phy'"),
        (ethtool.parse_driver_info, "driver: mlx5_core\ndriver: virtio_net\n", "'driver'"),
        (pci.parse_nvidia_smi, "GPU 00000000:17:00.0\n    Replays Since Reset : 0\n"
         "    Replays Since Reset : 4\n", "'replays'"),
        (ptp.parse_chrony_tracking, "Reference ID    : 50484330 (PHC0)\nStratum : 1\n"
         "Stratum : 3\n", "'Stratum'"),
    ]
    for parse, text, record in cases:
        with pytest.raises(ParseError, match=re.escape(record) + " appears twice"):
            parse(text)


def test_json_sources_refuse_a_key_twice():
    assert loads_unique('{"a": 1, "a": 1}', "x") == {"a": 1}
    with pytest.raises(ParseError, match="'rx_missed_errors' appears twice"):
        loads_unique('{"rx_missed_errors": 0, "rx_missed_errors": 12}', "dpdk xstats")
    out: dict = {}
    put(out, "k", 1, "src")
    with pytest.raises(ParseError, match=r"src: 'k' appears twice with different values \(1, "
                       r"then 2\)"):
        put(out, "k", 2, "src")


# -- digits that are not ASCII -------------------------------------------------------------

def test_a_superscript_where_a_parser_took_isdigit_is_a_parse_error():
    """These crashed (int('²') after isdigit()): now each is a precise parse error."""
    ts = "PTP Hardware Clock: \u00b2\nCapabilities:\n"
    with pytest.raises(ParseError, match="PTP Hardware Clock"):
        ethtool.parse_timestamping(ts)
    with pytest.raises(ParseError, match="not an IRQ"):
        procfs.parse_interrupts("   CPU0\n \u00b2: 5 IO-APIC 1-edge i8042\n")
    with pytest.raises(ParseError, match="not a number"):
        procfs.parse_pressure("some avg10=\uff11.00 avg60=0.00 avg300=0.00 total=1\n")


def test_only_ascii_digits_are_digits():
    assert "²".isdigit() and "٣".isdecimal()  # what str accepts
    assert is_uint("0123456789")
    for text in ("²", "٣", "１", "1²", "", "-1", "+1", " 1", "1_0"):
        assert not is_uint(text), text


SUPERSCRIPTS = {  # file, the line made hostile, the finding that reads it, what it must name
    "status-threads": (f"proc/{PID}/status", ("Threads:\t4", "Threads:\t\u00b2"),
                       "l2.numa.affinity", [f"/proc/{PID}/status", "Threads"]),
    "status-vmrss": (f"proc/{PID}/status", ("VmRSS:\t    1952 kB", "VmRSS:\t    \u00b9952 kB"),
                     "l2.numa.affinity", [f"/proc/{PID}/status", "kB"]),
    "interrupts": ("proc/interrupts", None, "l2.irq.isolation", ["/proc/interrupts"]),
}


@pytest.mark.parametrize("case", sorted(SUPERSCRIPTS))
def test_a_superscript_digit_is_not_a_number(case, tmp_path):
    rel, change, cid, named = SUPERSCRIPTS[case]
    root = build_root(tmp_path / "root")
    path = root / rel
    text = path.read_text()
    if change is None:  # the first number of the file's first data line: '²' for its digit
        lines = text.splitlines(keepends=True)
        i = next(i for i, ln in enumerate(lines)
                 if i > 0 and re.search(r"(?<![\w.])[0-9]", ln) and not ln.startswith("#"))
        lines[i] = re.sub(r"(?<![\w.])[0-9]", "\u00b2", lines[i], count=1)
        path.write_text("".join(lines))
    else:
        assert change[0] in text
        path.write_text(text.replace(change[0], change[1]))
    rc, report = inspect(root, "--require", cid)
    assert report["verdict"]["counts"].get("error", 0) == 0, report["verdict"]["errors"]
    got = findings(report, cid)
    assert {f["status"] for f in got} == {"unknown"}, got
    reason = " ".join(f["reason"] for f in got)
    for text in named:
        assert text in reason, reason
    assert rc == 1


# -- identity and scope ---------------------------------------------------------------------

def test_a_pid_reused_during_the_interval_is_not_the_same_process(tmp_path):
    """t0: the service started at tick 71849; t1: another process with that PID, started
    later, with smaller counters. Its deltas would be negative: they are not taken."""
    from tailgate.collect import Scope, collect
    from tailgate.host import Host
    from tailgate.safe import strict_json

    root = build_root(tmp_path / "root")
    stat = root / f"proc/{PID}/stat"
    fields = stat.read_text().split(") ", 1)
    rest = fields[1].split()
    rest[19] = "71849"
    stat.write_text(fields[0] + ") " + " ".join(rest) + "\n")
    scope = Scope(pids=(PID,), cgroup="/sys/fs/cgroup/svc")
    before = collect(Host(root), scope, 0)
    rest[19] = "99000"
    stat.write_text(fields[0] + ") " + " ".join(rest) + "\n")
    (root / f"proc/{PID}/schedstat").write_text("1000 2000 3\n")
    after = collect(Host(root), scope, 0)
    assert before.fact(f"proc.{PID}.schedstat").value["start_ticks"] == 71849
    assert after.fact(f"proc.{PID}.schedstat").value["start_ticks"] == 99000
    after.before = before.facts
    after.interval_s = 5.0
    path = tmp_path / "snap.json"
    path.write_text(strict_json(after.to_json()))
    out = tmp_path / "report.json"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["inspect", "--quiet", "--from", str(path), "--json", str(out),
                   "--require", "l2.sched.runqlat"])
    report = json.loads(out.read_text())
    (f,) = findings(report, "l2.sched.runqlat")
    assert f["status"] == "unknown" and rc == 1, f
    ctx = f["evidence"][f"pid {PID}"]
    assert isinstance(ctx, str) and "start time 71849 -> 99000" in ctx and "reused" in ctx, ctx
    assert "-" not in json.dumps(f["evidence"]).replace("->", ""), f["evidence"]


def test_an_unreadable_proc_interrupts_is_named_not_no_irqs(tmp_path):
    root = build_root(tmp_path / "root")
    # no msi_irqs: the NIC's IRQs are found only by name in /proc/interrupts
    for d in root.glob("sys/devices/**/msi_irqs"):
        for p in d.iterdir():
            p.unlink()
    interrupts = root / "proc/interrupts"
    interrupts.unlink()
    import os
    os.mkfifo(interrupts)
    rc, report = inspect(root, "--require", "l2.irq.isolation")
    got = findings(report, "l2.irq.isolation")
    assert {f["status"] for f in got} == {"unknown"}, got
    reason = " ".join(f["reason"] for f in got)
    assert "/proc/interrupts" in reason and "FIFO" in reason, reason
    assert "no IRQs found" not in reason
    assert rc == 1


def _by_subject(report: dict) -> dict[tuple[str, str], str]:
    return {(f["id"], f["subject"]): f["status"] for f in report["findings"]}


def test_one_interface_out_of_the_root_leaves_the_others_judged(tmp_path):
    """eth9 links to this machine's /sys: eth9's findings are unknown naming the refusal,
    every other finding is what it was without eth9."""
    import os
    root = build_root(tmp_path / "root")
    _, clean = inspect(root)
    os.symlink("/sys/class/net/lo", root / "sys/class/net/eth9")
    rc, report = inspect(root)
    mine = [f for f in report["findings"] if "eth9" in f["subject"]]
    assert mine and {f["status"] for f in mine} == {"unknown"}, mine
    sysfs = {f["id"]: f["reason"] for f in mine if f["id"] in (
        "l2.irq.isolation", "l2.numa.affinity", "l3.xps.per_core_tx")}
    assert len(sysfs) == 3 and all("eth9" in r and "outside the root" in r
                                   for r in sysfs.values()), sysfs
    was = _by_subject(clean)
    others = {k: s for k, s in _by_subject(report).items() if "eth9" not in k[1]}
    assert others == was


def test_one_pci_device_out_of_the_root_leaves_the_others_judged(tmp_path):
    import os
    root = build_root(tmp_path / "root")
    _, clean = inspect(root)
    os.symlink("/sys/devices/pci0000:00/0000:00:00.0", root / "sys/bus/pci/devices/0000:99:00.0")
    rc, report = inspect(root)
    for cid in ("l1.pcie.bad_tlp", "l1.pcie.link_recovery", "l1.pcie.link_downtrained"):
        bad = [f for f in findings(report, cid) if f["subject"].startswith("0000:99:00.0")]
        assert len(bad) == 1 and bad[0]["status"] == "unknown", (cid, findings(report, cid))
        assert "outside the root" in bad[0]["reason"] and "0000:99:00.0" in bad[0]["reason"], bad
    was = _by_subject(clean)
    others = {k: s for k, s in _by_subject(report).items() if "0000:99:00.0" not in k[1]}
    assert others == was


# -- size -----------------------------------------------------------------------------------

def test_more_interfaces_than_the_cap_are_refused_with_the_reason(tmp_path):
    from tailgate.collect import Scope, collect
    from tailgate.host import Host
    from tailgate.sources.netdev import MAX_IFACES

    root = tmp_path / "root"
    for i in range(MAX_IFACES + 1):
        (root / f"sys/class/net/vf{i}/device").mkdir(parents=True)
    snap = collect(Host(root), Scope(), 0)
    for name in ("nic", "ethtool.fec", "xps", "rps", "tc.qdisc"):
        fact = snap.fact(name)
        assert not fact.ok and f"{MAX_IFACES + 1} network interfaces" in fact.missing, name
        assert f"over the {MAX_IFACES}" in fact.missing and "--iface" in fact.missing
    assert not any(k.startswith("nic.vf") for k in snap.facts)  # nothing per entry was kept
    # at the cap, every interface is judged (each one's own facts, here all absent)
    for i in range(MAX_IFACES, MAX_IFACES + 1):
        (root / f"sys/class/net/vf{i}/device").rmdir()
        (root / f"sys/class/net/vf{i}").rmdir()
    snap = collect(Host(root), Scope(), 0)
    assert snap.fact("nic").ok and len(snap.fact("nic").value) == MAX_IFACES


def test_the_interface_cap_in_a_run(tmp_path):
    from tailgate.sources.netdev import MAX_IFACES

    root = build_root(tmp_path / "root")
    for i in range(MAX_IFACES):  # eth2 and these: one over the cap
        (root / f"sys/class/net/vf{i}/device").mkdir(parents=True)
    rc, report = inspect(root, "--require", "l3.queue.aqm")
    (f,) = findings(report, "l3.queue.aqm")
    assert f["status"] == "unknown" and f"{MAX_IFACES + 1} network interfaces" in f["reason"]
    assert rc == 1 and report["verdict"]["counts"].get("error", 0) == 0


SS_MEMORY = r'''
import json, sys
from pathlib import Path
from support.hostile import PID, build_root
from tailgate.collect import Scope, collectors, run_collector
from tailgate.host import Host

def hwm():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

root = build_root(Path(sys.argv[1]))
line = ("ESTAB 0 0 10.0.0.1:443 10.0.0.{n}:{port} users:((\"other\",pid=7,fd=9))\n"
        "\t skmem:(r0,rb131072,t0,tb87040,f0,w0,o0,bl0,d0) cubic wscale:7,7 rto:204\n")
mine = line.replace("pid=7", f"pid={PID}")
with open(root / "commands/ss_-tmpin_state_established", "w") as fh:
    fh.write("State Recv-Q Send-Q Local Address:Port Peer Address:Port Process\n")
    for i in range(int(sys.argv[2])):
        fh.write((mine if i % 10000 == 0 else line).format(n=i % 250, port=1024 + i % 60000))
size = (root / "commands/ss_-tmpin_state_established").stat().st_size
base = hwm()
facts = run_collector(collectors()["sockets.pid"], Host(root), Scope(pids=(PID,)))
print(json.dumps({"size": size, "grew": hwm() - base,
                  "connections": facts[f"sockets.{PID}"].value["connections"]}))
'''


def test_a_big_ss_capture_costs_at_most_three_bytes_per_byte(tmp_path):
    """A 60 MiB `ss` capture (400k sockets, 40 of the service's): the peak memory of reading
    it grows by at most 3 bytes per byte of input (the text, and its decoded copy), not by
    the number of the host's sockets."""
    import os
    import subprocess
    import sys

    tests = Path(__file__).parent
    proc = subprocess.run([sys.executable, "-c", SS_MEMORY, str(tmp_path / "root"), "400000"],
                          cwd=tests, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    print(got)
    assert got["size"] > 50 * 2**20 and got["connections"] == 40
    assert got["grew"] <= 3 * got["size"], got
