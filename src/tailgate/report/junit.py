"""JUnit XML: one testcase per finding, so any CI system shows the red lines.

fail -> <failure>; error (a check or parser of tailgate raised) -> <error>; warn ->
passes but carries a <system-out> note; skip and unknown -> <skipped> with the reason
(a CI shows them without failing the build; `--fail-on` decides the exit status).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from ..model import Report
from ..safe import clean_report


def _message(f) -> str:
    observed = "" if f.observed is None else f"observed {f.observed} {f.unit}".rstrip()
    limit = "" if f.limit is None else f"limit {f.limit} {f.unit}".rstrip()
    parts = [p for p in (f.reason, observed, limit) if p]
    return "; ".join(parts) or f.title


def render_junit(report: Report) -> str:
    # XML 1.0 cannot hold most control characters at all: they are escaped first, so the
    # file stays valid whatever the host's text holds.
    report = clean_report(report)
    suites = ET.Element("testsuites", name="tailgate")
    for layer in ("L1", "L2", "L3", "L4"):
        findings = [f for f in report.findings if f.layer == layer]
        suite = ET.SubElement(
            suites, "testsuite",
            name=f"tailgate.{layer}",
            tests=str(len(findings)),
            failures=str(sum(f.status == "fail" for f in findings)),
            skipped=str(sum(f.status in ("skip", "unknown") for f in findings)),
            errors=str(sum(f.status == "error" for f in findings)),
            hostname=str(report.host.get("hostname", "")),
        )
        for f in findings:
            case = ET.SubElement(suite, "testcase", classname=f"tailgate.{layer}.{f.id}",
                                 name=f"{f.id} [{f.subject}]")
            msg = _message(f)
            if f.status == "fail":
                node = ET.SubElement(case, "failure", message=msg, type="redline")
                node.text = f"{f.title}\nremedy: {f.remedy}\nevidence: " + json.dumps(
                    f.evidence, default=str, sort_keys=True)
            elif f.status == "error":
                node = ET.SubElement(case, "error", message=msg, type="tailgate-bug")
                node.text = json.dumps(f.evidence, default=str, sort_keys=True)
            elif f.status in ("skip", "unknown"):
                ET.SubElement(case, "skipped", message=f"{f.status}: {msg}")
            elif f.status == "warn":
                ET.SubElement(case, "system-out").text = f"WARN: {msg}\nremedy: {f.remedy}"
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
