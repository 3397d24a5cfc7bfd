"""Packets per second and CPU per packet of `tailgate bench udp://` (batch 1, batch 32,
io_uring) beside iperf3 -u, in one run, interleaved, repeated; medians with ranges.

Across a veth pair into a network namespace this script makes (tg46-bench-*, removed after):
the suite's echo server (tests/support/udp_echo.c) or iperf3's server inside it on CPU 1,
each generator on CPU 0, 64-byte datagrams, as fast as the path takes (`--rate max`,
`iperf3 -u -b 0`), D seconds a run. Each tailgate mode runs twice: against the echo server
(each datagram sent and its echo received: the latency load) and against a sink (`udp_echo
sink`: sent only, what iperf3 -u does), so the like-for-like row beside iperf3 is the sink's.

CPU per packet: tailgate's loop thread (user + system, `packets.cpu_ns_per_packet`, the
echo's receive included where there is one); iperf3's own report of its process
(`cpu_utilization_percent.host_total` × seconds / packets sent).

Why iperf3 -u: Debian ships it (`apt-get install iperf3`), it is the UDP generator people
reach for, it sends from user space through the same socket calls (one `write` a datagram,
like tailgate's batch 1), and it reports its own packets, loss and CPU. trafgen (netsniff-ng)
and the kernel's pktgen send below the socket layer (a packet socket, or inside the kernel),
so they measure another path; pktgen needs its module, which this VM cannot load.

    sudo .venv/bin/python benchmarks/bench_udp.py --runs 3 --duration 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.udp_echo import EchoNs, build_echo  # noqa: E402

MODES = {"batch 1": ["--batch", "1"], "batch 32": ["--batch", "32"],
         "io_uring": ["--io", "io_uring", "--batch", "32"]}


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                  if ln.startswith("model name")), "?")
    la = os.getloadavg()
    return (f"machine: {platform.node()} ({model}), {os.cpu_count()} CPUs, kernel "
            f"{platform.release()}, load {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")


def tailgate(url: str, mode: str, duration: float, sink: bool) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "tailgate", "bench", url,
                        "--rate", "max", "--duration", f"{duration}s", "--size", "64",
                        "--timeout", "0.2s" if sink else "1s", "--quiet", "--json", f.name,
                        *MODES[mode]], capture_output=True, text=True, timeout=300,
                       check=False)
        d = json.loads(Path(f.name).read_text())
    p = d["packets"]
    return {"pps": p["pps_sent"], "echoed_pps": p["pps_echoed"], "loss": p["loss_pct"],
            "cpu_ns": p["cpu_ns_per_packet"], "per_call": p["datagrams_per_send_call"],
            "p99_ms": d["latency_ms"]["p99"] if not sink else None}


def iperf(ns: EchoNs, duration: float) -> dict:
    port = ns.port + 1
    srv = subprocess.Popen(["ip", "netns", "exec", ns.ns, "taskset", "-c", "1", "iperf3", "-s",
                            "-1", "-B", ns.ns_ip, "-p", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = subprocess.run(["taskset", "-c", "0", "iperf3", "-c", ns.ns_ip, "-p", str(port),
                              "-u", "-b", "0", "-l", "64", "-t", f"{duration}", "-J"],
                             capture_output=True, text=True, timeout=duration + 30, check=False)
        d = json.loads(out.stdout)
        if "error" in d:
            raise RuntimeError(f"iperf3: {d['error']}")
    finally:
        srv.terminate()
        srv.wait(5)
    end = d["end"]
    s = end["sum"]
    packets = s["packets"]
    secs = s["seconds"]
    cpu = end["cpu_utilization_percent"]["host_total"] / 100.0 * secs
    return {"pps": packets / secs, "echoed_pps": None, "loss": s.get("lost_percent"),
            "cpu_ns": 1e9 * cpu / packets if packets else None, "per_call": 1.0, "p99_ms": None}


def med(vals: list[float | None]) -> str:
    v = [x for x in vals if x is not None]
    if not v:
        return "—"
    m = statistics.median(v)
    big = m >= 1000
    f = (lambda x: f"{x:,.0f}") if big else (lambda x: f"{x:.3g}")
    return f"{f(m)} ({f(min(v))}–{f(max(v))})" if len(v) > 1 else f(m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("iperf3"):
        print("needs root (a network namespace) and iperf3 (apt-get install iperf3)")
        return 2
    print(machine())
    print(time.strftime("started %Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    exe = build_echo(Path(tempfile.mkdtemp(prefix="tg46-bench-")))
    cells = [(m, False) for m in MODES] + [(m, True) for m in MODES] + [("iperf3 -u", True)]
    got: dict[tuple[str, bool], list[dict]] = {c: [] for c in cells}
    with EchoNs(exe, seconds=3600) as echo, \
            EchoNs(exe, "sink", seconds=3600, subnet=147) as sink:
        for ns in (echo, sink):  # the servers on CPU 1
            subprocess.run(["taskset", "-p", "-c", "1", str(ns.proc.pid)],
                           capture_output=True, check=False)
        for r in range(args.runs):
            for cell in cells:
                mode, to_sink = cell
                if mode == "iperf3 -u":
                    got[cell].append(iperf(sink, args.duration))
                else:
                    got[cell].append(tailgate((sink if to_sink else echo).url, mode,
                                              args.duration, to_sink))
            print(f"run {r + 1}/{args.runs} done", file=sys.stderr)
    print(time.strftime("ended %Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    print(f"64-byte datagrams, as fast as the path takes, {args.duration:g} s a run, "
          f"{args.runs} runs interleaved; median (min–max)\n")
    print("| generator | server | pps sent | pps echoed | loss % | datagrams a send call | "
          "CPU ns/packet | latency P99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for cell in cells:
        mode, to_sink = cell
        rows = got[cell]
        name = mode if mode == "iperf3 -u" else f"tailgate {mode}"
        server = "iperf3 -s" if mode == "iperf3 -u" else ("sink" if to_sink else "echo")
        print(f"| {name} | {server} | {med([x['pps'] for x in rows])} | "
              f"{med([x['echoed_pps'] for x in rows])} | {med([x['loss'] for x in rows])} | "
              f"{med([x['per_call'] for x in rows])} | {med([x['cpu_ns'] for x in rows])} | "
              f"{med([x['p99_ms'] for x in rows])} |")
    print("\n" + machine())
    return 0


if __name__ == "__main__":
    sys.exit(main())
