"""``analyse(spec, evidence) -> document``: the window's evidence lined up with the requests.

The evidence becomes spans per cause (:mod:`.causes`); :mod:`.attribution` ranks the causes
of the slow requests, :mod:`.accounting` splits each request's latency, :mod:`.profile`
splits the profile by them, and :mod:`.timeline` bins it all on one axis. Pure but for
reading the load's per-request log.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import UsageError
from .engine import engine_into
from .restart import restart_into
from .spec import DiagnoseSpec
from .window import Evidence


def _requests(bench_doc: dict[str, Any], log_path: str):
    """Intended start, end, dispatch and the generator's read of the reply of every request
    that ended (ns, CLOCK_MONOTONIC; dispatch 0 where not known). A reply ends at the
    kernel's receive stamp where the log has it (``arrive_s``, compiled engine), as bench's
    latency does: the generator's read after it is no part of the latency explained, but it
    is what finds the reply's connection among the probe's reads (chain.serving)."""
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
        read = b
        b = np.where(np.isnan(cols["arrive_s"][keep]), b, cols["arrive_s"][keep])
        scale = 1e9
    else:
        rows = [json.loads(x) for x in text.splitlines() if x.strip()]
        rows = [r for r in rows if r.get("end_ms") is not None]
        a = np.array([r["intended_ms"] for r in rows], dtype=np.float64)
        b = read = np.array([r["end_ms"] for r in rows], dtype=np.float64)
        sent = np.array([-1.0 if r.get("sent_ms") is None else r["sent_ms"] for r in rows])
        scale = 1e6
    base = int(round(start * 1e9))
    sends = np.where(sent >= 0, base + (sent * scale).astype(np.int64), 0)
    return (base + (a * scale).astype(np.int64), base + (b * scale).astype(np.int64), sends,
            base + (read * scale).astype(np.int64))


def analyse(spec: DiagnoseSpec, ev: Evidence) -> dict[str, Any]:
    """The ``tailgate_diagnose`` document of one window: the evidence, the causes of the
    slow requests (claimed or not), the latency accounting, the profile and the timeline."""
    import numpy as np

    from ..spans import merge_spans, subtract_spans
    from .attribution import attribute, part_share
    from .causes import CAUSES
    from .chain import Blame, owned_causes, report, through_engine
    from .timeline import timeline

    opts = spec.options
    events, maps, cpus, t0, t1 = ev.events, ev.maps, ev.cpus, ev.t0, ev.t1
    bench_doc, log_path, bin_s, pids = ev.bench, ev.log_path, spec.bin_s, spec.pids

    throttled = ev.throttling.throttle_spans()
    port = _port(spec.target) if spec.target else None
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
    if opts.softirq:  # not probed otherwise: not a cause that "never happened"
        spans["softirq"] = merge_spans(events.softirq_spans(cpus))
    doc: dict[str, Any] = {
        "tailgate_diagnose": 1, "target": spec.target, "pids": list(pids),
        "cgroups": list(spec.cgroups),
        "mode": "load" if spec.target else "passive", "overhead": ev.overhead,
        "evidence": {k: {"events": int(len(v)), "total_ms": round(
            float((v[:, 1] - v[:, 0]).sum()) / 1e6, 3)} for k, v in spans.items()},
        "malformed_probe_lines": events.malformed, "poll_errors": ev.throttling.errors,
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
        starts, ends, sends, reads = _requests(bench_doc, log_path)
        doc["bench"] = {k: bench_doc.get(k) for k in ("requests", "rate", "latency_ms",
                                                      "ttft_ms", "e2e_ms", "warnings", "slo")
                        if k in bench_doc}
        doc["bench"]["histograms"] = bench_doc.get("histograms")
        # the loop's read after each reply's kernel stamp: in no latency explained here
        doc["bench"]["read_lag_ms"] = (bench_doc.get("generator") or {}).get("read_lag_ms")
        t0 = min(t0, int(starts.min())) if len(starts) else t0
        # the chain of blame: who served each request, whom it waited for; a wait counts
        # only for the requests of the thread it belongs to (diagnose.chain)
        blame = Blame.of(events, _service_threads(events, maps), port, starts, ends, sends,
                         spans["throttled"], reads)
        # an LLM server's HTTP thread waits for the engine's thread on a futex: that wait is
        # the engine's phase of the request (its own record), no lock's
        win = _engine_windows(spec.target, bench_doc, log_path, ev.spans)
        resolved = through_engine(blame, win) if win is not None else []
        causes = {CAUSES[k]: v for k, v in spans.items()}
        causes.update({CAUSES[k]: own for k, own in
                       owned_causes(blame, events, starts, ends, spans["throttled"],
                                    resolved).items()})
        attributions, info = attribute(starts, ends, causes,
                                       opts.min_cover, opts.min_lift, opts.min_share,
                                       sends=sends, min_ms=opts.min_ms)
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
        threads = _threads(events, maps, starts, ends, t1, resolved)
        doc["accounting"] = _accounting(threads, spans, starts, ends, sends)
        if ev.profile is not None:
            # the profile's serving windows end at the generator's read, as before replies
            # ended at their stamps: ending them at the stamp ranked the service's read for
            # its next request first in 3 runs of 4 of test_a_sleep_in_the_handler (why: not
            # traced)
            doc["profile"] = _profile(ev.profile, threads, starts, reads, sends)
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
        if ev.profile is not None:
            doc["profile"] = {"unknown": "passive mode: no requests to split the profile by"}
    instants = {"retransmit": rtx}
    doc["timeline"] = tl = timeline(t0, t1, int(bin_s * 1e9), starts, ends,
                                    {k: v for k, v in spans.items() if k != "retransmit"},
                                    instants)
    tl["series"], tl["unknown"] = _series(maps, ev.counters, cpus, tl["t0_monotonic_ns"],
                                          int(bin_s * 1e9), len(tl["t_ms"]))
    doc["counters"] = ev.counters.to_json()
    _steal(doc, tl["series"], ev.load_cpus, cpus)
    criteria = {"min_cover": opts.min_cover, "min_lift": opts.min_lift,
                "min_share": opts.min_share, "min_ms": opts.min_ms}
    if bench_doc is not None:  # the chain of blame of each slow request
        report(blame, doc, starts, ends, criteria, ev.task_cgroups, set(pids))
    # the engine's own record of each request (llama-server's timings, or vLLM's spans
    # received over the run), on the same clock
    engine_into(doc, spec.target, bench_doc, log_path, criteria, ev.spans, ev.otlp_endpoint)
    # a target that exited mid-window (an engine restarted): what its evidence cannot cover
    restart_into(doc, ev.counters, ends)
    return doc


def _engine_windows(target: str | None, bench_doc: dict[str, Any], log_path: str, spans):
    """The engine's phases of each request (diagnose.engine.windows) for an openai+ load
    whose log has the engine's records (or whose spans came over OTLP); None otherwise."""
    from .engine import windows, workers_of

    start = (bench_doc.get("clock") or {}).get("start_monotonic_s")
    if not (target and target.startswith("openai+")) or start is None:
        return None
    with open(log_path, encoding="utf-8") as f:
        text = f.read()
    return (windows(text, start, spans=spans, workers=workers_of(bench_doc))
            if text.startswith("worker,") else None)


