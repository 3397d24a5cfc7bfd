"""`tailgate compare BEFORE_DIR AFTER_DIR` (issue 26): a before with a real CPU quota that a busy
neighbour in the service's cgroup spends, an after without; the latency rows improve
significantly."""

from __future__ import annotations

import contextlib
import json
import os

import pytest

from support.cgroups import HALF_PERIOD_US, cpu_cgroup, spent_quota
from support.nginx import Nginx, available
from support.require import require
from test_campaign import tailgate


def test_compare_two_campaigns_shows_the_quota_fix(tmp_path):
    """Before: the nginx worker shares a cgroup v1 CPU quota (half of each 500 ms period) with a
    busy loop that spends it (`spent_quota`); after: no quota, no busy loop. The generator runs on the other
    CPU."""
    require(available())
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("the service and the load go on different CPUs: need 2")
    runs = {}
    with Nginx(workers=1) as ng:
        (pid,) = ng.worker_pids()
        os.sched_setaffinity(pid, {1})
        with cpu_cgroup(period_us=HALF_PERIOD_US) as cg:
            (cg / "cgroup.procs").write_text(str(pid))
            c = tmp_path / "c.yaml"
            c.write_text(f"name: web\nservice: {{cgroup: '{cg}'}}\ndiagnose: true\n"
                         "inspect: {interval: 1}\nloads:\n"
                         f"  - {{name: web, url: '{ng.url('/')}', rate: 1000, duration: 6s, "
                         "workers: 1, arrival: poisson, slo: ['p99<100ms']}\n")
            for name in ("before", "after"):
                runs[name] = tmp_path / name
                with spent_quota(cg) if name == "before" else contextlib.nullcontext():
                    res = tailgate("campaign", "run", str(c), "--out", str(runs[name]), cpu="0")
                # the before misses its SLO (exit 1), the after meets it (exit 0)
                assert res.returncode == (1 if name == "before" else 0), res.stdout + res.stderr
    # the before missed its SLO: diagnosed in the same campaign; the after passed: not
    steps = {r: [s["name"] for s in json.loads((runs[r] / "campaign.json").read_text())["steps"]]
             for r in runs}
    assert steps == {"before": ["inspect", "load web", "diagnose web"],
                     "after": ["inspect", "load web"]}
    diag = json.loads((runs["before"] / "diagnose-web.json").read_text())
    # a cause is claimed (which one first, throttling or the run-queue waits around it, is
    # test_diagnose_scenarios' matter: here the polls that date a throttled span compete
    # with the load for CPU 0)
    assert diag["verdict"]["claimed"], diag["verdict"]
    html = tmp_path / "c.html"
    res = tailgate("compare", str(runs["before"]), str(runs["after"]), "--json",
                   str(tmp_path / "c.json"), "--markdown", "-", "--html", str(html),
                   "--max-regression", "p99=10%")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    for stat in ("p99", "p999"):
        r = rows[f"web latency.{stat}"]
        assert r["before"] > 3 * r["after"] and r["significant"] == "yes", r
    # inspect ran first, beside the busy loop: its periods were throttled already
    assert {(x["id"], x["before"], x["after"]) for x in doc["status_changes"]} >= {
        ("l2.cgroup.throttling", "fail", "pass")}
    assert {"id": "slo p99<100ms", "subject": "web", "layer": "end-to-end", "before": "fail",
            "after": "pass", "reason": ""} in doc["status_changes"]
    assert "| end-to-end | web latency.p99 |" in res.stdout
    page = html.read_text()
    assert "campaign-table" in page and "spectrum-0" in page
    # the other way round is a regression the gate names
    back = tailgate("compare", str(runs["after"]), str(runs["before"]), "--max-regression",
                    "p99=10%", "--json", "-")
    assert back.returncode == 1, back.stderr
    assert "web latency.p99" in {g["metric"] for g in json.loads(back.stdout)["regressions"]}
