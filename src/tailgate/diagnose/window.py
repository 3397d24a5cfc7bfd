"""What one diagnose window recorded (:class:`Evidence`): every source on CLOCK_MONOTONIC ns,
gathered by :func:`~.runner.collect` and lined up with the requests by :func:`~.analyse.analyse`.
A new evidence source is one more field here, filled in ``collect`` and read in ``analyse``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .counters import Polls
from .evidence import CounterPolls, Events, ProbeMaps
from .profile import Samples

if TYPE_CHECKING:
    from ..sources.otlp import Received


@dataclass(frozen=True)
class Evidence:
    """The window ``[t0, t1]`` (ns) and what each source recorded over it."""

    t0: int  # every probe attached: the load started then
    t1: int  # the load (or the passive watch) ended
    events: Events  # the diagnose probe's printed events (and the softirq probe's)
    maps: ProbeMaps  # the diagnose probe's maps: context switches, softirq time per bin
    throttling: CounterPolls  # the service's cgroups' cpu.stat, polled every 5 ms
    counters: Polls  # the counters inspect reads (PSI, softnet, steal, ...), every bin
    cpus: tuple[int, ...]  # the service's CPUs
    load_cpus: tuple[int, ...]  # the load generator's CPUs (none when passive)
    profile: Samples | str | None  # the profile probe's; its reason when unreadable
    bench: dict[str, Any] | None  # the load's tailgate_bench document (None: passive)
    log_path: str  # the load's per-request log
    overhead: dict[str, Any]  # what the probes and polls cost (the document's "overhead")
    # the cgroup of each process the chains of blame name (pid -> path), read after the window
    task_cgroups: dict[int, str] = field(default_factory=dict)
    # the engine's spans an OTLP receiver took in over the run (diagnose --otlp-listen)
    spans: Received | None = None
    otlp_endpoint: str | None = None
