"""Soak: `tailgate bench --log` for --minutes at a high rate against nginx. A benchmark, not a
test (minutes of wall time).

nginx (one worker) on one core, the generator (`--engine fast`, one worker) on the other.
Every 5 s it samples the RSS of the whole tailgate process tree (parent and workers) and the
size of the worker's log part on disk; each minute's row is the floor and peak of its RSS
samples and how far the log grew. At the end it reads the merged log once and computes the
generator's own lateness (dispatch - intended) and the latency per minute. It checks:

* memory flat: the RSS floor of every minute from minute 2 on within --rss-bound MiB (default
  8) of minute 2's (minute 1 holds the start: the schedule and a flag per request are
  allocated before the run, so nothing should grow after it);
* the log streamed: its part grew in every minute (rows are written as requests end, never
  held until the end);
* lateness unchanged: the last minute's lateness P99 no more than --lateness-factor (default 2)
  times the first minute's, or within 0.05 ms of it;
* every request accounted: the log has one row per scheduled request and the JSON's
  ``scheduled == sent + abandoned + lost``.

    .venv/bin/python benchmarks/soak_bench.py [--minutes 10] [--rate 20000]

Exit status 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

from support.nginx import Nginx  # noqa: E402


def tree(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(entry))
    out, todo = [root], [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def per_minute(log: Path, minutes: int) -> tuple[list[dict], int]:
    """Lateness and latency percentiles per minute of intended time, from the merged log."""
    late: list[list[np.ndarray]] = [[] for _ in range(minutes + 1)]
    lat: list[list[np.ndarray]] = [[] for _ in range(minutes + 1)]
    rows = 0
    with open(log, encoding="ascii") as f:
        f.readline()
        while True:
            lines = f.readlines(1 << 24)
            if not lines:
                break
            rows += len(lines)
            cols = np.array([ln.split(",")[2:6] for ln in lines], dtype=object)
            intended = cols[:, 0].astype(np.float64)
            dispatch = cols[:, 1].astype(np.float64)
            end = cols[:, 3].astype(np.float64)
            minute = np.minimum((intended // 60).astype(np.int64), minutes)
            for m in np.unique(minute).tolist():
                sel = minute == m
                late[m].append((dispatch[sel] - intended[sel]) * 1e3)
                lat[m].append((end[sel] - intended[sel]) * 1e3)
    out = []
    for m in range(minutes):
        if not late[m]:
            continue
        a, b = np.concatenate(late[m]), np.concatenate(lat[m])
        out.append({"minute": m + 1, "requests": int(a.size),
                    "lateness_p50_ms": float(np.percentile(a, 50)),
                    "lateness_p99_ms": float(np.percentile(a, 99)),
                    "latency_p99_ms": float(np.percentile(b, 99)),
                    "latency_p999_ms": float(np.percentile(b, 99.9))})
    return out, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=int, default=10)
    ap.add_argument("--rate", type=float, default=20_000)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--rss-bound", type=float, default=8.0, help="MiB (default 8)")
    ap.add_argument("--lateness-factor", type=float, default=2.0)
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    gen, srv = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    print(f"machine: {os.uname().nodename}, {len(cpus)} cpus, kernel {os.uname().release}; "
          f"load average at start {os.getloadavg()[0]:.2f}; bench {args.rate:,.0f}/s for "
          f"{args.minutes} min, --engine fast, 1 worker on cpu {gen}, nginx (1 worker) on cpu "
          f"{srv}", flush=True)
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tailgate-soak-", dir="/var/tmp") as tmp, \
            Nginx(workers=1) as ng:
        if srv is not None:
            for pid in [ng.proc.pid, *ng.worker_pids()]:
                os.sched_setaffinity(pid, {srv})
        log, out = Path(tmp) / "requests.csv", Path(tmp) / "bench.json"
        cmd = [*(["taskset", "-c", str(gen)] if gen is not None else []), sys.executable,
               "-m", "tailgate", "bench", ng.url("/"), "--rate", f"{args.rate:g}",
               "--duration", f"{args.minutes}m", "--engine", "fast", "--workers", "1",
               "--connections", str(args.connections), "--log", str(log), "--json", str(out),
               "--quiet"]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        t0 = time.monotonic()
        part = Path(f"{log}.part0")
        rows: list[dict] = []
        samples: list[float] = []
        last_size, minute = 0, 1
        print(f"{'minute':>6} {'RSS floor MiB':>14} {'RSS peak MiB':>13} {'log grew MiB':>13}",
              flush=True)
        while proc.poll() is None:
            time.sleep(5)
            samples.append(rss_mib(tree(proc.pid)))
            if time.monotonic() - t0 >= 60 * minute and minute <= args.minutes:
                size = part.stat().st_size if part.exists() else last_size
                rows.append({"minute": minute, "rss_floor": min(samples),
                             "rss_peak": max(samples), "log_grew": (size - last_size) / 2**20})
                print(f"{minute:>6} {rows[-1]['rss_floor']:>14.1f} {rows[-1]['rss_peak']:>13.1f}"
                      f" {rows[-1]['log_grew']:>13.1f}", flush=True)
                samples, last_size, minute = [], size, minute + 1
        err = proc.stderr.read().decode() if proc.stderr else ""
        doc = json.loads(out.read_text())
        lat, n_rows = per_minute(log, args.minutes)
    req = doc["requests"]
    print(f"exit {proc.returncode}; requests {req['scheduled']:,} scheduled, {req['sent']:,} "
          f"sent, {req['ok']:,} ok, {req['abandoned']} abandoned, {req.get('lost', 0)} lost; "
          f"log rows {n_rows:,}")
    print(f"{'minute':>6} {'requests':>10} {'lateness P50':>13} {'lateness P99':>13} "
          f"{'latency P99':>12} {'latency P999':>13}  (ms)")
    for r in lat:
        print(f"{r['minute']:>6} {r['requests']:>10,} {r['lateness_p50_ms']:>13.3f} "
              f"{r['lateness_p99_ms']:>13.3f} {r['latency_p99_ms']:>12.3f} "
              f"{r['latency_p999_ms']:>13.3f}")
    if proc.returncode not in (0,):
        failures.append(f"bench exited {proc.returncode}: {err.strip()[-300:]}")
    base = next((r["rss_floor"] for r in rows if r["minute"] == 2), None)
    grown = [r for r in rows if base is not None and r["minute"] >= 2
             and r["rss_floor"] > base + args.rss_bound]
    if base is None or grown:
        failures.append(f"RSS floor grew past minute 2's {base} + {args.rss_bound} MiB: {grown}")
    if any(r["log_grew"] <= 0 for r in rows if r["minute"] <= args.minutes - 1):
        failures.append("the log did not grow in every minute (not streamed)")
    if len(lat) >= 2:
        first, last = lat[0]["lateness_p99_ms"], lat[-1]["lateness_p99_ms"]
        if last > max(first * args.lateness_factor, first + 0.05):
            failures.append(f"lateness P99 grew from {first:.3f} ms (minute 1) to {last:.3f} ms")
    if n_rows != req["scheduled"] or req["scheduled"] != req["sent"] + req["abandoned"] + \
            req.get("lost", 0):
        failures.append(f"accounting: {n_rows} log rows, {req}")
    for f in failures:
        print("FAIL:", f)
    print("every check held" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
