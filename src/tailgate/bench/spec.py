"""What one benchmark is: the options as given (:class:`BenchOptions`), checked and
resolved into a :class:`BenchSpec` by :func:`build`.

Every path that runs a bench builds its spec here — the ``bench`` command, each target
of a ``--scenario``, the Ray fleet, ``diagnose`` and ``--sweep`` — so an option means
one thing everywhere and is refused in one place. From Python::

    from tailgate.bench import BenchSpec, run
    result = run(BenchSpec.of("http://127.0.0.1:8080/", rate="1k", duration="5s",
                              slo=["p99<5ms"]))
    print(result.json["latency_ms"]["p99"], result.passed)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ..errors import UsageError
from ..units import parse_size  # the one size rule (K=1000, KiB=1024)
from .options import BenchOptions

MAX_BODY_FILE = 2**30  # one request body
MAX_REQUESTS = 100_000_000  # the schedule and a done-flag per request are held (~9 B each)


@dataclass(frozen=True)
class BenchSpec:
    """A checked bench: what runs (:class:`~tailgate.bench.result.RunInfo`, the target's
    bytes, the parsed SLOs, the global schedule where one is fixed in advance, the
    protocol's engine fields) and the options it came from (outputs included)."""

    options: BenchOptions
    info: Any  # bench.result.RunInfo
    target: Any  # bench.target.Target
    slos: tuple[Any, ...]
    schedule: Any = None  # numpy array of intended offsets, or None (each worker's own)
    engine_fields: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, target: str, **options: Any) -> BenchSpec:
        """Build from keyword options named as :class:`BenchOptions` (numbers accepted where
        the command line takes text: ``rate=1000``, ``duration=5`` seconds)."""
        text = {"rate", "duration", "warmup", "coalesce", "timeout", "hdr_interval", "max_header_bytes",
                "max_body_bytes", "max_event_bytes"}
        kw = {k: (str(v) if k in text and isinstance(v, (int, float)) else v)
              for k, v in options.items()}
        unknown = set(kw) - set(BenchOptions.defaults())
        if unknown:
            raise UsageError(f"no bench option {', '.join(sorted(unknown))}")
        return build(BenchOptions().with_(target=target, **kw))

    @property
    def protocol(self) -> str:
        return self.target.kind


def parse_limits(opts: BenchOptions) -> Any:
    """The protocol buffer limits (ValueError when malformed)."""
    from .http1 import Limits

    sizes = {flag: parse_size(getattr(opts, flag.replace("-", "_")))
             for flag in ("max-header-bytes", "max-body-bytes", "max-event-bytes")}
    for flag, n in sizes.items():
        if n < 64:
            raise ValueError(f"--{flag} must be at least 64 bytes, not {n}")
    return Limits(max_header_bytes=sizes["max-header-bytes"],
                  max_body_bytes=sizes["max-body-bytes"])


def tls_options(opts: BenchOptions) -> Any:
    """--insecure/--cacert/--cert/--key/--sni as a TlsOptions (None when none is given)."""
    from .tls import TlsOptions

    tls = TlsOptions(insecure=opts.insecure, cacert=opts.cacert, cert=opts.cert,
                     key=opts.key, sni=opts.sni)
    if tls.insecure and tls.cacert:
        raise ValueError("give --insecure or --cacert, not both")
    return None if tls == TlsOptions() else tls


