"""Every HTML page kind, opened in a real browser (headless Chromium) from a file URL with the
network cut: no console errors, the expected plots and series in the DOM, a screenshot for a
person to look at (build/screenshots/)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from support.browser import render
from support.nginx import Nginx, available
from support.require import require
from tailgate.baseline import catalog
from tailgate.diagnose.causes import CAUSES

TAILGATE = [sys.executable, "-m", "tailgate"]


def tailgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TAILGATE, *args], capture_output=True, text=True, timeout=120,
                          check=False)


def plots(dom: str) -> int:
    return len(re.findall(r'class="[^"]*\bjs-plotly-plot\b', dom))


def traces(dom: str) -> int:
    return len(re.findall(r'class="[^"]*\btrace scatter\b', dom))


@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory):
    require(available())
    d = tmp_path_factory.mktemp("html")
    with Nginx(workers=1) as ng:
        for name in ("a", "b"):
            out = tailgate("bench", ng.url("/"), "--rate", "500", "--duration", "1s",
                           "--workers", "1", "--quiet", "--json", str(d / f"{name}.json"),
                           "--html", str(d / f"{name}.html"))
            assert out.returncode == 0, out.stderr
    return d


def test_the_console_check_sees_errors(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>console.error('tailgate-canary')</script>"
                    "<img src='http://example.invalid/x.png'></body></html>")
    r = render(page, "control-broken")
    assert any("tailgate-canary" in m for m in r.console), r.console


def test_bench_page(bench_runs):
    r = render(bench_runs / "a.html", "bench")
    assert r.console == []
    assert plots(r.dom) == 3 and traces(r.dom) == 3  # latency, service, lateness
    assert 'id="percentiles"' in r.dom and r.screenshot.stat().st_size > 10_000


def test_compare_page(bench_runs, tmp_path):
    page = tmp_path / "compare.html"
    out = tailgate("compare", str(bench_runs / "a.json"), str(bench_runs / "b.json"), "--html",
                   str(page), "--quiet")
    assert out.returncode == 0, out.stderr
    r = render(page, "compare")
    assert r.console == []
    assert plots(r.dom) == 2 and traces(r.dom) == 4  # latency and service: before and after
    assert r.dom.count("<tr") >= 14


def test_inspect_page(tmp_path):
    page = tmp_path / "inspect.html"
    out = tailgate("inspect", "--interval", "0", "--no-history", "--quiet", "--html", str(page))
    assert out.returncode in (0, 1), out.stderr
    r = render(page, "inspect")
    assert r.console == []
    for cid in catalog():
        assert cid in r.dom


def test_diagnose_page(tmp_path):
    require(available())
    page, doc = tmp_path / "diagnose.html", tmp_path / "diagnose.json"
    with Nginx(workers=1) as ng:
        (pid,) = ng.worker_pids()
        out = tailgate("diagnose", ng.url("/"), "--pid", str(pid), "--rate", "500",
                       "--duration", "1s", "--workers", "1", "--html", str(page),
                       "--json", str(doc))
    assert out.returncode in (0, 1), out.stderr
    tl = json.loads(doc.read_text())["timeline"]
    r = render(page, "diagnose", size="1200,4000")
    assert r.console == []
    assert plots(r.dom) == 2  # the timeline and the spectrum
    assert 'id="causes"' in r.dom
    # every series of the JSON timeline is drawn: request P99 and max, the evidence that
    # occurred, every counter series; and the spectrum's latency and service
    drawn = (2 + sum(1 for v in tl["evidence_ms"].values() if any(v))
             + sum(1 for v in tl["instants"].values() if any(v)) + len(tl["series"]))
    assert len(tl["series"]) >= 20, sorted(tl["series"])
    assert traces(r.dom) == drawn + 2
    # one row per layer that has evidence, under the latency row, titled in the drawing
    layers = {s["layer"] for s in tl["series"].values()} | {
        CAUSES[k].layer for k, v in {**tl["evidence_ms"], **tl["instants"]}.items() if any(v)}
    titles = re.findall(r'class="annotation-text[^"]*"[^>]*data-unformatted="(L\d): ms per bin',
                        r.dom)
    assert sorted(titles) == sorted(layers) and "L2" in layers, (titles, layers)
