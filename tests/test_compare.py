"""`tailgate compare`: the before/after table, its significance marks and the regression gate
(issue 11), on real bench runs against nginx and on constructed histograms."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.cgroups import HALF_PERIOD_US, cpu_cgroup, spent_quota
from support.inspect import gate_code
from support.nginx import Nginx, available
from support.require import require
from tailgate.compare import compare, hist_interval, parse_gate, rank_interval, side
from tailgate.hist import Histogram, encode

TAILGATE = [sys.executable, "-m", "tailgate"]


def tailgate(*args: str, timeout: float = 120, cpu: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    pre = ["taskset", "-c", cpu] if cpu else []
    return subprocess.run([*pre, *TAILGATE, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def bench_doc(samples_ms: np.ndarray) -> dict:
    """A bench result document around real samples (what the histogram part is about)."""
    h = Histogram()
    h.record(samples_ms * 1e6)
    s = {k: min(h.value_at_percentile(p), h.max) / 1e6 for k, p in
         (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9), ("p9999", 99.99))}
    s.update(max=h.max / 1e6, count=h.total)
    return {"tailgate_bench": 1, "target": "x", "latency_ms": s, "service_time_ms": s,
            "rate": {"achieved": 1000.0}, "requests": {"sent": h.total, "errors": {}},
            "histograms": {"latency": encode(h), "service": encode(h)}}


def write(tmp: Path, name: str, doc: dict) -> str:
    path = tmp / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_rank_interval_brackets_the_quantile():
    lo, hi = rank_interval(100_000, 0.999)
    assert lo < 99_900 < hi and hi - lo < 130  # +-1.96 sqrt(n q (1-q)) ~ +-20 ranks... and more
    assert rank_interval(10, 0.999) == (9, 10)


def test_same_distribution_is_rarely_significant_and_a_shift_always_is(tmp_path):
    rng = np.random.default_rng(7)
    false_pos = 0
    for i in range(40):
        a = rng.lognormal(0, 0.6, 20_000)
        b = rng.lognormal(0, 0.6, 20_000)
        (_, ma), (_, mb) = (side([write(tmp_path, f"{i}{n}.json", bench_doc(x))])
                            for n, x in (("a", a), ("b", b)))
        rows = {r.name: r for r in compare(ma, mb)}
        false_pos += rows["latency.p99"].significant == "yes"
        shifted = side([write(tmp_path, f"{i}c.json", bench_doc(a * 1.25))])[1]
        assert {r.name: r for r in compare(ma, shifted)}["latency.p99"].significant == "yes"
    assert false_pos <= 2, false_pos  # two 95 % intervals that must not overlap: ~0.5 % expected


def test_several_runs_per_side_merge_exactly(tmp_path):
    rng = np.random.default_rng(1)
    parts = [rng.exponential(2.0, 5_000) for _ in range(3)]
    paths = [write(tmp_path, f"r{i}.json", bench_doc(x)) for i, x in enumerate(parts)]
    _, merged = side(paths)
    whole = Histogram()
    whole.record(np.concatenate(parts) * 1e6)
    p999 = next(m for m in merged if m.name == "latency.p999")
    assert p999.value == min(whole.value_at_percentile(99.9), whole.max) / 1e6
    assert p999.count == 15_000
    ci = hist_interval(whole, 99.9)
    assert p999.ci == (ci[0] / 1e6, ci[1] / 1e6)


def test_gates_parse_and_bad_input_exits_2(tmp_path):
    assert parse_gate("p999=10%").max_pct == 10.0
    with pytest.raises(ValueError):
        parse_gate("p999<10%")
    good = write(tmp_path, "g.json", bench_doc(np.ones(10)))
    other = tmp_path / "o.json"
    other.write_text('{"hello": 1}')
    for args, words in (([good, str(other)], f"{other}: not a tailgate"),
                        ([good, str(tmp_path / "none.json")], "cannot read"),
                        ([good, good, "--max-regression", "p999"], "METRIC=PCT%")):
        out = tailgate("compare", *args)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_compare_reproduces_a_quota_fix_and_gates_the_regression(tmp_path):
    """Before: nginx on CPU 1 in a cgroup whose quota a busy neighbour spends (`spent_quota`,
    throttled half of each 500 ms period); after: no quota, no neighbour. The load runs on
    CPU 0."""
    require(available())
    runs = {}
    rate = 1000
    with Nginx(workers=1) as ng:
        (pid,) = ng.worker_pids()
        os.sched_setaffinity(pid, {1})
        with cpu_cgroup(period_us=HALF_PERIOD_US) as cg:
            (cg / "cgroup.procs").write_text(str(pid))
            for name in ("before", "after"):
                runs[name] = str(tmp_path / f"{name}.json")
                with spent_quota(cg) if name == "before" else contextlib.nullcontext():
                    out = tailgate("bench", ng.url("/"), "--rate", str(rate), "--duration",
                                   "4s", "--arrival", "poisson", "--workers", "1", "--quiet",
                                   "--json", runs[name], cpu="0")
                assert out.returncode == 0, out.stderr
    md = tailgate("compare", runs["before"], runs["after"], "--markdown", "-",
                  "--json", str(tmp_path / "c.json"), "--max-regression", "p99=10%")
    assert md.returncode == 0, md.stdout + md.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    rows = {r["name"]: r for r in doc["rows"]}
    p99 = rows["latency.p99"]
    # a throttled period holds requests until the next one: milliseconds, not microseconds
    assert p99["before"] > 3 * p99["after"] and p99["significant"] == "yes", p99
    for run in ("before", "after"):  # every request of each run stands behind its P99
        sent = json.loads(Path(runs[run]).read_text())["requests"]["sent"]
        assert p99[f"{run}_n"] == sent and abs(sent - rate * 4) < 0.1 * rate * 4
    assert "| end-to-end | latency.p99 |" in md.stdout
    assert doc["measured_differently"] == []  # one engine, no window: alike
    # the same pair the other way round is a regression: exit 1, named
    back = tailgate("compare", runs["after"], runs["before"], "--max-regression", "p99=10%",
                    "--json", "-")
    assert back.returncode == 1
    assert {g["metric"] for g in json.loads(back.stdout)["regressions"]} >= {"latency.p99"}


def test_runs_measured_differently_are_said_so(tmp_path):
    """A --coalesce window is in every latency, and the python engine ends a latency at its
    read, not at the kernel's stamp: compare says so above the table (nginx, 500/s, 1 s)."""
    require(available())
    paths = {}
    with Nginx(workers=1) as ng:
        for name, extra in (("plain", []), ("coalesced", ["--coalesce", "1ms"]),
                            ("python", ["--engine", "python"])):
            paths[name] = str(tmp_path / f"{name}.json")
            out = tailgate("bench", ng.url("/"), "--rate", "500", "--duration", "1s",
                           "--workers", "1", "--quiet", "--json", paths[name], *extra)
            assert out.returncode == 0, out.stderr
    moves = "(the figures move with it, not only with the system)"
    r = tailgate("compare", paths["plain"], paths["coalesced"], "--json", "-", "--quiet")
    assert json.loads(r.stdout)["measured_differently"] == [
        f"measured differently: --coalesce 0 µs before, 1000 µs after {moves}"]
    md = tailgate("compare", paths["plain"], paths["python"], "--markdown", "-", "--quiet")
    assert md.returncode == 0, md.stderr
    assert f"**measured differently: engine fast before, python after {moves}**" in md.stdout
    assert ("**measured differently: latency ends at the reply's kernel receive stamp before, "
            f"the generator's read after {moves}**") in md.stdout
    same = tailgate("compare", paths["plain"], paths["plain"], "--json", "-", "--quiet")
    assert json.loads(same.stdout)["measured_differently"] == []


