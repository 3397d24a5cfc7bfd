"""What diagnose's probe costs, wake-up recording included, on a service that switches context
more than 50,000 times a second: the service's throughput without the probe and with it,
alternated in one run, and bpftrace's own CPU per 1,000 context switches.

The service is switcher.c (tests/support/workloads): two threads of one process pinned to
one CPU passing a byte over two pipes, every round two wake-ups and two context switches.
Each run lasts ``--seconds``; the probe (diagnose.bt as `tailgate diagnose` runs it, watching
the switcher's pid) is attached before the run starts. The eBPF programs run in the context
of the tasks that fire them, so their cost shows in the service's throughput, and bpftrace's
own CPU is reading and printing what they send it. The switcher runs SCHED_FIFO, so that the
other work of a shared machine does not decide the comparison, and its CPU time per round is
printed beside the throughput: the programs run in its threads, so that figure holds even
when other real-time work (another suite's scenarios) takes its CPU. Root only.

    .venv/bin/python benchmarks/bench_diagnose_chain.py [--runs 5] [--seconds 3] [--also FILE]

``--also FILE`` adds a third variant, another bpftrace program run the same way (e.g. the
probe as it was before wake-ups were recorded: ``git show REV:src/tailgate/probes/diagnose.bt``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.workloads import argv_for  # noqa: E402
from tailgate.diagnose.evidence import ATTACHED  # noqa: E402
from tailgate.probes.driver import Run, attached  # noqa: E402
from tailgate.probes.output import parse_output  # noqa: E402


def cpu_s(pid: int) -> float:
    """A process's CPU time, every thread's, in ns precision (schedstat, not clock ticks)."""
    return sum(int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
               for t in os.listdir(f"/proc/{pid}/task")) / 1e9


def ctxt() -> int:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("ctxt "):
            return int(line.split()[1])
    raise SystemExit("no ctxt line in /proc/stat")


def once(probe: str | None, seconds: float, cpu: int) -> dict[str, float]:
    """One run: ``probe`` None (no probe), "" (diagnose.bt) or another program's text."""
    # SCHED_FIFO: the other work of a shared machine cannot take its CPU (the comparison is
    # of the probe, not of the neighbours); the kernel's RT throttling caps it at 95 %, the
    # same with the probe and without
    proc = subprocess.Popen(["chrt", "-f", "10", "taskset", "-c", str(cpu),
                             *argv_for("switcher", seconds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("switcher did not start")
        run = Run("diagnose", seconds + 30, 0, (proc.pid,), text=probe or None, extra=(0,))
        with (attached(run) if probe is not None else _nothing()) as bt:
            if bt is not None:
                while not any(ATTACHED in line for line in list(bt.out)):
                    time.sleep(0.01)
                cpu0 = cpu_s(bt.proc.pid)
            sw0, svc0 = ctxt(), cpu_s(proc.pid)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            rounds = int(proc.stdout.readline())
            out = {"rounds_per_s": rounds / seconds, "switches_per_s": (ctxt() - sw0) / seconds,
                   # the eBPF programs run in the service's threads: its CPU per round is the
                   # probe's cost whatever else took the CPU meanwhile
                   "cpu_us_per_round": 1e6 * (cpu_s(proc.pid) - svc0) / max(rounds, 1)}
            if bt is not None:
                out["bpftrace_cpu_s"] = cpu_s(bt.proc.pid) - cpu0
        if bt is not None:  # stopped: everything it printed has been read
            printed = parse_output("".join(bt.out)).printf
            out["lines"] = sum(len(chunk.splitlines()) for chunk in printed) - 1  # "attached"
        return out
    finally:
        proc.kill()
        proc.wait()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--cpu", type=int, default=1, help="the CPU the service is pinned to")
    ap.add_argument("--also", metavar="FILE", help="another bpftrace program to compare")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("root only (bpftrace)")
    variants: dict[str, str | None] = {"without the probe": None, "with diagnose.bt": ""}
    if args.also:
        variants[f"with {Path(args.also).name}"] = Path(args.also).read_text()
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    for i in range(args.runs):  # alternated: a drift of the machine hits every variant
        for label in list(variants)[:: 1 if i % 2 == 0 else -1]:
            rows[label].append(once(variants[label], args.seconds, args.cpu))
    load = os.getloadavg()[0]
    print(f"switcher on CPU {args.cpu}, {args.runs} runs of {args.seconds:g} s each way, "
          f"alternated; load average {load:.1f} on {os.cpu_count()} CPUs")
    base = statistics.median(x["rounds_per_s"] for x in rows["without the probe"])
    base_cpu = statistics.median(x["cpu_us_per_round"] for x in rows["without the probe"])
    for label in variants:
        r = [x["rounds_per_s"] for x in rows[label]]
        s = [x["switches_per_s"] for x in rows[label]]
        line = (f"  {label:24s} {statistics.median(r):10,.0f} rounds/s ({statistics.median(r) / base:.3f}x;"
                f" min {min(r):,.0f}, max {max(r):,.0f}); host context switches "
                f"{statistics.median(s):,.0f}/s")
        if variants[label] is not None:
            per_k = [1e6 * x["bpftrace_cpu_s"] / (x["switches_per_s"] * args.seconds)
                     for x in rows[label]]
            line += (f"; bpftrace CPU {statistics.median(per_k):.1f} us per 1,000 switches "
                     f"(range {min(per_k):.1f}-{max(per_k):.1f}), "
                     f"{statistics.median(x['lines'] for x in rows[label]):.0f} lines a run")
        print(line)
        c = [x["cpu_us_per_round"] for x in rows[label]]
        print(f"  {'':24s} the service's CPU per round {statistics.median(c):.2f} us (range "
              f"{min(c):.2f}-{max(c):.2f}): {statistics.median(c) / base_cpu:.3f}x, "
              f"{(statistics.median(c) - base_cpu) / 2:+.2f} us per context switch")


if __name__ == "__main__":
    main()