def build(opts: BenchOptions) -> BenchSpec:
    """Check ``opts`` and resolve them into a spec; a usage error names the option."""
    from ..slo import SloError
    from .confidence import parse_targets
    from .fastpath import EngineUnavailable, choose, fallback_note, url_scheme
    from .protocols import protocol_of, refuse_flags
    from .result import RunInfo
    from .schedule import Ramp, parse_ramp
    from .target import TargetError, parse_header, parse_target
    from .tls import client_context
    from .units import parse_duration, parse_rate, unescape
    from .workers import default_workers

    if opts.target is None:
        raise UsageError("give TARGET (or --scenario FILE)")
    proto = protocol_of(opts.target)
    refuse_flags(opts, proto, BenchOptions.defaults())
    if proto.kind == "udp":  # one socket, its own loop: bench.udp checks its options
        return _udp_spec(opts)
    llm = proto.kind == "openai"
    trace = llm and opts.workload == "trace"
    if llm and opts.concurrency is not None:
        raise UsageError("--concurrency (closed loop) is gone: the engine is open-loop for "
                         "every protocol; to bound the requests in flight use --rate with "
                         "--max-connections C (requests beyond C queue, their latency still "
                         "counted from their intended start)")
    if opts.rate is None and not trace:
        raise UsageError("--rate is required" + (" (or --workload trace)" if llm else ""))
    if opts.duration is None and opts.requests is None and not trace:
        raise UsageError("give --duration D and/or --requests N")
    if opts.requests is not None and opts.requests < 1:
        raise UsageError("--requests must be >= 1")
    try:
        pair = parse_ramp(opts.rate) if opts.rate is not None else None
        rate = (pair[1] if pair else parse_rate(opts.rate)) if opts.rate is not None else None
        duration = parse_duration(opts.duration) if opts.duration is not None else None
        warmup = parse_duration(opts.warmup or "0s")
        coalesce = parse_duration(opts.coalesce or "0s")
        timeout = parse_duration(opts.timeout or proto.default_timeout)
        limits = parse_limits(opts)
        max_event = parse_size(opts.max_event_bytes)
        hdr_interval = parse_duration(opts.hdr_interval)
        slos = tuple(proto.parse_slo(e) for e in opts.slo)
        confidence = tuple(t for text in opts.confidence for t in parse_targets(text))
        headers = [parse_header(h) for h in opts.header]
        body = _body(opts)
        tls = tls_options(opts)
        target = parse_target(
            opts.target, method=opts.method, headers=headers, body=body,
            payload=unescape(opts.payload) if opts.payload is not None else None,
            delimiter=unescape(opts.delimiter) if opts.delimiter is not None else None,
            response_length=opts.response_length, api=opts.api, tls=tls)
        if target.tls is not None:
            client_context(target.tls)  # unreadable certificate files: a usage error now
    except (ValueError, SloError, TargetError) as exc:
        raise UsageError(str(exc)) from None
    if (duration is not None and duration <= 0) or timeout <= 0 or warmup < 0 \
            or hdr_interval <= 0:
        raise UsageError("--duration, --timeout and --hdr-interval must be > 0, --warmup >= 0")
    if rate is not None and (rate <= 0 or (pair is not None and pair[0] <= 0)):
        raise UsageError("--rate must be > 0")
    ramp = None
    if pair is not None:
        if duration is None:
            raise UsageError(f"--rate {opts.rate}: a ramp runs over --duration: give it")
        ramp = Ramp(pair[0], pair[1], warmup, warmup + duration)
        rate = ramp.mean_rate
    burstiness = _burstiness(opts)
    try:
        engine = choose(opts.engine, url_scheme(target))
    except EngineUnavailable as exc:
        raise UsageError(str(exc)) from None
    if not 0 <= coalesce < timeout:
        raise UsageError(f"--coalesce {opts.coalesce}: must be >= 0 and below --timeout")
    if coalesce and engine == "python":
        # (the Python engine batches its own sends above 1/MIN_TICK_S requests/s)
        why = fallback_note(opts.engine, url_scheme(target)) or "--engine python"
        raise UsageError(f"--coalesce is the compiled engine's, and this run is the python "
                         f"engine's ({why})")
    workers = opts.workers if opts.workers is not None else default_workers()
    if workers < 1 or opts.connections < 0 or opts.max_connections < 1:
        raise UsageError("--workers and --max-connections must be >= 1, --connections >= 0")
    if opts.max_connections < workers:
        raise UsageError(f"--max-connections {opts.max_connections} is fewer than --workers "
                         f"{workers} (each worker needs one)")
    peak = ramp.peak if ramp is not None else rate
    if peak is not None and duration is not None and peak * (duration + warmup) > MAX_REQUESTS:
        raise UsageError("more than 100 million requests in one run: shorten it")
    if opts.requests is not None and opts.requests > MAX_REQUESTS:
        raise UsageError("more than 100 million requests in one run: fewer --requests")
    info = RunInfo(target=opts.target, protocol=target.scheme, rate=rate or 0.0,
                   duration_s=duration if duration is not None else 0.0,
                   arrival="trace" if trace and rate is None else opts.arrival,
                   warmup_s=warmup, workers=workers,
                   connections=opts.connections, max_connections=opts.max_connections,
                   timeout_s=timeout, seed=opts.seed, min_tail_samples=opts.min_tail_samples,
                   hdr_interval_s=hdr_interval if opts.hdr else None, limits=limits,
                   retry_stale=opts.retry_stale, requests=opts.requests,
                   confidence=confidence, engine=opts.engine, burstiness=burstiness,
                   ramp=ramp, coalesce_s=coalesce)
    schedule = None
    extra: dict[str, Any] = {}
    if llm:
        from .openai_requests import llm_requests

        info, schedule, extra = llm_requests(opts, info, target, list(slos), max_event)
    elif opts.requests is not None:
        from .workers import global_schedule

        total = duration + warmup if duration is not None else None
        schedule = global_schedule(rate, total, opts.arrival, opts.requests, opts.seed,  # type: ignore[arg-type]
                                   burstiness=burstiness, ramp=ramp)
        info = _span(info, schedule)
    # At most ~600 intervals in the --hdr log, whatever the duration; without --hdr,
    # 20..100 for the stationarity test (0.25 s ones up to 25 s: a --confidence run
    # may stop early).
    span = info.duration_s
    info = replace(info, hdr_interval_s=max(hdr_interval, (span + 1e-9) / 600) if opts.hdr
                   else max(span / 100, min(span / 20, 0.25), 1e-6))
    return BenchSpec(opts, info, target, slos, schedule, MappingProxyType(extra))


