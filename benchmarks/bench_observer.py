"""The observer's cost: the resident run-queue probe (`serve`'s runqlat.bt) and diagnose's
probe (diagnose.bt) at rising context-switch rates, beside libbpf-tools' runqlat and the
stock bpftrace runqlat.bt, in one run, interleaved, repeated; medians with ranges.

The workload is the suite's ping-pong (tests/support/workloads/pingpong.c) pinned to one
CPU: every round trip is two wake-ups and two context switches on that CPU; a spin before
each round (SPIN_NS) sets the switch rate. For each rate and each observer it runs a fixed
number of rounds, unobserved just before and just after each observer's own runs (other work
on a shared host, other engineers' probes included, comes and goes: each observer is
compared with the mean of the two baselines around it), and reads the ping-pong's CPU time
(user + system of both processes: a BPF program runs, and is charged, in the context of the
task whose switch or wake-up fires it) and its wall time. The ping-pong runs SCHED_FIFO.
Cost per 1,000 switches = (CPU with - CPU without) / switches x 1,000 (each switch comes
with its wake-up, so this is the cost of a switch and a wake-up); throughput = round trips
per second.

Observers:
* serve's runqlat.bt, host-wide (what `tailgate serve --probe runqlat` keeps attached);
* diagnose.bt, host-wide (its worst case: diagnose watches the service's pids);
* benchmarks/probes/runqlat_lean.bt: serve's program without the map updates it can spare
  (an experiment: what the program's own work costs);
* an empty bpftrace program on the same three tracepoints: the floor of any bpftrace
  (0.17: tracepoints only, no raw tracepoints or fentry) program there;
* libbpf-tools' runqlat (Debian `libbpf-tools`, CO-RE: BTF tracepoints, the peer);
* bpftrace's own runqlat.bt (power-of-two hist(); its kernel-header include dropped, as
  benchmarks/bench_probe.py does), the other peer.

The same run also reads each observer's BPF programs' own run time (the kernel's per-program
`run_time_ns`/`run_cnt`, in /proc/PID/fdinfo of the observer's program descriptors, counted
while this script holds `BPF_ENABLE_STATS`: for its duration every BPF program of the host
pays two clock reads a run): the program bodies' cost, exact, without the tracepoint's own
(which the CPU-time difference above includes, and which the empty program shows).

Why these peers: bcc's runqlat (bpfcc-tools) fails here without kernel headers; libbpf-tools'
needs only the kernel's BTF, which this kernel has.

    sudo .venv/bin/python benchmarks/bench_observer.py --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_probe import stock_argv  # noqa: E402

from support import workloads  # noqa: E402
from support.workloads import argv_for  # noqa: E402
from tailgate.probes.driver import Run, attached, program_path  # noqa: E402

LIBBPF_RUNQLAT = "/usr/sbin/runqlat"  # Debian libbpf-tools
EMPTY = ("tracepoint:sched:sched_wakeup, tracepoint:sched:sched_wakeup_new {} "
         "tracepoint:sched:sched_switch {} interval:s:600 { exit(); }")
# spin before each round (ns) -> rounds run (about 2 s each unobserved on an idle core)
PACES = {40_000: 20_000, 10_000: 50_000, 2_000: 100_000, 0: 150_000}
CPU = "1"
# SCHED_FIFO: on a shared machine the ping-pong's wake-ups would otherwise wait behind other
# work for whole time slices (rounds of milliseconds, not microseconds); the kernel's RT
# throttling still leaves 5 % of each second to the rest
PRIO = "10"


def machine() -> str:
    import platform

    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                  if ln.startswith("model name")), "?")
    la = os.getloadavg()
    return (f"machine: {platform.node()} ({model}), {os.cpu_count()} CPUs, kernel "
            f"{platform.release()}, load {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")


def pingpong(spin: int, rounds: int) -> tuple[float, float]:
    """(wall s, CPU s) of one ping-pong run on CPU."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(["chrt", "-f", PRIO, "taskset", "-c", CPU,
                          *argv_for("pingpong", rounds, spin)],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(out.split()[-1]), cpu


