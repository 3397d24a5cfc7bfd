"""`tailgate serve` (resident runqlat) beside Debian's prometheus-node-exporter, in one run.

Both serve /metrics on loopback. Each is scraped the same number of times and each scrape is
timed; then both idle-run side by side for --steady seconds while their CPU time is read from
/proc (tailgate's own threads apart from its bpftrace children, which are reaped after every
probe window and so land in cutime/cstime). A scrape of tailgate is answered from memory: the
collection runs on its own interval, never inside the scrape.

    .venv/bin/python benchmarks/bench_serve.py [--scrapes N] [--steady SECONDS]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children) CPU seconds of a process."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / TICK, (cutime + cstime) / TICK


def scrape(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
        body = r.read()
    return time.perf_counter() - t0, len(body)


def wait_ready(url: str, needle: bytes, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback
                if needle in r.read():
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready after {timeout:g} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--steady", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=15.0, help="tailgate serve --interval")
    ap.add_argument("--probe-window", type=float, default=30.0)
    a = ap.parse_args()
    exe = shutil.which("prometheus-node-exporter")
    if not exe:
        raise SystemExit("prometheus-node-exporter is not installed")
    ports = free_port(), free_port()
    procs = {
        "node_exporter": subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{ports[0]}"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "tailgate serve": subprocess.Popen(
            [sys.executable, "-m", "tailgate", "serve", "--listen", f"127.0.0.1:{ports[1]}",
             "--interval", str(a.interval), "--probe-window", str(a.probe_window)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    }
    urls = {name: f"http://127.0.0.1:{port}/metrics" for name, port in zip(procs, ports, strict=True)}
    try:
        wait_ready(urls["node_exporter"], b"node_cpu_seconds_total", 30)
        wait_ready(urls["tailgate serve"], b"tailgate_runqueue_latency_seconds_count", 120)
        print(f"{'':16} {'scrape p50 ms':>14} {'p90 ms':>8} {'max ms':>8} {'bytes':>8}")
        medians = {}
        for name, url in urls.items():
            times, size = [], 0
            for _ in range(a.scrapes):
                t, size = scrape(url)
                times.append(t * 1e3)
            times.sort()
            medians[name] = statistics.median(times)
            print(f"{name:16} {medians[name]:14.2f} {times[int(0.9 * len(times))]:8.2f} "
                  f"{times[-1]:8.2f} {size:8d}")
        print(f"scrape ratio tailgate/node_exporter: "
              f"{medians['tailgate serve'] / medians['node_exporter']:.2f}x")
        start = {name: cpu(p.pid) for name, p in procs.items()}
        time.sleep(a.steady)
        print(f"steady CPU over {a.steady:g} s (no scrapes), % of one core:")
        for name, p in procs.items():
            own, kids = (x - y for x, y in zip(cpu(p.pid), start[name], strict=True))
            extra = f", probes (bpftrace) {100 * kids / a.steady:.2f} %" if kids else ""
            print(f"  {name:16} own {100 * own / a.steady:.2f} %{extra}")
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
