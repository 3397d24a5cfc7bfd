"""HTTP load generators side by side at equal rates: tailgate (fast, python), wrk2, wrk, autocannon.

Like with like, in one run: the same URL on one nginx worker pinned to one core, each
generator pinned to the other core, 16 connections each, the same offered rates
(``--rates``, default 10k, 30k, 50k, 90k, 120k/s) for ``--duration`` seconds measured each
(default 10). From every tool the same figures: P50/P99/P999 latency, the achieved rate
(ok responses per second over the measured window) and CPU µs per request of the
generator's whole process tree (user + system, from the kernel's rusage of that
process, ``wait4``), plus tailgate's own lateness P99.

* ``tailgate bench --engine fast`` and ``--engine python`` (open loop, latency from the
  intended start); ``--warmup 1s`` before the measured window;
* ``wrk2 -R RATE`` (open loop, corrected for coordinated omission), where a ``wrk2``
  binary is on PATH or in ``$WRK2`` (it is not packaged: build it from
  github.com/giltene/wrk2 outside the repository). wrk2 calibrates for its first 10 s
  and then resets its histogram, so it runs ``10 s + --duration`` to measure the same
  window;
* ``autocannon -R RATE`` (npm, into benchmarks/.peers, git-ignored): a rate-limited
  closed loop with its coordinated-omission correction;
* ``wrk`` (Debian, closed loop): one run, its own rate and tail, labelled closed-loop.

The floor: a tiny C responder (compiled here with gcc, on the server core) answers every
request exactly ``--floor-delay-us`` after it arrived (it spins on its core, so the delay
is exact to a microsecond or two). Reported latency minus that delay, at P50/P99/P999, is
what each tool adds (its own delay plus the loopback stack, the same for every tool). A
C responder, not nginx: nginx has no constant-delay response without a module, and
its own service time varies by tens of µs, which would hide the floor being measured.

Every tool runs ``--repeat`` times (default 3) at each rate, the tools interleaved, and
the table shows the median of each figure with the range of P99 and lateness P99: on a
shared VM a stall of a few ms now and then (other tenants, kernel threads) decides one
run's tail, and it should not decide which tool looks better.

Run: ``.venv/bin/python benchmarks/bench_http.py`` (``--quick``: 3 s per rate, one run). On a
shared VM other processes add noise; the load average is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

from support.nginx import Nginx  # noqa: E402

PEERS = HERE / ".peers"
AUTOCANNON = PEERS / "node_modules" / ".bin" / "autocannon"
TAILGATE = [sys.executable, "-m", "tailgate", "bench"]
WRK2_CALIBRATION_S = 10  # wrk2 resets its histograms after 10 s (+5 ms per connection)

RESPONDER_C = r"""
/* Answers each HTTP/1.1 request (one at a time per connection) exactly DELAY_NS after
 * its last byte arrived, busy-polling its own core so the delay is exact. */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <signal.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#define QN (1 << 20)
static int64_t now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec; }
static int64_t due[QN]; static int qfd[QN]; static unsigned qgen[QN]; static long qh, qt;
static int seen[65536]; /* per fd: bytes of "\r\n\r\n" matched so far */
static unsigned gen[65536]; /* per fd: bumped at close, so a reused fd gets no stale answer */
int main(int argc, char **argv) {
    int64_t delay = atoll(argv[1]) * 1000;
    signal(SIGPIPE, SIG_IGN);  /* a client that timed out and closed: not our end */
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1024)) return 1;
    socklen_t al = sizeof a; getsockname(ls, (void *)&a, &al);
    printf("%d\n", ntohs(a.sin_port)); fflush(stdout);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    static char buf[65536]; struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(ep, evs, 64, 0);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int c = accept(ls, NULL, NULL);
                if (c < 0 || c >= 65536) { if (c >= 0) close(c); continue; }
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                seen[c] = 0;
                struct epoll_event e2 = {.events = EPOLLIN, .data.fd = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &e2);
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf);
            if (r <= 0) { gen[fd]++; close(fd); continue; }
            int64_t t = now();
            for (ssize_t k = 0; k < r; k++) {
                char want = "\r\n\r\n"[seen[fd]];
                seen[fd] = buf[k] == want ? seen[fd] + 1 : (buf[k] == '\r' ? 1 : 0);
                if (seen[fd] == 4) {
                    seen[fd] = 0;
                    due[qt % QN] = t + delay; qfd[qt % QN] = fd; qgen[qt % QN] = gen[fd]; qt++;
                }
            }
        }
        int64_t t = now();
        while (qh < qt && due[qh % QN] <= t) {  /* constant delay: the queue is in due order */
            int fd = qfd[qh % QN];
            if (qgen[qh % QN] == gen[fd] && write(fd, resp, sizeof resp - 1) < 0) { /* gone */ }
            qh++;
        }
    }
}
"""


def pin(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []


def timed(cmd: list[str], timeout: float) -> tuple[str, str, float]:
    """Run ``cmd``; (stdout, stderr, CPU seconds of its whole process tree)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.05)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return out.read(), err.read(), ru.ru_utime + ru.ru_stime


