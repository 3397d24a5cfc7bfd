"""openai+ load at scale (issue 27): the compiled engine against the Python one, at rising
rates, on one generator core.

The server is the benchmark's own, compiled (``benchmarks/sse_fake_server.c``, built here
with gcc): every stream gets ``--tokens`` content chunks exactly ``--itl-ms`` apart from
the moment its request was read (true TTFT about 0), and it notes CLOCK_MONOTONIC right
after each write. ``tailgate bench`` (one worker) runs pinned to one core (``taskset``),
the server to another. Per run:

* lateness P50/P99: how late the generator sent each request behind its schedule;
* chunk delay P50/P99: each stream's first and last content chunk, the client's receive
  time minus the server's write time of it (same clock), so the client's own delay;
* achieved chunks/s (content chunks of the requests that ended ok, per second of the
  schedule: offered rate x tokens when every stream completes) and the concurrency
  (offered rate x tokens x ITL);
* the client's CPU per chunk (its process's CPU time over every chunk it read).

Each point is the median of ``--repeats`` runs with the range (min-max) beside it. The
goal (issue 27): 2,000 concurrent streams and 100,000 chunks/s with lateness P99 <= 0.1 ms
and chunk delay P99 <= 50 us; the ceiling is the highest rate that holds both.

Run: ``.venv/bin/python benchmarks/bench_llm_scale.py [--rates 100,500,1000,2000]
[--duration 3] [--repeats 3] [--engines fast,python] [--reference OTHER/src]``; with
``--reference`` another checkout's compiled engine runs too, as ``fast (reference)``, and
at each rate the variants take turns run by run, so a change is measured against the code
before it in the same minutes. ``--schemes http,https`` runs each engine over TLS as well
(the server then speaks TLS with a throwaway CA's certificate, and a chunk's write time is
when its ciphertext was written), taking turns with the plaintext runs. With
``SSE_DECODE_STEPS=1`` in the environment the server emits tokens as an engine's decode loop
does (issue 46): a step every ITL on one clock, each step a chunk for every running stream
at once, so chunks arrive in bursts (see sse_fake_server.c).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))


def build_server(tmp: str) -> str:
    exe = os.path.join(tmp, "sse_fake_server")
    subprocess.run(["gcc", "-O2", "-o", exe, str(HERE / "sse_fake_server.c"), "-lssl",
                    "-lcrypto"], check=True)
    return exe


@dataclass(frozen=True)
class ServerWrites:
    """What the fake server recorded: per stream (in arrival order) its key, the time it
    had read the request (ns, when asked for) and the write time of each content chunk."""

    keys: list[str]
    t0: list[int]
    writes: list[list[int]]

    def by_key(self) -> dict[str, list[int]]:
        return dict(zip(self.keys, self.writes, strict=True))


@contextmanager
def fake_server(exe: str, tokens: int, itl_s: float, cpu: str, tmp: str,
                out: list[ServerWrites], pki: Any = None) -> Iterator[int]:
    """Run the compiled server pinned to ``cpu`` (over TLS with ``pki``'s server
    certificate); yield its port; on exit stop it and append what it recorded to ``out``."""
    env = dict(os.environ)
    if pki is not None:
        env.update(SSE_TLS_CERT=pki.server_cert, SSE_TLS_KEY=pki.server_key)
    port_file, sends, t0s = (os.path.join(tmp, n) for n in ("port", "sends.txt", "t0.txt"))
    for f in (port_file, sends, t0s):
        if os.path.exists(f):
            os.unlink(f)
    server = subprocess.Popen(["taskset", "-c", cpu, exe, port_file, sends, str(tokens),
                               str(int(itl_s * 1e9)), t0s], env=env)
    try:
        for _ in range(500):
            if os.path.exists(port_file) and Path(port_file).read_text():
                break
            time.sleep(0.01)
        yield int(Path(port_file).read_text())
    finally:
        server.terminate()
        server.wait(30)
    keys, writes = [], []
    for line in Path(sends).read_text().splitlines():
        key, *ts = line.split()
        keys.append(key)
        writes.append([int(t) for t in ts])
    t0 = [int(x) for x in Path(t0s).read_text().split()]
    out.append(ServerWrites(keys, t0, writes))


def tailgate_cmd(port: int, engine: str, rate: float, duration: float, tokens: int,
                 itl_s: float, client_cpu: str, res: str, log: str,
                 arrival: str = "constant", cacert: str | None = None) -> list[str]:
    stream_s = tokens * itl_s
    conns = int(rate * stream_s * 1.3) + 16
    return ["taskset", "-c", client_cpu, sys.executable, "-m", "tailgate", "bench",
            f"openai+{'https' if cacert else 'http'}://127.0.0.1:{port}/v1", "--model", "m",
            "--engine", engine, *(("--cacert", cacert) if cacert else ()),
            "--rate", f"{rate:g}", "--duration", f"{duration:g}s", "--workers", "1",
            "--arrival", arrival,
            "--output-len", str(tokens), "--input-len", "4", "--no-usage",
            "--connections", str(conns), "--max-connections", str(conns + 256),
            "--timeout", f"{stream_s + 30:g}s", "--quiet", "--json", res, "--log", log]


def one_run(exe: str, engine: str, rate: float, duration: float, tokens: int, itl_s: float,
            client_cpu: str, server_cpu: str, tmp: str, src: Path = SRC,
            pki: Any = None) -> dict:
    from tailgate.bench.result import read_log

    recorded: list[ServerWrites] = []
    with fake_server(exe, tokens, itl_s, server_cpu, tmp, recorded, pki) as port:
        res, log = os.path.join(tmp, "r.json"), os.path.join(tmp, "log.csv")
        stream_s = tokens * itl_s
        cmd = tailgate_cmd(port, engine, rate, duration, tokens, itl_s, client_cpu, res, log,
                           cacert=pki.ca if pki is not None else None)
        p = subprocess.run(cmd, capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               [str(src), *filter(None, [os.environ.get("PYTHONPATH")])])},
                           timeout=duration + stream_s + 300)
        if p.returncode not in (0, 1) or not os.path.exists(res):
            raise SystemExit(f"tailgate bench failed ({p.returncode}): {p.stderr[-800:]}")
    data = json.loads(Path(res).read_text())
    cols = read_log(Path(log).read_text())
    sends = recorded[0].by_key()
    t0 = data["clock"]["start_monotonic_s"]
    delays = []
    ok = cols["outcome"] == "ok"
    for i in np.flatnonzero(ok).tolist():
        st = sends.get(str(int(cols["id"][i])), [])
        if len(st) != int(cols["chunks"][i]) or not st:
            continue
        for col, s_ns in (("first_token_s", st[0]), ("last_token_s", st[-1])):
            delays.append((cols[col][i] + t0) * 1e9 - s_ns)
    d = np.array(delays) / 1e3
    # the generator's lateness per measured request: how many were late past the 0.1 ms
    # goal, and the worst (a P99 hides a rare stall of a few ms)
    m = cols["warmup"] == 0
    late = (cols["dispatch_s"] - cols["intended_s"])[m] * 1e3
    chunks = int(cols["chunks"][ok].sum())
    all_chunks = int(cols["chunks"].sum())
    req = data["requests"]
    return {
        "engine": data["generator"]["engine"], "sent": req["sent"], "ok": req["ok"],
        "errors": {k: v for k, v in req["errors"].items() if v},
        "late_p50_ms": data["lateness_ms"]["p50"], "late_p99_ms": data["lateness_ms"]["p99"],
        "late_over_goal_pct": 100.0 * float(np.mean(late > 0.1)) if late.size else 0.0,
        "late_max_ms": float(late.max()) if late.size else 0.0,
        "delay_p50_us": float(np.percentile(d, 50)) if d.size else float("nan"),
        "delay_p99_us": float(np.percentile(d, 99)) if d.size else float("nan"),
        "chunks_per_s": chunks / duration,  # ok streams' chunks per second of schedule
        "cpu_us_per_chunk": data["generator"]["cpu_s"] * 1e6 / max(all_chunks, 1),
        "ttft_p99_ms": data["ttft_ms"]["p99"], "itl_p99_ms": data["itl_ms"]["p99"],
        "read_pauses": data["generator"]["read_pauses"],
        "spin_us": data["generator"].get("spin_us", 0.0),  # a reference checkout may lack it
    }


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "CPU model unknown"


def machine(load: tuple[float, float, float] | None = None) -> str:
    """The machine line every LLM benchmark starts with: host, CPU, kernel and load (read
    now unless the caller read it to keep)."""
    load = load or os.getloadavg()
    return (f"machine: {platform.node()} {platform.machine()} ({cpu_model()}), "
            f"{os.cpu_count()} CPUs, kernel {platform.release()}, load "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def med(runs: list[dict], key: str) -> tuple[float, float, float]:
    vals = [r[key] for r in runs]
    return statistics.median(vals), min(vals), max(vals)


def fmt(m: tuple[float, float, float], digits: int) -> str:
    return f"{m[0]:.{digits}f} ({m[1]:.{digits}f}-{m[2]:.{digits}f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="100,200,500,1000,2000", help="requests/s, rising")
    ap.add_argument("--engines", default="fast,python")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--min-requests", type=int, default=2000,
                    help="runs at low rates last longer, to schedule at least this many "
                         "requests: a P99 of 300 sends is their 3rd-worst")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--client-cpu", default="0")
    ap.add_argument("--server-cpu", default="1")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--reference", metavar="SRC", type=Path,
                    help="another checkout's src: its compiled engine runs as well")
    ap.add_argument("--schemes", default="http", help="http, https or both (http,https)")
    ap.add_argument("--server-exe", help="the fake server built already (on a machine "
                    "without gcc or OpenSSL's headers); default: built here with gcc")
    args = ap.parse_args()
    itl = args.itl_ms / 1e3
    rates = [float(r) for r in args.rates.split(",")]
    print(f"{machine()}; client on CPU {args.client_cpu}, "
          f"server on CPU {args.server_cpu}; {args.tokens} chunks per stream "
          f"{args.itl_ms:g} ms apart; {args.duration:g} s per run (at least "
          f"{args.min_requests} requests), median of {args.repeats} (min-max)")
    print("| engine | offered req/s | streams | s per run | chunks/s offered | chunks/s got | "
          "lateness P50 / P99 ms | late > 0.1 ms % / max ms | chunk delay P50 / P99 us | "
          "CPU us/chunk | read pauses | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    everything = []
    ceiling: dict[str, float] = {}
    broken: set[str] = set()  # a rate broke the goal: higher ones do not raise the ceiling
    schemes = args.schemes.split(",")
    variants = {(e if s == "http" else f"{e} {s}"): (e, SRC, s == "https")
                for s in schemes for e in args.engines.split(",")}
    if args.reference:
        for s in schemes:
            variants["fast (reference)" + ("" if s == "http" else f" {s}")] = (
                "fast", args.reference.resolve(), s == "https")
    with tempfile.TemporaryDirectory(prefix="tailgate-scale-") as tmp:
        exe = args.server_exe or build_server(tmp)
        pki = None
        if "https" in schemes:
            sys.path.insert(0, str(HERE.parent / "tests"))
            from support.tls_certs import Pki

            pki = Pki(Path(tmp))
        for rate in rates:
            duration = max(args.duration, args.min_requests / rate)
            turns: dict[str, list[dict]] = {v: [] for v in variants}
            for _ in range(args.repeats):  # the variants take turns, run by run
                for v, (engine, src, secure) in variants.items():
                    turns[v].append(one_run(exe, engine, rate, duration, args.tokens,
                                            itl, args.client_cpu, args.server_cpu, tmp, src,
                                            pki if secure else None))
            for engine, runs in turns.items():
                everything.append({"rate": rate, "engine": engine, "duration": duration,
                                   "runs": runs})
                late = med(runs, "late_p99_ms")
                delay = med(runs, "delay_p99_us")
                errs: dict[str, int] = {}
                for r in runs:
                    for k, v in r["errors"].items():
                        errs[k] = errs.get(k, 0) + v
                print(f"| {engine} | {rate:g} | {rate * args.tokens * itl:.0f} | "
                      f"{duration:g} | "
                      f"{rate * args.tokens:,.0f} | {fmt(med(runs, 'chunks_per_s'), 0)} | "
                      f"{fmt(med(runs, 'late_p50_ms'), 3)} / {fmt(late, 3)} | "
                      f"{fmt(med(runs, 'late_over_goal_pct'), 2)} / "
                      f"{fmt(med(runs, 'late_max_ms'), 2)} | "
                      f"{fmt(med(runs, 'delay_p50_us'), 0)} / {fmt(delay, 0)} | "
                      f"{fmt(med(runs, 'cpu_us_per_chunk'), 1)} | "
                      f"{sum(r['read_pauses'] for r in runs)} | {errs or '-'} |", flush=True)
                if late[0] <= 0.1 and delay[0] <= 50 and not errs:
                    if engine not in broken:
                        ceiling[engine] = rate
                else:
                    broken.add(engine)
    for engine in variants:
        held = ceiling.get(engine)
        print(f"{engine}: lateness P99 <= 0.1 ms and chunk delay P99 <= 50 us up to "
              + (f"{held:g} req/s ({held * args.tokens:,.0f} chunks/s, "
                 f"{held * args.tokens * itl:.0f} streams)" if held else "no rate measured"))
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