def test_inspect_reports_list_status_changes_first(tmp_path):
    """One snapshot of a fixture host judged twice: with the default red lines, and with a
    tighter PTP limit that its 3 ns offset crosses."""
    root = Path(__file__).parent / "fixtures" / "roots" / "l1l3-clean"
    snap = tmp_path / "snap.json"
    base = tmp_path / "tight.yaml"
    base.write_text("l1.clock.ptp: 2.0\n")
    runs = {"before": [], "after": ["--baseline", str(base)]}
    out = tailgate("inspect", "--root", str(root), "--interval", "0", "--no-history", "--quiet",
                   "--save", str(snap), "--json", str(tmp_path / "root.json"))
    assert out.returncode == gate_code(json.loads((tmp_path / "root.json").read_text())), \
        out.stderr
    for name, extra in runs.items():
        out = tailgate("inspect", "--from", str(snap), "--quiet", "--json",
                       str(tmp_path / f"{name}.json"), *extra)
        assert out.returncode == gate_code(json.loads((tmp_path / f"{name}.json").read_text())), \
            out.stderr
    res = tailgate("compare", str(tmp_path / "before.json"), str(tmp_path / "after.json"),
                   "--json", "-", "--max-regression", "l1.optics.rx_power [eth2]=1%")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["kind"] == "inspect"
    assert doc["status_changes"] == [{"id": "l1.clock.ptp", "subject": "host", "layer": "L1",
                                      "before": "pass", "after": "fail",
                                      "reason": doc["status_changes"][0]["reason"]}]
    rows = {r["name"]: r for r in doc["rows"]}
    assert rows["l1.clock.ptp [host]"]["before"] == rows["l1.clock.ptp [host]"]["after"] == 3
    assert rows["l1.optics.rx_power [eth2]"]["significant"] == "n/a"  # no noise model


