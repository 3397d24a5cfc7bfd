"""The eBPF probes: start-up time, runqlat's overhead, and the P999's error vs raw samples.

Needs root, bpftrace and tracefs (it mounts tracefs where absent, and unmounts it again).
In one run:

1. start-up: spawn to probes attached, for every probe (median of --runs), next to the
   stock ``/usr/sbin/runqlat.bt`` that Debian's bpftrace ships (the peer);
2. overhead of ``runqlat`` on a CPU-bound workload (2 x cores copies of a fixed amount of
   arithmetic) and a context-switch-heavy one (a pipe ping-pong between two processes
   pinned to one CPU):
   wall time with the probe attached / without, interleaved rounds, medians; the stock
   runqlat.bt measured the same way;
3. accuracy: runqlat in raw mode (every sample printed too) under contention; the P50..P999
   from the log-linear buckets vs the exact nearest-rank values of the same samples, and
   what a power-of-two histogram (bpftrace's ``hist()``) could say at best (its bucket's
   midpoint).

    .venv/bin/python benchmarks/bench_probe.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import workloads  # noqa: E402
from support.workloads import argv_for, running  # noqa: E402
from tailgate.probes import PROBES, Request, driver, loglin, measure  # noqa: E402
from tailgate.probes.driver import Run, attached  # noqa: E402

NCPU = os.cpu_count() or 1
STOCK = "/usr/sbin/runqlat.bt"


def stock_argv() -> list[str] | None:
    """The stock runqlat.bt, power-of-two hist(), as the peer. It includes linux/sched.h
    for TASK_RUNNING, which fails without kernel headers (as on our VMs), so the peer is
    that program with the include dropped and TASK_RUNNING written as 0."""
    if not os.path.exists(STOCK):
        return None
    text = Path(STOCK).read_text(encoding="utf-8")
    text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#include"))
    return ["bpftrace", "-f", "json", "-e", text.replace("TASK_RUNNING", "0")]


def timed(argvs: list[list[str]]) -> float:
    """Wall seconds for these processes, started together, to finish."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for a in argvs]
    for p in procs:
        if p.wait(timeout=300) != 0:
            raise SystemExit(f"workload {p.args} failed")
    return time.perf_counter() - t0


def startup(runs: int) -> None:
    print(f"start-up, spawn to probes attached (median of {runs}):")
    for name in PROBES:
        pids = (os.getpid(),) if PROBES[name].needs_pid else ()
        times = [measure(Request(name, 0.2, pids))["startup_s"] for _ in range(runs)]
        print(f"  {name:9s} {statistics.median(times):6.3f} s   (min {min(times):.3f})")
    if stock_argv():
        times = []
        for _ in range(runs):
            with attached(Run("runqlat", 1.0), stock_argv()) as p:
                times.append(p.attached_at - p.spawned)
        print(f"  {'stock runqlat.bt':9s} {statistics.median(times):6.3f} s   "
              f"(min {min(times):.3f})")


def overhead(runs: int) -> None:
    cpu = [argv_for("cpuwork", 800_000_000)] * (2 * NCPU)
    # Both ends on one CPU: every round trip is two context switches on that CPU, with no
    # cross-CPU wake-up (IPI, idle exit) whose cost swings with what else the host runs.
    ctx = [["taskset", "-c", "0", *argv_for("pingpong", 200_000)]]
    variants = {"without": None, "runqlat": Run("runqlat", 600.0)}
    if stock_argv():
        variants["stock runqlat.bt"] = "stock"
    print(f"\noverhead (wall time of the workload, median of {runs} interleaved rounds):")
    for label, argvs in (("CPU-bound", cpu), ("context-switch heavy", ctx)):
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(runs):
            for name, how in variants.items():
                if how is None:
                    times[name].append(timed(argvs))
                elif how == "stock":
                    with attached(Run("runqlat", 600.0), stock_argv()):
                        times[name].append(timed(argvs))
                else:
                    with attached(how):
                        times[name].append(timed(argvs))
        base = statistics.median(times["without"])
        row = ", ".join(f"{k} {statistics.median(v):.3f} s (x{statistics.median(v) / base:.3f})"
                        for k, v in times.items())
        print(f"  {label}: {row}")


def pow2_estimate(samples: list[int], q: float) -> float:
    """The best a power-of-two histogram can answer: the midpoint of the bucket of the rank."""
    exact = loglin.exact_quantile(samples, q)
    low = 1 << (int(exact).bit_length() - 1) if exact >= 1 else 0
    return (low + 2 * low) / 2 if low else 0.5


def accuracy(runs: int) -> None:
    print("\naccuracy vs the exact value of the same raw samples (runqlat raw mode, "
          f"{3 * NCPU} busy loops on {NCPU} CPUs):")
    worst = 0.0
    for i in range(runs):
        with running(*[("spin", 6)] * (3 * NCPU)):
            s = measure(Request("runqlat", 1.5, raw=True))
        raw = s["raw_ns"]
        parts = []
        for name, q in loglin.QUANTILES:
            exact = loglin.exact_quantile(raw, q)
            err = abs(s[name] * 1e3 - exact) / exact
            p2 = abs(pow2_estimate(raw, q) - exact) / exact
            worst = max(worst, err) if name == "p999" else worst
            parts.append(f"{name} {exact / 1e3:.1f} us: log-linear {100 * err:.2f} %, "
                         f"power-of-two {100 * p2:.1f} %")
        print(f"  run {i + 1} ({len(raw)} samples, {s['count']} in buckets, "
              f"{s['lost_events']} lost): " + "; ".join(parts))
    print(f"  worst P999 error of the log-linear buckets: {100 * worst:.2f} % (bound: 2 %)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    gen = workloads.tracefs_mounted()
    next(gen)
    try:
        reason = driver.unavailable()
        if reason:
            print(f"cannot benchmark the probes: {reason}")
            return 1
        startup(args.runs)
        overhead(args.runs)
        accuracy(args.runs)
    finally:
        gen.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
