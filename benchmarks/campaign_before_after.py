"""The method's table, for real: one system measured before and after its problems are removed.

    python benchmarks/campaign_before_after.py [--out DIR]    (root; nginx, llama-cpp-python,
                                                              mpirun with mpi4py)

The system: nginx (one worker on CPU 1), a llama.cpp server (llama-cpp-python, a tiny
random-weight model) and a 2-rank MPI allreduce. Before: nginx's worker under a cgroup v1 CPU
quota it overruns in its busier periods with two busy loops sharing its CPU, the llama.cpp
server under a 2 ms / 10 ms quota, and rank 1 of the allreduce moved into a 20 % quota as soon
as it starts. After: every quota lifted (-1) and no busy loops. The same campaign file runs
twice (`tailgate campaign run`), then `tailgate compare BEFORE AFTER --markdown -` prints the
table; the generator and the campaign run on CPU 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.cgroups import cpu_cgroup, throttling_load  # noqa: E402
from support.llm_server import MODEL_NAME, llama_server  # noqa: E402
from support.nginx import Nginx  # noqa: E402

TAILGATE = [sys.executable, "-m", "tailgate"]


def listener_pid(port: int) -> int:
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return int(re.search(r"pid=(\d+)", out).group(1))


@contextlib.contextmanager
def busy_on_cpu1(n: int = 2):
    procs = [subprocess.Popen(["taskset", "-c", "1", "sh", "-c",
                               "end=$(($(date +%s)+300)); while [ $(date +%s) -lt $end ]; do :; "
                               "done"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextlib.contextmanager
def slow_rank(cg: Path, rank: int = 1):
    """Move MPI rank ``rank`` of any allreduce started meanwhile into ``cg`` (its quota)."""
    stop = threading.Event()
    want = f"OMPI_COMM_WORLD_RANK={rank}".encode()
    moved: set[int] = set()

    def loop() -> None:
        while not stop.wait(0.02):
            for d in os.listdir("/proc"):
                if not d.isdigit() or int(d) in moved:
                    continue
                try:
                    cmd = Path(f"/proc/{d}/cmdline").read_bytes()
                    env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"allreduce" in cmd and b"tailgate" in cmd and want in env:
                    with contextlib.suppress(OSError):
                        (cg / "cgroup.procs").write_text(d)
                        moved.add(int(d))

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield moved
    finally:
        stop.set()
        t.join()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="directory for the two campaigns (default: temp)")
    ap.add_argument("--duration", default="15s")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="tailgate-campaign-"))
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        ng = stack.enter_context(Nginx(workers=1))
        (ngpid,) = ng.worker_pids()
        os.sched_setaffinity(ngpid, {1})
        rate, quota_us = throttling_load(ngpid, ng.url("/"))
        base = stack.enter_context(llama_server(stack.enter_context(tempfile.TemporaryDirectory())))
        llpid = listener_pid(int(base.rsplit(":", 1)[1].split("/")[0]))
        subprocess.run([*TAILGATE, "bench", "openai+" + base, "--model", MODEL_NAME,
                        "--input-len", "8", "--output-len", "4", "--rate", "100", "--requests",
                        "4", "--max-connections", "1", "--workers", "1", "--quiet"],
                       check=True, timeout=120, capture_output=True)  # warm-up, one at a time
        web = stack.enter_context(cpu_cgroup())
        (web / "cgroup.procs").write_text(str(ngpid))
        llm = stack.enter_context(cpu_cgroup(period_us=10_000))
        (llm / "cgroup.procs").write_text(str(llpid))
        ranks = stack.enter_context(cpu_cgroup())
        campaign = out / "system.yaml"
        campaign.write_text(f"""name: web+llm+allreduce
service: {{cgroup: '{web}'}}
inspect: {{interval: 2, probe_window: 3, during: web}}
loads:
  - {{name: web, url: '{ng.url("/")}', rate: {rate}, duration: {args.duration}, workers: 1,
     arrival: poisson, slo: ['p99<2ms']}}
  - {{name: llm, url: 'openai+{base}', model: {MODEL_NAME}, input_len: 8, output_len: 4,
     rate: 12, arrival: poisson, duration: {args.duration}, workers: 1,
     slo: ['ttft_p99<200ms']}}
collective: mpirun --allow-run-as-root --oversubscribe -np 2 -x PYTHONPATH
  tailgate bench allreduce --backend mpi --sizes 64KiB --iters 2000 --timeout 120s
timeout: 5m
""")
        print(f"campaign file: {campaign}  (web: {rate}/s; nginx quota {quota_us} us/100 ms)",
              file=sys.stderr)
        for name in ("before", "after"):
            before = name == "before"
            (web / "cpu.cfs_quota_us").write_text(str(quota_us) if before else "-1")
            (llm / "cpu.cfs_quota_us").write_text("2000" if before else "-1")
            (ranks / "cpu.cfs_quota_us").write_text("20000" if before else "-1")
            with contextlib.ExitStack() as faults:
                if before:
                    faults.enter_context(busy_on_cpu1())
                    faults.enter_context(slow_rank(ranks))
                subprocess.run(["taskset", "-c", "0", *TAILGATE, "campaign", "run",
                                str(campaign), "--out", str(out / name)], timeout=1800,
                               check=False)
    cmd = [*TAILGATE, "compare", str(out / "before"), str(out / "after"), "--markdown", "-",
           "--html", str(out / "compare.html"), "--json", str(out / "compare.json")]
    print("$ " + " ".join(cmd[2:]), file=sys.stderr)
    return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
