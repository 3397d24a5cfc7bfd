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
    otlp_listen: str | None = None  # HOST:PORT of the OTLP/HTTP receiver of the engine's spans
    otlp_wait: str = "6s"

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
class OtlpListen:
    """Where the run's OTLP/HTTP receiver listens (``POST /v1/traces``; port 0: any free
    one), how long it waits after the load for the last spans, and the tag of the run's
    request ids (:func:`tailgate.sources.otlp.request_uuid`: the load sends each request's
    as ``X-Request-Id``, the engine names its span by it)."""

    host: str
    port: int
    wait_s: float
    run: int


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
    otlp: OtlpListen | None = None  # the engine's spans received over the run

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
    for flag, given in (("--hdr", load.hdr),
                        ("--hdr-interval", load.hdr_interval != BenchOptions.hdr_interval)):
        if given:  # (bench's output, never silently dropped)
            raise UsageError(f"{flag}: diagnose writes no HdrHistogram log (bench does); "
                             "--log FILE keeps the run's per-request log")
    # --json and --html are diagnose's own documents; --log stays the load's (its path is the
    # log diagnose reads)
    load = load.with_(json=None, html=None, quiet=True)
    otlp = _otlp(opts, load)
    bench = build_bench(load) if load.target is not None else None
    if otlp is not None and bench is not None:
        bench = with_request_ids(bench, otlp.run)
    return DiagnoseSpec(opts, load, host, pids, tuple(cgroups), bin_s, window_s, warmup_s,
                        hz, bench, otlp)


def _otlp(opts: DiagnoseOptions, load: BenchOptions) -> OtlpListen | None:
    """--otlp-listen HOST:PORT (HOST defaults to loopback) and --otlp-wait, checked."""
    import secrets

    from ..bench.units import parse_duration

    if opts.otlp_listen is None:
        if opts.otlp_wait != DiagnoseOptions.otlp_wait:
            raise UsageError("--otlp-wait needs --otlp-listen")
        return None
    if not (load.target and load.target.startswith("openai+")):
        raise UsageError("--otlp-listen needs an openai+http:// TARGET: the spans are joined "
                         "to the requests the load sends")
    for h in load.header:
        name = h.split(":", 1)[0].strip()
        if name.lower() in ("x-request-id", "traceparent"):
            raise UsageError(f"--otlp-listen sends each request's own X-Request-Id and "
                             f"traceparent: not with --header {name}")
    host, sep, port_text = opts.otlp_listen.rpartition(":")
    host = host.strip("[]") if sep else ""
    if not sep:
        port_text = opts.otlp_listen
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise UsageError(f"--otlp-listen {opts.otlp_listen!r}: give HOST:PORT (a port 0-65535)")
    try:
        wait_s = parse_duration(opts.otlp_wait)
    except ValueError as exc:
        raise UsageError(f"--otlp-wait: {exc}") from None
    if not 0 <= wait_s <= 600:
        raise UsageError("--otlp-wait must be between 0s and 10m")
    return OtlpListen(host or "127.0.0.1", port, wait_s, secrets.randbits(32))


def with_request_ids(bench: BenchSpec, run: int) -> BenchSpec:
    """The load sending request ``i`` of the run tagged ``run`` with ``X-Request-Id``
    :func:`tailgate.sources.otlp.request_uuid` (``run``, ``i``) and the ``traceparent`` of
    that id (:func:`tailgate.sources.otlp.traceparent`: SGLang's spans are found by it)."""
    from types import MappingProxyType

    from ..bench.openai_requests import with_request_ids as stamped
    from ..sources.otlp import request_uuid, traceparent

    reqs = bench.engine_fields["requests"]
    ids = [request_uuid(run, i) for i in range(len(reqs))]
    return replace(bench, engine_fields=MappingProxyType(
        {**bench.engine_fields,
         "requests": stamped(reqs, ids, [traceparent(rid) for rid in ids])}))


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
