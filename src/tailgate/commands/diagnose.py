"""`tailgate diagnose`: drive load (or watch passively) while taking kernel evidence over the
same window, then say which layer explains the slow requests."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from typing import Any

from ..errors import UsageError
from ..outputs import check_writable, write_output
from .options import existing_cgroup, existing_pids, status


def register(sub: argparse._SubParsersAction) -> None:
    from .bench import add_load_options, add_request_options

    p = sub.add_parser(
        "diagnose", help="explain a tail spike: load + kernel evidence on one time axis",
        description="Drive load at TARGET (any bench target) or, without TARGET, watch the "
        "service passively, while eBPF probes record every long run-queue wait, stop and "
        "futex wait of the service's threads and every TCP retransmission, and its cgroup's "
        "throttling is polled: all on one clock. Then name, bottom-up, the evidence that "
        "co-occurs with the requests above the P99 and P999.")
    p.add_argument("target", metavar="TARGET", nargs="?",
                   help="a bench target (http://, tcp://, openai+http://); omit to watch")
    g = p.add_argument_group("the service")
    g.add_argument("--pid", action="append", default=[], metavar="PID",
                   help="the service's process (repeatable, at most 8)")
    g.add_argument("--cgroup", metavar="PATH", help="the service's cgroup")
    g.add_argument("--bin", default="100ms", metavar="DURATION",
                   help="timeline bin (default 100ms)")
    g.add_argument("--softirq", action="store_true",
                   help="also time every softirq per vector and CPU (a second probe on every "
                   "softirq of every CPU: it can make a loopback load generator late)")
    g.add_argument("--min-cover", type=float, default=0.5, metavar="FRACTION",
                   help="claim a cause only when it covers at least this share of the requests "
                   "above the P99 (default 0.5)")
    g.add_argument("--min-lift", type=float, default=1.5, metavar="RATIO",
                   help="... and this many times its share of all requests (default 1.5)")
    g.add_argument("--min-share", type=float, default=0.1, metavar="FRACTION",
                   help="... and it lasted at least this share of those requests' latency "
                   "(default 0.1)")
    g.add_argument("--min-ms", type=float, default=1.0, metavar="MS",
                   help="... and at least this long per slow request, on average (default 1)")
    g.add_argument("--profile", action="store_true",
                   help="also sample the service's on-CPU stacks and record its off-CPU waits "
                   "with their stacks, and show what is over-represented while the slowest "
                   "requests were in flight (a third probe)")
    g.add_argument("--profile-hz", type=int, default=None, metavar="HZ",
                   help="on-CPU samples per second and CPU (default 997; with --profile)")
    add_load_options(p)
    add_request_options(p)
    p.set_defaults(func=run)


def _service(args: argparse.Namespace, host) -> tuple[tuple[int, ...], list[str]]:
    """The pids the probe filters on and the cgroups whose throttling is polled."""
    from ..probes.driver import MAX_PIDS
    from ..sources.cgroup import cgroup_members, cgroup_of_pid

    pids = existing_pids(host, args.pid)
    cgroups: list[str] = []
    if args.cgroup:
        path = existing_cgroup(host, args.cgroup)
        cgroups.append(path)
        if not pids:
            pids = tuple(sorted(cgroup_members(host, path)))
    if not pids:
        raise UsageError("name the service: --pid PID or --cgroup PATH (its threads are "
                         "what the probes watch)")
    if len(pids) > MAX_PIDS:
        raise UsageError(f"at most {MAX_PIDS} processes (the cgroup has {len(pids)})")
    for pid in pids:
        try:
            path = cgroup_of_pid(host, pid)
        except Exception:  # noqa: BLE001 - no cpu cgroup mounted: throttling is not polled
            continue
        if path not in cgroups:
            cgroups.append(path)
    return pids, cgroups


def run(args: argparse.Namespace) -> int:
    from ..bench.units import parse_duration
    from ..host import Host
    from ..probes.driver import unavailable

    host = Host("/")
    reason = unavailable(host)
    if reason:
        raise UsageError(f"diagnose needs the eBPF probes: {reason}")
    try:
        bin_s = parse_duration(args.bin)
        window_s = parse_duration(args.duration) if args.duration else None
        warmup_s = parse_duration(args.warmup) if args.warmup else 0.0
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if window_s is None and not (args.target and args.target.startswith("openai+")):
        raise UsageError("--duration is required")
    if not 0.001 <= bin_s <= 60:
        raise UsageError("--bin must be between 1ms and 60s")
    _profile_rate(args)
    pids, cgroups = _service(args, host)
    check_writable(args.json, args.html)
    with tempfile.TemporaryDirectory(prefix="tailgate-diagnose-") as tmp:
        with status(args, "diagnose") as say:
            doc = _collect(args, host, pids, cgroups, window_s, warmup_s, bin_s, tmp, say)
    if args.json:
        write_output(args.json, json.dumps(doc, indent=1) + "\n")
    if args.html:
        from ..report.diagnose_html import diagnose_page

        write_output(args.html, diagnose_page(doc))
    if args.json != "-":
        from rich.console import Console

        from ..report.diagnose_render import terminal

        terminal(doc, Console())
    return 1 if doc["verdict"]["claimed"] else 0


DRAIN_S = 0.3


def _profile_rate(args: argparse.Namespace) -> None:
    from ..diagnose.profile import DEFAULT_HZ, MAX_HZ

    if args.profile_hz is not None and not args.profile:
        raise UsageError("--profile-hz needs --profile")
    if args.profile_hz is None:
        args.profile_hz = DEFAULT_HZ
    elif not 1 <= args.profile_hz <= MAX_HZ:
        raise UsageError(f"--profile-hz must be between 1 and {MAX_HZ}")


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


def _stop_patiently(proc, start_s: float = 2.0, print_s: float = 30.0) -> None:
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


def _counter_spec(args, host, pids, cgroups):
    """What the counter polls read, and why a part of it could not be found."""
    from ..diagnose.counters import Spec, psi_cgroups, target_cpus
    from ..model import SourceError

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
    load_cpus = tuple(sorted(os.sched_getaffinity(0))) if args.target else ()
    return Spec(tuple(pids), cpus, tuple(cgroups), psi, _engine_url(args.target),
                load_cpus), unknown


def _collect(args, host, pids, cgroups, window_s, warmup_s, bin_s, tmp,
             say=lambda text: None) -> dict[str, Any]:
    from ..diagnose.counters import CounterPoller
    from ..diagnose.evidence import ATTACHED, Poller, parse_events, parse_maps
    from ..diagnose.profile import ATTACHED as PROFILE_ATTACHED
    from ..diagnose.profile import program as profile_program
    from ..probes.driver import Run, attached
    from ..probes.output import parse_output

    load = args.target is not None
    probe_s = (window_s or 0) + warmup_s + (60.0 if not window_s else 5.0)
    bench_doc = None
    log_path = os.path.join(tmp, "requests.log")
    spec, spec_unknown = _counter_spec(args, host, pids, cgroups)
    # every bin gets a poll when bins are 100 ms or longer; finer bins share the 100 ms polls
    # less finely (a poll reads about a dozen files: 20 ms is the floor)
    period_s = max(0.02, min(bin_s, 0.1))
    with contextlib.ExitStack() as stack:
        poller = stack.enter_context(Poller(host, cgroups, limit_s=probe_s))
        counters = stack.enter_context(CounterPoller(host, spec, period_s, limit_s=probe_s))
        # softirq probes apart and only when asked: attached, they slow a loopback generator
        say("compiling and attaching the eBPF probes")
        sirq = (stack.enter_context(attached(Run("diagnose_softirq", probe_s)))
                if args.softirq else None)
        prof = (stack.enter_context(attached(Run("diagnose_profile", probe_s, 0, pids,
                                                 text=profile_program(args.profile_hz))))
                if args.profile else None)
        probe = stack.enter_context(attached(Run("diagnose", probe_s, 0, pids)))
        _await_line(probe, ATTACHED)  # its BEGIN: the load starts once every probe is on
        if prof:
            _await_line(prof, PROFILE_ATTACHED)
        t_attached = time.monotonic_ns()
        ctxt0 = _ctxt()
        service0 = sum(_cpu_s(p) for p in pids)
        # compiling and attaching, before the window
        probe0 = _cpu_s(probe.proc.pid) + (_cpu_s(sirq.proc.pid) if sirq else 0.0)
        prof0 = _cpu_s(prof.proc.pid) if prof else 0.0
        if load:
            say(f"loading {args.target} while the probes record")
            bench_doc = _drive(args, log_path)
        else:
            say(f"watching the service for {window_s:g} s while the probes record")
            time.sleep(window_s)
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
        if prof:
            _stop_patiently(prof)
    # after the window, the probes print (and the profile symbolises) their maps: the CPU of
    # the bpftrace processes reaped since, less what they had used by the window's end
    readout_s = (time.monotonic_ns() - t_end) / 1e9
    readout_cpu = _children_cpu_s() - reaped0 - probe_cpu - prof_cpu
    text = "".join(probe.out) + ("".join(sirq.out) if sirq else "")
    output = parse_output(text)
    events = parse_events(output.printf)
    counters.polls.errors.update(spec_unknown)
    if not args.softirq:
        counters.polls.errors["softirq time"] = "not probed (diagnose --softirq)"
    extra = {"maps": parse_maps(output), "counters": counters.polls, "cpus": spec.cpus,
             "load_cpus": spec.load_cpus,
             "profile": _profile_samples(prof, args.profile_hz) if prof else None}
    profile_cpu = ({"profile_cpu_s": round(prof_cpu, 3),
                    "profile_window_cpu_s": round(prof_cpu - prof0, 3)} if prof else {})
    return _analyse(args, bench_doc, log_path, events, poller.polls, t_attached,
                    t_end, bin_s, pids, cgroups, extra,
                    {"probe_cpu_s": round(probe_cpu + prof_cpu, 3), "context_switches": switches,
                     "readout_s": round(readout_s, 3),
                     "readout_cpu_s": round(max(readout_cpu, 0.0), 3),
                     "probe_window_cpu_s": round(probe_cpu - probe0 + prof_cpu - prof0, 3),
                     **profile_cpu,
                     "poll_cpu_s": round(counters.cpu_s + poller.cpu_s, 3),
                     "service_cpu_s": round(service_cpu, 3),
                     "window_s": round((t_end - t_attached) / 1e9, 3),
                     "startup_s": round((probe.attached_at - probe.spawned), 3)})


def _drive(args, log_path: str) -> dict[str, Any]:
    """Run the bench with its own options (the library call), its log to ``log_path``."""
    from ..bench.runner import run
    from ..bench.spec import BenchOptions, build

    opts = BenchOptions.from_namespace(args).with_(json=None, log=log_path, html=None,
                                                   hdr=None, quiet=True)
    return run(build(opts)).json


def _requests(bench_doc: dict[str, Any], log_path: str):
    """Intended start, end, dispatch and reply's arrival (in the kernel) of every request
    that ended (ns, CLOCK_MONOTONIC; dispatch and arrival 0 where not known)."""
    import numpy as np

    start = (bench_doc.get("clock") or {}).get("start_monotonic_s")
    if start is None:
        raise UsageError("the bench result has no clock: cannot line requests up with probes")
    with open(log_path, encoding="utf-8") as f:
        text = f.read()
    if text.startswith("worker,"):
        from ..bench.result import read_log

        cols = read_log(text)
        keep = (cols["warmup"] == 0) & np.isfinite(cols["end_s"])
        a = cols["intended_s"][keep]
        b = cols["end_s"][keep]
        # dispatch, not send: a request waiting for a free connection waits for the service
        sent = np.nan_to_num(cols["dispatch_s"][keep], nan=-1.0)
        came = np.nan_to_num(cols["arrive_s"][keep], nan=-1.0)
        scale = 1e9
    else:
        rows = [json.loads(x) for x in text.splitlines() if x.strip()]
        rows = [r for r in rows if r.get("end_ms") is not None]
        a = np.array([r["intended_ms"] for r in rows], dtype=np.float64)
        b = np.array([r["end_ms"] for r in rows], dtype=np.float64)
        sent = np.array([-1.0 if r.get("sent_ms") is None else r["sent_ms"] for r in rows])
        came = np.full(len(rows), -1.0)
        scale = 1e6
    base = int(round(start * 1e9))
    sends = np.where(sent >= 0, base + (sent * scale).astype(np.int64), 0)
    arrives = np.where(came >= 0, base + (came * scale).astype(np.int64), 0)
    return (base + (a * scale).astype(np.int64), base + (b * scale).astype(np.int64), sends,
            arrives)


def _analyse(args, bench_doc, log_path, events, polls, t0, t1, bin_s, pids, cgroups,
             extra, overhead) -> dict[str, Any]:
    import numpy as np

    from ..diagnose.attribution import attribute, merge_spans, part_share, subtract_spans
    from ..diagnose.causes import CAUSES
    from ..diagnose.timeline import timeline

    maps, cpus = extra["maps"], extra["cpus"]

    throttled = polls.throttle_spans()
    port = _port(args.target) if args.target else None
    rtx = np.array([t for t, sport, dport in events.retransmits
                    if port is None or port in (sport, dport)], dtype=np.int64)
    spans = {
        "throttled": merge_spans(throttled),
        "runq": subtract_spans(events.spans("runq"), throttled),
        "stopped": merge_spans(events.spans("stopped")),
        "futex": merge_spans(events.spans("futex")),
        # a retransmission is an instant; a request in flight then waited for it
        "retransmit": np.stack([rtx, rtx], axis=1) if len(rtx) else np.zeros((0, 2), np.int64),
    }
    if args.softirq:  # not probed otherwise: not a cause that "never happened"
        spans["softirq"] = merge_spans(events.softirq_spans(cpus))
    doc: dict[str, Any] = {
        "tailgate_diagnose": 1, "target": args.target, "pids": list(pids), "cgroups": cgroups,
        "mode": "load" if args.target else "passive", "overhead": overhead,
        "evidence": {k: {"events": int(len(v)), "total_ms": round(
            float((v[:, 1] - v[:, 0]).sum()) / 1e6, 3)} for k, v in spans.items()},
        "malformed_probe_lines": events.malformed, "poll_errors": polls.errors,
        "cpus": list(cpus),
    }
    doc["evidence"]["switches"] = {**maps.switch_totals(), "threads": {
        str(tid): v for tid, v in sorted(maps.switches.items())}}
    doc["evidence"]["retransmit"]["total_ms"] = None
    preempted = subtract_spans(events.spans("runq_preempted"), spans["throttled"])
    doc["evidence"]["runq_preempted"] = {  # the part of runq that followed a preemption
        "events": int(len(preempted)),
        "total_ms": round(float((preempted[:, 1] - preempted[:, 0]).sum()) / 1e6, 3)}
    starts = ends = np.zeros(0, np.int64)
    if bench_doc is not None:
        starts, ends, sends, arrives = _requests(bench_doc, log_path)
        doc["bench"] = {k: bench_doc.get(k) for k in ("requests", "rate", "latency_ms",
                                                      "ttft_ms", "e2e_ms", "warnings", "slo")
                        if k in bench_doc}
        doc["bench"]["histograms"] = bench_doc.get("histograms")
        t0 = min(t0, int(starts.min())) if len(starts) else t0
        attributions, info = attribute(starts, ends, {CAUSES[k]: v for k, v in spans.items()},
                                       args.min_cover, args.min_lift, args.min_share,
                                       sends=sends, min_ms=args.min_ms, arrives=arrives)
        doc["tail"] = info
        for a in attributions:
            if a.cause.key == "runq":
                share = part_share(starts, ends, 90 if a.extra["tail"] == "P90" else 99,
                                   spans["runq"], preempted)
                a.extra["preempted_share"] = None if share is None else round(share, 4)
                if share is not None:
                    a.sentence += (f"; {100 * share:.0f} % of that wait followed a preemption "
                                   "(an involuntary switch: the thread's slice ran out)")
        doc["causes"] = [a.to_json() for a in attributions]
        threads = _threads(events, maps, starts, ends, t1)
        doc["accounting"] = _accounting(threads, spans, starts, ends, sends, arrives)
        if extra.get("profile") is not None:
            doc["profile"] = _profile(extra["profile"], threads, starts, ends, sends)
        claimed = [a for a in attributions if a.claimed]
        doc["verdict"] = {"claimed": [a.cause.key for a in claimed],
                          "first": claimed[0].cause.key if claimed else None,
                          "layer": claimed[0].cause.layer if claimed else None,
                          "unexplained": info.get("unexplained")}
    else:
        ranked = sorted(spans.items(), key=lambda kv: -float((kv[1][:, 1] - kv[1][:, 0]).sum()))
        doc["causes"] = [{"cause": k, "layer": CAUSES[k].layer, "events": int(len(v)),
                          "sentence": f"{CAUSES[k].what}: {len(v)} events, "
                          f"{float((v[:, 1] - v[:, 0]).sum()) / 1e6:.1f} ms",
                          "remedy": CAUSES[k].remedy, "claimed": False}
                         for k, v in ranked]
        doc["verdict"] = {"claimed": [], "first": None, "layer": None,
                          "unexplained": "passive mode: no requests to attribute; the evidence "
                          "is listed by total time"}
        if extra.get("profile") is not None:
            doc["profile"] = {"unknown": "passive mode: no requests to split the profile by"}
    instants = {"retransmit": rtx}
    doc["timeline"] = tl = timeline(t0, t1, int(bin_s * 1e9), starts, ends,
                                    {k: v for k, v in spans.items() if k != "retransmit"},
                                    instants)
    tl["series"], tl["unknown"] = _series(maps, extra["counters"], cpus, tl["t0_monotonic_ns"],
                                          int(bin_s * 1e9), len(tl["t_ms"]))
    doc["counters"] = extra["counters"].to_json()
    _steal(doc, tl["series"], extra["load_cpus"], cpus)
    return doc


def _steal(doc: dict[str, Any], series: dict[str, Any], load_cpus: tuple[int, ...],
           cpus: tuple[int, ...]) -> None:
    """Steal time per CPU over the window (ms, to the clock tick). A late generator says how
    much of it the hypervisor took from the generator's CPUs, and run-queue waits how much
    from the service's: on a VM, a vCPU the host does not run holds its runnable threads as
    a busy task would, with no task on the guest to blame."""
    steal = {name.split(".", 1)[1]: round(sum(v or 0 for v in s["values"]), 1)
             for name, s in series.items() if name.startswith("steal.")}
    doc["evidence"]["steal_ms"] = steal
    whose = {"generator": (load_cpus, "its CPUs"), "runq": (cpus, "the service's CPUs")}
    for cause in doc.get("causes", ()):
        on, what = whose.get(cause.get("cause"), ((), ""))
        mine = [steal[f"cpu{c}"] for c in on if f"cpu{c}" in steal]
        if not mine:
            continue
        took = sum(mine)
        cause["steal_ms"] = round(took, 1)
        cause["sentence"] += (f"; the hypervisor took {took:.0f} ms of {what} in the window "
                              "(steal time, counted in clock ticks)" if took else
                              f"; no steal time on {what} (to the clock tick)")


def _threads(events, maps, starts, ends, t_end: int) -> dict[int, dict[str, Any]]:
    """Per thread of the service, its intervals per part of the accounting (diagnose.accounting
    THREAD_PARTS), from the main probe's events and maps."""
    import numpy as np

    from ..diagnose.accounting import syscall_class

    rows: dict[int, dict[str, list[tuple[int, int]]]] = {}

    def add(tid: int, kind: str, a: int, b: int) -> None:
        rows.setdefault(tid, {}).setdefault(kind, []).append((a, b))

    for tid in maps.switches:
        rows.setdefault(tid, {})
    for tid, a, b in events.intervals.get("stopped", []):
        add(tid, "stopped", a, b)
    for tid, a, b in events.runq_not_after_stop():
        add(tid, "runq", a, b)
    for tid, a, b in events.intervals.get("futex", []):
        add(tid, "futex", a, b)
    for tid, a, b, nr in events.offcpu:
        add(tid, syscall_class(nr), a, b)
    t_begin = int(min(starts.min(), ends.min())) if len(starts) else t_end
    for tid, first in maps.first_seen.items():  # before it, what the thread did is not known
        if first > t_begin:
            add(tid, "unseen", t_begin, first)
    for tid, t in events.exits.items():  # gone: no thread of the service from then on
        if t < t_end:
            add(tid, "unseen", t, t_end)
    for tid, (since, nr) in maps.open_waits.items():  # still waiting when the probe ended
        if since < t_end:
            add(tid, syscall_class(nr), since, t_end)
    return {tid: {k: np.array(v, dtype=np.int64) for k, v in kinds.items()}
            for tid, kinds in rows.items()}


