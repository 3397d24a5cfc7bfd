"""Capture real ``bpftrace -f json`` outputs of every probe as test fixtures.

Run as root from tests/: ``python -m support.workloads.capture``. Each file's first
line says how it was made; the parser skips it as a non-JSON line.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

from tailgate.probes.driver import Run

from . import running

OUT = Path(__file__).resolve().parents[2] / "fixtures" / "probes"


def capture(name: str, run: Run, what: str) -> None:
    proc = subprocess.run(run.argv(), capture_output=True, text=True, timeout=60)
    head = (f"# source: captured on {platform.node()} (kernel {platform.release()}), "
            f"bpftrace 0.17 `{' '.join(['bpftrace', '-f', 'json', run.program + '.bt'] + run.params())}`"
            f" while {what}\n")
    (OUT / f"{name}.jsonl").write_text(head + proc.stdout, encoding="utf-8")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with running(*[("spin", 10)] * 3) as ps:
        pids = tuple(p.pid for p in ps)
        capture("runqlat-host", Run("runqlat", 1.0), "3 spin loops ran on 2 vCPUs")
        capture("runqlat-pids", Run("runqlat", 1.0, 1, pids),
                f"3 spin loops (pids {pids}) ran on 2 vCPUs")
        capture("switches", Run("switches", 0.5, 0, pids), f"3 spin loops (pids {pids}) ran")
        capture("offcpu", Run("offcpu", 0.5), "3 spin loops ran on 2 vCPUs")
    with running(("futex_contend", 4, 3)) as ps:
        capture("futex", Run("futex", 1.0, 0, (ps[0].pid,)),
                f"futex_contend (4 threads on one mutex, pid {ps[0].pid}) ran")
    with running(("alloc", "alloc", 3), ("alloc", "prealloc", 3)) as ps:
        pids = tuple(p.pid for p in ps)
        capture("malloc", Run("malloc", 1.0, 0, pids),
                f"alloc alloc (pid {pids[0]}) and alloc prealloc (pid {pids[1]}) ran")
    with running(("udp_batch", "mmsg", 4), ("udp_batch", "single", 4)) as ps:
        pids = tuple(p.pid for p in ps)
        capture("mmsg", Run("mmsg", 1.0, 0, pids),
                f"udp_batch mmsg (pid {pids[0]}) and udp_batch single (pid {pids[1]}) ran")
        capture("softirq", Run("softirq", 1.0), "udp_batch sent datagrams over loopback")
    with running(("rcvbuf", "pin", 4), ("rcvbuf", "default", 4)) as ps:
        pids = tuple(p.pid for p in ps)
        capture("sockopt", Run("sockopt", 1.5),
                f"rcvbuf.py pin (pid {pids[0]}) and rcvbuf.py default (pid {pids[1]}) ran")


if __name__ == "__main__":
    main()
