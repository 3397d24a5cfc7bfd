"""What `tailgate diagnose` costs the workload it watches: the same open-loop load on the same
nginx worker, measured by `tailgate bench` alone and by `tailgate diagnose` (the load plus the
diagnose probe and the counter polls), alternated so that a drift of the machine hits both.

The server is pinned to CPU 1 and the load (with diagnose's bpftrace, its child) to CPU 0, as
in the scenario tests. Printed per mode: the median over the runs of the P50, P99 and P999
latency, and the server's CPU per request (from /proc/PID/schedstat); then the ratio diagnose/bench.
Also the CPU that bpftrace and the polls used, from diagnose's own report. Root only.

    .venv/bin/python benchmarks/bench_diagnose.py [--runs 3] [--rate 1000] [--duration 4s]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.nginx import Nginx  # noqa: E402


def cpu_s(pid: int) -> float:
    """The worker's time on a CPU in ns precision (schedstat), not clock ticks."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def once(mode: str, url: str, pid: int, rate: str, duration: str) -> dict:
    cmd = ["taskset", "-c", "0", sys.executable, "-m", "tailgate", mode, url, "--rate", rate,
           "--duration", duration, "--workers", "1", "--json", "-"]
    if mode == "diagnose":
        cmd += ["--pid", str(pid)]
    else:
        cmd += ["--quiet"]
    before = cpu_s(pid)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if out.returncode not in (0, 1):
        raise SystemExit(f"{mode} failed: {out.stderr[-2000:]}")
    doc = json.loads(out.stdout)
    bench = doc["bench"] if mode == "diagnose" else doc
    lat = bench["latency_ms"]
    n = bench["requests"]["ok"] if isinstance(bench["requests"], dict) else bench["requests"]
    row = {"p50": lat["p50"], "p99": lat["p99"], "p999": lat["p999"],
           "server_us_per_req": 1e6 * (cpu_s(pid) - before) / max(n, 1)}
    if mode == "diagnose":
        o = doc["overhead"]
        row.update(probe_cpu_share=o["probe_window_cpu_s"] / o["window_s"],
                   poll_cpu_share=o["poll_cpu_s"] / o["window_s"])
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", default="1000")
    ap.add_argument("--duration", default="4s")
    a = ap.parse_args()
    rows: dict[str, list[dict]] = {"bench": [], "diagnose": []}
    with Nginx(workers=1) as ng:
        (pid,) = ng.worker_pids()
        os.sched_setaffinity(pid, {1})
        for _ in range(a.runs):
            for mode in rows:
                rows[mode].append(once(mode, ng.url("/"), pid, a.rate, a.duration))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in rows.items()}
    print(f"nginx, {a.rate} req/s for {a.duration}, median of {a.runs} runs each")
    print(f"{'':10}{'P50 ms':>10}{'P99 ms':>10}{'P999 ms':>10}{'server us/req':>15}")
    for m, v in med.items():
        print(f"{m:10}{v['p50']:10.3f}{v['p99']:10.3f}{v['p999']:10.3f}"
              f"{v['server_us_per_req']:15.1f}")
    b, d = med["bench"], med["diagnose"]
    print("diagnose/bench: " + ", ".join(f"{k} {d[k] / b[k]:.2f}x" for k in
                                         ("p50", "p99", "p999", "server_us_per_req")))
    print(f"in the window, bpftrace used {100 * d['probe_cpu_share']:.1f} % of a CPU, the polls "
          f"{100 * d['poll_cpu_share']:.1f} %")


if __name__ == "__main__":
    main()