MIN_BURSTINESS, MAX_BURSTINESS = 1e-3, 1e3  # beyond, gamma gaps are degenerate in doubles


def _burstiness(opts: BenchOptions) -> float:
    """--burstiness (only with --arrival gamma; 1 when not given)."""
    b = opts.burstiness
    if b is None:
        return 1.0
    if opts.arrival != "gamma":
        raise UsageError(f"--burstiness is the shape of --arrival gamma, not of "
                         f"--arrival {opts.arrival}")
    if not MIN_BURSTINESS <= b <= MAX_BURSTINESS:
        raise UsageError(f"--burstiness must be between {MIN_BURSTINESS:g} and "
                         f"{MAX_BURSTINESS:g}, not {b:g}")
    return float(b)


def _body(opts: BenchOptions) -> bytes:
    if opts.body is not None and opts.body_file:
        raise UsageError("give --body or --body-file, not both")
    if not opts.body_file:
        return opts.body.encode() if opts.body is not None else b""
    from ..host import TooLarge, read_regular
    from ..model import SourceError

    try:  # a regular file under the body cap: a FIFO or /dev/zero never ends
        return read_regular(os.path.realpath(opts.body_file), MAX_BODY_FILE,
                            what=opts.body_file)
    except (TooLarge, SourceError) as exc:
        raise UsageError(f"--body-file: {exc}") from None


def _span(info: Any, schedule: Any) -> Any:
    """With --requests and no --duration the measured span is the schedule's."""
    if info.duration_s or not len(schedule):
        return info
    last = float(schedule[-1]) - info.warmup_s
    gap = 1.0 / info.rate if info.rate else 0.0
    return replace(info, duration_s=max(last + gap, 1e-9))