class Libbpf:
    """libbpf-tools' runqlat, host-wide, attached for the body of a with."""

    def __enter__(self) -> Libbpf:
        # line-buffered: its "Tracing ..." line says the programs are attached
        self.p = subprocess.Popen(["stdbuf", "-oL", LIBBPF_RUNQLAT, "600", "1"],
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        line = self.p.stdout.readline()  # type: ignore[union-attr]
        if "Tracing" not in line:
            raise RuntimeError(f"runqlat did not start: {line!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.p.terminate()
        self.p.wait(10)


def observers() -> dict[str, object]:
    diag = ["bpftrace", "-f", "json", str(program_path("diagnose")), "600000", "0", *["0"] * 8]
    out: dict[str, object] = {
        "serve runqlat.bt": ("tailgate", None),
        "diagnose.bt": ("diagnose", diag),
        "runqlat_lean.bt": ("lean", ["bpftrace", "-f", "json",
                                     str(ROOT / "benchmarks" / "probes" / "runqlat_lean.bt"),
                                     "600000"]),
        "empty bpftrace": ("empty", ["bpftrace", "-f", "json", "-e", EMPTY]),
        "libbpf-tools runqlat": "libbpf",
    }
    if stock_argv():
        out["bpftrace runqlat.bt"] = ("stock", stock_argv())
    return out


@contextlib.contextmanager
def bpf_stats() -> Iterator[None]:
    """Per-program run time counted while held (bpf(2) BPF_ENABLE_STATS, BPF_STATS_RUN_TIME;
    kernel 5.8+): no sysctl, and it ends with the descriptor."""
    libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.create_string_buffer(struct.pack("<I", 0), 16)
    fd = libc.syscall(321, 32, attr, 16)  # x86_64 bpf(2), BPF_ENABLE_STATS
    if fd < 0:
        raise OSError(ctypes.get_errno(), "BPF_ENABLE_STATS")
    try:
        yield
    finally:
        os.close(fd)


def prog_stats(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs process ``pid`` holds."""
    ns = cnt = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            info = dict(ln.split(":", 1) for ln in
                        Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines() if ":" in ln)
        except OSError:
            continue
        ns += int(info.get("run_time_ns", "0").strip())
        cnt += int(info.get("run_cnt", "0").strip())
    return ns, cnt


def under(how: object, paces: dict[int, int]) -> tuple[dict[int, tuple[float, float]],
                                                         tuple[int, int]]:
    """Every pace's ping-pong under one observer, attached once, and its programs' run time."""
    def each() -> dict[int, tuple[float, float]]:
        return {spin: pingpong(spin, n) for spin, n in paces.items()}

    if how is None:
        return each(), (0, 0)
    if how == "libbpf":
        with Libbpf() as lb:
            return each(), prog_stats(lb.p.pid)
    kind, argv = how  # type: ignore[misc]
    with attached(Run("runqlat", 600.0), argv) as p:
        return each(), prog_stats(p.proc.pid)


def fmt(vals: list[float], digits: int = 0) -> str:
    m = statistics.median(vals)
    return f"{m:,.{digits}f} ({min(vals):,.{digits}f}–{max(vals):,.{digits}f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="rounds x this (shorter runs)")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("bpftrace") or not os.path.exists(LIBBPF_RUNQLAT):
        print("needs root, bpftrace and libbpf-tools (apt-get install bpftrace libbpf-tools)")
        return 2
    gen = workloads.tracefs_mounted()
    next(gen)
    obs = observers()
    print(machine())
    print(time.strftime("started %Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    # (pace, observer) -> per run: (wall, cpu) with it, and the baseline (wall, cpu) around it
    res: dict[tuple[int, str], list[tuple[float, float, float, float]]] = {}
    bpf: dict[str, list[tuple[int, int]]] = {}
    stats = bpf_stats()
    stats.__enter__()
    try:
        paces = {spin: max(int(n * args.scale), 1000) for spin, n in PACES.items()}
        for r in range(args.runs):
            for name, how in obs.items():
                before, _ = under(None, paces)
                got, prog = under(how, paces)
                after, _ = under(None, paces)
                bpf.setdefault(name, []).append(prog)
                for spin in paces:
                    base_w = (before[spin][0] + after[spin][0]) / 2
                    base_c = (before[spin][1] + after[spin][1]) / 2
                    res.setdefault((spin, name), []).append((*got[spin], base_w, base_c))
            print(f"run {r + 1}/{args.runs} done", file=sys.stderr)
    finally:
        stats.__exit__(None, None, None)
        gen.close()
    print(time.strftime("ended %Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    print(f"\nping-pong on CPU {CPU}, {args.runs} runs interleaved; median (min–max)\n")
    print("| spin µs | observer | switches/s without | switches/s with | throughput with / "
          "without | CPU µs per 1,000 switches | % of a core at 100,000 switches/s |")
    print("|---|---|---|---|---|---|---|")
    for spin, rounds in PACES.items():
        n = max(int(rounds * args.scale), 1000)
        for name in obs:
            runs = res[(spin, name)]
            sw0 = [2 * n / bw for _, _, bw, _ in runs]
            sw = [2 * n / w for w, _, _, _ in runs]
            ratio = [bw / w for w, _, bw, _ in runs]  # throughput with / without
            cost = [1e6 * (c - bc) / (2 * n) * 1000 for _, c, _, bc in runs]
            share = [x / 100 for x in cost]  # µs per 1,000 -> % of a core at 100,000/s
            print(f"| {spin / 1000:g} | {name} | {fmt(sw0)} | {fmt(sw)} | {fmt(ratio, 3)} | "
                  f"{fmt(cost)} | {fmt(share, 2)} |")
    print("\nBPF program run time (run_time_ns / run_cnt of the observer's programs, every "
          "event of the host while attached)\n")
    print("| observer | ns per program run | program runs |")
    print("|---|---|---|")
    for name, got in bpf.items():
        per = [ns / cnt for ns, cnt in got if cnt]
        print(f"| {name} | {fmt(per, 1) if per else '—'} | {fmt([c for _, c in got])} |")
    print("\n" + machine())
    return 0


if __name__ == "__main__":
    sys.exit(main())
