"""eBPF probes: kernel evidence for tail latency, from bpftrace programs.

Each probe is a bpftrace program shipped beside this file (``NAME.bt``, with a
header saying what it measures, its parameters, its output and its overhead),
an analysis that turns its maps into a JSON summary (:mod:`.analyze`), and an
entry in :data:`PROBES`. :func:`measure` runs one, :func:`measure_many` runs
several at once over the same window (what ``inspect --probe-window`` does).

Layers: :mod:`.loglin` (bucket arithmetic), :mod:`.output` (bpftrace's JSON
lines), :mod:`.analyze` (maps -> summary) are pure; :mod:`.driver` alone starts
and stops processes. :mod:`.allocators` and :mod:`.symbols` read a live process's maps
and ELF symbols: which allocators the malloc probe attaches to, and the names of the
addresses it records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..host import valid_pid
from ..model import SourceError
from . import analyze
from .driver import MAX_PIDS, Progress, Result, Run, run_probes
from .output import BpftraceOutput


@dataclass(frozen=True)
class Probe:
    name: str
    summary: str
    analyze: Callable[..., dict[str, Any]]
    needs_pid: bool = False  # malloc: uprobes on the target's allocators, and a filter
    takes_pids: bool = True  # softirq runs in no process's name
    per_process_mode: bool = False  # runqlat: mode 1 keys the histogram by process
    wants_duration: bool = False  # the analysis turns counts into rates


PROBES: dict[str, Probe] = {p.name: p for p in (
    Probe("runqlat", "run-queue latency (wake-up or preemption to running): histogram, "
          "P50..P999, max", analyze.runqlat, per_process_mode=True),
    Probe("offcpu", "time off CPU per process: blocked vs preempted", analyze.offcpu),
    Probe("futex", "futex wait time per process and thread", analyze.futex),
    Probe("switches", "context switches per process: voluntary vs involuntary",
          analyze.switches),
    Probe("sockopt", "processes pinning receive buffers with setsockopt(SO_RCVBUF), and "
          "locked TCP sockets", analyze.sockopt),
    Probe("mmsg", "datagram syscalls per process: recvfrom/sendto vs recvmmsg/sendmmsg and "
          "batch size", analyze.mmsg),
    Probe("malloc", "heap allocations by a process, through whichever allocator it uses "
          "(glibc, musl, jemalloc, tcmalloc, mimalloc, Go), with top stacks", analyze.malloc,
          needs_pid=True, wants_duration=True),
    Probe("softirq", "NET_RX softirq time per CPU", analyze.softirq, takes_pids=False,
          wants_duration=True),
)}


@dataclass(frozen=True)
class Request:
    """What to measure. ``pids`` filter in the kernel (at most 8); ``keep`` selects
    processes afterwards (a cgroup with more processes than that)."""

    probe: str
    duration_s: float
    pids: tuple[int, ...] = ()
    keep: frozenset[int] | None = None
    raw: bool = False  # runqlat only: also print every sample (accuracy tests)

    def spec(self) -> Probe:
        try:
            return PROBES[self.probe]
        except KeyError:
            raise ValueError(f"unknown probe {self.probe!r} (one of: {', '.join(PROBES)})") \
                from None

    def validate(self) -> Run:
        p = self.spec()
        pids = tuple(valid_pid(x) for x in self.pids)
        if pids and not p.takes_pids:
            raise ValueError(f"probe {p.name} measures CPUs, not processes: no --pid")
        if p.needs_pid and not pids:
            raise ValueError(f"probe {p.name} needs --pid (at most {MAX_PIDS})")
        if len(pids) > MAX_PIDS:
            raise ValueError(f"at most {MAX_PIDS} process ids per probe, got {len(pids)}")
        if self.raw and p.name != "runqlat":
            raise ValueError("raw samples exist only for runqlat")
        per_process = bool(pids) or self.keep is not None
        mode = 2 if self.raw else (1 if p.per_process_mode and per_process else 0)
        if self.raw and per_process:
            raise ValueError("raw samples are host-wide only")
        run = Run(p.name, float(self.duration_s), mode, pids)
        run.params()  # range checks
        return run


def prepare(req: Request) -> tuple[Run | None, dict[str, Any]]:
    """The run for ``req`` and what was learnt preparing it. For malloc this reads the
    target's mappings and symbols (which allocators to probe); its run is None when
    no allocator of any process can be probed. ValueError for an invalid request."""
    run = req.validate()
    if req.probe != "malloc":
        return run, {}
    from . import malloc_program

    text, detections = malloc_program.prepare(run.pids)
    context = {"allocators": {str(pid): d.to_json() for pid, d in detections.items()}}
    return (replace(run, text=text) if text else None), context


def _summary(req: Request, res: Result | None, context: dict[str, Any]) -> dict[str, Any]:
    p = req.spec()
    kwargs: dict[str, Any] = {"pids": req.pids, "keep": req.keep, **context}
    # The window is the program's own timer (it exits itself); the wall time
    # around it also counts attaching the other probes and printing the maps.
    if p.wants_duration:
        kwargs["duration_s"] = float(req.duration_s)
    if res is not None and res.run.text:  # malloc: name the call sites while they live
        from .malloc_program import name_sites

        kwargs["names"] = name_sites(res.output)
    out = p.analyze(res.output if res else BpftraceOutput(), **kwargs)
    out.update({"duration_s": float(req.duration_s),
                "wall_s": res.sampled_s if res else None,
                "startup_s": res.startup_s if res else None,
                "pids": list(req.pids), "lost_events": res.output.lost_events if res else 0})
    if res is None:
        out["not_run"] = "nothing to probe"
    elif res.run.text:
        # Generated uprobes: one that did not attach would count zero calls, never a pass.
        from .malloc_program import attach_shortfall, complete

        if not complete(res.output.printf):
            how = f" (stopped with {res.stopped})" if res.stopped else ""
            raise SourceError(f"bpftrace {req.probe} ended before printing all its maps{how}: "
                              "its counts are incomplete")
        short = attach_shortfall(res.run.text, res.output.attached)
        for r in (out.get("processes") or {}).values() if short else ():
            r.setdefault("unprobed", []).append(short)
    if res and res.stopped:
        out["stopped"] = res.stopped
    if req.raw and res:
        out["raw_ns"] = analyze.runqlat_raw(res.output)
    return out


def measure_many(requests: Sequence[Request], on_progress: Progress | None = None,
                 cancelled: Callable[[], bool] | None = None
                 ) -> list[dict[str, Any] | SourceError]:
    """Run every request over the same window; a summary or the error for each."""
    prepared: list[tuple[Run | None, dict[str, Any]] | SourceError] = []
    for req in requests:
        try:
            prepared.append(prepare(req))
        except ValueError as exc:
            prepared.append(SourceError(str(exc)))
    runs = [p[0] for p in prepared if not isinstance(p, SourceError) and p[0] is not None]
    it = iter(run_probes(runs, on_progress, cancelled=cancelled))
    out: list[dict[str, Any] | SourceError] = []
    for req, prep in zip(requests, prepared, strict=True):
        if isinstance(prep, SourceError):
            out.append(prep)
            continue
        run, context = prep
        res = next(it) if run is not None else None
        if isinstance(res, SourceError):
            out.append(res)
            continue
        try:
            out.append(_summary(req, res, context))
        except SourceError as exc:  # a ParseError of its maps
            out.append(exc)
    return out


def measure(request: Request, on_progress: Progress | None = None) -> dict[str, Any]:
    (res,) = measure_many([request], on_progress)
    if isinstance(res, SourceError):
        raise res
    return res
