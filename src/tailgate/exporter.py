"""`tailgate serve`: inspect on an interval and keep resident probes running, in the background;
a scrape is answered from memory, never by collecting inside it.

Two loops, each in its own thread:

* inspect: collect (two samples ``interval`` apart) -> judge -> verdict, then swap in the new
  metric families. The last resident runqlat window stands in for a probe window, so
  ``l2.sched.runqlat`` is judged continuously.
* probes: back-to-back runqlat windows (``probe_window`` seconds each, the program exits by
  itself); each window's log-linear buckets are added to a cumulative histogram. A window that
  fails marks the probe down (a series, ``tailgate_probe_up 0`` with the reason) and the loop
  retries after a back-off; memory stays bounded (buckets are fixed, ~400 of them).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .baseline import Baseline, catalog
from .collect import Scope, collect
from .host import Host
from .model import Fact, SourceError
from .report import prometheus as prom
from .verdict import judged_report

RESIDENT_PROBES = ("runqlat",)
# What one event costs the host, CPU seconds: a context switch with its wake-up (two program
# runs of 219 ns each, the median that benchmarks/bench_observer.py read from the kernel's
# per-program run time on our 2-core VM, 2026-12-06; the CPU-time difference of a ping-pong
# with and without the probe agreed, 430 us per 1,000 switches, within its noise). The
# programs run inside the switching tasks, so no process of ours shows this time: serve
# states it (docs/benchmarks.md, "The observer's cost").
PROBE_COST_S = {"runqlat": 2 * 219e-9}


@dataclass
class ProbeState:
    up: bool = False
    reason: str = "starting"
    ok: int = 0
    failed: int = 0
    last: dict[str, Any] | None = None  # the last window's summary
    counts: list[int] = field(default_factory=list)  # per exported bucket, cumulative over time
    sum_s: float = 0.0
    events: int = 0  # switches the probe timed, every window added


class Exporter(Collector):
    def __init__(self, host: Host, scope: Scope, baseline: Baseline, interval_s: float,
                 probes: tuple[str, ...] = (), probe_window_s: float = 30.0) -> None:
        self.host, self.scope, self.baseline = host, scope, baseline
        self.interval_s, self.probe_window_s = interval_s, probe_window_s
        self.bounds = prom.histogram_bounds_ns()
        self.probes = {name: ProbeState(counts=[0] * (len(self.bounds) + 1)) for name in probes}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.families: list[Metric] = []
        self.cycles = 0
        self.cycle_s = 0.0
        self.last_error: str | None = None
        self.limits = {cid: (baseline.get(cid).get("limit"), e.unit)
                       for cid, e in catalog().items()}
        self.ready = threading.Event()  # set after the first inspection

    # -- prometheus_client Collector: called by every scrape, reads memory only -------------
    def collect(self) -> Iterator[Metric]:
        with self.lock:
            families = list(self.families)
            probes = {n: {"up": s.up, "reason": s.reason, "ok": s.ok, "failed": s.failed,
                          "events": s.events, "cost_s": PROBE_COST_S.get(n)}
                      for n, s in self.probes.items()}
            hist = None
            if "runqlat" in self.probes:
                st = self.probes["runqlat"]
                hist = (prom.cumulative(st.counts, self.bounds), st.sum_s)
            cycles, cycle_s = self.cycles, self.cycle_s
        yield from families
        yield from prom.probe_state(probes)
        if hist is not None:
            yield prom.runqlat_histogram(*hist)
        yield from prom.exporter_state(cycles, cycle_s, self.interval_s)

    # -- the inspection loop ------------------------------------------------------------------
    def inspect_once(self) -> None:
        started = time.monotonic()
        snap = collect(self.host, self.scope, self.interval_s)
        with self.lock:
            last = self.probes.get("runqlat").last if "runqlat" in self.probes else None
        if last is not None:
            snap.facts["probe.runqlat"] = Fact(value=last)
        report = judged_report(snap, self.baseline)
        families = prom.report_metrics(report, self.limits)
        with self.lock:
            self.families = families
            self.cycles += 1
            self.cycle_s = time.monotonic() - started
        self.ready.set()

    def inspect_loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.inspect_once()
            except Exception as exc:  # noqa: BLE001 - reported as a series, the loop goes on
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.ready.set()
                self.stop.wait(min(self.interval_s, 5.0) or 1.0)

    # -- resident probes -------------------------------------------------------------------
    def probe_once(self, name: str) -> bool:
        """One window of a resident probe; False (and the probe marked down) when it failed."""
        from .probes import Request, driver, measure

        try:
            # the live kernel whatever the root: a container's --root /host is that kernel's
            # host, and eBPF sees all of it (a fixture root's probe measures this machine)
            reason = driver.unavailable(Host("/"))
            if reason:
                raise SourceError(reason)
            summary = measure(Request(name, self.probe_window_s))
        except (SourceError, ValueError) as exc:
            with self.lock:
                st = self.probes[name]
                st.up, st.reason, st.failed = False, str(exc), st.failed + 1
            return False
        self.add_window(name, summary)
        return True

    def probe_loop(self, name: str) -> None:
        backoff = 1.0
        while not self.stop.is_set():
            if self.probe_once(name):
                backoff = 1.0
            else:
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)

    def add_window(self, name: str, summary: dict[str, Any]) -> None:
        """Add one window's log-linear buckets (µs bounds in the summary) to the histogram."""
        buckets = [(round(b["min"] * 1000), round(b["max"] * 1000), int(b["count"]))
                   for b in summary.get("buckets") or []]
        with self.lock:
            st = self.probes[name]
            for low, high, count in buckets:
                st.counts[prom.bucket_index(self.bounds, high - 1)] += count
                st.sum_s += count * (low + high - 1) / 2 * 1e-9  # bucket midpoints
            st.events += int(summary.get("count") or 0)
            st.up, st.reason, st.ok, st.last = True, "", st.ok + 1, summary

    # -- running -----------------------------------------------------------------------------
    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.inspect_loop, name="inspect", daemon=True)]
        threads += [threading.Thread(target=self.probe_loop, args=(n,), name=f"probe-{n}",
                                     daemon=True) for n in self.probes]
        for t in threads:
            t.start()
        return threads


def write_textfile(directory: str, text: str) -> str:
    """node_exporter's textfile collector reads ``*.prom``: write a temporary file beside it and
    rename it into place, so a scrape never sees half a file."""
    path = os.path.join(directory, "tailgate.prom")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tailgate.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
