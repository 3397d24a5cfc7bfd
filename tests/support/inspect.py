"""Run `tailgate inspect` on a process the test started, and read one finding back."""

from __future__ import annotations

import json
import subprocess
import sys


def inspect_ready_process(argv: list[str], check_id: str) -> dict:
    """Start ``argv``, wait for it to print "ready", inspect it with --pid, kill it; the finding."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        out = subprocess.run([sys.executable, "-m", "tailgate", "inspect", "--pid", str(proc.pid),
                              "--interval", "0", "--json", "-"], capture_output=True, text=True,
                             timeout=60, check=False)
    finally:
        proc.kill()
        proc.wait()
    report = json.loads(out.stdout)
    assert out.returncode == gate_code(report), out.stderr  # the status the report decides
    (finding,) = [f for f in report["findings"] if f["id"] == check_id]
    return finding


def gate_code(report: dict) -> int:
    """The exit status a JSON inspect report decides under the default --fail-on fail
    (README: 0 passed, 1 failed, 3 tailgate failed), worked out from its findings alone."""
    statuses = {f["status"] for f in report["findings"]}
    if "error" in statuses:
        return 3
    return 1 if "fail" in statuses or report["verdict"].get("unmet_required") else 0


def diagnose_code(doc: dict) -> int:
    """The exit status a `tailgate diagnose` JSON document decides: 1 when it claims a
    cause of the tail, else 0 (commands/diagnose.py)."""
    return 1 if doc["verdict"]["claimed"] else 0


def bench_code(doc: dict) -> int:
    """The exit status a `tailgate bench` JSON result decides (BenchResult.passed): 0 when
    every SLO held, the confidence asked for was reached, nothing was lost and at least one
    request succeeded; else 1."""
    conf = doc.get("confidence")
    ok = (all(s["pass"] for s in doc.get("slo", [])) and (conf is None or conf["reached"])
          and not doc["requests"].get("lost") and bool(doc["requests"].get("ok")))
    return 0 if ok else 1


def fleet_code(view: dict) -> int:
    """The exit status an `inspect --ray` fleet view decides (commands/inspect_fleet.py,
    default --fail-on): 3 when any host's report does, else 1 when any does, else 0."""
    codes = {gate_code(r["report"]) for r in view["reports"]}
    return 3 if 3 in codes else 1 if 1 in codes else 0
