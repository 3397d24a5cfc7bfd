"""``tailgate bench allreduce`` (Python, mpi4py) beside a C MPI_Allreduce loop: the same
collective, the same library, the same ranks, the timing loop in C.

Both time every iteration on every rank and take the slowest rank per iteration; the
peer is compiled here with Open MPI's ``mpicc`` (the way OSU's osu_allreduce and
nccl-tests time, without their averaging). The ratio of the medians (P50) is what
tailgate's Python loop adds to each collective; the bandwidths and tails are printed
side by side.

    .venv/bin/python benchmarks/bench_allreduce.py [--ranks 2] [--iters 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import collective as co  # noqa: E402

PEER = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &n);
  long bytes = atol(argv[1]); int iters = atoi(argv[2]), warm = 20;
  long count = bytes / 4;
  float *s = malloc(count * 4), *r = malloc(count * 4);
  for (long i = 0; i < count; i++) s[i] = (float)((i * 5 + rank * 3 + 1) % 16 - 8);
  double *t = malloc(iters * sizeof(double)), *all = rank ? NULL : malloc(n * iters * sizeof(double));
  for (int i = 0; i < warm + iters; i++) {
    double t0 = MPI_Wtime();
    MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t1 = MPI_Wtime();
    if (i >= warm) t[i - warm] = t1 - t0;
  }
  MPI_Gather(t, iters, MPI_DOUBLE, all, iters, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (!rank) for (int i = 0; i < iters; i++) {
    double m = 0; for (int k = 0; k < n; k++) if (all[k * iters + i] > m) m = all[k * iters + i];
    printf("%.9f\n", m);
  }
  MPI_Finalize(); return 0;
}
"""


def peer(exe: str, ranks: int, nbytes: int, iters: int) -> np.ndarray:
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), exe, str(nbytes), str(iters)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    return np.array([float(x) for x in out.split()]) * 1e6  # us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    sizes = [8, 1024, 65536, 1 << 20]
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "allreduce_peer")
        subprocess.run(["mpicc", "-O2", "-x", "c", "-", "-o", exe], input=PEER, text=True,
                       check=True)
        out = os.path.join(d, "t.json")
        r = co.run("mpi", args.ranks, "--sizes", ",".join(f"{s}B" for s in sizes), "--iters",
                   str(args.iters), "--json", out, "--quiet", timeout=600)
        if r.returncode != 0:
            sys.exit(r.stderr)
        doc = json.loads(Path(out).read_text())
        print(f"allreduce, {args.ranks} ranks (Open MPI, shared memory), {args.iters} "
              "iterations per size; per-iteration time of the slowest rank, us")
        print(f"{'size':>8} {'who':>9} {'p50':>9} {'p99':>9} {'p999':>9} {'max':>10} "
              f"{'busbw GB/s':>11}")
        for block in doc["sizes"]:
            n = block["bytes"]
            c = peer(exe, args.ranks, n, args.iters)
            lat = block["latency_ms"]
            ours = [lat[k] * 1e3 for k in ("p50", "p99", "p999", "max")]
            theirs = [float(np.percentile(c, q, method="inverted_cdf")) for q in (50, 99, 99.9)]
            theirs.append(float(c.max()))
            bus_c = n / 1e9 / (c.mean() / 1e6) * 2 * (args.ranks - 1) / args.ranks
            print(f"{n:>8} {'tailgate':>9} " + " ".join(f"{v:>9.1f}" for v in ours)
                  + f" {block['busbw_gbps']:>11.3f}")
            print(f"{'':>8} {'C loop':>9} " + " ".join(f"{v:>9.1f}" for v in theirs)
                  + f" {bus_c:>11.3f}")
            print(f"{'':>8} {'ratio':>9} {ours[0] / theirs[0]:>9.2f}  (p50, tailgate / C)")


if __name__ == "__main__":
    main()
