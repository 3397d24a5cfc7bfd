"""Verdict and gate on constructed findings: every status, error, --fail-on, required ids.

The gate is tested on findings built here, not through a host whose state happens
to fail: each case states the findings and the verdict and exit status it must give.
"""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from tailgate.baseline import BaselineError, catalog, load_baseline
from tailgate.errors import EXIT_BUG, EXIT_GATE, EXIT_OK
from tailgate.model import STATUSES, Finding, Snapshot
from tailgate.report.html import render_html
from tailgate.report.json_report import render_json
from tailgate.report.junit import render_junit
from tailgate.report.terminal import print_report
from tailgate.verdict import build_report, exit_status, verdict

SNAP = Snapshot(host={"hostname": "t"}, target={}, interval_s=1.0, taken_at=0.0)
IDS = {"L1": "l1.pcie.bad_tlp", "L2": "l2.sched.runqlat", "L3": "l3.queue.aqm",
       "L4": "l4.kv.quantization"}


def f(status: str, layer: str = "L2", check_id: str | None = None, reason: str = "") -> Finding:
    cid = check_id or IDS[layer]
    return Finding(id=cid, layer=catalog()[cid].layer, title="t", status=status, subject="host",
                   observed=None, limit=None, unit="", reason=reason or f"{status} here",
                   evidence={}, remedy="r")


def report(*findings: Finding, required=()):
    return build_report(SNAP, list(findings), required)


@pytest.mark.parametrize(("statuses", "expected"), [
    (["pass"], "pass"),
    (["pass", "skip"], "pass"),
    (["skip"], "pass"),
    (["pass", "unknown"], "incomplete"),
    (["unknown", "skip"], "incomplete"),
    (["pass", "warn", "unknown"], "warn"),
    (["pass", "warn", "fail", "unknown"], "fail"),
    (["pass", "error"], "error"),
    (["fail", "error", "unknown"], "error"),
])
def test_verdict_status(statuses, expected):
    assert verdict([f(s) for s in statuses]).status == expected


def test_counts_cover_every_status_including_error():
    v = verdict([f(s) for s in STATUSES])
    assert v.counts == {s: 1 for s in STATUSES}
    assert "error" in STATUSES and v.status == "error"


def test_incomplete_names_each_unmeasured_id_with_what_would_measure_it():
    v = verdict([f("pass", "L1"), f("unknown", "L2", reason="no probe window")])
    assert v.status == "incomplete" and v.first_failing_layer is None
    (u,) = v.unmeasured
    assert u["id"] == "l2.sched.runqlat" and u["reason"] == "no probe window"
    assert "--probe-window" in u["needs"] and "bpftrace" in u["needs"]


def test_every_catalog_id_says_what_it_takes_to_measure_it():
    assert all(e.needs for e in catalog().values()), \
        [e.id for e in catalog().values() if not e.needs]


def test_first_failing_layer_is_the_lowest():
    v = verdict([f("fail", "L3"), f("fail", "L2"), f("warn", "L1")])
    assert v.status == "fail" and v.first_failing_layer == "L2"


@pytest.mark.parametrize(("statuses", "fail_on", "code"), [
    (["pass", "skip"], "fail", EXIT_OK),
    (["pass", "skip"], "unknown", EXIT_OK),
    (["pass", "unknown"], "fail", EXIT_OK),
    (["pass", "unknown"], "warn", EXIT_OK),
    (["pass", "unknown"], "unknown", EXIT_GATE),
    (["warn"], "fail", EXIT_OK),
    (["warn"], "warn", EXIT_GATE),
    (["warn"], "unknown", EXIT_GATE),
    (["fail"], "fail", EXIT_GATE),
    (["fail"], "unknown", EXIT_GATE),
    (["pass", "error"], "fail", EXIT_BUG),
    (["fail", "error"], "fail", EXIT_BUG),
    (["error"], "unknown", EXIT_BUG),
])
def test_exit_status(statuses, fail_on, code):
    assert exit_status(report(*(f(s) for s in statuses)), fail_on) == code


