"""One meaning of an SLO on every path (issue 23): the same target and SLOs through
`tailgate bench`, `bench --scenario`, `bench --sweep`, `diagnose`, the library call
(`run(BenchSpec.of(...))`) and (tests/test_fleet_ray.py) `bench --ray` give the same
verdict and the same accounting, the unmeasurable-percentile case included (20 requests
cannot bound a P99.99)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.nginx import Nginx, available
from support.require import require

pytestmark = pytest.mark.timeout(120)

SLOS = ["p50<10s", "p9999<10s", "error_rate<1%"]
# what each path must say of each: p9999's interval cannot be formed from 20 samples
WANT = [(True, None), (False, "not measurable"), (True, None)]


def tailgate(*argv: str, command: str = "bench") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tailgate", command, "--quiet", *argv],
                          capture_output=True, text=True, timeout=90)


def verdicts(slo: list[dict]) -> list[tuple[bool, str | None]]:
    return [(s["pass"], s.get("reason", "").split(":")[0] or None) for s in slo]


def test_bench_and_scenario_judge_one_target_alike(tmp_path):
    require(available())
    with Nginx(workers=1) as ng:
        url = ng.url("/")
        single = tmp_path / "single.json"
        r1 = tailgate(url, "--rate", "20", "--duration", "1s", "--connections", "1",
                      *[x for s in SLOS for x in ("--slo", s)], "--json", str(single))
        f = tmp_path / "one.yaml"
        f.write_text(f"targets:\n  - name: web\n    url: {url}\n    rate: 20\n"
                     f"    duration: 1s\n    connections: 1\n    slo: {json.dumps(SLOS)}\n")
        scen = tmp_path / "scenario.json"
        r2 = tailgate("--scenario", str(f), "--json", str(scen))
    a = json.loads(single.read_text())
    (b,) = json.loads(scen.read_text())["targets"]
    assert a["requests"]["ok"] == b["requests"]["ok"] == 20
    assert verdicts(a["slo"]) == verdicts(b["slo"]) == WANT, (a["slo"], b["slo"])
    assert r1.returncode == r2.returncode == 1, (r1.stderr, r2.stderr)


def test_every_local_path_judges_one_spec_alike(tmp_path):
    """One spec through the library call, `bench`, `--sweep` and `diagnose`: the same
    verdict of each SLO, the same accounting (20 scheduled, 20 sent, 20 ok)."""
    from tailgate.bench import BenchSpec, run

    require(available())
    argv = ["--rate", "20", "--duration", "1s", "--connections", "1", "--workers", "1",
            *[x for s in SLOS for x in ("--slo", s)]]
    with Nginx(workers=1) as ng:
        url = ng.url("/")
        (pid,) = ng.worker_pids()
        lib = run(BenchSpec.of(url, rate=20, duration=1, connections=1, workers=1, slo=SLOS))
        single, sweep, diag = (tmp_path / f"{n}.json" for n in ("single", "sweep", "diag"))
        r1 = tailgate(url, *argv, "--json", str(single))
        # the sweep's first rate is its LO: one run at 20/s, then it stops (the SLO failed)
        r2 = tailgate(url, *argv, "--sweep", "20..40", "--json", str(sweep))
        r3 = tailgate(url, "--pid", str(pid), *argv, "--json", str(diag), command="diagnose")
    a = json.loads(single.read_text())
    (p,) = json.loads(sweep.read_text())["points"]
    assert r1.returncode == r2.returncode == 1, (r1.stderr, r2.stderr)
    doc3 = json.loads(diag.read_text())
    assert r3.returncode == (1 if doc3["verdict"]["claimed"] else 0), r3.stderr  # its own rule
    for doc in (lib.json, a, p, doc3["bench"]):
        req = doc["requests"]
        assert (req["sent"], req["ok"], sum(req["errors"].values())) == (20, 20, 0), req
        assert verdicts(doc["slo"]) == WANT, doc["slo"]
    assert p["slo_pass"] is False and not lib.passed
