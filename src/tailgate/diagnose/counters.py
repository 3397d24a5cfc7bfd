"""The counters inspect reads, polled through the diagnose window and binned on its clock.

Reading (:func:`read_counters`) and binning (:func:`bin_series`, pure) are apart. Each poll is
one flat ``{series: value}`` of cumulative counters (PSI stall time, softnet drops, IRQ counts,
throttling, TCP retransmissions, an engine's preemptions) and gauges (an engine's queue depth
and KV-cache usage). A source that cannot be read is left out of the poll and its reason kept:
the report shows it as unknown, never as zero.

Sources, all per poll (the files are small; a poll reads about a dozen):

* PSI, system-wide (/proc/pressure) and of the target's cgroup v2 (``cpu.pressure`` ...):
  the stall time's ``total`` in microseconds;
* /proc/net/softnet_stat: drops and time squeezes, summed over the CPUs;
* /proc/interrupts (numbered IRQs) and /proc/softirqs (NET_RX, NET_TX) on the target's CPUs;
* /proc/stat: steal time (a VM's vCPU runnable while the hypervisor ran something else) on the
  target's CPUs and the load generator's, in clock ticks (10 ms on most kernels: a coarse
  figure, but the only one a guest has of time it never saw);
* the target's cgroup ``cpu.stat``: periods throttled and time throttled;
* /proc/PID/net/snmp and netstat: the target's own network namespace (a server in a test
  namespace counts its retransmissions there, not in the host's);
* an LLM engine's Prometheus ``/metrics`` (vLLM, SGLang, llama-server ``--metrics``) for
  ``openai+`` targets.
"""

from __future__ import annotations

import os
import posixpath
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..host import Host
from ..model import ParseError, SourceError
from ..sources import procfs
from ..sources.cgroup import parse_cpu_stat, parse_mounts, parse_proc_cgroup
from .evidence import idle_priority


@dataclass(frozen=True)
class Series:
    layer: str
    unit: str  # "ms" (time per bin), "count" (events per bin), or a gauge's unit
    gauge: bool = False  # a level (queue depth), not a counter: its mean per bin
    scale: float = 1.0  # raw counter units per ``unit`` (PSI: 1000 us per ms)


def series_meta(name: str) -> Series:
    """What a series is, from its name (the names :func:`read_counters` makes)."""
    if name.startswith(("psi.", "cgroup.psi.")):
        return Series("L2", "ms", scale=1000.0)
    if name.startswith("cgroup.throttled_ms"):
        return Series("L2", "ms", scale=1e6)
    if name.startswith("steal."):  # below the kernel: the VM's host
        return Series("L1", "ms", scale=os.sysconf("SC_CLK_TCK") / 1000.0)
    if name.startswith("engine."):
        gauge = not name.endswith("_total")
        return Series("L4", "%" if name.endswith("kv_usage") else "count", gauge=gauge,
                      scale=0.01 if name.endswith("kv_usage") else 1.0)
    return Series("L2", "count")


@dataclass(frozen=True)
class Spec:
    """Whose counters: the target's processes, CPUs, cgroups and engine."""

    pids: tuple[int, ...]
    cpus: tuple[int, ...]
    cgroups: tuple[str, ...] = ()  # cpu.stat directories (v1 cpu or v2)
    psi_cgroups: tuple[str, ...] = ()  # cgroup v2 directories with *.pressure
    engine_url: str | None = None
    load_cpus: tuple[int, ...] = ()  # the load generator's (diagnose's own affinity)


def target_cpus(host: Host, pids: tuple[int, ...]) -> tuple[int, ...]:
    """The CPUs the target's threads may run on (their affinity, ``Cpus_allowed_list``)."""
    cpus: set[int] = set()
    for pid in pids:
        for line in host.read(f"/proc/{pid}/status").splitlines():
            if line.startswith("Cpus_allowed_list:"):
                cpus |= _cpu_list(line.split(":", 1)[1])
    return tuple(sorted(cpus))