def _accounting(threads, spans, starts, ends, sends, arrives) -> dict[str, Any]:
    """Each request's latency split into parts (diagnose.accounting), summarised, with the
    slowest requests' own splits."""
    import numpy as np

    from ..diagnose.accounting import METHOD, account, summarise

    service = {k: spans[k] for k in ("throttled", "softirq", "retransmit") if k in spans}
    acc = account(starts, ends, sends, threads, service, arrives)
    out = summarise(acc)
    out["method"] = METHOD
    out["threads"] = len(threads)
    out["probed"] = sorted(service)
    slowest = np.argsort(-acc.latency, kind="stable")[:20]
    out["slowest"] = [{"latency_ms": round(float(acc.latency[i]) / 1e6, 4),
                       "candidates": int(acc.candidates[i]),
                       "parts_ms": {p: round(float(v[i]) / 1e6, 4)
                                    for p, v in acc.parts.items() if v[i]}}
                      for i in slowest]
    return out


def _profile_samples(proc, hz: int):
    """The profile probe's samples and waits; a SourceError's reason when its output is not
    readable (then the profile is unknown, the rest of diagnose stands)."""
    from ..diagnose.profile import name_frames, parse_samples
    from ..model import SourceError
    from ..probes.output import parse_output

    try:
        samples = parse_samples(parse_output("".join(proc.out)), hz)
    except SourceError as exc:
        return str(exc)
    samples.named_by_tailgate = name_frames(samples)
    return samples