def test_exit_status_refuses_an_unknown_threshold():
    with pytest.raises(ValueError, match="fail_on"):
        exit_status(report(f("pass")), "skip")


@pytest.mark.parametrize("status", ["unknown", "skip", "error"])
def test_a_required_id_that_was_not_measured_fails_the_gate(status):
    rep = report(f("pass", "L1"), f(status, "L2"), required=["l2.sched.runqlat"])
    (unmet,) = rep.verdict.unmet_required
    assert unmet["id"] == "l2.sched.runqlat" and unmet["statuses"] == [status]
    assert exit_status(rep, "fail") == (EXIT_BUG if status == "error" else EXIT_GATE)
    if status == "skip":
        assert rep.verdict.status == "incomplete"  # skipped alone is no pass when required


def test_a_required_id_that_was_measured_does_not_fail_the_gate():
    rep = report(f("pass", "L1"), f("warn", "L2"), required=["l2.sched.runqlat", "l1.pcie.bad_tlp"])
    assert rep.verdict.unmet_required == () and exit_status(rep, "fail") == EXIT_OK
    assert rep.verdict.required == ("l2.sched.runqlat", "l1.pcie.bad_tlp")


def test_a_required_id_with_one_unmeasured_subject_is_unmet():
    rep = report(f("pass", "L2"), f("unknown", "L2", reason="pid 7 exited"),
                 required=["l2.sched.runqlat"])
    assert rep.verdict.unmet_required[0]["reason"] == "pid 7 exited"
    assert exit_status(rep) == EXIT_GATE


def test_a_required_id_without_any_finding_is_unmet():
    rep = report(f("pass", "L1"), required=["l3.queue.aqm"])
    assert rep.verdict.unmet_required[0]["reason"] == "no finding"
    assert exit_status(rep) == EXIT_GATE


def test_baseline_required_and_its_errors(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("l2.sched.runqlat: {required: true, limit: 300}\nl1.clock.ptp: {required: false}\n")
    b = load_baseline(str(path))
    assert b.required == frozenset({"l2.sched.runqlat"}) and b.params["l2.sched.runqlat"]["limit"] == 300
    path.write_text("l2.sched.runqlat: {required: yes please}\n")
    with pytest.raises(BaselineError,
                       match=r"b.yaml:1: key l2.sched.runqlat.required: expected true or false"):
        load_baseline(str(path))
    path.write_text("l1.clock.ptp: {required: true, enabled: false}\n")
    with pytest.raises(BaselineError, match="both required and disabled"):
        load_baseline(str(path))


def test_renderers_show_error_and_incomplete():
    bug = f("error", "L1", reason="tailgate bug: check l1.pcie.bad_tlp raised KeyError: 'x'")
    rep = report(bug, f("unknown", "L2", reason="no probe window"), f("pass", "L3"))
    data = json.loads(render_json(rep))
    assert data["verdict"]["status"] == "error" and data["verdict"]["counts"]["error"] == 1
    assert data["verdict"]["errors"][0]["id"] == "l1.pcie.bad_tlp"
    assert data["verdict"]["unmeasured"][0]["id"] == "l2.sched.runqlat"

    suites = ET.fromstring(render_junit(rep).split("\n", 1)[1])
    l1 = suites.find("testsuite[@name='tailgate.L1']")
    assert l1.get("errors") == "1"
    assert "KeyError" in l1.find("testcase/error").get("message")

    out = io.StringIO()
    print_report(rep, Console(file=out, width=100, color_system=None))
    text = out.getvalue()
    assert "ERROR   l1.pcie.bad_tlp" in text and "verdict: ERROR" in text
    assert "not measured (what would measure it):" in text
    assert "l2.sched.runqlat: a probe window: `tailgate inspect --probe-window 10`" in text

    page = render_html(rep)
    assert "verdict: ERROR" in page and "no probe window" in page

    out = io.StringIO()
    print_report(report(f("pass", "L1"), f("unknown", "L2", reason="no probe window")),
                 Console(file=out, width=100, color_system=None))
    assert "verdict: INCOMPLETE" in out.getvalue() and "1 id(s) were not measured" in out.getvalue()
