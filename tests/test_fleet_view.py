"""The fleet view of `inspect --ray` (pure): per layer which hosts fail, the fleet's lowest
failing layer, hosts without a snapshot, and the JUnit of many hosts (issue 13)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from tailgate.fleet.cluster import Node
from tailgate.fleet.inspect import HostReport, fleet_view
from tailgate.model import Finding, Report
from tailgate.report.fleet_html import render_fleet_html
from tailgate.report.fleet_render import fleet_junit, fleet_text
from tailgate.verdict import verdict


def finding(cid: str, layer: str, status: str) -> Finding:
    return Finding(id=cid, layer=layer, title=cid, status=status, subject="host",
                   observed=None, limit=None, unit="", reason=f"{cid} {status}",
                   evidence={}, remedy="")


def report(host: str, *findings: Finding) -> Report:
    return Report(version="t", host={"hostname": host}, target={}, interval_s=1.0,
                  taken_at=0.0, verdict=verdict(list(findings)), findings=tuple(findings))


def hosts() -> list[HostReport]:
    a = report("a", finding("l1.x", "L1", "pass"), finding("l2.y", "L2", "fail"),
               finding("l3.z", "L3", "fail"))
    b = report("b", finding("l1.x", "L1", "pass"), finding("l2.y", "L2", "warn"),
               finding("l3.z", "L3", "fail"))
    c = report("c", finding("l1.x", "L1", "unknown"), finding("l2.y", "L2", "pass"))
    return [HostReport(Node("n1", "10.0.0.1"), a), HostReport(Node("n2", "10.0.0.2"), b),
            HostReport(Node("n3", "10.0.0.3"), c),
            HostReport(Node("n4", "10.0.0.4"), None, "no snapshot within 3 s")]


def test_fleet_view_counts_failing_hosts_per_layer():
    view = fleet_view(hosts())
    assert view["layers"]["L1"] == {"failing_hosts": 0, "failing": [], "warn": [],
                                    "unknown": ["10.0.0.3"], "error": []}
    assert view["layers"]["L2"]["failing"] == ["10.0.0.1"]
    assert view["layers"]["L2"]["warn"] == ["10.0.0.2"]
    assert view["layers"]["L3"]["failing"] == ["10.0.0.1", "10.0.0.2"]
    assert view["layers"]["L3"]["failing_hosts"] == 2
    # the fleet fixes L2 first (one host fails there), though more hosts fail L3
    assert view["first_failing_layer"] == "L2"
    assert view["status"] == "fail" and view["hosts_total"] == 4
    assert view["hosts_unreachable"] == 1
    rows = {r["address"]: r for r in view["hosts"]}
    assert rows["10.0.0.2"]["first_failing_layer"] == "L3"
    assert rows["10.0.0.3"]["status"] == "incomplete"
    assert rows["10.0.0.4"] == {"node_id": "n4", "address": "10.0.0.4", "hostname": None,
                                "status": "unknown", "first_failing_layer": None,
                                "counts": None, "reason": "no snapshot within 3 s"}
    assert [r["address"] for r in view["reports"]] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    text = fleet_text(view)
    assert "L3  fail on 2/4 host(s): 10.0.0.1, 10.0.0.2" in text
    assert "lowest failing layer of the fleet: L2" in text
    assert "10.0.0.4" in text and "UNKNOWN  no snapshot within 3 s" in text


def test_fleet_without_failures_or_snapshots():
    view = fleet_view([HostReport(Node("n", "10.0.0.9"), None, "node died")])
    assert view["status"] == "incomplete" and view["first_failing_layer"] is None
    ok = report("ok", finding("l1.x", "L1", "pass"))
    assert fleet_view([HostReport(Node("n", "10.0.0.8"), ok)])["status"] == "pass"


def test_fleet_junit_names_each_hosts_suites():
    root = ET.fromstring(fleet_junit(hosts()))
    names = [s.get("name") for s in root]
    assert "tailgate.10.0.0.1.L2" in names and "tailgate.10.0.0.2.L3" in names
    down = next(s for s in root if s.get("name") == "tailgate.10.0.0.4")
    assert down.find("testcase/skipped").get("message") == "no snapshot within 3 s"
    l3 = next(s for s in root if s.get("name") == "tailgate.10.0.0.2.L3")
    assert l3.get("failures") == "1"


def test_fleet_html_has_every_host_and_escapes_host_text():
    hs = hosts()
    hs[0] = HostReport(Node("n1", "10.0.0.1"), report("<script>x</script>",
                                                      finding("l2.y", "L2", "fail")))
    page = render_fleet_html(fleet_view(hs), hs)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("<section id='h-") == 3  # the host without a snapshot has no report
    assert "fix L2 first" in page and "no snapshot within 3 s" in page
