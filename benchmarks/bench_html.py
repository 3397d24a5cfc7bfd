"""How long a browser takes to open the HTML report of a one-million-request run.

A bench result document is built around one million real-shaped latency samples (log-normal
with a stall tail) in every histogram, rendered with `bench_page`, and opened in headless
Chromium (file URL, network cut) with `--dump-dom`; the wall time of that process is what a
person waits for, browser start included. The page is drawn from the histograms, so its size
does not depend on the number of requests: the same page is also timed for 1,000 requests.

    .venv/bin/python benchmarks/bench_html.py [--runs N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from tailgate.hist import Histogram, encode
from tailgate.report.bench_html import bench_page

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--proxy-server=http://127.0.0.1:9", "--virtual-time-budget=10000", "--dump-dom"]


def document(n: int) -> dict:
    rng = np.random.default_rng(1)
    ms = rng.lognormal(np.log(0.2), 0.8, n)
    stall = rng.random(n) < 0.002
    ms[stall] += rng.uniform(20, 80, int(stall.sum()))
    hists = {}
    for name, scale in (("latency", 1.0), ("service", 0.7), ("lateness", 0.1)):
        h = Histogram()
        h.record(ms * scale * 1e6)
        hists[name] = h
    summary = {k: hists["latency"].value_at_percentile(p) / 1e6 for k, p in
               (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9), ("p9999", 99.99))}
    summary.update(max=hists["latency"].max / 1e6, count=n)
    return {"target": "http://127.0.0.1/", "requests": {"sent": n, "ok": n, "errors": {}},
            "rate": {"target": 10000, "achieved": 10000}, "latency_ms": summary,
            "histograms": {k: encode(h) for k, h in hists.items()}}


def open_s(page: Path) -> float:
    exe = shutil.which("chromium")
    with tempfile.TemporaryDirectory() as profile:
        t0 = time.perf_counter()
        subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", page.as_uri()],
                       capture_output=True, check=True, timeout=120)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if not shutil.which("chromium"):
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as d:
        for n in (1_000, 1_000_000):
            page = Path(d) / f"bench-{n}.html"
            t0 = time.perf_counter()
            page.write_text(bench_page(document(n)))
            render = time.perf_counter() - t0
            times = [open_s(page) for _ in range(a.runs)]
            print(f"{n:>9,} requests: page {page.stat().st_size / 1e6:.2f} MB, written in "
                  f"{render:.2f} s; opened in Chromium (start included) median "
                  f"{statistics.median(times):.2f} s, max {max(times):.2f} s")


if __name__ == "__main__":
    main()
