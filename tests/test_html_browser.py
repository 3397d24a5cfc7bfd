"""Every HTML page kind, opened in a real browser (headless Chromium) from a file URL with the
network cut: no console errors, the expected plots and series in the DOM, a screenshot for a
person to look at (build/screenshots/; `make screenshots` makes one of every kind)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter

import pytest

from support import pages
from support.browser import render
from support.llm_server import MODEL_NAME, llama_cpp_available, llama_server
from support.nginx import Nginx, available
from support.require import require
from tailgate.baseline import catalog
from tailgate.diagnose.causes import CAUSES
from tailgate.hist import decode
from tailgate.report.diagnose_html import acted, timeline_panels

tailgate = pages.tailgate


def plots(dom: str) -> int:
    return len(re.findall(r'class="[^"]*\bjs-plotly-plot\b', dom))


def traces(dom: str) -> int:
    return len(re.findall(r'class="[^"]*\btrace scatter\b', dom))


def bars(dom: str) -> int:
    return len(re.findall(r'class="[^"]*\btrace bars\b', dom))


def figure(dom: str, div_id: str) -> str:
    """The DOM of one plot, from its div to the next plot's."""
    start = dom.index(f'id="{div_id}"')
    nxt = dom.find('class="plotly-graph-div', dom.index(">", start))
    return dom[start:nxt if nxt > 0 else len(dom)]


@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory):
    require(available())
    d = tmp_path_factory.mktemp("html")
    with Nginx(workers=1) as ng:
        for name in ("a", "b"):
            pages.bench(d, name, ng.url("/"))
    return d


def test_the_console_check_sees_errors(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>console.error('tailgate-canary')</script>"
                    "<img src='http://example.invalid/x.png'></body></html>")
    r = render(page, "control-broken")
    assert any("tailgate-canary" in m for m in r.console), r.console


def _over_time_traces(doc: dict) -> int:
    """P50, P99 and max, and the two halves' P99 where the stationarity test split the run."""
    return 3 + (2 if (doc["stationarity"].get("shift") or {}).get("split_s") is not None else 0)


def test_bench_page(bench_runs):
    doc = json.loads((bench_runs / "a.json").read_text())
    r = render(bench_runs / "a.html", "bench", size="1200,2600")
    assert r.console == []
    # latency over time, then the spectra of latency, service, lateness
    assert plots(r.dom) == 4 and traces(r.dom) == _over_time_traces(doc) + 3
    over = figure(r.dom, "over-time")
    assert traces(over) == _over_time_traces(doc)
    n = len(doc["over_time"]["latency"]["t_s"])
    assert n >= 4 and sum(doc["over_time"]["latency"]["count"]) == doc["latency_ms"]["count"]
    # drift is marked exactly when the result says the tail drifted
    assert ('data-unformatted="drifted"' in over) == (doc["stationarity"]["verdict"] == "drifted")
    assert 'id="percentiles"' in r.dom and r.screenshot.stat().st_size > 10_000


def test_bench_page_marks_a_drifted_tail(tmp_path):
    require(available())
    with Nginx(workers=1) as ng:
        page, path = pages.bench_stalled(tmp_path, "drifted", ng)
    doc = json.loads(path.read_text())
    st = doc["stationarity"]
    assert st["verdict"] == "drifted", st  # a 0.3 s stop in a 4 s run at 1000/s
    r = render(page, "bench-drifted", size="1200,2600")
    assert r.console == []
    over = figure(r.dom, "over-time")
    assert 'data-unformatted="drifted"' in over and traces(over) == 5
    from tailgate.report.bench_html import latency_figure

    # the shaded half is the one whose P99 is the higher
    (shade,) = [s for s in latency_figure(doc).layout.shapes if s.type == "rect"]
    heavier_first = st["shift"]["first_half_p99"] > st["shift"]["second_half_p99"]
    assert (shade.x1 == st["shift"]["split_s"]) == heavier_first
    # the stall is in the per-interval max: the worst interval holds a request that waited
    # for most of the stop
    assert max(doc["over_time"]["latency"]["max_ms"]) > 200