def to_ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s|m)$", text)
    if not m:
        return float("nan")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[m.group(2)]


def run_tailgate(engine: str, url: str, rate: float, duration: float, conns: int,
                 cpu: int | None, src: str | None = None, startup: bool = False,
                 coalesce: str | None = None) -> dict:
    """``src``: another checkout's ``src`` to run instead of this one (--reference);
    ``startup``: one request only, no warm-up (what a run costs before its first request);
    ``coalesce``: tailgate's --coalesce window."""
    span = (["--requests", "1"] if startup else
            ["--duration", f"{duration:g}s", "--warmup", "1s"])
    cmd = [*pin(cpu), *(["env", f"PYTHONPATH={src}"] if src else []), *TAILGATE, url,
           "--engine", engine, "--rate", str(int(rate)), *span, "--workers", "1",
           "--connections", str(conns), "--max-connections", str(conns), "--json", "-",
           "--quiet", *(["--coalesce", coalesce] if coalesce else [])]
    out, err, cpu_s = timed(cmd, duration + 60)
    name = (f"tailgate ({engine}{', reference' if src else ''}"
            f"{f', coalesce {coalesce}' if coalesce else ''})")
    try:
        d = json.loads(out)
    except json.JSONDecodeError:
        return {"tool": name, "error": err.strip()[-300:]}
    lat = d["latency_ms"]
    total = sum(d["requests"]["errors"].values()) + d["requests"]["ok"] + d["requests"]["warmup"]
    return {"tool": name, "cmd": " ".join(cmd[len(pin(cpu)):]),
            # completed ok per second, as the peers count it (rate.achieved is dispatched/s)
            "achieved": d["rate"]["ok"], "p50": lat["p50"], "p99": lat["p99"],
            "p999": lat["p999"], "late_p99": d["lateness_ms"]["p99"],
            "errors": d["requests"]["sent"] - d["requests"]["ok"],
            "cpu_us": 1e6 * cpu_s / max(total, 1), "engine": d["generator"]["engine"],
            "cpu_s": cpu_s, "requests": total}


def wrk2_binary() -> str | None:
    exe = os.environ.get("WRK2") or shutil.which("wrk2")
    return exe if exe and os.access(exe, os.X_OK) else None


def run_wrk2(exe: str, url: str, rate: float, duration: float, conns: int,
             cpu: int | None, startup: bool = False) -> dict:
    """``startup``: 1 s at 1 request/s, the least wrk2 runs (an upper bound of its
    start-up: that second's timer wake-ups are in it)."""
    run_s = 1 if startup else WRK2_CALIBRATION_S + int(round(duration))
    rate = 1 if startup else rate
    cmd = [*pin(cpu), exe, "-t1", f"-c{conns}", f"-d{run_s}s", f"-R{int(rate)}", "--latency", url]
    out, err, cpu_s = timed(cmd, run_s + 60)
    pct = {float(p): to_ms(v)
           for p, v in re.findall(r"^ *([\d.]+)%\s+(\S+) *$", out, re.M)}
    total = re.search(r"(\d+) requests in", out)
    # Achieved: the requests its (post-calibration) histogram recorded over the window.
    rec = re.search(r"Total count\s+=\s+(\d+)", out)
    if not rec or 99.0 not in pct:
        return {"tool": "wrk2", "error": (err or out).strip()[-300:]}
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {"tool": "wrk2", "cmd": " ".join(cmd[len(pin(cpu)):]),
            "achieved": int(rec.group(1)) / duration,
            "p50": pct.get(50.0), "p99": pct.get(99.0), "p999": pct.get(99.9), "late_p99": None,
            "errors": (int(errs.group(1)) if errs else 0)
            + (sum(int(x) for x in sock.groups()) if sock else 0),
            "cpu_us": 1e6 * cpu_s / max(int(total.group(1)) if total else 0, 1),
            "cpu_s": cpu_s, "requests": int(total.group(1)) if total else 0}


