"""`tailgate diagnose openai+http://...` against a real OpenAI-compatible server (llama-cpp-python
serving the tiny random-weight GGUF of tests/support/llm_server.py) with a known injected
cause: a cgroup CPU quota on the server process, 2 ms every 10 ms. A streamed request costs the
server a few milliseconds of CPU (more on a busy machine), so it is throttled inside each
request. The rate is set from the CPU a request cost this server just before, so the mean
demand stays well under the cap on a slow machine too (a saturated server queues, and its
queue's waits are then futex waits, which would rightly be named first). The
quota owns the server's waiting, and is named first (the server's own threads also wait on
futexes for each other while one computes: L3, after it).

llama-cpp-python has no /metrics (MACHINE.md): the engine series are then unknown, with the
reason, never zero."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from support.cgroups import cpu_cgroup, cpu_seconds
from support.llm_server import MODEL_NAME, llama_cpp_available, llama_server
from support.require import require

pytestmark = pytest.mark.timeout(300)
LOAD = ("--input-len", "8", "--output-len", "4")


@pytest.fixture(autouse=True, scope="module")
def _needs():
    require(llama_cpp_available())
    if os.geteuid() != 0:
        pytest.fail("diagnose needs root (bpftrace); CI runs as root")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("the server and the load are pinned to different CPUs: need 2")


def listener_pid(port: int) -> int:
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    m = re.search(r"pid=(\d+)", out)
    assert m, f"nothing listens on {port}: {out!r}"
    return int(m.group(1))


def bench(base: str, *args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "tailgate", "bench", "openai+" + base, "--model",
                          MODEL_NAME, *LOAD, "--quiet", *args], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_cpu_quota_on_the_llm_server_is_named_first(tmp_path):
    with llama_server(tmp_path) as base:
        pid = listener_pid(int(base.rsplit(":", 1)[1].split("/")[0]))
        # the first requests are slow: one at a time (requests beyond one connection queue)
        bench(base, "--rate", "100", "--requests", "4", "--max-connections", "1", "--workers", "1")
        # what a request costs the server in CPU, idle time included (so an overestimate)
        calls, before = 20, cpu_seconds(pid)
        bench(base, "--rate", "20", "--requests", str(calls), "--max-connections", "1",
              "--workers", "1")
        per_request = max((cpu_seconds(pid) - before) / calls, 0.001)
        # 2 ms of CPU every 10 ms: a request (several ms of CPU) spans periods and is
        # throttled in each; the rate keeps the mean demand to 40 % of the cap
        quota_us, period_us = 2000, 10_000
        rate = min(12.0, 0.4 * quota_us / period_us / per_request)
        duration = min(30, max(10, round(100 / rate)))
        with cpu_cgroup(quota_us, period_us) as cg:
            (cg / "cgroup.procs").write_text(str(pid))
            out = subprocess.run(
                ["taskset", "-c", "0", sys.executable, "-m", "tailgate", "diagnose",
                 "openai+" + base, "--pid", str(pid), "--model", MODEL_NAME, *LOAD,
                 "--rate", f"{rate:.2f}", "--arrival", "poisson", "--duration", f"{duration}s",
                 "--json", "-"], capture_output=True, text=True, timeout=200, check=False)
    print(f"a request cost {per_request * 1000:.1f} ms of CPU: {rate:.2f}/s for {duration} s")
    assert out.returncode == 1, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    why = "\n".join(c["sentence"] for c in doc["causes"]) + f"\n{doc['tail']}"
    assert doc["verdict"]["first"] == "throttled", why
    assert sum(v or 0 for v in doc["timeline"]["series"]["cgroup.throttled_ms"]["values"]) > 0
    metrics = base.rsplit("/", 1)[0] + "/metrics"
    assert "404" in doc["timeline"]["unknown"][metrics], doc["timeline"]["unknown"]
    assert not any(k.startswith("engine.") for k in doc["timeline"]["series"])
