"""``mpirun -np N tailgate bench allreduce --backend mpi``: real Open MPI ranks on this machine.

Needs Debian's openmpi-bin and mpi4py (``tailgate[mpi]``); without them these tests
fail saying so. Ranks outnumber the cores here, so mpirun runs with --oversubscribe.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from support import collective as co
from tailgate.bench.collective.spec import algbw_gbps
from tailgate.hist import parse_log

CORRUPT = str(Path(__file__).parent / "support" / "allreduce_corrupt.py")


@pytest.fixture(autouse=True)
def _launchers():
    why = co.missing("mpi")
    if why:
        pytest.fail(why)


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_size_every_rank_checked_with_nccl_tests_bandwidths(ranks, tmp_path):
    out, hdr = tmp_path / "r.json", tmp_path / "r.hlog"
    r = co.run("mpi", ranks, "--sizes", "8B..64KB:8", "--iters", "200", "--warmup", "5",
               "--json", str(out), "--hdr", str(hdr), "--html", str(tmp_path / "r.html"),
               "--slo", "p90<30s", "--quiet")  # 200 samples bound a P90, not a P999
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["source"] == "tailgate" and doc["backend"] == "mpi" and doc["ranks"] == ranks
    assert doc["library"].startswith("Open MPI") and doc["clock"]["kind"] == "shared"
    assert [b["bytes"] for b in doc["sizes"]] == [8, 64, 512, 4096, 32768]
    for b in doc["sizes"]:
        assert b["count"] == b["bytes"] // 4 and b["placement"] == "out_of_place"
        assert b["wrong"] == 0 and b["iterations"] == 200
        lat = b["latency_ms"]
        assert lat["count"] == 200 and lat["samples_above"]["p99"] == 2
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"]
        assert lat["max"] <= lat["p999"] * 1.001  # HdrHistogram: the top bucket's upper bound
        assert b["algbw_gbps"] == pytest.approx(algbw_gbps(b["bytes"], b["time_us"] / 1e6),
                                                rel=1e-3, abs=1e-6)
        # both are rounded to 6 decimals: their rounding errors add up to 2e-6 at most
        assert b["busbw_gbps"] == pytest.approx(b["algbw_gbps"] * 2 * (ranks - 1) / ranks,
                                                rel=1e-3, abs=2e-6)
        assert len(b["per_rank"]) == ranks and b["straggler"]["rank"] in range(ranks)
        assert sum(p["last_arrivals"] for p in b["per_rank"]) == 200
        # the slowest rank of each iteration bounds every rank's own times
        assert max(p["max_us"] for p in b["per_rank"]) == pytest.approx(lat["max"] * 1e3,
                                                                        rel=1e-3)
    assert doc["slo"][0]["pass"] and len(doc["slo"][0]["per_size"]) == 5
    assert "32KiB" in r.stdout and "busbw GB/s" in r.stdout
    _, intervals = parse_log(hdr.read_text())
    assert [iv.histogram.total for iv in intervals] == [200] * 5
    assert "Tag=8B," in hdr.read_text()
    page = (tmp_path / "r.html").read_text()
    assert page.count("<tr>") == 6 and "SLO p90&lt;30s: pass" in page


def test_a_stopped_rank_shows_in_the_p999_and_is_named_the_straggler(tmp_path):
    out = tmp_path / "r.json"
    stop_s = 0.8
    proc = co.launch("mpi", 2, "--sizes", "1KB", "--iters", "500", "--warmup", "5",
                     "--gap", "5ms", "--json", str(out))
    try:
        co.wait_for_line(proc, "measuring")
        time.sleep(0.3)
        # stopped during its --gap (Python's sleep): it then arrives late. A rank stopped
        # inside the call before its data left makes every rank wait alike, and no
        # timestamp can tell who was stopped (see tailgate.bench.collective.analyze).
        co.stall(co.rank_pid(proc, 1), stop_s, in_syscall=co.GAP_SLEEP)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.returncode is None:
            co.kill(proc)
    assert proc.returncode == 0, err
    b = json.loads(out.read_text())["sizes"][0]
    lat = b["latency_ms"]
    # the iteration that waited for the stopped rank is the slowest of 500: at or above the
    # P999 (HdrHistogram: the value at rank round(0.999 * 500) = 500)
    assert stop_s * 0.9 <= lat["p999"] / 1e3 <= stop_s + 0.5, lat
    assert lat["p99"] < stop_s * 1e3 / 2, lat  # the rest did not
    assert b["straggler"]["rank"] == 1, b["per_rank"]
    assert b["straggler"]["tail_ms"] >= stop_s * 0.9 * 1e3, b["per_rank"]
    assert b["wrong"] == 0


def test_a_corrupted_contribution_fails_the_check(tmp_path):
    out = tmp_path / "r.json"
    r = co.run("mpi", 2, "--sizes", "64B,4KB", "--iters", "50", "--warmup", "2",
               "--json", str(out), "--quiet", script=CORRUPT)
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    # element 3 of every result on both ranks, at every measured iteration
    assert [b["wrong"] for b in doc["sizes"]] == [2 * 50, 2 * 50]
    assert [p["wrong"] for p in doc["sizes"][0]["per_rank"]] == [50, 50]
    assert any("wrong result element" in w for w in doc["warnings"])
    # the same run without the check reports n/a, not 0
    r = co.run("mpi", 2, "--sizes", "64B", "--iters", "20", "--no-check", "--json", str(out),
               "--quiet", script=CORRUPT)
    assert r.returncode == 0 and json.loads(out.read_text())["sizes"][0]["wrong"] is None


def test_in_place_and_other_ops_are_checked_exactly(tmp_path):
    out = tmp_path / "r.json"
    for op, dtype in (("prod", "float64"), ("max", "int32"), ("min", "float32")):
        r = co.run("mpi", 4, "--sizes", "1KB", "--iters", "30", "--op", op, "--dtype", dtype,
                   "--in-place", "--json", str(out), "--quiet")
        assert r.returncode == 0, r.stderr
        b = json.loads(out.read_text())["sizes"][0]
        assert (b["op"], b["dtype"], b["placement"], b["wrong"]) == (op, dtype, "in_place", 0)


def test_slo_failure_is_the_launchers_exit_status(tmp_path):
    r = co.run("mpi", 2, "--sizes", "8B", "--iters", "50", "--slo", "p999<1ns", "--quiet")
    assert r.returncode == 1
    assert "SLO p999<1ns: FAIL" in r.stdout and r.stdout.count("SLO p999<1ns") == 1


@pytest.mark.parametrize("args,message", [
    (("--dtype", "bfloat16"), "--backend mpi has no bfloat16"),
    (("--sizes", "1KB..8B"), "empty size range"),
    (("--sizes", "2B"), "holds no float32 element"),
    (("--iters", "0"), "--iters must be >= 1"),
    (("--slo", "p999<fast"), "bad SLO"),
    (("--json", "/nonexistent/dir/r.json"), "cannot write"),
])
def test_bad_usage_is_said_once_and_exits_2(args, message):
    r = co.run("mpi", 2, *args, "--quiet")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count(message) == 1, r.stderr


def test_a_run_past_its_timeout_ends_every_rank():
    started = time.monotonic()
    r = co.run("mpi", 2, "--sizes", "1KB", "--iters", "1000000", "--gap", "1ms",
               "--timeout", "2s", "--quiet", timeout=60)
    assert r.returncode == 124, r.stderr
    assert "passed --timeout 2s" in r.stderr
    assert time.monotonic() - started < 30