def spec_of(args: argparse.Namespace) -> BenchSpec:
    """The checked BenchSpec of a parsed command line (a usage error names the option)."""
    return build(BenchOptions.from_namespace(args))


def _udp_spec(opts: Any) -> BenchSpec:
    """The BenchSpec of a udp:// target (bench.udp): one sender, a constant schedule or
    ``--rate max``."""
    import numpy as np

    from ..slo import SloError, parse_slo
    from . import udp
    from .result import RunInfo
    from .target import TargetError, parse_target
    from .units import parse_duration, parse_rate

    defaults = type(opts).defaults()
    if opts.engine == "python":
        raise UsageError("udp:// targets run on the compiled datagram loop only "
                         "(--engine fast or auto)")
    if udp.UNAVAILABLE is not None:
        raise UsageError(f"udp://: {udp.UNAVAILABLE}")
    for flag in ("burstiness", "arrival", "connections", "max_connections", "confidence",
                 "retry_stale", "seed", "max_header_bytes", "max_body_bytes", "coalesce"):
        if getattr(opts, flag) != defaults[flag]:
            raise UsageError(f"--{flag.replace('_', '-')} does not apply to udp:// targets "
                             "(datagrams on one socket, a constant schedule or --rate max)")
    if opts.log:
        raise UsageError("--log does not apply to udp:// targets (a line per datagram, millions "
                         "a second): --hdr writes the latency histogram over time")
    if opts.workers not in (None, 1):
        raise UsageError("udp:// runs one sender (--workers 1): its figures are one "
                         "socket's, one core's")
    if opts.rate is None:
        raise UsageError("--rate is required (datagrams per second, or max)")
    if opts.duration is None and opts.requests is None:
        raise UsageError("give --duration D and/or --requests N")
    if opts.requests is not None and opts.requests < 1:
        raise UsageError("--requests must be >= 1")
    s = udp.settings_of(opts)
    try:
        rate = 0.0 if s.max_rate else parse_rate(opts.rate)
        duration = parse_duration(opts.duration) if opts.duration is not None else None
        warmup = parse_duration(opts.warmup or "0s")
        timeout = parse_duration(opts.timeout or udp.BENCH_PROTOCOL.default_timeout)
        hdr_interval = parse_duration(opts.hdr_interval)
        slos = tuple(parse_slo(e) for e in opts.slo)
        target = parse_target(opts.target, tls=tls_options(opts))  # TLS options: refused
    except (ValueError, SloError, TargetError) as exc:
        raise UsageError(str(exc)) from None
    if (duration is not None and duration <= 0) or timeout <= 0 or warmup < 0 \
            or hdr_interval <= 0:
        raise UsageError("--duration, --timeout and --hdr-interval must be > 0, --warmup >= 0")
    if s.max_rate and duration is None:
        raise UsageError("--rate max runs for --duration: give it")
    n = udp.count(rate, duration, warmup, opts.requests)
    if n > udp.MAX_DATAGRAMS:
        raise UsageError(f"more than {udp.MAX_DATAGRAMS:,} datagrams in one run: shorten it")
    info = RunInfo(target=opts.target, protocol="udp", rate=rate,
                   arrival="max" if s.max_rate else "constant",
                   duration_s=duration if duration is not None else 0.0, warmup_s=warmup,
                   workers=1, connections=1, max_connections=1, timeout_s=timeout,
                   seed=None, min_tail_samples=opts.min_tail_samples,
                   requests=opts.requests, engine=opts.engine)
    if duration is None:  # --requests alone: the span is the schedule's
        info = _span(info, np.arange(n, dtype=np.float64) / rate)
    span = info.duration_s
    info = replace(info, hdr_interval_s=max(hdr_interval, (span + 1e-9) / 600) if opts.hdr
                   else max(span / 100, min(span / 20, 0.25), 1e-6))
    return BenchSpec(opts, info, target, slos, None, MappingProxyType({"udp": s, "n": n}))
