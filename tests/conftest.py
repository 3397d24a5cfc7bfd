"""Suite-wide guard: a finding with status ``error`` anywhere in the suite fails it.

An ``error`` finding means a check or a parser of tailgate raised: a defect, not a
fact about the host. Every judgment made during the tests is watched:

* in this process, ``tailgate.judge.run_check`` is wrapped (``judge()`` calls it
  for every id), so a fixture root, corpus file or fuzz case judged in-process is seen;
* in subprocesses (``python -m tailgate inspect`` run by CLI tests), tailgate appends
  each error finding to ``$TAILGATE_ERROR_LOG``, which is set here for the session.

The test during which an error finding appeared fails at teardown with the finding;
one that appeared outside any test fails the session. A test that makes error
findings on purpose (to test the error status itself) says so with
``@pytest.mark.expect_error_findings``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

import tailgate.judge
from tailgate.verdict import ERROR_LOG_ENV

_LOG = Path(tempfile.mkstemp(prefix="tailgate-error-findings-", suffix=".jsonl")[1])
os.environ[ERROR_LOG_ENV] = str(_LOG)
_checked = 0  # bytes of the log already attributed to a test
_orphans: list[str] = []  # error findings logged between tests (a module fixture's run)
_original_run_check = tailgate.judge.run_check


def _log_errors(where: str, findings) -> None:
    errors = [f for f in findings if f.status == "error"]
    if errors:
        with open(_LOG, "a", encoding="utf-8") as fh:
            for f in errors:
                fh.write(json.dumps({"where": where, **f.to_json()}, default=str) + "\n")


def _watched_run_check(check_id, fn, snap, params):
    findings = _original_run_check(check_id, fn, snap, params)
    _log_errors("judge (in the test process)", findings)
    return findings


tailgate.judge.run_check = _watched_run_check


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "expect_error_findings: this test makes error findings on purpose")
    config.addinivalue_line(
        "markers", "unit: needs no root, server, network, bpftrace or compiler (make check)")
    config.addinivalue_line(
        "markers", "integration: in a unit module, but needs a server, a namespace or a live "
        "process's every library: left out of make check")


# The modules of `make check`: parsers, checks, codecs and pure computation, fed fixtures and
# captured formats. Everything else needs root, a real server, bpftrace or a namespace.
UNIT_MODULES = frozenset("""
    test_alloc_units test_bench_confidence test_bench_units test_collective_units
    test_compare test_diagnose_accounting_units test_diagnose_engine_units test_diagnose_units
    test_dpdk_parsers test_error_tree test_errors test_fleet_view test_hist test_layering
    test_http1_codec test_l1_checks test_l1_parsers test_l2_checks test_l2_parsers
    test_l3_checks test_l3_parsers test_llm_units test_pcie_link test_plan_fanout
    test_plan_kv test_plan_library test_plan_readme test_plan_specdec test_probe_units test_readme
    test_require test_sched_units
    test_user_yaml test_verdict
""".split())


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    """Under ``-m unit`` (make check) the other modules are not even imported: collecting the
    whole suite costs more than a third of the fast loop."""
    if (config.getoption("markexpr") == "unit" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_")
            and collection_path.stem not in UNIT_MODULES):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (item.module is not None and item.module.__name__.rpartition(".")[2] in UNIT_MODULES
                and item.get_closest_marker("integration") is None):
            item.add_marker(pytest.mark.unit)


def _new_lines() -> list[str]:
    global _checked
    size = _LOG.stat().st_size if _LOG.exists() else 0
    if size <= _checked:
        return []
    with open(_LOG, encoding="utf-8") as fh:
        fh.seek(_checked)
        text = fh.read()
    _checked = size
    return [line for line in text.splitlines() if line.strip()]


def _describe(lines: list[str]) -> str:
    out = []
    for line in lines[:10]:
        try:
            f = json.loads(line)
            out.append(f"  {f.get('id')} [{f.get('subject')}] in {f.get('where')}: {f.get('reason')}")
        except ValueError:
            out.append(f"  {line[:200]}")
    more = f"\n  ... and {len(lines) - 10} more" if len(lines) > 10 else ""
    return "\n".join(out) + more


@pytest.fixture(autouse=True)
def _no_error_findings(request: pytest.FixtureRequest):
    _orphans.extend(_new_lines())  # logged between tests: reported at session end
    yield
    lines = _new_lines()
    if lines and request.node.get_closest_marker("expect_error_findings") is None:
        pytest.fail("tailgate produced error findings (a check or parser raised):\n"
                    + _describe(lines), pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    lines = _orphans + _new_lines()
    if lines:
        print("\ntailgate produced error findings outside any test:\n" + _describe(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _LOG.unlink(missing_ok=True)