def test_llm_page(tmp_path):
    require(llama_cpp_available())
    with llama_server(tmp_path) as base:
        page, path = pages.llm_bench(tmp_path, "llm", base, MODEL_NAME)
    doc = json.loads(path.read_text())
    ot = doc["over_time"]
    done = ot["completed"]
    assert sum(done["ok_per_s"]) * ot["interval_s"] == pytest.approx(doc["requests"]["ok"])
    assert sum(done["output_tokens_per_s"]) * ot["interval_s"] == pytest.approx(
        doc["tokens"]["output"])
    assert sum(done["good_per_s"]) * ot["interval_s"] == pytest.approx(doc["requests"]["good"])
    assert sum(ot["ttft"]["count"]) == doc["ttft_ms"]["count"]
    r = render(page, "llm", size="1200,5200")
    assert r.console == []
    spectra = sum(1 for v in doc["histograms"].values() if decode(v).total)
    assert spectra >= 7  # latency, service, lateness, TTFT, ITL, TPOT, E2E (+ first chunk)
    # latency over time, throughput, goodput, TTFT/ITL over time, then the spectra
    assert plots(r.dom) == 4 + spectra, (plots(r.dom), spectra)
    assert traces(figure(r.dom, "throughput")) == 1
    assert traces(figure(r.dom, "goodput")) == 2  # ok and good requests per second
    assert traces(figure(r.dom, "llm-over-time")) == 6  # P50, P99, max of TTFT and of ITL
    assert 'id="throughput-table"' in r.dom and "goodput (good requests/s)" in r.dom
    # every figure is drawn into its own div (an id shared with another element was not)
    divs = re.findall(r'<div id="([^"]+)" class="([^"]*\bplotly-graph-div\b[^"]*)"', r.dom)
    assert all("js-plotly-plot" in cls for _, cls in divs), divs
    assert len(divs) == plots(r.dom) == len({i for i, _ in divs})
    assert {"over-time", "throughput", "goodput", "llm-over-time"} <= {i for i, _ in divs}


def _inspect_expectations(doc: dict) -> tuple[dict[str, str], int, int]:
    """Per layer the pyramid's status (the worst of its findings; skip when all are), the
    number of findings drawn as a bar (numeric observed and limit, not skipped) and of
    layers with bars."""
    order = ("error", "fail", "warn", "unknown", "pass")
    status, drawn, layers = {}, 0, set()
    for layer in ("L1", "L2", "L3", "L4"):
        fs = [f for f in doc["findings"] if f["layer"] == layer]
        status[layer] = next((s for s in order if any(f["status"] == s for f in fs)), "skip")
        for f in fs:
            if f["status"] != "skip" and all(isinstance(f[k], (int, float))
                                             and not isinstance(f[k], bool)
                                             for k in ("observed", "limit")):
                drawn += 1
                layers.add(layer)
    return status, drawn, len(layers)


def _pyramid(dom: str) -> dict[str, str]:
    return dict(re.findall(r'<polygon [^>]*data-layer="(L\d)" data-status="(\w+)"', dom))


def test_inspect_page(tmp_path):
    page, path = pages.inspect_host(tmp_path, "inspect")
    doc = json.loads(path.read_text())
    r = render(page, "inspect", size="1200,3200")
    assert r.console == []
    for cid in catalog():
        assert cid in r.dom
    status, drawn, layers = _inspect_expectations(doc)
    assert _pyramid(r.dom) == status
    first = doc["verdict"]["first_failing_layer"]
    assert re.findall(r'class="fix-first" data-layer="(L\d)"', r.dom) == ([first] if first else [])
    assert plots(r.dom) == layers and bars(r.dom) == drawn
    # the counts are a table, not JSON
    assert 'id="counts"' in r.dom and '{"pass"' not in r.dom