def test_not_measurable_exactly_where_bench_says_so(tmp_path):
    """P99.99 of 5,000 samples has no interval in bench (result.intervals); compare must call it
    n/m, not a significant change, even when the after side is three times slower."""
    from tailgate.bench.result import PERCENTILES, intervals

    rng = np.random.default_rng(3)
    a = rng.lognormal(0, 0.5, 5_000)
    (_, ma), (_, mb) = (side([write(tmp_path, f"{n}.json", bench_doc(x))])
                        for n, x in (("a", a), ("b", a * 3)))
    rows = {r.name: r for r in compare(ma, mb)}
    h = Histogram()
    h.record(a * 1e6)
    said = intervals(h)
    assert not said["p9999"]["measurable"] and said["p99"]["measurable"]
    for name in PERCENTILES:
        if f"latency.{name}" not in rows:
            continue
        row = rows[f"latency.{name}"]
        if said[name]["measurable"]:
            assert row.significant == "yes" and row.before_ci == pytest.approx(
                (said[name]["lo"], said[name]["hi"]), rel=1e-3), name
        else:
            assert row.significant == "n/m" and said[name]["reason"] in row.not_measurable
    assert rows["latency.p9999"].significant == "n/m"
    # a document without histograms: what bench wrote in its "ci" decides
    doc = bench_doc(a)
    del doc["histograms"]
    doc["latency_ms"]["ci"] = said
    (_, mc), (_, md) = (side([write(tmp_path, f"nh{n}.json", doc)]) for n in "cd")
    assert {r.name: r for r in compare(mc, md)}["latency.p9999"].significant == "n/m"


def test_quiet_regression_says_why_on_stderr(tmp_path):
    rng = np.random.default_rng(5)
    a = rng.lognormal(0, 0.5, 20_000)
    before, after = (write(tmp_path, f"{n}.json", bench_doc(x)) for n, x in (("a", a), ("b", a * 2)))
    out = tailgate("compare", before, after, "--quiet", "--max-regression", "p99=10%")
    assert out.returncode == 1 and out.stdout == ""
    assert "regression: latency.p99 +" in out.stderr and "gate p99=10%" in out.stderr
    ok = tailgate("compare", before, before, "--quiet", "--max-regression", "p99=10%")
    assert ok.returncode == 0 and ok.stderr == ""
