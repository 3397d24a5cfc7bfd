"""Measure the overhead of diagnose's profile probe (docs/diagnose-accounting.md). Root only.

    python tests/support/profile_overhead.py samples [REPS]   # cost per on-CPU sample
    python tests/support/profile_overhead.py diagnose [REPS]  # diagnose with and without it

``samples``: a fixed amount of CPU work (cpuwork, SCHED_FIFO on CPU 1) timed with no probe and
under diagnose_profile.bt at 997 and 4999 Hz; the slowdown over the samples taken is the cost
of one sample (stack walks and a map update, run in the interrupted task's time).
``diagnose``: `tailgate diagnose --profile` and without it against slowpath (sleep, 10 ms on 1
request in 50), 300 requests/s for 4 s; the overhead block of each JSON and the bench's P50/P99.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).parents[1])  # tests/, not tests/support (its inspect.py)

from support.nginx import free_port  # noqa: E402
from support.workloads import build, finish, start  # noqa: E402
from tailgate.diagnose.profile import ATTACHED, program  # noqa: E402
from tailgate.diagnose.runner import stop_patiently  # noqa: E402
from tailgate.probes.driver import Run, attached  # noqa: E402
from tailgate.probes.output import parse_output  # noqa: E402

WORK = 3_000_000_000
HZ = tuple(int(x) for x in os.environ.get("HZ", "0,997,4999").split(","))


def cpuwork_paused() -> subprocess.Popen:
    """cpuwork (SCHED_FIFO on CPU 1) waiting for a line on stdin first: its pid is known
    before it runs (exec keeps it), so the probe can filter on it."""
    cmd = f"read x; exec chrt -f 10 taskset -c 1 {build('cpuwork')} {WORK}"
    return subprocess.Popen(["sh", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def run(p: subprocess.Popen) -> float:
    out, _ = p.communicate("go\n", timeout=120)
    return float(out.split()[-1])


def samples(reps: int) -> None:
    for hz in HZ:
        for _ in range(reps):
            p = cpuwork_paused()
            if hz == 0:
                print(json.dumps({"hz": 0, "elapsed_s": round(run(p), 4)}), flush=True)
                continue
            with attached(Run("diagnose_profile", 60, 0, (p.pid,), text=program(hz))) as bt:
                while not any(ATTACHED in line for line in list(bt.out)):
                    time.sleep(0.01)
                t = run(p)
                stop_patiently(bt)
            out = parse_output("".join(bt.out))
            print(json.dumps({"hz": hz, "elapsed_s": round(t, 4),
                              "samples": out.scalar("@on_n"),
                              "kept": sum(out.map("@on").values())}), flush=True)


def diagnose(reps: int) -> None:
    for _ in range(reps):
        for extra in ((), ("--profile",)):
            port = free_port()
            proc = start("slowpath", port, 40, "sleep", 10_000, 50)
            try:
                for tid in os.listdir(f"/proc/{proc.pid}/task"):
                    os.sched_setaffinity(int(tid), {1})
                    os.sched_setscheduler(int(tid), os.SCHED_FIFO, os.sched_param(10))
                with tempfile.TemporaryDirectory() as tmp:
                    t0 = time.monotonic()
                    subprocess.run(["chrt", "-f", "10", "taskset", "-c", "0", sys.executable,
                                    "-m", "tailgate", "diagnose", f"tcp://127.0.0.1:{port}",
                                    "--pid", str(proc.pid), "--rate", "300", "--duration", "4s",
                                    "--workers", "1", "--payload", "x\\n", "--delimiter", "\\n",
                                    "--json", f"{tmp}/d.json", *extra], capture_output=True,
                                   timeout=150, check=False)
                    wall = time.monotonic() - t0
                    doc = json.loads(Path(f"{tmp}/d.json").read_text())
            finally:
                finish(proc)
            lat = doc["bench"]["latency_ms"]
            print(json.dumps({"profile": bool(extra), "wall_s": round(wall, 2),
                              **doc["overhead"], "p50_ms": lat.get("p50"),
                              "p99_ms": lat.get("p99")}), flush=True)


if __name__ == "__main__":
    what, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    {"samples": samples, "diagnose": diagnose}[what](reps)
