"""``run(spec) -> document``: one diagnosis from a :class:`~.spec.DiagnoseSpec`, on this host.

Two steps, each its own function: :func:`collect` attaches the probes, starts the polls,
drives the load (or waits) and returns the window's :class:`~.window.Evidence`;
:func:`~.analyse.analyse` lines the requests up with it and builds the
``tailgate_diagnose`` document. It prints nothing: ``say`` is told what it is doing.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from ..host import Host
from ..sources.otlp import Receiver
from .analyse import analyse
from .counters import Spec
from .engine import expected_numbers, workers_of
from .spec import DiagnoseSpec, with_log
from .window import Evidence

DRAIN_S = 0.3


def run(spec: DiagnoseSpec, say: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Diagnose as ``spec`` says and return the ``tailgate_diagnose`` document."""
    with tempfile.TemporaryDirectory(prefix="tailgate-diagnose-") as tmp:
        evidence = collect(spec, tmp, say)
        return analyse(spec, evidence)


def _cpu_s(pid: int) -> float:
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _await_line(proc, marker: str, timeout_s: float = 10.0) -> None:
    """Wait until the probe prints ``marker`` (its BEGIN: every probe attached)."""
    from ..model import SourceError

    deadline = time.monotonic() + timeout_s
    while not any(marker in line for line in list(proc.out)):
        if proc.proc.poll() is not None or time.monotonic() > deadline:
            raise SourceError(f"the probe did not say it was attached ({marker!r})")
        time.sleep(0.01)