def ensure_autocannon() -> str | None:
    """Path to autocannon, installing it with npm if needed; None if that failed."""
    if AUTOCANNON.exists():
        return str(AUTOCANNON)
    npm = shutil.which("npm")
    if npm is None:
        print("autocannon: npm not found: left out")
        return None
    PEERS.mkdir(exist_ok=True)
    (PEERS / ".gitignore").write_text("*\n")
    r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(PEERS),
                        "autocannon@8"], capture_output=True, text=True, timeout=600)
    if r.returncode or not AUTOCANNON.exists():
        print(f"autocannon: npm install failed: {r.stderr.strip()[-300:]}")
        return None
    return str(AUTOCANNON)


def run_autocannon(exe: str, url: str, rate: float | None, duration: float, conns: int,
                   cpu: int | None) -> dict:
    cmd = [*pin(cpu), exe, "-c", str(conns), "-d", str(int(round(duration))), "-j"]
    if rate:
        cmd += ["-R", str(int(rate))]
    cmd.append(url)
    out, err, cpu_s = timed(cmd, duration + 60)
    try:
        d = json.loads(out)
    except json.JSONDecodeError:
        return {"tool": "autocannon", "error": (err or out).strip()[-300:]}
    lat = d["latency"]
    total = int(d["requests"]["total"])
    return {"tool": "autocannon", "cmd": " ".join(cmd[len(pin(cpu)):]),
            "achieved": total / max(float(d.get("duration", duration)), 1e-9),
            "p50": float(lat["p50"]), "p99": float(lat["p99"]), "p999": float(lat["p99_9"]),
            "late_p99": None, "errors": int(d.get("errors", 0)) + int(d.get("non2xx", 0)),
            "cpu_us": 1e6 * cpu_s / max(total, 1)}  # node's start-up included


def run_wrk(url: str, duration: float, conns: int, cpu: int | None) -> dict:
    cmd = [*pin(cpu), "wrk", "-t1", f"-c{conns}", f"-d{int(round(duration))}s", "--latency", url]
    out, err, cpu_s = timed(cmd, duration + 30)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    if not rps:
        return {"tool": "wrk (closed loop)", "error": (err or out).strip()[-300:]}
    pct = dict(re.findall(r"^\s+(\d+)%\s+(\S+)", out, re.M))
    return {"tool": "wrk (closed loop)", "cmd": " ".join(cmd[len(pin(cpu)):]),
            "achieved": float(rps.group(1)), "p50": to_ms(pct.get("50", "")),
            "p99": to_ms(pct.get("99", "")), "p999": None, "late_p99": None, "errors": 0,
            "cpu_us": 1e6 * cpu_s / max(int(total.group(1)) if total else 0, 1)}