def _cpu_list(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out


def psi_cgroups(host: Host, pids: tuple[int, ...]) -> tuple[str, ...]:
    """The target's cgroup v2 directories (PSI lives there even without the cpu controller)."""
    mounts = [m for m, fs, _ in parse_mounts(host.read("/proc/mounts")) if fs == "cgroup2"]
    out: list[str] = []
    for pid in pids:
        inner = parse_proc_cgroup(host.read(f"/proc/{pid}/cgroup")).get("")
        for mount in mounts if inner is not None else []:
            path = posixpath.normpath(posixpath.join(mount, inner.lstrip("/")))
            # the root cgroup's pressure is the system's, polled already
            if (path.startswith(mount + "/") and path not in out
                    and host.exists(f"{path}/cpu.pressure")):
                out.append(path)
    return tuple(out)


ENGINE_SERIES = (  # (series, metric names in preference order): vLLM's, SGLang's, llama.cpp's
    ("engine.queue_depth", ("vllm:num_requests_waiting", "sglang:num_queue_reqs",
                            "llamacpp:requests_deferred")),
    ("engine.running", ("vllm:num_requests_running", "sglang:num_running_reqs",
                        "llamacpp:requests_processing")),
    ("engine.kv_usage", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                         "sglang:token_usage")),
    ("engine.preemptions_total", ("vllm:num_preemptions_total",)),
    # a counter every engine keeps: the prompt tokens per bin on the timeline, and the
    # mark of a restarted engine (its counters start again from zero: :func:`resets`)
    ("engine.prompt_tokens_total", ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total",
                                    "llamacpp:prompt_tokens_total")),
)


def _engine(text: str) -> dict[str, float]:
    from ..llm.engine_metrics import total
    from ..sources.engine import parse_exposition

    samples = parse_exposition(text)
    out = {}
    for key, names in ENGINE_SERIES:
        for name in names:
            value = total(samples, name)
            if value is not None:
                out[key] = value
                break
    if not out:
        raise SourceError("its /metrics has no queue, KV-cache or preemption series of vLLM, "
                          "SGLang or llama.cpp")
    return out


def kept_reason(first: str | None, new: str) -> str:
    """Why a source is unknown over the window: the first reason it gave, unless that was a
    time-out and a later poll got an answer (an engine's 404 says why its series are unknown;
    a poll the busy machine kept from its CPU past the deadline does not)."""
    from ..sources.engine import LATE

    return new if first is None or (LATE in first and LATE not in new) else first


