"""The fleet view of `inspect --ray` (:func:`tailgate.fleet.inspect.fleet_view`) on a terminal
and as JUnit; its HTML page is :mod:`.fleet_html`."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from ..fleet.inspect import HostReport
from ..model import LAYERS
from .junit import render_junit


def fleet_text(view: dict[str, Any]) -> str:
    """The terminal fleet view: layers bottom-up, then one line per host."""
    n = view["hosts_total"]
    lines = [f"tailgate inspect --ray: {n} host(s), fleet status {view['status'].upper()}"
             + (f", {view['hosts_unreachable']} without a snapshot"
                if view["hosts_unreachable"] else ""),
             ""]
    for layer in LAYERS:
        row = view["layers"][layer]
        failing = row["failing"]
        lines.append(f"  {layer}  fail on {len(failing)}/{n} host(s)"
                     + (f": {', '.join(failing)}" if failing else "")
                     + (f"; warn on {len(row['warn'])}" if row["warn"] else "")
                     + (f"; unknown on {len(row['unknown'])}" if row["unknown"] else ""))
    first = view["first_failing_layer"]
    lines += ["", f"lowest failing layer of the fleet: {first} (fix that one first)" if first
              else "lowest failing layer of the fleet: none", "", "hosts:"]
    for r in view["hosts"]:
        who = r["address"] + (f" ({r['hostname']})" if r["hostname"] else "")
        if r["counts"] is None:
            lines.append(f"  {who:<32} UNKNOWN  {r['reason']}")
        else:
            c = r["counts"]
            lines.append(f"  {who:<32} {r['status'].upper():<10} first failing "
                         f"{r['first_failing_layer'] or '-'}; fail {c.get('fail', 0)}, warn "
                         f"{c.get('warn', 0)}, unknown {c.get('unknown', 0)}, pass "
                         f"{c.get('pass', 0)}")
    if view.get("clock_skew"):
        lines += ["", *skew_text(view["clock_skew"])]
    return "\n".join(lines)


def skew_text(skew: dict[str, Any]) -> list[str]:
    """The clock-skew section (:func:`tailgate.fleet.clock.clock_skew`) as terminal lines."""
    lines = [f"cross-node clock skew (red line +-{skew['limit_ns']:g} ns): "
             f"{skew['status'].upper()}", f"  PTP: {skew['ptp']['reason']}"]
    if skew["round_trip"].get("nodes"):
        lines.append(f"  round trip: {skew['round_trip']['reason']}")
    for r in skew["hosts"]:
        off = r["offset_to_master_ns"]
        rt = r.get("round_trip", {})
        lines.append(f"  {r['address']:<32} offset to master "
                     f"{'-' if off is None else f'{off:g} ns'}"
                     + (f" (gm {r['grandmaster']})" if r.get("grandmaster") else "")
                     + (f"; vs driver {rt['offset_ns']:,} ns +- {rt['rtt_ns'] // 2:,} ns"
                        if "offset_ns" in rt else f"; {rt['error']}" if "error" in rt else "")
                     + ("" if off is not None else f"  [{r['ptp_status']}: {r['reason']}]"))
    return lines


def fleet_junit(hosts: Sequence[HostReport]) -> str:
    """JUnit with each host's suites (named tailgate.ADDRESS.Ln); a host without a snapshot
    is one skipped testcase saying why."""
    out = ET.Element("testsuites", name="tailgate-fleet")
    for h in hosts:
        if h.report is None:
            suite = ET.SubElement(out, "testsuite", name=f"tailgate.{h.node.address}",
                                  tests="1", failures="0", errors="0", skipped="1")
            case = ET.SubElement(suite, "testcase", classname=f"tailgate.{h.node.address}",
                                 name="snapshot")
            ET.SubElement(case, "skipped", message=h.reason)
            continue
        for suite in ET.fromstring(render_junit(h.report)):
            suite.set("name", suite.get("name", "").replace(
                "tailgate.", f"tailgate.{h.node.address}.", 1))
            out.append(suite)
    return ET.tostring(out, encoding="unicode") + "\n"