def test_inspect_page_of_a_bare_metal_host_marks_l1_and_draws_its_red_lines(tmp_path):
    page, path = pages.inspect_root(tmp_path, "metal", "fec-grown")
    doc = json.loads(path.read_text())
    failing = [(f["id"], f["layer"], f["status"], f.get("reason")) for f in doc["findings"]
               if f["status"] != "pass"]
    assert doc["verdict"]["first_failing_layer"] == "L1", (doc["verdict"], failing)
    r = render(page, "inspect-baremetal", size="1200,4200")
    assert r.console == []
    status, drawn, layers = _inspect_expectations(doc)
    assert _pyramid(r.dom) == status and status["L1"] == "fail"
    assert re.findall(r'class="fix-first" data-layer="(L\d)"', r.dom) == ["L1"]
    assert drawn >= 10 and plots(r.dom) == layers and bars(r.dom) == drawn
    # the failing FEC rate's bar is red (#cf222e), the passing ones green
    fec = figure(r.dom, "bars-L1")
    assert "rgb(207, 34, 46)" in fec and "rgb(26, 127, 55)" in fec


def test_inspect_page_draws_the_measured_run_queue_histogram(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("a probe window needs root (bpftrace); CI runs as root")
    page, path = pages.inspect_host(tmp_path, "probed", "--probe-window", "1")
    doc = json.loads(path.read_text())
    runq = [f for f in doc["findings"] if f["id"] == "l2.sched.runqlat"]
    assert runq and all(f["status"] in ("pass", "fail") for f in runq), runq
    assert all(f["evidence"]["buckets"] for f in runq)
    assert sum(b["count"] for b in runq[0]["evidence"]["buckets"]) == runq[0]["evidence"]["count"]
    r = render(page, "inspect-probed", size="1200,3200")
    assert r.console == []
    status, drawn, layers = _inspect_expectations(doc)
    assert _pyramid(r.dom) == status
    assert plots(r.dom) == layers + 1 and bars(r.dom) == drawn  # + the histogram
    assert traces(figure(r.dom, "runqlat")) == len(runq)


def test_compare_page(bench_runs, tmp_path):
    page = pages.compare(tmp_path, "compare", bench_runs / "a.json", bench_runs / "b.json")
    r = render(page, "compare")
    assert r.console == []
    assert plots(r.dom) == 2 and traces(r.dom) == 4  # latency and service: before and after
    assert r.dom.count("<tr") >= 14


def _row_colours(dom: str) -> dict[str, list[str]]:
    """The line colour of every trace, by the x axis (= the row) of its subplot (the legend's
    samples, after the subplots, left out)."""
    start = dom.index('class="cartesianlayer"')
    end = min(i for i in (dom.find('class="polarlayer"', start), dom.find('class="infolayer"', start),
                          len(dom)) if i >= 0)
    out: dict[str, list[str]] = {}
    for chunk in re.split(r'(?=<g class="subplot x\d*y\d*")', dom[start:end])[1:]:
        axis = re.match(r'<g class="subplot (x\d*)y', chunk).group(1)
        out.setdefault(axis, []).extend(
            re.findall(r'class="js-line"[^>]*stroke: (rgb\([^)]*\))', chunk))
    return out


def test_diagnose_page(tmp_path):
    require(available())
    if os.geteuid() != 0:
        pytest.fail("diagnose needs root (bpftrace); CI runs as root")
    with Nginx(workers=1) as ng:
        page, path = pages.diagnose_stopped(tmp_path, "diagnose", ng)
    doc = json.loads(path.read_text())
    tl = doc["timeline"]
    assert doc["verdict"]["first"] == "stopped", [c["sentence"] for c in doc["causes"]]
    r = render(page, "diagnose", size="1200,4600")
    assert r.console == []
    assert plots(r.dom) == 2  # the timeline and the spectrum
    assert 'id="causes"' in r.dom
    # every series of the JSON timeline is accounted for: request P99 and max, the evidence
    # that occurred and every counter series of a source with something in it are drawn; a
    # source whose every series stayed at zero is one line under the drawing (issue 44); and
    # the spectrum's latency and service
    sources: dict[tuple[str, str], list[str]] = {}
    for k, s in tl["series"].items():
        sources.setdefault((s["layer"], k.split(".", 1)[0]), []).append(k)
    quiet = {src for src, names in sources.items()
             if not any(v for k in names for v in tl["series"][k]["values"] if v is not None)}
    drawn = (2 + sum(1 for v in tl["evidence_ms"].values() if any(v))
             + sum(1 for v in tl["instants"].values() if any(v))
             + sum(len(names) for src, names in sources.items() if src not in quiet))
    assert len(tl["series"]) >= 20, sorted(tl["series"])
    # the band layer (timeline.bands: the slowest requests' chains): a bar trace per source
    # and kind, and a line joining each chain's links (the stops: stopped <- the stopper)
    bands = tl["bands"]
    per_request = Counter((b["source"], b["request"]) for b in bands if b["kind"] != "request")
    line = int(any(n > 1 for n in per_request.values()))
    assert bands and line, bands[:5]
    assert bars(figure(r.dom, "timeline")) == len({(b["source"], b["kind"]) for b in bands})
    assert "bands: the slowest requests' chains" in r.dom
    assert traces(r.dom) == drawn + 2 + line
    said = re.findall(r"<li>(L\d) (\w+): ([^<]*)</li>", figure(r.dom, "timeline").split(
        'id="quiet"', 1)[1].split("</ul>", 1)[0]) if quiet else []
    assert {(layer, kind): names.split(", ") for layer, kind, names in said} == {
        src: sources[src] for src in quiet}, (said, quiet)
    # under the latency row, one row per layer and evidence kind (the causes' evidence, then
    # each counter source with something in it), titled in the drawing
    layers = {s["layer"] for s in tl["series"].values()} | {
        CAUSES[k].layer for k, v in {**tl["evidence_ms"], **tl["instants"]}.items() if any(v)}
    kinds = (set(sources) - quiet) | {
        (CAUSES[k].layer, "evidence") for k, v in {**tl["evidence_ms"], **tl["instants"]}.items()
        if any(v)}
    titles = re.findall(r'class="annotation-text[^"]*"[^>]*data-unformatted="(L\d) (\w+): ',
                        r.dom)
    assert sorted(titles) == sorted(kinds) and "L2" in layers, (titles, kinds)
    assert {"evidence", "switches"} <= {k for _, k in kinds}  # the stops, nginx's switches
    assert {"psi", "softirq"} <= {k for _, k in set(sources)}  # drawn or said quiet
    # no colour twice in a row (each row's traces, left and right axis together)
    timeline = figure(r.dom, "timeline")
    rows = _row_colours(timeline)
    assert len(rows) == 1 + len(kinds) + line, rows.keys()
    # the band row (the second): the chains' line, one path per chain, one grey
    chained = sum(n > 1 for n in per_request.values())
    assert rows.pop("x2") == ["rgb(85, 85, 85)"] * chained
    want = [2] + [len(series) for _, _, series in timeline_panels(tl)]
    assert sorted(len(c) for c in rows.values()) == sorted(want)
    for axis, colours in rows.items():
        assert len(set(colours)) == len(colours), (axis, Counter(colours).most_common(3))
    # the claimed cause is shaded where it acted: one rectangle per range of bins
    ranges = acted(tl["evidence_ms"]["stopped"], tl["t_ms"], tl["bin_ms"])
    assert 1 <= len(ranges) <= 200
    shaded = re.findall(r'<path data-index="\d+"[^>]*fill: rgb\(207, 34, 46\)', timeline)
    assert len(shaded) == len(ranges), (len(shaded), len(ranges))
    assert "shaded: where stopped (claimed) acted" in timeline
