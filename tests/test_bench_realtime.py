"""A generator run at a real-time priority (``chrt -f``, how a user keeps ordinary work on a
busy host from delaying the load) on a core that ordinary work keeps busy.

The compiled engine used to demote its loop thread to SCHED_OTHER (it sets a short CFS
slice) and to record as an idle-policy thread that a busy core never runs, so the run never
returned ("no worker returned a result"). Now the loop keeps the priority it was given, the
recorder runs at an ordinary one below it, and every scheduled request is accounted for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.nginx import Nginx, available
from support.require import require
from tailgate.bench import fastpath

pytestmark = pytest.mark.timeout(120)
SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"


@pytest.fixture(autouse=True, scope="module")
def _needs():
    require(None if fastpath.UNAVAILABLE is None else fastpath.UNAVAILABLE)
    require(available())
    if os.geteuid() != 0:
        pytest.fail("chrt -f needs root; CI runs as root")


@pytest.mark.parametrize("engine", ["fast", "python"])
def test_a_real_time_generator_on_a_busy_core_keeps_its_schedule(tmp_path, engine):
    out = tmp_path / "r.json"
    cpu = str(min(os.sched_getaffinity(0)))
    busy = subprocess.Popen(["taskset", "-c", cpu, sys.executable, "-c", SPIN])
    try:
        with Nginx(workers=1) as ng:
            proc = subprocess.run(
                ["chrt", "-f", "10", "taskset", "-c", cpu, sys.executable, "-m", "tailgate",
                 "bench", ng.url("/"), "--engine", engine, "--rate", "200", "--duration", "2s",
                 "--workers", "1", "--quiet", "--json", str(out)],
                capture_output=True, text=True, timeout=90, check=False)
    finally:
        busy.kill()
        busy.wait()
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    req = doc["requests"]
    assert req["scheduled"] == 400 and req["ok"] == 400, req