def stop_patiently(proc, start_s: float = 2.0, print_s: float = 30.0) -> None:
    """Stop the profile probe and let it print: symbolising thousands of stacks takes longer
    than the driver's stop steps allow (it would be killed mid-print). SIGINT, again if it
    has printed nothing after ``start_s`` (bpftrace 0.17 may ignore the first), then up to
    ``print_s`` for it to finish; the driver's steps after that."""
    import signal
    import subprocess

    def wait(s: float) -> bool:
        try:
            proc.proc.wait(timeout=s)
            return True
        except subprocess.TimeoutExpired:
            return False

    n = len(proc.out)
    for _ in range(2):
        try:
            os.killpg(proc.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            return
        if wait(start_s) or len(proc.out) > n:
            break
    wait(print_s)


def _children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _ctxt() -> int:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("ctxt "):
                return int(line.split()[1])
    return 0


def _engine_url(target: str | None) -> str | None:
    """An LLM target's Prometheus endpoint: ``/metrics`` at the root of its server."""
    from urllib.parse import urlsplit

    if not target or not target.startswith("openai+"):
        return None
    url = urlsplit(target.split("+", 1)[1])
    return f"{url.scheme}://{url.netloc}/metrics"


def _counter_spec(spec: DiagnoseSpec, host: Host) -> tuple[Spec, dict[str, str]]:
    """What the counter polls read, and why a part of it could not be found."""
    from ..model import SourceError
    from .counters import psi_cgroups, target_cpus

    pids = spec.pids
    unknown: dict[str, str] = {}
    cpus: tuple[int, ...] = ()
    psi: tuple[str, ...] = ()
    try:
        cpus = target_cpus(host, pids)
    except (SourceError, ValueError) as exc:
        unknown["the service's CPUs (Cpus_allowed_list)"] = str(exc)
    try:
        psi = psi_cgroups(host, pids)
    except SourceError as exc:
        unknown["the service's cgroup v2 (PSI)"] = str(exc)
    load_cpus = tuple(sorted(os.sched_getaffinity(0))) if spec.target else ()
    return Spec(tuple(pids), cpus, tuple(spec.cgroups), psi, _engine_url(spec.target),
                load_cpus), unknown


def collect(spec: DiagnoseSpec, tmp: str, say: Callable[[str], None] = lambda text: None
            ) -> Evidence:
    """Attach the probes, start the polls, drive the load (its log under ``tmp``) or watch,
    and read back what every source recorded over the window."""
    from ..probes.driver import Run, attached
    from ..probes.output import parse_output
    from .analyse import _port
    from .counters import CounterPoller
    from .evidence import ATTACHED, Poller, chain_pids, parse_events, parse_maps, task_cgroups
    from .profile import ATTACHED as PROFILE_ATTACHED
    from .profile import program as profile_program

    host, pids, opts = spec.host, spec.pids, spec.options
    window_s, warmup_s, bin_s = spec.window_s, spec.warmup_s, spec.bin_s
    probe_s = ((window_s or 0) + warmup_s + (60.0 if not window_s else 5.0)
               + (spec.otlp.wait_s if spec.otlp else 0.0))
    bench_doc = None
    # the load's per-request log: where --log asked for it (it was dropped before), else a
    # temporary file; diagnose reads it either way
    asked = spec.bench.options.log if spec.bench is not None else None
    log_path = asked or os.path.join(tmp, "requests.log")
    counter_spec, spec_unknown = _counter_spec(spec, host)
    # every bin gets a poll when bins are 100 ms or longer; finer bins share the 100 ms polls
    # less finely (a poll reads about a dozen files: 20 ms is the floor)
    period_s = max(0.02, min(bin_s, 0.1))
    span_wait_s = 0.0
    with contextlib.ExitStack() as stack:
        # bound first: a busy address is refused before any probe is compiled
        rx = stack.enter_context(_receiver(spec)) if spec.otlp else None
        poller = stack.enter_context(Poller(host, list(spec.cgroups), limit_s=probe_s))
        counters = stack.enter_context(CounterPoller(host, counter_spec, period_s,
                                                     limit_s=probe_s))
        # softirq probes apart and only when asked: attached, they slow a loopback generator
        say("compiling and attaching the eBPF probes")
        sirq = (stack.enter_context(attached(Run("diagnose_softirq", probe_s)))
                if opts.softirq else None)
        prof = (stack.enter_context(attached(Run("diagnose_profile", probe_s, 0, pids,
                                                 text=profile_program(spec.profile_hz))))
                if opts.profile else None)
        # the service's port: the probe names the thread that read each request
        port = (_port(spec.target) if spec.target else None) or 0
        probe = stack.enter_context(attached(Run("diagnose", probe_s, 0, pids, extra=(port,))))
        _await_line(probe, ATTACHED)  # its BEGIN: the load starts once every probe is on
        if prof:
            _await_line(prof, PROFILE_ATTACHED)
        t_attached = time.monotonic_ns()
        ctxt0 = _ctxt()
        service0 = sum(_cpu_s(p) for p in pids)
        # compiling and attaching, before the window
        probe0 = _cpu_s(probe.proc.pid) + (_cpu_s(sirq.proc.pid) if sirq else 0.0)
        prof0 = _cpu_s(prof.proc.pid) if prof else 0.0
        if rx is not None:
            say(f"receiving the engine's spans at {rx.endpoint}")
        if spec.bench is not None:
            say(f"loading {spec.target} while the probes record")
            bench_doc = _drive(spec, log_path)
        else:
            say(f"watching the service for {window_s:g} s while the probes record")
            time.sleep(window_s)  # type: ignore[arg-type]  # passive: --duration is required
        say("reading the probes and attributing the tail")
        t_end = time.monotonic_ns()
        probe_cpu = _cpu_s(probe.proc.pid) + (_cpu_s(sirq.proc.pid) if sirq else 0.0)
        prof_cpu = _cpu_s(prof.proc.pid) if prof else 0.0
        switches = _ctxt() - ctxt0
        service_cpu = sum(_cpu_s(p) for p in pids) - service0
        reaped0 = _children_cpu_s()
        # bpftrace drops the events still in its ring buffers when it is stopped: the last
        # ones (the waits the load generator's closing connections end, threads exiting) are
        # read only if it is given a moment first
        time.sleep(DRAIN_S)
        if rx is not None and spec.otlp is not None:  # (the probes drain meanwhile too)
            say("waiting for the engine's last spans")
            t_wait = time.monotonic()
            _await_spans(rx, log_path, bench_doc or {}, spec.otlp.wait_s - DRAIN_S)
            span_wait_s = time.monotonic() - t_wait
        if prof:
            stop_patiently(prof)
    # after the window, the probes print (and the profile symbolises) their maps: the CPU of
    # the bpftrace processes reaped since, less what they had used by the window's end
    readout_s = (time.monotonic_ns() - t_end) / 1e9 - span_wait_s
    readout_cpu = _children_cpu_s() - reaped0 - probe_cpu - prof_cpu
    text = "".join(probe.out) + ("".join(sirq.out) if sirq else "")
    output = parse_output(text)
    events = parse_events(output.printf)
    counters.polls.errors.update(spec_unknown)
    if not opts.softirq:
        counters.polls.errors["softirq time"] = "not probed (diagnose --softirq)"
    profile_cpu = ({"profile_cpu_s": round(prof_cpu, 3),
                    "profile_window_cpu_s": round(prof_cpu - prof0, 3)} if prof else {})
    return Evidence(
        t0=t_attached, t1=t_end, events=events, maps=parse_maps(output),
        throttling=poller.polls, counters=counters.polls, cpus=counter_spec.cpus,
        load_cpus=counter_spec.load_cpus,
        profile=_profile_samples(prof, spec.profile_hz) if prof else None,
        bench=bench_doc, log_path=log_path,
        # read now: the tasks the chains name (an interfering job) may be gone later
        task_cgroups=task_cgroups(host, chain_pids(events)),
        spans=rx.got if rx is not None else None,
        otlp_endpoint=rx.endpoint if rx is not None else None,
        overhead={"probe_cpu_s": round(probe_cpu + prof_cpu, 3), "context_switches": switches,
                  "readout_s": round(readout_s, 3),
                  **({"otlp_wait_s": round(span_wait_s, 3)} if rx is not None else {}),
                  "readout_cpu_s": round(max(readout_cpu, 0.0), 3),
                  "probe_window_cpu_s": round(probe_cpu - probe0 + prof_cpu - prof0, 3),
                  **profile_cpu,
                  "poll_cpu_s": round(counters.cpu_s + poller.cpu_s, 3),
                  "service_cpu_s": round(service_cpu, 3),
                  "window_s": round((t_end - t_attached) / 1e9, 3),
                  "startup_s": round((probe.attached_at - probe.spawned), 3)})


def _receiver(spec: DiagnoseSpec):
    """The run's OTLP/HTTP receiver (sources.otlp), bound now: a busy or foreign address is
    the option's fault."""
    o = spec.otlp
    assert o is not None
    try:
        return Receiver(o.run, o.host, o.port)
    except OSError as exc:
        raise UsageError(f"--otlp-listen {o.host}:{o.port}: {exc.strerror or exc}") from None


def _await_spans(rx, log_path: str, bench_doc: dict[str, Any], wait_s: float) -> None:
    """Until the receiver holds a span of every measured request that ended ok (an
    exporter sends in batches: vLLM's every 5 s), or ``wait_s`` passed."""
    try:
        with open(log_path, encoding="utf-8") as f:
            want = expected_numbers(f.read(), workers_of(bench_doc))
    except OSError:
        want = set()
    deadline = time.monotonic() + max(wait_s, 0.0)
    while not want <= rx.numbers() and time.monotonic() < deadline:
        time.sleep(0.05)


def _drive(spec: DiagnoseSpec, log_path: str) -> dict[str, Any]:
    """Run the load (the bench library call), its log to ``log_path``."""
    from ..bench.runner import run as run_bench

    assert spec.bench is not None
    return run_bench(with_log(spec.bench, log_path)).json


def _profile_samples(proc, hz: int):
    """The profile probe's samples and waits; a SourceError's reason when its output is not
    readable (then the profile is unknown, the rest of diagnose stands)."""
    from ..model import SourceError
    from ..probes.output import parse_output
    from .profile import name_frames, parse_samples

    try:
        samples = parse_samples(parse_output("".join(proc.out)), hz)
    except SourceError as exc:
        return str(exc)
    samples.named_by_tailgate = name_frames(samples)
    return samples
