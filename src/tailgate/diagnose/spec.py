"""What one diagnosis is: its own options as given (:class:`DiagnoseOptions`) and the load's
(a :class:`~tailgate.bench.spec.BenchOptions`, TARGET included), checked against this host
and resolved into a frozen :class:`DiagnoseSpec` by :func:`build`.

The ``diagnose`` command builds its spec here, and so does Python::

    from tailgate.diagnose import DiagnoseSpec, run
    doc = run(DiagnoseSpec.of("http://127.0.0.1:8080/", pid=[1234], rate="1k", duration="5s"))
    print(doc["verdict"]["first"])

Every refusal is a :class:`~tailgate.errors.UsageError` naming the option (exit status 2).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from typing import Any

from ..bench.spec import BenchOptions, BenchSpec
from ..errors import UsageError
from ..host import Host


@dataclass(frozen=True)
class DiagnoseOptions:
    """diagnose's own options as a user gives them, named as the command-line flags are
    (``--min-cover`` is ``min_cover``); the defaults are the command's."""

    pid: tuple[str, ...] = ()
    cgroup: str | None = None
    bin: str = "100ms"
    softirq: bool = False
    min_cover: float = 0.5
    min_lift: float = 1.5
    min_share: float = 0.1
    min_ms: float = 1.0
    profile: bool = False
    profile_hz: int | None = None

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> DiagnoseOptions:
        """The diagnose options of a parsed command line (the load's flags ignored)."""
        given = vars(ns)
        return cls(**{f.name: (tuple(given[f.name]) if isinstance(given[f.name], list)
                               else given[f.name]) for f in fields(cls) if f.name in given})

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in fields(cls)}


@dataclass(frozen=True)
class DiagnoseSpec:
    """A checked diagnosis: the service (its pids, the cgroups whose throttling is polled),
    the window and the bin in seconds, the profile rate, and the load (a checked
    :class:`~tailgate.bench.spec.BenchSpec`, or None when the service is watched
    passively); with the options it came from."""

    options: DiagnoseOptions
    load: BenchOptions  # TARGET, --duration, --warmup and the load's options as given
    host: Host
    pids: tuple[int, ...]
    cgroups: tuple[str, ...]
    bin_s: float
    window_s: float | None  # None: an openai+ trace workload's own span
    warmup_s: float
    profile_hz: int  # the on-CPU sampling rate (used with options.profile)
    bench: BenchSpec | None

    @property
    def target(self) -> str | None:
        return self.load.target

    @classmethod
    def of(cls, target: str | None = None, *, host: Host | None = None,
           **options: Any) -> DiagnoseSpec:
        """Build from keyword options named as :class:`DiagnoseOptions` and
        :class:`~tailgate.bench.spec.BenchOptions` (numbers accepted where the command line
        takes text: ``duration=5`` seconds, ``pid=[1234]``); ``host`` defaults to this one."""
        text = {"bin", "rate", "duration", "warmup", "timeout", "hdr_interval",
                "max_header_bytes", "max_body_bytes", "max_event_bytes"}
        kw = {k: (str(v) if k in text and isinstance(v, (int, float)) else v)
              for k, v in options.items()}
        if "pid" in kw:
            pids = kw["pid"]
            kw["pid"] = tuple(str(p) for p in ([pids] if isinstance(pids, (int, str))
                                               else pids))
        own = DiagnoseOptions.defaults()
        unknown = set(kw) - set(own) - set(BenchOptions.defaults())
        if unknown:
            raise UsageError(f"no diagnose option {', '.join(sorted(unknown))}")
        mine = DiagnoseOptions(**{k: v for k, v in kw.items() if k in own})
        load = BenchOptions().with_(target=target, **{k: v for k, v in kw.items()
                                                      if k not in own})
        return build(mine, load, host)


def build(opts: DiagnoseOptions, load: BenchOptions, host: Host | None = None) -> DiagnoseSpec:
    """Check the options against ``host`` (this one by default) and resolve them; a usage
    error names the option. The load is checked as ``bench`` checks it, its outputs off
    (the diagnosis keeps the requests' log itself)."""
    from ..bench.spec import build as build_bench
    from ..bench.units import parse_duration
    from ..probes.driver import unavailable

    host = host or Host("/")
    reason = unavailable(host)
    if reason:
        raise UsageError(f"diagnose needs the eBPF probes: {reason}")
    try:
        bin_s = parse_duration(opts.bin)
        window_s = parse_duration(load.duration) if load.duration else None
        warmup_s = parse_duration(load.warmup) if load.warmup else 0.0
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if window_s is None and not (load.target and load.target.startswith("openai+")):
        raise UsageError("--duration is required")
    if not 0.001 <= bin_s <= 60:
        raise UsageError("--bin must be between 1ms and 60s")
    hz = _profile_rate(opts)
    pids, cgroups = _service(opts, host)
    load = load.with_(json=None, log=None, html=None, hdr=None, quiet=True)
    bench = build_bench(load) if load.target is not None else None
    return DiagnoseSpec(opts, load, host, pids, tuple(cgroups), bin_s, window_s, warmup_s,
                        hz, bench)


def with_log(bench: BenchSpec, path: str) -> BenchSpec:
    """The load writing its per-request log to ``path`` (the runner reads only the option)."""
    return replace(bench, options=bench.options.with_(log=path))


def _profile_rate(opts: DiagnoseOptions) -> int:
    from .profile import DEFAULT_HZ, MAX_HZ

    if opts.profile_hz is not None and not opts.profile:
        raise UsageError("--profile-hz needs --profile")
    if opts.profile_hz is None:
        return DEFAULT_HZ
    if not 1 <= opts.profile_hz <= MAX_HZ:
        raise UsageError(f"--profile-hz must be between 1 and {MAX_HZ}")
    return opts.profile_hz


def _service(opts: DiagnoseOptions, host: Host) -> tuple[tuple[int, ...], list[str]]:
    """The pids the probe filters on and the cgroups whose throttling is polled."""
    from ..probes.driver import MAX_PIDS
    from ..service import existing_cgroup, existing_pids
    from ..sources.cgroup import cgroup_members, cgroup_of_pid

    pids = existing_pids(host, list(opts.pid))
    cgroups: list[str] = []
    if opts.cgroup:
        path = existing_cgroup(host, opts.cgroup)
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
