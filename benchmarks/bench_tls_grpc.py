"""What TLS and gRPC cost the generator: tailgate's http:// vs https:// vs grpc://, with
wrk (http vs https) and grpcio's own client as peers, in one run.

* nginx (one worker) serves the same ``/`` over plain HTTP and over TLS (a throwaway CA
  made with trustme); a grpcio server (generic handler, raw bytes) answers ``Echo``.
* ``tailgate bench --workers 1`` at the same open-loop ``--rate`` for each protocol:
  achieved rate, CPU µs per request (``generator.cpu_us_per_request``), latency and
  service time P50/P99, TLS handshake P50.
* wrk (closed loop, 1 thread, 16 connections) on http and https: requests/s and CPU µs
  per request (its rusage), so the https/http CPU ratio of each tool can be compared.
* grpcio's client (C core, synchronous unary calls, one channel) in a subprocess: CPU
  µs per call, the peer for tailgate's grpc:// CPU per request.

``--engines 2000,5000,10000``: instead, the two engines on ``https://`` and ``openai+https://``
(nginx serving a fixed event stream over TLS) at each rate, taking turns run by run, with the
compiled engine on ``http://`` as the plaintext reference in the same run: the generator's
lateness P99, its CPU per request and the achieved rate, medians of ``--repeat`` runs with
their ranges. The pool is the 16 connections opened before the run (``--max-connections
16``): a TLS handshake costs the generator ~0.8 ms of CPU (OpenSSL 3.0), so connections
opened mid-run when the server stalls would measure handshakes, not the engines.

Run: ``.venv/bin/python benchmarks/bench_tls_grpc.py [--rate 2000] [--duration 3]``.
On a shared 2-core VM other processes add noise; every figure comes with its command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.grpc_servers import grpcio_server  # noqa: E402
from support.nginx import DEFAULT_LOCATIONS, Nginx  # noqa: E402
from support.tls_certs import Pki  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tailgate(url: str, rate: float, duration: float, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "tailgate", "bench", url, "--rate", str(rate), "--duration",
           f"{duration}s", "--workers", "1", "--connections", "16", "--quiet", "--json", "-",
           *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, env=ENV)
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def wrk(url: str, duration: float) -> tuple[float, float]:
    """(requests/s, CPU µs per request) of wrk -t1 -c16."""
    before = children_cpu()
    p = subprocess.run(["wrk", "-t1", "-c16", f"-d{max(int(duration), 1)}s", url],
                       capture_output=True, text=True, timeout=duration + 30)
    cpu = children_cpu() - before
    m = re.search(r"(\d+) requests in", p.stdout)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", p.stdout)
    if not m or not rps:
        raise SystemExit(f"wrk {url}: {p.stdout}{p.stderr}")
    return float(rps.group(1)), 1e6 * cpu / max(int(m.group(1)), 1)


GRPC_PEER = """
import grpc, sys, time, resource
ch = grpc.insecure_channel(sys.argv[1]); call = ch.unary_unary("/test.Svc/Echo")
n = int(sys.argv[2]); call(b"hello")
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.monotonic()
for _ in range(n): call(b"hello")
r1 = resource.getrusage(resource.RUSAGE_SELF); t1 = time.monotonic()
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(n / (t1 - t0), 1e6 * cpu / n)
"""


def grpc_peer(target: str, calls: int) -> tuple[float, float]:
    p = subprocess.run([sys.executable, "-c", GRPC_PEER, target, str(calls)],
                       capture_output=True, text=True, timeout=120)
    if p.returncode:
        raise SystemExit(f"grpcio client: {p.stderr[-2000:]}")
    rps, us = p.stdout.split()
    return float(rps), float(us)


def row(name: str, d: dict) -> str:
    conn = d["connections"]
    shake = conn.get("handshake_ms", {}).get("p50")
    return (f"{name:<8}{d['rate']['achieved']:>10.0f}{d['requests']['ok']:>9}"
            f"{d['generator']['cpu_us_per_request']:>10.1f}"
            f"{d['latency_ms']['p50']:>9.3f}{d['latency_ms']['p99']:>9.3f}"
            f"{d['service_time_ms']['p99']:>9.3f}"
            + (f"{shake:>10.3f}" if shake is not None else f"{'-':>10}"))


SSE = ('data: {"choices":[{"text":"hi","index":0,"finish_reason":null}]}\\n\\n' * 8
       + 'data: {"choices":[{"text":"","index":0,"finish_reason":"length"}]}\\n\\n'
       + 'data: [DONE]\\n\\n')


def spread(xs: list[float], fmt: str) -> str:
    xs = sorted(xs)
    return f"{xs[len(xs) // 2]:{fmt}} [{xs[0]:{fmt}}-{xs[-1]:{fmt}}]"


def engines(rates: list[float], duration: float, repeat: int) -> None:
    """The two engines over TLS, taking turns, with plaintext fast as the reference."""
    with tempfile.TemporaryDirectory() as tmp:
        pki = Pki(Path(tmp))
        tls_loc = (f"ssl_certificate {pki.server_cert}; ssl_certificate_key {pki.server_key};"
                   + DEFAULT_LOCATIONS
                   + f"location = /v1/completions {{ default_type text/event-stream; "
                     f"return 200 '{SSE}'; }}")
        with Nginx() as plain, Nginx(locations=tls_loc, listen_options="ssl") as secure:
            cases = {
                "http fast": (plain.url("/"), ("--engine", "fast")),
                "https python": (f"https://127.0.0.1:{secure.port}/",
                                 ("--engine", "python", "--cacert", pki.ca)),
                "https fast": (f"https://127.0.0.1:{secure.port}/",
                               ("--engine", "fast", "--cacert", pki.ca)),
                "openai+https python": (f"openai+https://127.0.0.1:{secure.port}/v1",
                                        ("--engine", "python", "--cacert", pki.ca, "--model",
                                         "m", "--no-usage")),
                "openai+https fast": (f"openai+https://127.0.0.1:{secure.port}/v1",
                                      ("--engine", "fast", "--cacert", pki.ca, "--model", "m",
                                       "--no-usage")),
            }
            got: dict[tuple[str, float], list[dict]] = {}
            for rate in rates:
                for _ in range(repeat):
                    for name, (url, extra) in cases.items():
                        r = rate / 5 if name.startswith("openai") else rate  # 10 chunks each
                        got.setdefault((name, rate), []).append(
                            tailgate(url, r, duration, "--max-connections", "16", *extra))
    print(f"tailgate bench --workers 1 --connections 16 --max-connections 16, {duration:g} s "
          f"a run, {repeat} runs "
          f"each, taking turns; openai+https at a fifth of the rate (10 events a stream); "
          f"medians [ranges]; {os.cpu_count()} CPUs")
    print(f"{'':<22}{'rate':>7}{'achieved':>22}{'lateness p99 ms':>26}{'cpu us/req':>22}"
          f"{'errors':>8}")
    for (name, rate), ds in got.items():
        r = rate / 5 if name.startswith("openai") else rate
        errs = sum(d["requests"]["sent"] - d["requests"]["ok"] for d in ds)
        print(f"{name:<22}{r:>7.0f}{spread([d['rate']['achieved'] for d in ds], '.0f'):>22}"
              f"{spread([d['lateness_ms']['p99'] for d in ds], '.3f'):>26}"
              f"{spread([d['generator']['cpu_us_per_request'] for d in ds], '.1f'):>22}"
              f"{errs:>8}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=2000)
    ap.add_argument("--grpc-rate", type=float, default=1000,
                    help="the grpcio (Python) server's own ceiling is low: default 1000/s")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--engines", metavar="RATES",
                    help="comma-separated rates: the two engines over TLS (see above)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.engines:
        engines([float(r) for r in args.engines.split(",")], args.duration, args.repeat)
        return
    with tempfile.TemporaryDirectory() as tmp:
        pki = Pki(Path(tmp))
        tls_loc = (f"ssl_certificate {pki.server_cert}; ssl_certificate_key {pki.server_key};"
                   + DEFAULT_LOCATIONS)
        server, gport = grpcio_server(workers=8)
        try:
            with Nginx() as plain, Nginx(locations=tls_loc, listen_options="ssl") as secure:
                http_url = plain.url("/")
                https_url = f"https://127.0.0.1:{secure.port}/"
                grpc_url = f"grpc://127.0.0.1:{gport}/test.Svc/Echo"
                runs = {
                    "http": tailgate(http_url, args.rate, args.duration),
                    "https": tailgate(https_url, args.rate, args.duration, "--cacert", pki.ca),
                    "grpc": tailgate(grpc_url, args.grpc_rate, args.duration, "--body",
                                     "hello"),
                }
                peers = {}
                if shutil.which("wrk"):
                    peers["wrk http"] = wrk(http_url, args.duration)
                    peers["wrk https"] = wrk(https_url, args.duration)
                time.sleep(0.2)
                peers["grpcio client"] = grpc_peer(f"127.0.0.1:{gport}",
                                                   int(args.grpc_rate * args.duration))
        finally:
            server.stop(0)
    print(f"tailgate bench --workers 1 --connections 16, {args.duration:g} s per protocol "
          f"(http/https at {args.rate:g}/s, grpc at {args.grpc_rate:g}/s)")
    print(f"{'':<8}{'achieved':>10}{'ok':>9}{'cpu us/r':>10}{'lat p50':>9}{'lat p99':>9}"
          f"{'svc p99':>9}{'tls p50':>10}   (ms)")
    for name, d in runs.items():
        print(row(name, d))
    print()
    for name, (rps, us) in peers.items():
        print(f"{name:<14} {rps:>10.0f} req/s (closed loop)  {us:>7.1f} cpu us/request")
    cpu = {k: d["generator"]["cpu_us_per_request"] for k, d in runs.items()}
    print()
    print(f"https/http CPU per request: tailgate {cpu['https'] / cpu['http']:.2f}"
          + (f", wrk {peers['wrk https'][1] / peers['wrk http'][1]:.2f}"
             if "wrk http" in peers else ", wrk absent"))
    print(f"grpc CPU per request, tailgate / grpcio client: "
          f"{cpu['grpc'] / peers['grpcio client'][1]:.2f}")


if __name__ == "__main__":
    main()
