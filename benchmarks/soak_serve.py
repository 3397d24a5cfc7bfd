"""Soak: `tailgate serve` with the resident runqlat probe for --minutes, behind TLS and basic
auth, scraped like Prometheus would (every --scrape-every seconds). A benchmark, not a test:
root and bpftrace, minutes of wall time.

Every 10 s it samples the serve process's RSS, open files and threads (between scrapes); each
minute's row is the floor (minimum) of its samples, with the peak beside it: an inspection's
command pipes and threads, or a new bpftrace's, come and go, a leak raises the floor. Each
minute it also counts the series serve exports. At the half-way mark it SIGKILLs the running
bpftrace. It watches every bpftrace child serve starts (one per probe window, polled every
0.5 s: a window lasts --window seconds, so none is missed) and at the end checks:

* flat: the RSS floor never more than --rss-bound MiB (default 4) above minute 2's (minute 1
  holds the imports and the first report); the floors of open files and threads in the last
  third of the run no higher than the highest floor of the first third (a floor can dip: the
  probe's reader threads are gone between two windows);
* every probe window accounted: tailgate_probe_windows_total{outcome="ok"} + {outcome="failed"}
  equals the bpftrace processes begun before the final scrape, or one less (the window in
  flight);
* bpftrace restarted when killed: exactly one failed window (the killed one), windows ok
  after it, and tailgate_probe_up back to 1;
* bounded: the number of exported series stays the same (the histogram has fixed buckets; serve
  keeps no counter history on disk: its rates are per inspection interval);
* every scrape answered 200.

    sudo .venv/bin/python benchmarks/soak_serve.py [--minutes 30] [--window 10]

Exit status 0 when every check holds, 1 otherwise; the per-minute table is printed as it goes.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PASSWORD = "soak-password"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_of(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def sample(pid: int) -> tuple[float, int, int]:
    """(RSS MiB, open files, threads) of ``pid``."""
    st = status_of(pid)
    return (int(st["VmRSS"].split()[0]) / 1024, len(os.listdir(f"/proc/{pid}/fd")),
            int(st["Threads"]))


def bpftrace_children(pid: int) -> set[int]:
    kids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and comm == "bpftrace":
            kids.add(int(entry))
    return kids


class Scraper:
    def __init__(self, url: str, ca: str) -> None:
        self.url, self.ctx = url, ssl.create_default_context(cafile=ca)
        self.auth = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
        self.ok = self.failed = 0

    def get(self) -> dict[tuple[str, str], float] | None:
        req = urllib.request.Request(self.url, headers={"Authorization": self.auth})
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ctx) as r:  # noqa: S310
                body = r.read().decode()
        except OSError as exc:
            self.failed += 1
            print(f"  scrape failed: {exc}", flush=True)
            return None
        self.ok += 1
        series: dict[tuple[str, str], float] = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                series[(name.split("{", 1)[0], name)] = float(value)
        return series


def value(series: dict, prefix: str) -> float:
    return sum(v for (_, full), v in series.items() if full.startswith(prefix))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--window", type=float, default=10.0, help="probe window, seconds")
    ap.add_argument("--interval", type=float, default=15.0, help="inspection interval, seconds")
    ap.add_argument("--scrape-every", type=float, default=5.0)
    ap.add_argument("--rss-bound", type=float, default=4.0, help="MiB of RSS growth allowed")
    args = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        raise SystemExit("needs root and bpftrace")
    if args.minutes < 3:
        raise SystemExit("--minutes must be at least 3 (minute 2 is the reference)")
    import trustme
    import yaml

    tmp = Path(tempfile.mkdtemp(prefix="tailgate-soak-"))
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "server.pem"))
    import bcrypt

    (tmp / "web.yml").write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(tmp / "server.pem"),
                              "key_file": str(tmp / "server.pem")},
        "basic_auth_users": {"prometheus": bcrypt.hashpw(PASSWORD.encode(),
                                                         bcrypt.gensalt(10)).decode()}}))
    port = free_port()
    err = open(tmp / "serve.stderr", "w+")  # noqa: SIM115 - read back at the end
    serve = subprocess.Popen([sys.executable, "-m", "tailgate", "serve", "--listen",
                              f"127.0.0.1:{port}", "--web.config.file", str(tmp / "web.yml"),
                              "--probe", "runqlat", "--probe-window", f"{args.window:g}",
                              "--interval", f"{args.interval:g}"],
                             stdout=subprocess.PIPE, stderr=err, text=True)
    print(serve.stdout.readline().strip(), flush=True)
    scraper = Scraper(f"https://127.0.0.1:{port}/metrics", str(tmp / "ca.pem"))
    seen: set[int] = set()
    running: set[int] = set()
    rows: list[tuple[int, float, int, int, int, float, float]] = []
    killed_at: float | None = None
    killed_pid: int | None = None
    ok_at_kill = 0.0
    start = time.monotonic()
    end = start + args.minutes * 60
    next_scrape, next_sample, next_probe = start, start + 60, start + 10
    minute: list[tuple[float, int, int]] = []
    last = None
    print(f"{'min':>4} {'RSS MiB':>8} {'fds':>4} {'threads':>7} {'(peaks)':>16} {'series':>6} "
          f"{'windows ok':>10} {'failed':>6}", flush=True)
    try:
        while time.monotonic() < end:
            if serve.poll() is not None:
                err.seek(0)
                print(f"serve exited {serve.returncode}: {err.read()[-2000:]}")
                return 1
            running = bpftrace_children(serve.pid)
            seen |= running
            now = time.monotonic()
            if killed_at is None and now - start >= args.minutes * 30 and running:
                killed_pid = min(running)
                os.kill(killed_pid, signal.SIGKILL)
                killed_at = now
                ok_at_kill = rows[-1][5] if rows else 0.0
                print(f"  killed bpftrace {killed_pid} at {(now - start) / 60:.1f} min",
                      flush=True)
            if now >= next_probe:
                minute.append(sample(serve.pid))  # between scrapes: no request thread
                next_probe += 10
            if now >= next_sample:
                rss, fds, threads = (min(m[i] for m in minute) for i in range(3))
                peaks = (f"{max(m[0] for m in minute):.1f}/{max(m[1] for m in minute)}/"
                         f"{max(m[2] for m in minute)}")
                minute = []
                series = scraper.get() or last or {}
                last = series
                ok = value(series, 'tailgate_probe_windows_total{outcome="ok"')
                failed = value(series, 'tailgate_probe_windows_total{outcome="failed"')
                rows.append((len(rows) + 1, rss, fds, threads, len(series), ok, failed))
                print(f"{len(rows):>4} {rss:>8.1f} {fds:>4} {threads:>7} {peaks:>16} "
                      f"{len(series):>6} "
                      f"{ok:>10g} {failed:>6g}", flush=True)
                next_sample += 60
            elif now >= next_scrape:
                scraper.get()
                next_scrape += args.scrape_every
            time.sleep(0.5)
        seen |= bpftrace_children(serve.pid)
        started = len(seen)  # every window begun before the final scrape
        final = scraper.get() or {}
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(20)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    ok = value(final, 'tailgate_probe_windows_total{outcome="ok"')
    failed = value(final, 'tailgate_probe_windows_total{outcome="failed"')
    up = value(final, "tailgate_probe_up")
    first, worst_rss = rows[1], max(r[1] for r in rows[1:])
    third = max(1, len(rows) // 3)

    def flat(col: int) -> tuple[str, bool]:
        early, late = [r[col] for r in rows[:third]], [r[col] for r in rows[-third:]]
        return (f"first third {min(early)}..{max(early)}, last third {min(late)}..{max(late)}",
                max(late) <= max(early))

    fds, threads = flat(2), flat(3)
    series = sorted({r[4] for r in rows})
    checks = {
        f"RSS floor at most {args.rss_bound:g} MiB above minute 2 ({first[1]:.1f} -> max "
        f"{worst_rss:.1f}, end {rows[-1][1]:.1f} MiB)": worst_rss - first[1] <= args.rss_bound,
        f"open files' floor flat ({fds[0]})": fds[1],
        f"threads' floor flat ({threads[0]})": threads[1],
        f"exported series constant ({series})": len(series) == 1,
        f"every window accounted: ok {ok:g} + failed {failed:g} of {started} bpftrace runs "
        f"begun (the last one may be in flight)": 0 <= started - (ok + failed) <= 1,
        f"the killed bpftrace ({killed_pid}) is the one failed window, windows ran after it, "
        f"probe up = {up:g}, {ok - ok_at_kill:g} ok windows since": killed_at is not None
        and failed == 1 and up == 1 and ok >= ok_at_kill + 2,
        f"every scrape answered ({scraper.ok} ok, {scraper.failed} failed)": scraper.failed == 0,
    }
    print(f"\nsoak: {args.minutes} min, probe window {args.window:g} s, inspection interval "
          f"{args.interval:g} s, scrape every {args.scrape_every:g} s over TLS + basic auth")
    for what, held in checks.items():
        print(f"  {'ok  ' if held else 'FAIL'} {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