def combine(runs: list[dict]) -> dict:
    """One row from repeated runs of one tool at one rate: the median of each figure, and
    the range of P99 and lateness P99 beside it (a shared VM's noise is one run's luck).
    A failed run is reported as the row when every run failed."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    out = dict(ok[0], runs=len(ok), failed=len(runs) - len(ok))
    for key in ("achieved", "p50", "p99", "p999", "late_p99", "errors", "cpu_us", "cpu_net_us"):
        vals = [r[key] for r in ok if r.get(key) is not None and r[key] == r[key]]
        out[key] = statistics.median(vals) if vals else None
        if key in ("p99", "late_p99", "cpu_us", "cpu_net_us") and len(vals) > 1:
            out[key + "_range"] = (min(vals), max(vals))
    return out


def net_of(r: dict, startup_s: float | None) -> dict:
    """The run's CPU per request less the tool's fixed start-up (measured apart): what
    each further request costs, the figure a longer run tends to."""
    if "error" not in r and startup_s is not None and r.get("requests"):
        r["cpu_net_us"] = 1e6 * (r["cpu_s"] - startup_s) / r["requests"]
    return r


def fmt(v: float | None, nd: int = 3) -> str:
    return "—" if v is None or v != v else f"{v:.{nd}f}"


def spread(r: dict, key: str) -> str:
    lo_hi = r.get(key + "_range")
    return f"{fmt(r[key])} ({fmt(lo_hi[0])}–{fmt(lo_hi[1])})" if lo_hi else fmt(r[key])


def cpu_spread(r: dict, key: str = "cpu_us") -> str:
    if r.get(key) is None:
        return "—"
    lo_hi = r.get(key + "_range")
    return f"{r[key]:.1f} ({lo_hi[0]:.1f}–{lo_hi[1]:.1f})" if lo_hi else f"{r[key]:.1f}"


def row(r: dict, rate: float | None) -> str:
    if "error" in r:
        return f"| {rate and f'{rate / 1000:g}k/s' or '—'} | {r['tool']} | failed: {r['error']} |"
    runs = f"{r.get('runs', 1)}" + (f" ({r['failed']} failed)" if r.get("failed") else "")
    return (f"| {f'{rate / 1000:g}k/s' if rate else 'closed loop'} | {r['tool']} | {runs} | "
            f"{r['achieved']:,.0f}/s | {fmt(r['p50'])} | {spread(r, 'p99')} | {fmt(r['p999'])} | "
            f"{spread(r, 'late_p99')} | {cpu_spread(r)} | {cpu_spread(r, 'cpu_net_us')} | "
            f"{r['errors']:.0f} |")


HEADER = ("| offered | tool | runs | achieved | P50 ms | P99 ms (range) | P999 ms | "
          "own lateness P99 ms (range) | CPU µs/req (range) | less start-up | errors |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def _normal_priority() -> None:
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def build_responder(tmp: str) -> str:
    src = Path(tmp) / "responder.c"
    src.write_text(RESPONDER_C)
    exe = str(Path(tmp) / "responder")
    subprocess.run(["gcc", "-O2", "-o", exe, str(src)], check=True)
    return exe


def floor(tools: dict, rate: float, duration: float, delay_us: int, conns: int,
          srv_cpu: int | None, gen_cpu: int | None, repeat: int = 1) -> list[str]:
    """Reported minus true latency against the constant-delay responder (medians of
    ``repeat`` interleaved runs)."""
    lines = [f"\nFloor: a C responder on cpu {srv_cpu} answers each request exactly "
             f"{delay_us} µs after it arrived; {rate:,.0f}/s, {conns} connections, "
             f"{duration:g} s, median of {repeat} runs. Reported latency minus {delay_us} µs "
             f"(what the tool and the loopback stack add), µs:\n",
             "| tool | P50 | P99 | P999 | achieved |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_responder(tmp)
        # The responder busy-polls its core, so it must not inherit a real-time policy
        # (the script may run under `chrt -f`): the kernel's RT throttling would stop it
        # for ~50 ms of every second (sched_rt_runtime_us), a stall that read as a 41-49 ms
        # P99 and P999 for every tool alike.
        srv = subprocess.Popen([*pin(srv_cpu), exe, str(delay_us)], stdout=subprocess.PIPE,
                               text=True, preexec_fn=_normal_priority)
        try:
            port = int(srv.stdout.readline())
            url = f"http://127.0.0.1:{port}/"
            runs: dict[str, list[dict]] = {name: [] for name in tools}
            for _ in range(repeat):
                for name, fn in tools.items():
                    runs[name].append(fn(url, rate, duration, conns, gen_cpu))
            for name in tools:
                r = combine(runs[name])
                if "error" in r:
                    lines.append(f"| {name} | failed: {r['error']} | | | |")
                    continue
                d = [None if v is None else 1000 * v - delay_us
                     for v in (r["p50"], r["p99"], r["p999"])]
                lines.append(f"| {name} | {fmt(d[0], 0)} | {fmt(d[1], 0)} | {fmt(d[2], 0)} | "
                             f"{r['achieved']:,.0f}/s |")
                print(lines[-1], flush=True)
        finally:
            srv.kill()
            srv.wait()
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="10000,30000,50000,90000,120000",
                    help="offered rates, requests/s (comma-separated)")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--floor-rate", type=float, default=10_000)
    ap.add_argument("--floor-delay-us", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each tool at each rate, interleaved; the table shows "
                         "medians (default 3)")
    ap.add_argument("--quick", action="store_true", help="3 s per run, one run each")
    ap.add_argument("--no-floor", action="store_true",
                    help="leave out the floor (the constant-delay C responder)")
    ap.add_argument("--tools", default="fast,python,wrk2,autocannon,wrk",
                    help="which generators (comma-separated)")
    ap.add_argument("--reference", metavar="SRC",
                    help="another checkout's src/ (its fastloop built in place, e.g. a "
                         "worktree of an older commit): its fast engine runs interleaved "
                         "with the others as 'tailgate (fast, reference)', so a change's "
                         "cost is read in one run")
    ap.add_argument("--coalesce", metavar="D",
                    help="also run the fast engine with --coalesce D (e.g. 50us), "
                         "interleaved, as 'tailgate (fast, coalesce D)'")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.repeat = 3.0, 1
    rates = [float(x) for x in args.rates.split(",")]
    want = set(args.tools.split(","))
    cpus = sorted(os.sched_getaffinity(0))
    gen_cpu = cpus[0] if len(cpus) >= 2 else None
    srv_cpu = cpus[1] if len(cpus) >= 2 else None
    wrk2 = wrk2_binary()
    ac = ensure_autocannon() if "autocannon" in want else None
    print(f"machine: {os.uname().nodename}, {len(cpus)} cpus, {os.uname().release}; "
          f"generator on cpu {gen_cpu}, server on cpu {srv_cpu}; load average "
          f"{os.getloadavg()[0]:.2f} (other processes share these cores)")
    if "wrk2" in want and wrk2 is None:
        print("wrk2: not found (no `wrk2` on PATH, $WRK2 unset): left out. Build it from "
              "https://github.com/giltene/wrk2 outside the repository and set WRK2.")
    tools: dict = {}
    if "fast" in want:
        tools["tailgate (fast)"] = partial(run_tailgate, "fast")
    if "fast" in want and args.coalesce:
        tools[f"tailgate (fast, coalesce {args.coalesce})"] = partial(
            run_tailgate, "fast", coalesce=args.coalesce)
    if args.reference:
        tools["tailgate (fast, reference)"] = partial(
            run_tailgate, "fast", src=str(Path(args.reference).resolve()))
    if "python" in want:
        tools["tailgate (python)"] = partial(run_tailgate, "python")
    if "wrk2" in want and wrk2:
        tools["wrk2"] = partial(run_wrk2, wrk2)
    if ac:
        tools["autocannon"] = partial(run_autocannon, ac)
    # each tool's run as it starts and ends with no load: its fixed start-up, measured apart
    # (autocannon's, like its node start-up, stays in its figure)
    startups = [name for name in tools if name != "autocannon"]
    lines = [f"{args.duration:g} s measured per run, {args.repeat} runs of each tool at each "
             f"rate (interleaved; medians, with the range of P99 and lateness), "
             f"{args.connections} connections, nginx (1 worker) on cpu {srv_cpu}, each "
             f"generator on cpu {gen_cpu}\n"]
    print("\n".join(lines), flush=True)
    with Nginx(workers=1) as ng:
        if srv_cpu is not None:
            for pid in [ng.proc.pid, *ng.worker_pids()]:
                os.sched_setaffinity(pid, {srv_cpu})
        url = ng.url("/")
        fixed: dict[str, list[float]] = {name: [] for name in startups}
        for _ in range(3):
            for name in startups:
                r = tools[name](url, 100, 1, args.connections, gen_cpu, startup=True)
                if "error" not in r:
                    fixed[name].append(r["cpu_s"])
        startup = {n: statistics.median(v) for n, v in fixed.items() if v}
        lines.append("start-up CPU (median of 3 runs of one request; wrk2: 1 s at 1/s), "
                     "subtracted in 'less start-up': " + ", ".join(
                         f"{n} {1e3 * s:.0f} ms" for n, s in startup.items()) + "\n")
        lines.append(HEADER)
        print("\n".join(lines[-2:]), flush=True)
        for rate in rates:
            runs: dict[str, list[dict]] = {name: [] for name in tools}
            for _ in range(args.repeat):  # interleaved: noise lands on every tool alike
                for name, fn in tools.items():
                    runs[name].append(net_of(fn(url, rate, args.duration, args.connections,
                                                gen_cpu), startup.get(name)))
            for name in tools:
                lines.append(row(combine(runs[name]), rate))
                print(lines[-1], flush=True)
        if "wrk" in want:
            lines.append(row(run_wrk(url, args.duration, args.connections, gen_cpu), None))
            print(lines[-1], flush=True)
    if not args.no_floor:
        lines += floor(tools, args.floor_rate, args.duration, args.floor_delay_us,
                       args.connections, srv_cpu, gen_cpu, args.repeat)
    print(f"\nload average now {os.getloadavg()[0]:.2f}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
