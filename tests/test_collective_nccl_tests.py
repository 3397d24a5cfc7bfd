"""nccl-tests ``*_perf`` output parsed into the collective document (tailgate.bench.collective).

Fixtures: real outputs from nccl-tests' repository threads and its users' issues, and the
variants no post shows rendered with nccl-tests' own format strings (see
tests/fixtures/nccl_tests/PROVENANCE.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailgate.bench.collective.nccl_tests import NcclTestsError, parse
from tailgate.bench.collective.spec import algbw_gbps, busbw_gbps

FIX = Path(__file__).parent / "fixtures" / "nccl_tests"


def load(name: str, **kw):
    return parse((FIX / name).read_text(), **kw)


def test_newest_format_with_version_program_and_two_hosts():
    doc = load("all_reduce_perf-2.20.0-gb10x2.txt")
    assert doc["source"] == "nccl-tests" and doc["collective"] == "allreduce"
    assert doc["library"] == "nccl-tests 2.20.0"
    assert doc["ranks"] == 2 and doc["ranks_from"] == "devices"
    assert doc["hosts"] == ["spark-d708", "spark-dbf4"]
    assert doc["config"]["iters"] == 100 and doc["config"]["warmup"] == 10
    sizes = doc["sizes"]
    assert [b["bytes"] for b in sizes] == [8192, 8192, 16384, 16384, 32768, 32768, 65536, 65536]
    assert [b["placement"] for b in sizes[:2]] == ["out_of_place", "in_place"]
    first = sizes[0]
    assert (first["count"], first["dtype"], first["op"], first["root"]) == (2048, "float", "sum", -1)
    assert (first["time_us"], first["algbw_gbps"], first["busbw_gbps"], first["wrong"]) == (
        35.15, 0.23, 0.23, 0)
    assert sizes[-1]["time_us"] == 64.71 and sizes[-1]["busbw_gbps"] == 1.01
    # nccl-tests prints means only: no percentile is invented
    assert first["latency_ms"] == {"mean": 0.03515, "count": 100}
    assert doc["warnings"] == []


def test_tagged_mpirun_output_and_trailing_blanks():
    doc = load("all_reduce_perf-tag-output-p5.txt")
    assert [(b["bytes"], b["placement"], b["time_us"]) for b in doc["sizes"]][:3] == [
        (8, "out_of_place", 12.90), (8, "in_place", 12.87), (16, "out_of_place", 12.88)]
    assert doc["ranks"] is None  # no device lines, and busbw 0.00 names no rank count


def test_partial_rank_list_large_sizes_and_footer():
    doc = load("all_reduce_perf-gb200-nvl72.txt")
    assert doc["ranks"] == 72  # "Rank 71": the highest index
    assert doc["nccl_tests"]["avg_busbw_gbps"] == 745.53
    assert doc["nccl_tests"]["out_of_bounds"] == 0
    big = [b for b in doc["sizes"] if b["bytes"] == 8589934592]
    assert [b["time_us"] for b in big] == [20299.0, 20006.0]


def test_error_column_of_old_versions_is_a_deviation_not_a_count():
    doc = load("all_reduce_perf-error-column-128gpu.txt", collective="allreduce")
    b = doc["sizes"][0]
    assert b["wrong"] is None and b["max_error"] == 1e-06 and b["root"] is None
    assert doc["nccl_tests"]["columns"][:4] == ["size", "count", "type", "redop"]
    # busbw/algbw printed with two decimals cannot tell 128 ranks from its neighbours
    assert doc["ranks"] is None


def test_first_format_in_milliseconds_without_units_line():
    doc = load("nccl1-test-ms-res.txt")
    b = doc["sizes"][0]
    assert doc["nccl_tests"]["time_unit"] == "ms"
    assert b["time_us"] == pytest.approx(64.0) and b["dtype"] == "char"
    assert [x["op"] for x in doc["sizes"][::2]] == ["sum", "prod", "max", "min", "sum"]
    assert b["max_error"] == 0.0


def test_zero_sizes_and_an_indented_paste_with_its_command_line():
    rs = load("reduce_scatter_perf-2.13-zero-size.txt")
    assert sum(b["bytes"] == 0 for b in rs["sizes"]) == 10
    doc = load("all_reduce_perf-4090x4.txt")
    assert doc["collective"] == "allreduce"  # from "./build/all_reduce_perf -b 256M ..."
    assert doc["ranks"] == 4 and doc["hosts"] == ["7773x"] * 4
    assert doc["sizes"][0]["time_us"] == 15654.0


@pytest.mark.parametrize("name,ranks", [
    ("all_reduce_perf-2.20.0-gb10x2.txt", 2),
    ("all_reduce_perf-gb200-nvl72.txt", 72),
    ("all_reduce_perf-4090x4.txt", 4),
])
def test_bandwidth_formulas_match_nccl_tests_on_its_own_sizes_and_times(name, ranks):
    doc = load(name)
    for b in doc["sizes"]:
        seconds = b["time_us"] / 1e6
        # the printed time is rounded (nccl-tests <= 2.19.5: %7.2f below 100 us, %7.1f below
        # 10 ms, %7.0f above): bound the effect of that rounding
        t = b["time_us"]
        t_err = (0.005 if t < 100 else 0.05 if t < 1e4 else 0.5) / t
        alg = algbw_gbps(b["bytes"], seconds)
        bus = busbw_gbps("allreduce", b["bytes"], seconds, ranks)
        assert abs(alg - b["algbw_gbps"]) <= 0.005 + alg * t_err * 1.01, (b, alg)
        assert abs(bus - b["busbw_gbps"]) <= 0.005 + bus * t_err * 1.01, (b, bus)
        assert bus == pytest.approx(alg * 2 * (ranks - 1) / ranks)


def test_ranks_derived_from_busbw_when_no_device_is_listed():
    text = (FIX / "all_reduce_perf-4090x4.txt").read_text()
    bare = "\n".join(line for line in text.splitlines() if "Rank" not in line)
    doc = parse(bare)
    assert doc["ranks"] == 4 and doc["ranks_from"] == "busbw/algbw"
    assert any("derived from busbw/algbw" in w for w in doc["warnings"])
    assert parse(bare, ranks=8)["ranks"] == 8


def test_rendered_variants():
    cpu = load("variant-cputime.txt")
    assert cpu["sizes"][0]["time_us"] == 35.15
    ts = load("variant-timestamps.txt")
    assert ts["sizes"][1]["timestamp"] == "2026-07-09 15:52:13"
    assert ts["sizes"][1]["busbw_gbps"] == 0.27
    na = load("variant-no-check.txt")
    assert {b["wrong"] for b in na["sizes"]} == {None} and na["config"]["validation"] == 0
    pi = load("variant-per-iteration.txt")
    lat = pi["sizes"][0]["latency_ms"]
    assert lat["p99"] == pytest.approx(0.0703) and lat["max"] == pytest.approx(0.10545)
    assert pi["sizes"][0]["cv_pct"] == 12.5 and "p999" not in lat
    ip = load("variant-in-place-only.txt")
    assert {b["placement"] for b in ip["sizes"]} == {"in_place"} and len(ip["sizes"]) == 4
    bad = load("variant-wrong.txt")
    assert [b["wrong"] for b in bad["sizes"]][4] == 4096
    assert bad["nccl_tests"]["out_of_bounds"] == 4096
    side = load("variant-copybw.txt")
    assert side["sizes"][0]["copybw_gbps"] == 12.5 and side["sizes"][0]["wrong"] == 0
    assert ip["collective"] == "allreduce"


def test_several_runs_in_one_output_are_said_not_silently_merged():
    text = (FIX / "all_reduce_perf-2.20.0-gb10x2.txt").read_text()
    doc = parse(text + "\n" + (FIX / "variant-cputime.txt").read_text())
    assert len(doc["sizes"]) == 8 and doc["library"] == "nccl-tests 2.20.0"
    assert any("1 more table" in w for w in doc["warnings"])


@pytest.mark.parametrize("text,message", [
    ("", "no nccl-tests table"),
    ("hello\nworld\n", "no nccl-tests table"),
    ("#  size count type redop root time algbw busbw #wrong\n", "no result rows"),
    ("#  size count type redop root time algbw busbw #wrong\n 8 2 float sum -1 1.0 0.0\n",
     "line 2: 7 fields"),
    ("#  size count type redop root time algbw busbw #wrong\n 8 2 float sum -1 x 0 0 0\n",
     "line 2: time 'x'"),
    ("#  size count type redop root time algbw busbw weird\n", "unknown nccl-tests column"),
])
def test_bad_input_is_a_precise_error(text, message):
    with pytest.raises(NcclTestsError, match=message):
        parse(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
    "time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)",
    "           8             2     float     sum      -1    12.90    0.00    0.00      0    "
    "12.87    0.00    0.00      0",
    "# Out of bounds values : 0 OK", "#  Rank  0 Group  0 Pid 1 on h device  0 [0x1] X",
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20",
    "", "garbage 1 2 3", "  8 2 float", "[1,0]<stdout>:#  size count time", "1e9 N/A",
]), max_size=12), st.text(max_size=40))
def test_any_text_parses_or_fails_with_a_parse_error(lines, noise):
    try:
        doc = parse("\n".join([*lines, noise]))
    except NcclTestsError:
        return
    assert doc["sizes"] and all(b["bytes"] >= 0 for b in doc["sizes"])


def test_cli_reads_a_file_gates_on_busbw_and_fails_on_wrong_results(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tailgate", "bench", "allreduce", *args],
                              capture_output=True, text=True, timeout=60)

    out = tmp_path / "r.json"
    r = cli("--nccl-tests", str(FIX / "all_reduce_perf-gb200-nvl72.txt"), "--slo", "busbw>=500",
            "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["slo"][0]["pass"] and doc["slo"][0]["observed"] == 576.74
    assert "SLO busbw>=500: pass" in r.stdout
    assert doc["collective"] == "allreduce" and "read as allreduce" in r.stdout
    page = tmp_path / "r.html"
    r = cli("--nccl-tests", str(FIX / "variant-wrong.txt"), "--html", str(page))
    assert r.returncode == 1
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "<script" not in text
    assert text.count("<tr class='bad'>") == 1 and "4096" in text
    r = cli("--nccl-tests", str(FIX / "all_reduce_perf-gb200-nvl72.txt"), "--slo", "busbw>=600")
    assert r.returncode == 1 and "SLO busbw>=600: FAIL" in r.stdout and "512MiB" in r.stdout
    r = cli("--nccl-tests", str(FIX / "all_reduce_perf-gb200-nvl72.txt"), "--slo", "p999<1ms")
    assert r.returncode == 1 and "no value at any size" in r.stdout  # means only: not judged
    assert cli("--nccl-tests", str(FIX / "variant-wrong.txt")).returncode == 1
    r = cli("--nccl-tests", str(tmp_path / "absent.log"))
    assert r.returncode == 2 and "cannot read" in r.stderr
    (tmp_path / "x.log").write_text("not nccl-tests\n")
    r = cli("--nccl-tests", str(tmp_path / "x.log"))
    assert r.returncode == 2 and "no nccl-tests table" in r.stderr
