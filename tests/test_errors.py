"""Errors are not unknowns: a check or collector that raises is an `error` finding, a
failing multi-fact collector names every fact it was to produce, and the CLI turns
errors into exit statuses in one place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tailgate.commands.catalog
from tailgate.baseline import default_baseline
from tailgate.cli import main
from tailgate.collect import Collector, Scope, run_collector
from tailgate.errors import EXIT_BUG, EXIT_GATE, EXIT_OK, EXIT_USAGE, ParseError, SourceError
from tailgate.host import Host
from tailgate.judge import judge, run_check
from tailgate.model import Fact, Result, Snapshot

TESTS = Path(__file__).parent


def snap(facts: dict[str, Fact], pids=(), before: dict[str, Fact] | None = None) -> Snapshot:
    return Snapshot(host={"hostname": "t"}, target={"pids": list(pids)}, interval_s=1.0,
                    taken_at=0.0, facts=facts, before=before or {})


def by_id(findings, check_id):
    return [f for f in findings if f.id == check_id]


@pytest.mark.expect_error_findings
def test_a_check_that_raises_is_an_error_with_the_exception_and_the_id():
    def broken(s, p):
        return {"a": 1}["missing key"]

    (f,) = run_check("l2.net.drop_rate", broken, snap({}), {"limit": 0.005})
    assert f.status == "error" and f.id == "l2.net.drop_rate"
    assert "check l2.net.drop_rate raised KeyError: 'missing key'" in f.reason
    assert f.evidence["exception"] == "KeyError: 'missing key'" and f.evidence["traceback"]


@pytest.mark.expect_error_findings
def test_a_check_returning_garbage_is_an_error_not_unknown():
    (f,) = run_check("l2.net.drop_rate", lambda s, p: "pass", snap({}), {"limit": 0.005})
    assert f.status == "error" and "not Result objects" in f.reason
    (f,) = run_check("l2.net.drop_rate", lambda s, p: [], snap({}), {"limit": 0.005})
    assert f.status == "error" and "no result" in f.reason


def test_unknown_and_a_precise_parse_error_stay_unknown():
    def parse_fails(s, p):
        raise ParseError("tcp_mem: expected 3 integers, got 2")

    (f,) = run_check("l2.tcp.mem_sizing", parse_fails, snap({}), {})
    assert f.status == "unknown" and f.reason == "tcp_mem: expected 3 integers, got 2"
    (f,) = run_check("l2.net.drop_rate", lambda s, p: Result("pass"), snap({}), {})
    assert f.status == "pass"


def _collector(fn, multi=False, names=None):
    return Collector("proc.pid.status", fn, counter=False, multi=multi, names=names)


NAMES = lambda t: [f"proc.{pid}.status" for pid in t.pids]  # noqa: E731


def test_a_failing_multi_collector_reports_each_fact_with_the_reason():
    def unreadable(host, target):
        raise SourceError("/proc: permission denied (run as root)")

    facts = run_collector(_collector(unreadable, True, NAMES), Host("/"), Scope(pids=(7, 9)))
    assert set(facts) == {"proc.pid.status", "proc.7.status", "proc.9.status"}
    assert all(f.missing == "/proc: permission denied (run as root)" and not f.error
               for f in facts.values())
    s = snap({**facts, "nic": Fact(value=["eth9"]), "nic.eth9": Fact(value={
        "iface": "eth9", "virtual": False, "numa_node": 0, "local_cpus": [0, 1], "irqs": [],
        "irq_affinity": {}}), "numa.nodes": Fact(value=[0])}, pids=(7, 9))
    found = by_id(judge(s, default_baseline()), "l2.numa.affinity")
    assert [f.status for f in found] == ["unknown", "unknown"]
    assert all("permission denied" in f.reason for f in found)


@pytest.mark.expect_error_findings
def test_a_crashing_collector_makes_error_facts_and_error_findings():
    def crashes(host, target):
        return int("not a number")

    facts = run_collector(_collector(crashes, True, NAMES), Host("/"), Scope(pids=(7,)))
    assert facts["proc.7.status"].error
    assert "collector proc.pid.status raised ValueError" in facts["proc.7.status"].missing
    s = snap({**facts, "nic": Fact(value=[])}, pids=(7,))
    (f,) = by_id(judge(s, default_baseline()), "l2.numa.affinity")
    assert f.status == "error" and "tailgate bug" in f.reason
    assert f.evidence["crashed_facts"] == {"proc.7.status": facts["proc.7.status"].missing}


@pytest.mark.expect_error_findings
def test_a_check_that_passes_around_a_crashed_fact_still_reports_the_error():
    def reads_then_passes(s, p):
        s.fact("net.snmp")  # crashed, but the check goes on without it
        return Result("pass")

    crashed = Fact(missing="tailgate bug: collector net.snmp raised KeyError: 'Tcp'", error=True)
    found = run_check("l2.net.drop_rate", reads_then_passes, snap({"net.snmp": crashed}), {})
    assert [f.status for f in found] == ["pass", "error"]
    assert "net.snmp" in found[1].reason


def test_a_fact_of_a_failed_collector_names_the_collectors_reason():
    s = snap({"ethtool.fec": Fact(missing="`ethtool` is not installed")})
    assert s.fact("ethtool.fec.eth0").missing == "`ethtool` is not installed"
    assert "was not collected" in s.fact("ethtool.phy.eth0").missing


def test_error_facts_survive_a_saved_snapshot():
    fact = Fact(missing="tailgate bug: x raised KeyError", error=True)
    assert Fact.from_json(json.loads(json.dumps(fact.to_json()))) == fact
    assert Fact.from_json(Fact(missing="absent").to_json()).error is False


# -- the CLI -------------------------------------------------------------------------------------

def _write_snapshot(path: Path, facts: dict[str, dict], pids=()) -> str:
    path.write_text(json.dumps({"tailgate_snapshot": 1, "host": {"hostname": "t"},
                                "target": {"pids": list(pids)}, "interval_s": 0.0,
                                "taken_at": 0.0, "facts": facts}))
    return str(path)


def _inspect(*args: str, log: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k != "TAILGATE_ERROR_LOG"}
    if log is not None:
        env["TAILGATE_ERROR_LOG"] = str(log)
    return subprocess.run([sys.executable, "-m", "tailgate", "inspect", *args, "--json", "-"],
                          capture_output=True, text=True, timeout=60, env=env)


def test_cli_a_report_with_an_error_exits_3_and_logs_it(tmp_path):
    crashed = {"missing": "tailgate bug: collector proc.pid.status raised KeyError: 'x'",
               "error": True}
    path = _write_snapshot(tmp_path / "s.json", {"proc.1.status": crashed, "nic": {"value": []}},
                           pids=[1])
    log = tmp_path / "errors.jsonl"
    proc = _inspect("--from", path, log=log)
    assert proc.returncode == EXIT_BUG, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["verdict"]["status"] == "error"
    # every check that read the crashed fact, and no other
    assert [e["id"] for e in rep["verdict"]["errors"]] == ["l2.numa.affinity", "l2.irq.isolation"]
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["id"] for e in logged] == ["l2.numa.affinity", "l2.irq.isolation"]
    assert {e["status"] for e in logged} == {"error"}


def test_cli_incomplete_report_gate_by_fail_on_and_require(tmp_path):
    # Nothing collected: nothing fails, most ids are unknown with their reason.
    path = _write_snapshot(tmp_path / "s.json", {})
    proc = _inspect("--from", path)
    assert proc.returncode == EXIT_OK, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["verdict"]["status"] == "incomplete"
    unmeasured = {u["id"] for u in rep["verdict"]["unmeasured"]}
    assert "l2.sched.runqlat" in unmeasured and "l2.net.drop_rate" in unmeasured
    assert _inspect("--from", path, "--fail-on", "unknown").returncode == EXIT_GATE
    assert _inspect("--from", path, "--fail-on", "warn").returncode == EXIT_OK

    proc = _inspect("--from", path, "--require", "l2.sched.runqlat", "l2.net.drop_rate",
                    "--require", "l1.clock.ptp")
    assert proc.returncode == EXIT_GATE
    assert [u["id"] for u in json.loads(proc.stdout)["verdict"]["unmet_required"]] == [
        "l1.clock.ptp", "l2.sched.runqlat", "l2.net.drop_rate"]  # catalog order
    baseline = tmp_path / "b.yaml"
    baseline.write_text("l4.kv.quantization: {required: true}\n")  # skipped without --engine
    proc = _inspect("--from", path, "--baseline", str(baseline))
    assert proc.returncode == EXIT_GATE
    assert json.loads(proc.stdout)["verdict"]["unmet_required"][0]["statuses"] == ["skip"]

    proc = _inspect("--from", path, "--require", "l9.nothing")
    assert proc.returncode == EXIT_USAGE and "--require l9.nothing: unknown check id" in proc.stderr
    baseline.write_text("l2.sched.runqlat: {enabled: false}\n")
    proc = _inspect("--from", path, "--baseline", str(baseline), "--require", "l2.sched.runqlat")
    assert proc.returncode == EXIT_USAGE and "disabled by the baseline" in proc.stderr


def test_cli_terminal_names_what_stayed_unmeasured(tmp_path):
    path = _write_snapshot(tmp_path / "s.json", {})
    env = {k: v for k, v in os.environ.items() if k != "TAILGATE_ERROR_LOG"}
    proc = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--from", path],
                          capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "200"})
    assert proc.returncode == EXIT_OK
    assert "verdict: INCOMPLETE" in proc.stdout
    assert "l2.sched.runqlat:" in proc.stdout and "--probe-window" in proc.stdout


def test_cli_an_unexpected_exception_exits_3_not_1(monkeypatch, capsys):
    def crash(args):
        raise KeyError("boom")

    monkeypatch.setattr(tailgate.commands.catalog, "run_checks", crash)
    assert main(["checks"]) == EXIT_BUG
    err = capsys.readouterr().err
    assert "KeyError: 'boom'" in err and "internal error (a bug in tailgate" in err


def test_cli_errors_carry_their_exit_status(tmp_path):
    bad = tmp_path / "b.yaml"
    bad.write_text("l2.net.drop_rate: {limit: fast}\n")
    proc = _inspect("--baseline", str(bad), "--interval", "0")
    assert proc.returncode == EXIT_USAGE and "b.yaml:1: key l2.net.drop_rate.limit" in proc.stderr


def test_commands_do_not_import_the_cli():
    for path in (TESTS.parent / "src" / "tailgate").rglob("*.py"):
        if path.name not in ("cli.py", "__main__.py"):
            assert "from ..cli import" not in path.read_text(), path


# -- the suite-wide guard itself ---------------------------------------------------------------

GUARDED = '''
import pytest
from tailgate.baseline import default_baseline
from tailgate.judge import judge
from tailgate.model import Fact, Snapshot

def crashed():
    fact = Fact(missing="tailgate bug: collector proc.pid.status raised KeyError", error=True)
    return Snapshot(host={}, target={"pids": [1]}, interval_s=1.0, taken_at=0.0,
                    facts={"proc.1.status": fact, "nic": Fact(value=[])})

def test_judges_a_crashed_fact():
    judge(crashed(), default_baseline())  # asserts nothing: the guard must catch it

@pytest.mark.expect_error_findings
def test_on_purpose():
    judge(crashed(), default_baseline())
'''


def test_the_suite_fails_when_any_finding_is_an_error(tmp_path):
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    env = {k: v for k, v in os.environ.items() if k != "TAILGATE_ERROR_LOG"}
    # the tailgate under test, whatever the subprocess's working directory
    src = str(Path(tailgate.commands.catalog.__file__).parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 passed, 1 error" in proc.stdout  # the marked test is not flagged
    assert "ERROR test_guarded.py::test_judges_a_crashed_fact" in proc.stdout
    assert "l2.numa.affinity [host] in judge (in the test process)" in proc.stdout