def read_counters(host: Host, spec: Spec, fetch: Callable[[str], str] | None = None
                  ) -> tuple[dict[str, float], dict[str, str]]:
    """One poll: ``({series: value}, {source: why it could not be read})``."""
    values: dict[str, float] = {}
    errors: dict[str, str] = {}

    def take(source: str, read: Callable[[], dict[str, float]]) -> None:
        try:
            values.update(read())
        except (SourceError, ValueError, KeyError, IndexError) as exc:
            errors[source] = str(exc) or type(exc).__name__

    def psi(prefix: str, directory: str, suffix: str) -> Callable[[], dict[str, float]]:
        def read() -> dict[str, float]:
            out = {}
            for res in ("cpu", "memory", "io"):
                rows = procfs.parse_pressure(host.read(f"{directory}/{res}{suffix}"))
                for kind, row in rows.items():
                    out[f"{prefix}.{res}.{kind}"] = float(row["total"])
            return out
        return read

    take("/proc/pressure", psi("psi", "/proc/pressure", ""))
    for i, path in enumerate(spec.psi_cgroups):
        take(f"{path}/*.pressure", psi("cgroup.psi" + (f"{i}" if i else ""), path, ".pressure"))

    def softnet() -> dict[str, float]:
        rows = procfs.parse_softnet(host.read("/proc/net/softnet_stat"))
        return {"softnet.dropped": float(sum(r["dropped"] for r in rows)),
                "softnet.time_squeeze": float(sum(r["time_squeeze"] for r in rows))}

    def irqs() -> dict[str, float]:
        parsed = procfs.parse_interrupts(host.read("/proc/interrupts"))
        cols = {c: i for i, c in enumerate(parsed["cpus"])}
        return {f"irq.cpu{c}": float(sum(v["counts"][cols[c]] for v in parsed["irqs"].values()))
                for c in spec.cpus if c in cols}

    def softirqs() -> dict[str, float]:
        parsed = procfs.parse_softirqs(host.read("/proc/softirqs"))
        return {f"softirq.{vec}.cpu{c}": float(parsed[vec][c])
                for vec in ("NET_RX", "NET_TX") for c in spec.cpus if c < len(parsed[vec])}

    def steal() -> dict[str, float]:
        parsed = procfs.parse_stat_cpus(host.read("/proc/stat"))
        return {f"steal.cpu{c}": float(parsed[c]["steal"])
                for c in sorted({*spec.cpus, *spec.load_cpus}) if c in parsed}

    take("/proc/net/softnet_stat", softnet)
    take("/proc/interrupts", irqs)
    take("/proc/softirqs", softirqs)
    take("/proc/stat", steal)

    def cpu_stat(path: str) -> Callable[[], dict[str, float]]:
        def read() -> dict[str, float]:
            st = parse_cpu_stat(host.read(f"{path}/cpu.stat"))
            if "nr_throttled" not in st:
                raise SourceError("cpu.stat has no nr_throttled (no CPU bandwidth control)")
            ns = st.get("throttled_time", st.get("throttled_usec", 0) * 1000)  # v1 | v2
            tag = "" if path == spec.cgroups[0] else f"{spec.cgroups.index(path)}"
            return {f"cgroup.nr_throttled{tag}": float(st["nr_throttled"]),
                    f"cgroup.throttled_ms{tag}": float(ns)}
        return read

    for path in spec.cgroups:
        take(f"{path}/cpu.stat", cpu_stat(path))

    if spec.pids:
        pid = spec.pids[0]

        def tcp() -> dict[str, float]:
            snmp = procfs.parse_snmp(host.read(f"/proc/{pid}/net/snmp"))["Tcp"]
            ext = procfs.parse_snmp(host.read(f"/proc/{pid}/net/netstat")).get("TcpExt", {})
            out = {"tcp.retrans_segs": float(snmp["RetransSegs"]),
                   "tcp.in_errs": float(snmp["InErrs"])}
            for key, name in (("ListenDrops", "tcp.listen_drops"),
                              ("TCPBacklogDrop", "tcp.backlog_drops")):
                if key in ext:
                    out[name] = float(ext[key])
            return out

        take(f"/proc/{pid}/net/snmp", tcp)
    if spec.engine_url:
        from ..sources.engine import fetch as get

        url = spec.engine_url
        take(url, lambda: _engine((fetch or (lambda u: get(u, 2.0)))(url)))
    return values, errors


def bin_series(polls: list[tuple[int, dict[str, float]]], t0: int, bin_ns: int, n: int
               ) -> dict[str, list[float | None]]:
    """Per series, its value per bin of ``[t0, t0 + n * bin_ns)`` (pure).

    A counter's growth between two polls is spread evenly over the time between them (the
    finest the polls allow), then scaled to the series' unit; a gauge is the mean of the polls
    inside the bin. A bin no poll interval reaches is None (not measured), never 0."""
    names = sorted({k for _, vals in polls for k in vals})
    out: dict[str, list[float | None]] = {}
    edges = t0 + np.arange(n + 1, dtype=np.int64) * bin_ns
    for name in names:
        meta = series_meta(name)
        pts = [(t, v[name]) for t, v in polls if name in v]
        restarts = name.startswith("engine.")
        acc = np.zeros(n)
        seen = np.zeros(n, dtype=bool)
        if meta.gauge:
            cnt = np.zeros(n)
            for t, v in pts:
                i = (t - t0) // bin_ns
                if 0 <= i < n:
                    acc[i] += v
                    cnt[i] += 1
                    seen[i] = True
            vals = np.divide(acc, np.maximum(cnt, 1))
        else:
            for (ta, va), (tb, vb) in zip(pts, pts[1:], strict=False):
                if tb <= ta:
                    continue
                # a counter that went back was reset: an engine's by its restart, the new
                # process counting vb from zero (Prometheus's increase() rule); any other
                # adds nothing (no rate is made of a source that is not the one before)
                grow = vb - va if vb >= va else (vb if restarts else 0.0)
                lo = np.clip(edges[:-1], ta, tb)
                hi = np.clip(edges[1:], ta, tb)
                part = (hi - lo) / (tb - ta)
                acc += grow * part
                seen |= part > 0
            vals = acc
        vals = vals / meta.scale
        out[name] = [round(float(x), 3) if s else None for x, s in zip(vals, seen, strict=True)]
    return out


