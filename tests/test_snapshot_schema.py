"""``inspect --from``: every fact of a saved snapshot is checked against its schema
(tailgate/schema.py) before it is judged (issue 24).

* the schemas are the collectors' contract: every fact collected from every fixture root
  matches its schema (so a valid snapshot loses nothing);
* a fact of the wrong type, range or shape is refused with the reason, naming the file:
  the findings that read it are ``unknown``, never ``pass``, never ``error``;
* a snapshot of a newer tailgate, or of a version this one cannot read, exits 2;
* property (hypothesis): any mutation of a saved snapshot's values yields, per finding,
  the original status or ``unknown`` (or exit 2) — never a pass from a failing original.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.hostile import PID, ROOTS, build_root
from support.inspect import gate_code
from tailgate.cli import main
from tailgate.collect import Scope, collect, collectors
from tailgate.host import Host
from tailgate.safe import strict_json
from tailgate.schema import index_refusals, refusal, schema_for

SCOPE = Scope(pids=(PID,), cgroup="/sys/fs/cgroup/svc")
# One-sample scenarios laid over the hostile root so the snapshot holds failing findings.
FAILING = ("l1l3-rx-low", "l1l3-pcie-downtrained", "l1l3-rss-asym")


def _collect(root: Path, scope: Scope = SCOPE):
    return collect(Host(root, timeout_s=2.0), scope, 0)


@pytest.fixture(scope="module")
def failing_snapshot(tmp_path_factory) -> Path:
    root = build_root(tmp_path_factory.mktemp("root") / "root")
    for scenario in FAILING:
        shutil.copytree(ROOTS / scenario, root, dirs_exist_ok=True)
    path = root.parent / "snap.json"
    snap = _collect(root)
    snap.interval_s = 5.0  # the two samples, as if 5 s apart: rates are judged (no growth)
    path.write_text(strict_json(snap.to_json()))
    return path


def run_from(path: Path, *args: str) -> tuple[int, str, dict | None]:
    out = path.with_name(path.name + ".report.json")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["inspect", "--quiet", "--from", str(path), "--json", str(out), *args])
    report = json.loads(out.read_text()) if rc in (0, 1) else None
    return rc, err.getvalue(), report


def statuses(report: dict) -> dict[tuple[str, str], dict]:
    return {(f["id"], f["subject"]): f for f in report["findings"]}


# -- the schemas are the collectors' contract ----------------------------------------------

def _roots() -> list[str]:
    return sorted(p.name for p in ROOTS.iterdir() if p.is_dir() and p.name.startswith(
        ("vm-", "l1l3-clean")))


@pytest.mark.parametrize("name", ["hostile", *_roots()])
def test_every_collected_fact_matches_its_schema(name, tmp_path):
    root = build_root(tmp_path / "root") if name == "hostile" else ROOTS / name
    snap = _collect(root, SCOPE if name == "hostile" else Scope())
    checked = 0
    for part in (snap.facts, snap.before):
        for fact_name, fact in part.items():
            if fact.ok:
                assert refusal(fact_name, fact.value) is None, (fact_name, fact.value)
                checked += 1
        # the interface lists name the interfaces whose facts were collected
        assert index_refusals(list(part), {n: f.value for n, f in part.items() if f.ok}) == {}
    assert checked >= (60 if name == "hostile" else 10)


GPU = Path(__file__).parent / "fixtures" / "gpu"


@pytest.mark.parametrize("name", sorted(p.name for p in GPU.glob("nvidia-smi-q-*")) + sorted(
    p.name for p in GPU.glob("dcgm-exporter-*")))
def test_real_gpu_captures_match_the_gpu_health_schema(name):
    # ecc_mode, clock_event_us and xid_last were once missing: every real GPU's
    # gpu.health was refused on --from
    from tailgate.sources import engine, gpu

    text = (GPU / name).read_text()
    gpus = (gpu.parse_smi_health(text) if name.startswith("nvidia-smi")
            else gpu.parse_dcgm(engine.parse_exposition(text)))
    assert gpus and refusal("gpu.health", {"source": name, "gpus": gpus, "tried": {}}) is None


def test_every_collector_has_a_schema():
    for name, c in collectors().items():
        # a multi collector's own fact is its list of entries (or it only names others)
        assert schema_for(name) is not None or (c.multi and name in (
            "pressure", "sysctl", "cgroup.cpu", "proc.pid.status", "proc.pid.schedstat",
            "proc.pid.io_uring", "proc.pid.numa_maps", "proc.pid.gpus", "probe",
            "sockets.pid")), name


def test_a_valid_snapshot_is_judged_as_it_was(failing_snapshot):
    rc, err, report = run_from(failing_snapshot)
    assert err == "" and rc == 1
    got = {f["status"] for f in report["findings"]}
    assert "fail" in got and "pass" in got
    assert not [f for f in report["findings"] if "refused" in f["reason"]]


# -- wrong types, ranges and shapes -----------------------------------------------------------

CASES = {  # fact, a wrong value, the finding that reads it, what the reason must say
    "net.dev as a string": ("net.dev", "lots", "l2.net.drop_rate",
                            "net.dev: expected an object, got a string"),
    "a counter as a list": ("net.snmp", {"Tcp": {"RetransSegs": [1], "OutSegs": 5}},
                            "l2.net.retransmit_rate", "net.snmp['Tcp'].RetransSegs: "
                            "expected an integer, got a list"),
    "an absurd counter": ("net.snmp", {"Tcp": {"RetransSegs": 10**30, "OutSegs": 5}},
                          "l2.net.retransmit_rate", "is outside 0 .. 18446744073709551615"),
    "a CPU id beyond NR_CPUS": (f"proc.{PID}.status", {
        "name": "svc", "cpus_allowed": [0, 99999], "mems_allowed": [0], "threads": 4,
        "rss_bytes": 1}, "l2.numa.affinity", "cpus_allowed[1]: 99999 is outside 0 .. 8191"),
    "an unknown key": ("ethtool.rss.eth2", lambda r: {**r, "key_v2": "6d5a"},
                       "l3.rss.symmetric", "unexpected key 'key_v2'"),
    "a number for a boolean": ("ethtool.module.eth2",
                               lambda m: {**m, "attached_cable": 1}, "l1.optics.rx_power",
                               "attached_cable: expected true or false, got an integer"),
    "an absurd power reading": ("ethtool.module.eth2", lambda m: {**m, "rx_power": [
        {**m["rx_power"][0], "dbm": 1e300}]}, "l1.optics.rx_power", "is outside -60 .. 30"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_fact_of_the_wrong_shape_is_refused(case, failing_snapshot, tmp_path):
    name, value, cid, why = CASES[case]
    data = json.loads(failing_snapshot.read_text())
    assert name in data["facts"], sorted(data["facts"])
    old = data["facts"][name]["value"]
    data["facts"][name] = {"value": value(old) if callable(value) else value}
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    rc, err, report = run_from(path, "--require", cid)
    assert err == "" and rc == 1  # the required id is not measured
    assert cid in [u["id"] for u in report["verdict"]["unmet_required"]]
    got = [f for f in report["findings"] if f["id"] == cid]
    assert got and {f["status"] for f in got} == {"unknown"}, got
    reason = " ".join(f["reason"] for f in got)
    assert str(path) in reason and why in reason and "refused" in reason, reason


def test_a_newer_or_unreadable_version_exits_2(failing_snapshot, tmp_path):
    for version, words in (("99.0.0", "newer than this one"),
                           ("tailgate-next", "not a version this tailgate knows")):
        data = json.loads(failing_snapshot.read_text())
        data["version"] = version
        # a reshaped fact under a new name: were it read as "no such fact" a fallback passes
        data["facts"]["net.dev.v2"] = {"value": {"lo": [1, 2, 3]}}
        path = tmp_path / "snap.json"
        path.write_text(json.dumps(data))
        rc, err, _ = run_from(path)
        assert rc == 2 and len(err.splitlines()) == 1 and words in err and str(path) in err, err


def test_a_fact_no_collector_writes_is_refused(failing_snapshot, tmp_path):
    data = json.loads(failing_snapshot.read_text())
    data["facts"]["net.dev.v2"] = {"value": {"lo": [1, 2, 3]}}
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    assert refusal("net.dev.v2", {"lo": [1, 2, 3]}) == "fact 'net.dev.v2': no such fact in " \
        "this tailgate"
    rc, err, report = run_from(path)
    assert err == "" and rc == 1


def test_a_key_twice_in_a_snapshot_exits_2(failing_snapshot, tmp_path):
    text = failing_snapshot.read_text()
    path = tmp_path / "snap.json"
    path.write_text(text.replace('"tailgate_snapshot": 1', '"tailgate_snapshot": 1, '
                                 '"interval_s": 1, "interval_s": 2', 1))
    rc, err, _ = run_from(path)
    assert rc == 2 and "'interval_s' appears twice" in err and len(err.splitlines()) == 1, err


# -- what the property found (issue 24): each as a concrete mutant of the same baseline ----

def _mutate(data: dict, part: str, name: str, path: tuple, value) -> None:
    target = data[part][name]["value"]
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value


UP = "0000:80:01.0"
FOUND = {  # (part, fact, path, value), the check, {subject: what its reason must say}
    # pci.aer refused: the upstream ports, whose only recovery stand-in is AER, were left
    # out of l1.pcie.link_recovery (no finding at all) instead of unknown
    "AER refused: upstream ports": (
        ("facts", "pci.aer", ("counters",), [0]), "l1.pcie.link_recovery",
        {f"{b} upstream": "AER unreadable (" for b in (UP, "0000:c0:01.0", "0000:e0:01.0")}),
    # one upstream port's AER counters without Rollover or Timeout (its only stand-in):
    # its l1.pcie.link_recovery vanished, and no other finding of the check was unknown
    "AER counters without a recovery stand-in": (
        ("facts", "pci.aer", ("counters", UP), {"v": 1}), "l1.pcie.link_recovery",
        {f"{UP} upstream": "its AER counters have neither Rollover nor Timeout"}),
    # a Tcp line without OutSegs: a KeyError in l2.net.retransmit_rate, an error (exit 3)
    "a Tcp line without OutSegs": (
        ("facts", "net.snmp", ("Tcp",), {"RetransSegs": 1}), "l2.net.retransmit_rate",
        {"host": "/proc/net/snmp: no Tcp OutSegs in the later sample"}),
    "a Tcp counter of no kernel name": (
        ("facts", "net.snmp", ("Tcp",), {"v": 1}), "l2.net.retransmit_rate",
        {"host": "net.snmp: a counter name that is not the kernel's"}),
    # an interface list naming an interface the snapshot has no facts of: eth2's failing
    # rx_power vanished for an unknown about "list" (a name no collector read)
    "an interface list of another interface": (
        ("facts", "ethtool.module", (0,), "list"), "l1.optics.rx_power",
        {"host": "ethtool.module: lists ['list'] but holds the facts of ['eth2']"}),
    # the max width a chain of mutations left at 1 while its sysfs text says 16: the NIC's
    # link judged x8 of x1, "full capability" (a pass from a fail)
    "a link width its raw text denies": (
        ("facts", "pci.links", ("links", UP, "max_width"), 1), "l1.pcie.link_downtrained",
        {"host": f"pci.links.links['{UP}']: a speed or width that is not what its raw"}),
    "a link speed its raw text denies": (
        ("facts", "pci.links", ("links", "0000:c1:00.0", "current_gts"), 1),
        "l1.pcie.link_downtrained", {"host": "that is not what its raw sysfs text"}),
    # a cgroup path that is no path: its own subject, judged (warn) from the mutant alone
    "a cgroup path that is a number": (
        ("facts", "cgroup.pid.4242", ("path",), "18446744073709551616"),
        "l2.cgroup.throttling",
        {"pid 4242": "cgroup.pid.4242.path: '18446744073709551616' is not of the form /"}),
    # the earlier cpu.stat without nr_throttled: its counters read as 0, growth since boot
    # (3 throttled periods) judged a fail
    "an earlier cpu.stat of other keys": (
        ("before", "cgroup.target", ("stat",), {"0": 73899}), "l2.cgroup.throttling",
        {"/sys/fs/cgroup/svc": "the earlier sample: "}),
    # RAM of 2^64 bytes: tcp_mem became "0.00 % of RAM", a warn from a pass
    "RAM beyond any physical address space": (
        ("facts", "proc.meminfo", ("MemTotal",), 2**64), "l2.tcp.mem_sizing",
        {"host": "proc.meminfo: no MemTotal in 1 byte .. 4 PiB"}),
    # an idle interface's counters as 1 packet of 0 bytes: the drop rate went unknown -> pass
    "a packet without bytes": (
        ("facts", "net.dev", ("ifb0", "rx_packets"), 1), "l2.net.drop_rate",
        {"host": "implausible: ifb0 rx_packets grew by 1 but rx_bytes by 0"}),
    # one RX ring under a table spreading over 12: "one ring, nothing to spread", a skip
    "an RSS table beyond its rings": (
        ("facts", "ethtool.rss.eth2", ("rings",), 1), "l3.rss.symmetric",
        {"eth2": "an indirection table entry names a ring beyond the RX rings"}),
    # the weak lane's dBm as 1 beside its 0.0562 mW: the fail became a pass
    "a power reading whose mW and dBm disagree": (
        ("facts", "ethtool.module.eth2", ("rx_power", 2, "dbm"), 1), "l1.optics.rx_power",
        {"eth2": "rx_power[2]: mw and dbm are not one reading"}),
    # clock event reasons under a name no source writes: unknown became "no slowdown", a pass
    "a clock event reason of no source": (
        ("facts", "gpu.health", ("gpus", "0000:c1:00.0", "clock_events"), {"v": True}),
        "l1.gpu.clock_events", {"host": "clock_events key: 'v' is none of 'idle'"}),
    # the unreadable NVLink source renamed: unknown became "no NVLink on this GPU", a skip
    "an unreadable source of no name": (
        ("facts", "gpu.health", ("gpus", "0000:c1:00.0", "unreadable"), {"v": "object"}),
        "l1.gpu.nvlink", {"host": "unreadable key: 'v' is none of 'nvlink', 'nvlink_state'"}),
    # nr_throttled grew by 2 while nr_periods did not: impossible, was judged a fail
    "more throttled periods than periods": (
        ("before", "cgroup.target", ("stat", "nr_throttled"), 1), "l2.cgroup.throttling",
        {"/sys/fs/cgroup/svc": "implausible: nr_throttled grew by 2 but nr_periods by 0"}),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_what_the_property_found(case, failing_snapshot, tmp_path):
    (part, name, path, value), cid, want = FOUND[case]
    data = json.loads(failing_snapshot.read_text())
    rc, _, report = run_from(failing_snapshot)
    was = {f["subject"]: f["status"] for f in report["findings"] if f["id"] == cid}
    _mutate(data, part, name, path, value)
    mutant = tmp_path / "snap.json"
    mutant.write_text(json.dumps(data))
    rc, err, report = run_from(mutant)
    assert err == "" and rc == 1
    now = {f["subject"]: f for f in report["findings"] if f["id"] == cid}
    for subject, why in want.items():
        assert subject in now, (subject, sorted(now))
        assert now[subject]["status"] == "unknown" and why in now[subject]["reason"], now[subject]
    for subject, f in now.items():  # the rest keep their status or say they cannot tell
        assert f["status"] == "unknown" or f["status"] == was.get(subject), (subject, f)


# -- property: mutations never turn a finding into a pass -----------------------------------

def _leaves(value, path=()):
    """Every path to a value inside ``value`` (the value itself included), None left out."""
    if value is None:
        return
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))


def _mutants(v) -> list:
    """Values of another JSON type, or beyond every range a schema allows, for ``v``."""
    big, small = 2**64, -(2**63) - 1
    if isinstance(v, bool):
        return [int(v), str(v).lower(), [v], {"v": v}]
    if isinstance(v, int):
        return [str(v), float(v) + 1e300, big, small, True, [v] * 2, {"v": v}]
    if isinstance(v, float):
        return [str(v), 1e300, -1e300, big, True, [v], {"v": v}]
    if isinstance(v, str):
        return [big, 1e300, True, [v], {"v": v}]
    if isinstance(v, list):
        return [{"0": v[0] if v else 0}, "list", big, True]
    if isinstance(v, dict):
        return [list(v.values())[:1] or [0], "object", big, True,
                {**v, "zz_unexpected": {"junk": [[]]}}]
    raise AssertionError(v)


@pytest.fixture(scope="module")
def baseline_run(failing_snapshot):
    data = json.loads(failing_snapshot.read_text())
    rc, err, report = run_from(failing_snapshot)
    assert report is not None and rc == gate_code(report) and err == ""
    targets = [(part, name, path) for part in ("facts", "before")
               for name, fact in sorted(data[part].items()) if "value" in fact
               for path in _leaves(fact["value"])]
    return data, statuses(report), targets


def _set(value, path, new):
    if not path:
        return new
    parent = value
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = new
    return value


@settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(st.data())
def test_mutated_snapshots_never_pass_what_failed(baseline_run, tmp_path, data):
    original, was, targets = baseline_run
    snap = copy.deepcopy(original)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        part, name, path = data.draw(st.sampled_from(targets), label="where")
        fact = snap[part][name]
        try:  # an earlier mutation may have replaced a container on this path
            now = fact["value"]
            for k in path:
                now = now[k]
        except (KeyError, IndexError, TypeError):
            continue
        # A mutant of the original value, never of an earlier mutant: a mutant's mutant can
        # be a plausible value of the right type ([2] -> True -> 1: another CPU for an XPS
        # queue), another snapshot rather than a broken one, judged as such. The chains
        # that found defects are regression tests (test_what_the_property_found).
        old = original[part][name]["value"]
        for k in path:
            old = old[k]
        new = data.draw(st.sampled_from(_mutants(old)), label=f"{part}.{name}{list(path)}")
        fact["value"] = _set(fact["value"], path, new)
    path = tmp_path / "mutant.json"
    path.write_text(json.dumps(snap))
    rc, err, report = run_from(path)
    if rc == 2:
        assert len(err.splitlines()) == 1 and str(path) in err, err
        return
    assert report is not None and rc == gate_code(report) and err == "", err
    now = statuses(report)
    for key, f in now.items():
        assert f["status"] != "error", f
        before = was.get(key)
        if before is None:  # a subject only the mutant has: it cannot be judged
            assert f["status"] in ("unknown", "skip"), f
        else:
            assert f["status"] in (before["status"], "unknown"), (key, before["status"], f)
    for key, f in was.items():
        if key not in now and f["status"] not in ("unknown", "skip"):
            # a judged subject that vanished: its check must say it could not tell
            assert any(k[0] == key[0] and g["status"] == "unknown" for k, g in now.items()), key