def _service_threads(events, maps) -> set[int]:
    """The service's threads: those the probe counted switches of or named at depth 1."""
    return set(maps.switches) | {t.tid for t in events.tasks.values() if t.depth == 1}


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


def _threads(events, maps, starts, ends, t_end: int,
             resolved: list[tuple[int, int, int]] = ()) -> dict[int, dict[str, Any]]:
    """Per thread of the service, its intervals per part of the accounting (diagnose.accounting
    THREAD_PARTS), from the main probe's events and maps. ``resolved``: the serving
    threads' futex waits the chain of blame resolved to the engine's phases
    (chain.through_engine): their futex calls and off-CPU waits are ``engine_wait``."""
    import numpy as np

    from .accounting import syscall_class
    from .chain import split_resolved

    rows: dict[int, dict[str, list[tuple[int, int]]]] = {}

    def add(tid: int, kind: str, a: int, b: int) -> None:
        rows.setdefault(tid, {}).setdefault(kind, []).append((a, b))

    for tid in maps.switches:
        rows.setdefault(tid, {})
    for tid, a, b in events.intervals.get("stopped", []):
        add(tid, "stopped", a, b)
    for tid, a, b in events.runq_not_after_stop():
        add(tid, "runq", a, b)
    futex, engine = split_resolved(events.intervals.get("futex", []), list(resolved))
    for kind, rows_ in (("futex", futex), ("engine_wait", engine)):
        for tid, a, b in rows_:
            add(tid, kind, a, b)
    off = [(tid, a, b) for tid, a, b, nr in events.offcpu if syscall_class(nr) == "futex"]
    _, engine_off = split_resolved(off, list(resolved))
    waits_for_engine = set(engine_off)
    for tid, a, b, nr in events.offcpu:
        kind = syscall_class(nr)
        add(tid, "engine_wait" if kind == "futex" and (tid, a, b) in waits_for_engine
            else kind, a, b)
    t_begin = int(min(starts.min(), ends.min())) if len(starts) else t_end
    for tid, first in maps.first_seen.items():  # before it, what the thread did is not known
        if first > t_begin:
            add(tid, "unseen", t_begin, first)
    for tid, t in events.exits.items():  # gone: no thread of the service from then on
        if t < t_end:
            add(tid, "unseen", t, t_end)
    service = _service_threads(events, maps)
    for tid, (since, nr) in maps.open_waits.items():  # still waiting when the probe ended
        if tid not in service:  # a waker the chain tracked: no thread of the service
            continue
        if since < t_end:
            add(tid, syscall_class(nr), since, t_end)
    return {tid: {k: np.array(v, dtype=np.int64) for k, v in kinds.items()}
            for tid, kinds in rows.items()}


def _accounting(threads, spans, starts, ends, sends) -> dict[str, Any]:
    """Each request's latency split into parts (diagnose.accounting), summarised, with the
    slowest requests' own splits."""
    import numpy as np

    from .accounting import METHOD, account, summarise

    service = {k: spans[k] for k in ("throttled", "softirq", "retransmit") if k in spans}
    acc = account(starts, ends, sends, threads, service)
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


def _profile(samples, threads, starts, ends, sends) -> dict[str, Any]:
    """The tail-differential profile (diagnose.profile) over the requests' windows."""
    import numpy as np

    from .profile import differential, serving_sets

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
    from .counters import bin_series, series_meta
    from .evidence import PROBE_BIN_NS
    from .timeline import rebin

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
