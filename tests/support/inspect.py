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
    assert out.returncode in (0, 1), out.stderr
    (finding,) = [f for f in json.loads(out.stdout)["findings"] if f["id"] == check_id]
    return finding


def gate_code(report: dict) -> int:
    """The exit status a JSON inspect report decides under the default --fail-on fail
    (README: 0 passed, 1 failed, 3 tailgate failed), worked out from its findings alone."""
    statuses = {f["status"] for f in report["findings"]}
    if "error" in statuses:
        return 3
    return 1 if "fail" in statuses or report["verdict"].get("unmet_required") else 0
