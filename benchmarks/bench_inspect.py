"""A full `tailgate inspect --interval 0` vs a scrape of Debian's prometheus-node-exporter.

Both read the same host in the same run. tailgate is timed as a whole process
(interpreter start and imports included), with its peak RSS; node_exporter is
started once on a loopback port and each scrape of /metrics is timed (its
process is already warm, which favours it). Then tailgate's time is broken
down: interpreter start, imports, collect, judge, render.

    .venv/bin/python benchmarks/bench_inspect.py [--runs N]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAILGATE = [sys.executable, "-m", "tailgate", "inspect", "--interval", "0", "--quiet",
            "--json", os.devnull]


def run_child(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv} exited {proc.returncode}: {proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_exporter_scrapes(runs: int) -> list[float] | str:
    exe = shutil.which("prometheus-node-exporter")
    if not exe:
        return "prometheus-node-exporter is not installed (apt-get install prometheus-node-exporter)"
    port = free_port()
    proc = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=5).read()
                break
            except OSError:
                time.sleep(0.05)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            body = urllib.request.urlopen(url, timeout=10).read()
            times.append(time.perf_counter() - t0)
        assert b"node_cpu_seconds_total" in body
        return times
    finally:
        proc.terminate()
        proc.wait(5)


def breakdown() -> dict[str, float]:
    """In-process phase timings (imports measured in a fresh interpreter)."""
    bare = min(run_child([sys.executable, "-c", "pass"])[0] for _ in range(5))
    imports = min(run_child([sys.executable, "-c",
                             "import tailgate.cli, tailgate.collect, tailgate.judge, "
                             "tailgate.report.terminal, tailgate.report.json_report"])[0]
                  for _ in range(5)) - bare
    from rich.console import Console

    from tailgate.baseline import default_baseline
    from tailgate.collect import Scope, collect, collectors
    from tailgate.host import Host
    from tailgate.judge import checks, judge
    from tailgate.report.terminal import print_report
    from tailgate.verdict import build_report

    collectors(), checks()  # registration happens once per process, counted in imports
    t0 = time.perf_counter()
    snap = collect(Host("/"), Scope(), 0)
    t1 = time.perf_counter()
    rep = build_report(snap, judge(snap, default_baseline()))
    t2 = time.perf_counter()
    print_report(rep, Console(file=io.StringIO(), width=100))
    t3 = time.perf_counter()
    return {"interpreter start": bare, "imports": imports, "collect": t1 - t0,
            "judge+verdict": t2 - t1, "render (terminal)": t3 - t2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    run_child(TAILGATE)  # warm the page cache
    samples = [run_child(TAILGATE) for _ in range(args.runs)]
    walls = [w for w, _ in samples]
    rss = max(r for _, r in samples)
    tg = statistics.median(walls)
    print(f"tailgate inspect --interval 0 (whole process, {args.runs} runs): "
          f"median {tg * 1000:.0f} ms, min {min(walls) * 1000:.0f} ms, "
          f"max {max(walls) * 1000:.0f} ms, peak RSS {rss / 1024:.1f} MiB  (target < 500 ms)")
    ne = node_exporter_scrapes(args.runs)
    if isinstance(ne, str):
        print(f"node_exporter: not measured: {ne}")
    else:
        med = statistics.median(ne)
        print(f"prometheus-node-exporter scrape of /metrics (warm process, {args.runs} scrapes): "
              f"median {med * 1000:.0f} ms")
        print(f"ratio tailgate / node_exporter scrape: {tg / med:.2f}x")
    print("where tailgate's time goes:")
    for phase, secs in breakdown().items():
        print(f"  {phase:<18} {secs * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