@dataclass(frozen=True)
class Reset:
    """Counters that went back between two polls (ns): the engine behind them restarted
    (a new process counts from zero) somewhere in ``(before_ns, after_ns]``."""

    before_ns: int
    after_ns: int
    series: tuple[str, ...]


def resets(rows: list[tuple[int, dict[str, float]]], prefix: str = "engine.") -> list[Reset]:
    """Where the cumulative counters of ``prefix`` (an engine's ``*_total``) went back
    between consecutive polls that read them (pure). A poll that could not read them (the
    engine down) is skipped: the reset is placed between the last poll before and the first
    after."""
    last: dict[str, tuple[int, float]] = {}
    found: dict[tuple[int, int], list[str]] = {}
    for t, vals in rows:
        for name, v in vals.items():
            if not (name.startswith(prefix) and name.endswith("_total")):
                continue
            prev = last.get(name)
            if prev is not None and v < prev[1]:
                found.setdefault((prev[0], t), []).append(name)
            last[name] = (t, v)
    return [Reset(a, b, tuple(sorted(names))) for (a, b), names in sorted(found.items())]


@dataclass
class Polls:
    """The counter polls of one window: ``(t_ns, values)`` rows, the first error per
    source (and when it failed), and where a target process was found gone (``exits``: pid -> the first poll
    that found it exited or its pid another process's)."""

    rows: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    exits: dict[int, int] = field(default_factory=dict)
    failed: dict[str, list[int]] = field(default_factory=dict)  # source -> its failed polls

    def to_json(self) -> dict[str, Any]:
        return {"polls": len(self.rows), "unknown": dict(self.errors)}


def process_start(host: Host, pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot), None where it is gone."""
    from ..sources.process import parse_stat_start

    try:
        return parse_stat_start(host.read(f"/proc/{pid}/stat"))
    except (SourceError, ParseError):
        return None


class CounterPoller:
    """Poll :func:`read_counters` every ``period_s`` on a thread until stopped."""

    def __init__(self, host: Host, spec: Spec, period_s: float = 0.1,
                 limit_s: float = 3600.0) -> None:
        self.host, self.spec, self.period_s, self.limit_s = host, spec, period_s, limit_s
        self.polls = Polls()
        # each target's start time now: a pid gone, or another process's later, is an exit
        self.starts = {pid: process_start(host, pid) for pid in spec.pids}
        self.cpu_s = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="diagnose-counters", daemon=True)

    def poll(self) -> None:
        t = time.monotonic_ns()
        values, errors = read_counters(self.host, self.spec)
        self.polls.rows.append((t, values))
        for pid, start in self.starts.items():
            if (start is not None and pid not in self.polls.exits
                    and process_start(self.host, pid) != start):
                self.polls.exits[pid] = t
        for k, v in errors.items():
            self.polls.errors[k] = kept_reason(self.polls.errors.get(k), v)
            self.polls.failed.setdefault(k, []).append(t)

    def _run(self) -> None:
        idle_priority()
        end = time.monotonic() + self.limit_s
        while not self.stop.is_set() and time.monotonic() < end:
            self.poll()
            self.cpu_s = time.thread_time()  # this thread's own CPU: part of the overhead
            self.stop.wait(self.period_s)

    def __enter__(self) -> CounterPoller:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)
        self.poll()  # the last poll closes the window
