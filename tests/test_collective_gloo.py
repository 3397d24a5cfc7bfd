"""``torchrun --nproc-per-node 2 -m tailgate bench allreduce --backend gloo``: real
torch.distributed ranks on CPU, the same checks as with MPI.

Needs torch (``tailgate[torch]``, the CPU build is enough), so these run on request
(``pytest -m optin``): PyPI's x86_64 torch is the CUDA build, about 2.9 GB, which the
default suite must not download onto a machine without a GPU. Without torch they fail
saying so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import collective as co
from tailgate.bench.collective.spec import algbw_gbps

pytestmark = pytest.mark.optin

CORRUPT = str(Path(__file__).parent / "support" / "allreduce_corrupt.py")


@pytest.fixture(autouse=True)
def _launchers():
    why = co.missing("gloo")
    if why:
        pytest.fail(why)


def test_two_ranks_every_size_checked_with_nccl_tests_bandwidths(tmp_path):
    out = tmp_path / "r.json"
    r = co.run("gloo", 2, "--sizes", "1KiB..64KiB:8", "--iters", "100", "--warmup", "3",
               "--json", str(out), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["backend"] == "gloo" and doc["ranks"] == 2 and "gloo" in doc["library"]
    assert [b["bytes"] for b in doc["sizes"]] == [1024, 8192, 65536]
    for b in doc["sizes"]:
        assert b["placement"] == "in_place" and b["wrong"] == 0
        assert b["latency_ms"]["count"] == 100
        assert b["algbw_gbps"] == pytest.approx(algbw_gbps(b["bytes"], b["time_us"] / 1e6),
                                                rel=1e-3, abs=1e-6)
        assert b["busbw_gbps"] == pytest.approx(b["algbw_gbps"], rel=1e-3, abs=1e-6)  # n=2: x1
        assert b["straggler"]["rank"] in (0, 1)


def test_bfloat16_and_prod_are_checked_exactly(tmp_path):
    out = tmp_path / "r.json"
    r = co.run("gloo", 2, "--sizes", "4KB", "--iters", "20", "--dtype", "bfloat16",
               "--op", "prod", "--json", str(out), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr
    b = json.loads(out.read_text())["sizes"][0]
    assert (b["dtype"], b["count"], b["op"], b["wrong"]) == ("bfloat16", 2048, "prod", 0)


def test_a_stopped_rank_shows_in_the_p999_and_is_named_the_straggler(tmp_path):
    out = tmp_path / "r.json"
    stop_s = 0.8
    proc = co.launch("gloo", 2, "--sizes", "1KB", "--iters", "500", "--warmup", "5",
                     "--gap", "5ms", "--json", str(out))
    try:
        co.wait_for_line(proc, "measuring")
        time.sleep(0.3)
        co.stall(co.rank_pid(proc, 1, "gloo"), stop_s, in_syscall=co.GAP_SLEEP)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.returncode is None:
            co.kill(proc)
    assert proc.returncode == 0, err
    b = json.loads(out.read_text())["sizes"][0]
    lat = b["latency_ms"]
    assert stop_s * 0.9 <= lat["p999"] / 1e3 <= stop_s + 0.5, lat
    assert lat["p99"] < stop_s * 1e3 / 2, lat
    assert b["straggler"]["rank"] == 1, b["per_rank"]
    assert b["straggler"]["tail_ms"] >= stop_s * 0.9 * 1e3, b["per_rank"]


def test_a_corrupted_contribution_fails_the_check(tmp_path):
    out = tmp_path / "r.json"
    r = co.run("gloo", 2, "--sizes", "256B", "--iters", "40", "--json", str(out), "--quiet",
               script=CORRUPT)
    assert r.returncode != 0, r.stdout + r.stderr  # torchrun: a rank exited 1
    b = json.loads(out.read_text())["sizes"][0]
    assert b["wrong"] == 2 * 40 and [p["wrong"] for p in b["per_rank"]] == [40, 40]


def test_a_run_past_its_timeout_ends_every_rank():
    started = time.monotonic()
    r = co.run("gloo", 2, "--sizes", "1KB", "--iters", "1000000", "--gap", "1ms",
               "--timeout", "3s", "--quiet", timeout=90)
    assert r.returncode != 0 and "passed --timeout 3s" in r.stderr, r.stderr
    assert time.monotonic() - started < 60


def test_nccl_without_a_gpu_says_so_and_exits_2():
    # this machine has no GPU: said before anything else is asked of the launch
    r = subprocess.run([sys.executable, "-m", "tailgate", "bench", "allreduce", "--backend",
                        "nccl", "--sizes", "1KB"], capture_output=True, text=True, timeout=120,
                       env=co.env())
    assert r.returncode == 2, r.stderr
    assert "--backend nccl needs an NVIDIA GPU: torch.cuda.is_available() is False" in r.stderr