def _profile(samples, threads, starts, ends, sends) -> dict[str, Any]:
    """The tail-differential profile (diagnose.profile) over the requests' windows."""
    import numpy as np

    from ..diagnose.profile import differential, serving_sets

    if isinstance(samples, str):
        return {"unknown": f"the profile probe's output could not be read: {samples}"}
    if not len(starts):
        return {"unknown": "no request ended: nothing to split the profile by"}
    p99 = float(np.percentile(ends - starts, 99, method="inverted_cdf"))
    out = differential(samples, serving_sets(starts, ends, sends, threads, p99))
    out["p99_ms"] = round(p99 / 1e6, 4)
    return out


def _series(maps, counters, cpus, t0: int, bin_ns: int, n: int):
    """The timeline's per-bin series: the probe's context switches and softirq time, and the
    polled counters; with the sources that could not be read and why."""
    from ..diagnose.counters import bin_series, series_meta
    from ..diagnose.evidence import PROBE_BIN_NS
    from ..diagnose.timeline import rebin

    out: dict[str, dict[str, Any]] = {}
    for kind in ("voluntary", "involuntary"):
        out[f"switches.{kind}"] = {"layer": "L2", "unit": "count", "values": rebin(
            maps.switch_bins.get(kind, {}), PROBE_BIN_NS, t0, bin_ns, n)}
    for (vec, cpu), bins in sorted(maps.softirq_bins.items()):
        if cpu in cpus:
            out[f"softirq_ms.{vec}.cpu{cpu}"] = {"layer": "L2", "unit": "ms", "values": rebin(
                bins, PROBE_BIN_NS, t0, bin_ns, n, scale=1e6)}
    for name, values in bin_series(counters.rows, t0, bin_ns, n).items():
        meta = series_meta(name)
        out[name] = {"layer": meta.layer, "unit": meta.unit, "values": values}
    return out, dict(counters.errors)


def _port(target: str) -> int | None:
    from urllib.parse import urlsplit

    url = urlsplit(target.split("+", 1)[-1] if target.startswith("openai+") else target)
    return url.port or {"http": 80, "https": 443}.get(url.scheme)
