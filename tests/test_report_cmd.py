"""`tailgate report FILE...`: saved documents shown again by their own renderers, nothing
re-run; unknown documents refused naming what it reads; `inspect --from` on a report says
what it needs (issue 25)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.nginx import Nginx, available
from support.require import require
from tailgate.probes.analyze import runqlat
from tailgate.probes.output import parse_output

ROOTS = Path(__file__).parent / "fixtures" / "roots"
PROBES = Path(__file__).parent / "fixtures" / "probes"


def tailgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tailgate", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def inspect_report(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("inspect")
    r = tailgate("inspect", "--root", str(ROOTS / "vm-kvm"), "--interval", "0", "--no-history",
                 "--json", str(d / "report.json"), "--save", str(d / "snap.json"),
                 "--junit", str(d / "report.xml"), "--html", str(d / "report.html"))
    assert r.returncode == 1, r.stderr  # the vm-kvm root fails at L2
    (d / "terminal.txt").write_text(r.stdout)
    return d


def test_an_inspect_report_renders_as_inspect_rendered_it(inspect_report):
    d = inspect_report
    r = tailgate("report", str(d / "report.json"))
    assert r.returncode == 0, r.stderr
    # the same renderer on the same report: the same text (the terminal output of inspect)
    assert r.stdout == (d / "terminal.txt").read_text()
    j = tailgate("report", str(d / "report.json"), "--junit", "-")
    assert j.returncode == 0 and j.stdout == (d / "report.xml").read_text()
    h = tailgate("report", str(d / "report.json"), "--html", str(d / "again.html"), "--quiet")
    assert h.returncode == 0 and h.stdout == ""
    assert (d / "again.html").read_text() == (d / "report.html").read_text()


def test_what_does_not_fit_or_is_unknown_exits_2_saying_what_it_reads(inspect_report, tmp_path):
    d = inspect_report
    r = tailgate("report", str(d / "report.json"), "--markdown", "-")
    assert r.returncode == 2 and "--markdown does not fit an inspect document" in r.stderr
    (tmp_path / "x.json").write_text('{"hello": 1}')
    r = tailgate("report", str(tmp_path / "x.json"))
    assert r.returncode == 2 and "reads: inspect report (inspect --json), bench result" in r.stderr
    r = tailgate("report", str(d / "snap.json"))
    assert r.returncode == 2 and "a snapshot (inspect --save)" in r.stderr
    assert "inspect --from FILE" in r.stderr
    r = tailgate("report", str(d / "report.json"), str(d / "report.json"), "--html", "x.html")
    assert r.returncode == 2 and "one FILE" in r.stderr


def test_inspect_from_a_report_says_exactly_what_it_needs(inspect_report):
    d = inspect_report
    r = tailgate("inspect", "--from", str(d / "report.json"))
    assert r.returncode == 2
    assert "an inspect report (the verdict), not a snapshot (the facts)" in r.stderr
    assert "inspect --save FILE" in r.stderr and "tailgate report" in r.stderr
    ok = tailgate("inspect", "--from", str(d / "snap.json"), "--quiet")
    assert ok.returncode == 1, ok.stderr  # the same snapshot judged again: the same verdict


def test_a_probe_summary_renders(tmp_path):
    out = parse_output((PROBES / "runqlat-host.jsonl").read_text())
    doc = {**runqlat(out), "duration_s": 5.0, "startup_s": 0.4}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    r = tailgate("report", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("runqlat: 5 s window")


def test_bench_and_compare_documents_render(tmp_path):
    require(available())
    with Nginx(workers=1) as ng:
        for name in ("a", "b"):
            r = tailgate("bench", ng.url("/"), "--rate", "200", "--duration", "1s", "--workers",
                         "1", "--quiet", "--json", str(tmp_path / f"{name}.json"))
            assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "a.json").read_text())
    r = tailgate("report", str(tmp_path / "a.json"))
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("latency ms"))
    assert f"{doc['latency_ms']['p95']:.3f}" in row and str(doc["latency_ms"]["count"]) in row
    assert f"requests: sent {doc['requests']['sent']}, ok {doc['requests']['ok']}" in r.stdout
    h = tailgate("report", str(tmp_path / "a.json"), "--html", str(tmp_path / "a.html"))
    assert h.returncode == 0 and "<html" in (tmp_path / "a.html").read_text()
    c = tailgate("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json",
                 str(tmp_path / "c.json"), "--markdown", str(tmp_path / "c.md"), "--quiet")
    assert c.returncode == 0, c.stderr
    m = tailgate("report", str(tmp_path / "c.json"), "--markdown", "-")
    assert m.returncode == 0 and m.stdout == (tmp_path / "c.md").read_text()
    both = tailgate("report", str(tmp_path / "a.json"), str(tmp_path / "c.json"))
    assert both.returncode == 0, both.stderr
    assert f"== {tmp_path / 'a.json'} (bench) ==" in both.stdout
    assert f"== {tmp_path / 'c.json'} (compare) ==" in both.stdout
