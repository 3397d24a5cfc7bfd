"""`tailgate bench TARGET`: open-loop load with coordinated-omission-correct tail latency.

Exit status: 0 every SLO held, 1 an SLO failed or a ``--confidence`` target was not
reached within ``--duration`` (named on the terminal and in the JSON), 2 bad usage,
130 interrupted (results for the completed requests are
still written, marked ``"interrupted": true``).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import Any

from ..errors import UsageError
from .options import check_writable, write_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="open-loop load test with exact tail percentiles, gated on SLOs",
        description="Send requests to TARGET on an open-loop schedule (constant or Poisson "
        "at --rate), measure latency from each request's intended start (so a stalled "
        "server's tail is not hidden), and gate on --slo expressions.",
        epilog="examples:\n"
        "  tailgate bench http://127.0.0.1:8080/ --rate 20k --duration 30s "
        "--slo 'p999<5ms' --slo 'error_rate<0.1%%'\n"
        "  tailgate bench tcp://127.0.0.1:6379 --payload 'PING\\r\\n' --delimiter '\\r\\n' "
        "--rate 5000 --duration 10s\n"
        "  tailgate bench https://db.internal:8443/health --cacert ca.pem --rate 1k "
        "--duration 30s\n"
        "  tailgate bench grpc://127.0.0.1:50051/helloworld.Greeter/SayHello "
        "--body-file req.bin --rate 2k --duration 30s --slo 'p99<2ms'\n"
        "  tailgate bench openai+http://127.0.0.1:8000/v1 --model M --api chat --rate 2 "
        "--duration 60s --slo 'ttft_p99<2s' --slo 'itl_p99<50ms'\n"
        "  mpirun -np 4 tailgate bench allreduce --backend mpi --sizes 8B..1MB  "
        "(collectives: tailgate bench allreduce --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="http(s)://host:port/path, "
                   "tcp://host:port, grpc(s)://host:port/package.Service/Method (unary), "
                   "or an OpenAI-compatible LLM server: openai+http://host:port/v1")
    add_load_options(p)
    g = p.add_argument_group("self-correcting (tailgate.bench.confidence)")
    g.add_argument("--confidence", action="append", default=[], metavar="TARGETS",
                   help="run until each percentile's confidence interval is this narrow, "
                   "--duration being the ceiling: 'p99=10us@95%%' (absolute width), "
                   "'p999=5%%@95%%' (relative to the percentile); comma-separated or "
                   "repeated; exit 1 when not reached")
    add_request_options(p)
    from .bench_fleet import add_fleet_options

    add_fleet_options(p)
    g = p.add_argument_group("rate sweep (tailgate.plan.sweep)")
    g.add_argument("--sweep", metavar="LO..HI", help="run once per offered rate from LO to HI "
                   "(e.g. 1k..50k; --rate is ignored) and report the highest rate meeting "
                   "every --slo, the latency-throughput curve and its knee")
    g.add_argument("--sweep-steps", type=int, default=6, metavar="N",
                   help="geometric steps from LO to HI (default 6)")
    g.add_argument("--sweep-bisect", type=int, default=3, metavar="N",
                   help="bisections between the last rate that held and the first that "
                   "failed (default 3)")
    g.add_argument("--sweep-html", metavar="FILE", help="write the latency-throughput curve "
                   "as HTML")
    p.set_defaults(func=run)


def add_request_options(p: argparse.ArgumentParser) -> None:
    """What each request is: HTTP, TCP and LLM options (shared with `tailgate diagnose`)."""
    g = p.add_argument_group("HTTP requests")
    g.add_argument("-X", "--method", default="GET", help="HTTP method (default GET)")
    g.add_argument("-H", "--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="request header (repeatable)")
    g.add_argument("--body", help="request body (text)")
    g.add_argument("--body-file", metavar="FILE", help="request body read from FILE; for "
                   "grpc:// targets the serialized protobuf request message (framed by "
                   "tailgate; -H adds call metadata)")
    g = p.add_argument_group("TCP requests")
    g.add_argument("--payload", help=r"request bytes, with escapes (\r \n \t \xNN)")
    g.add_argument("--delimiter", help=r"a response ends with these bytes (escapes allowed)")
    g.add_argument("--response-length", type=int, metavar="N",
                   help="a response is exactly N bytes")
    g = p.add_argument_group("TLS (https:// and grpcs:// targets)")
    g.add_argument("--insecure", action="store_true",
                   help="do not verify the server's certificate or name")
    g.add_argument("--cacert", metavar="FILE",
                   help="trust the CA certificates in FILE (PEM) instead of the system's")
    g.add_argument("--cert", metavar="FILE",
                   help="client certificate (PEM chain; with its key unless --key)")
    g.add_argument("--key", metavar="FILE", help="private key of --cert (PEM)")
    g.add_argument("--sni", metavar="NAME", help="server name sent (SNI) and verified "
                   "against the certificate (default: the target's host; the Host header "
                   "is not used)")
    g = p.add_argument_group("protocol limits and keep-alive (every target)")
    g.add_argument("--max-header-bytes", default="256KiB", metavar="SIZE",
                   help="one response header block (or trailer section) larger than this "
                   "is a too_large error (default 256KiB)")
    g.add_argument("--max-body-bytes", default="1GiB", metavar="SIZE",
                   help="one response body (or TCP response) larger than this is a "
                   "too_large error (default 1GiB)")
    g.add_argument("--max-event-bytes", default="16MiB", metavar="SIZE",
                   help="one server-sent event (LLM targets) larger than this is a "
                   "too_large error (default 16MiB)")
    g.add_argument("--max-tokens-per-stream", type=int, default=None, metavar="N",
                   help="a stream (LLM targets) of more than N content chunks is a too_large "
                   "error: what a client keeps of one stream stays bounded (default "
                   "1,000,000)")
    g.add_argument("--retry-stale", action="store_true",
                   help="resend (once) a request whose reused keep-alive connection closed "
                   "before any response byte, instead of counting it stale_connection; its "
                   "latency still runs from its intended start")
    from ..llm.command import add_llm_arguments

    add_llm_arguments(p)  # streamed LLM load: --model, --api, --workload, ... (tailgate.llm)


def add_load_options(p: argparse.ArgumentParser) -> None:
    """The schedule, connection, SLO and output options (shared with other bench kinds)."""
    g = p.add_argument_group("load")
    # Required for http/tcp (checked in _parse); an openai+ target may use --concurrency
    # or --requests instead.
    g.add_argument("--rate", help="requests per second, all workers together "
                   "(e.g. 1000, 20k)")
    g.add_argument("--duration", help="measured run time (e.g. 30s, 2m)")
    g.add_argument("--arrival", choices=("constant", "poisson"), default="constant",
                   help="inter-arrival times: constant (default) or exponential (Poisson)")
    g.add_argument("--warmup", default="0s", help="run this long first, not measured")
    g.add_argument("--connections", type=int, default=16,
                   help="connections opened before the run (default 16)")
    g.add_argument("--max-connections", type=int, default=1024,
                   help="open more when all are busy, up to this; beyond it requests queue, "
                   "their latency still counted from their intended start (default 1024)")
    g.add_argument("--workers", type=int, default=None,
                   help="generator processes (default: one per CPU)")
    g.add_argument("--timeout", default=None,
                   help="a request without a full response this long after its intended "
                   "start is a time-out, recorded at the time-out (default 2s; 60s for "
                   "openai+ targets)")
    g.add_argument("--requests", type=int, metavar="N",
                   help="send the schedule's first N requests (with --duration: at most N)")
    g.add_argument("--seed", type=int, default=0, help="Poisson schedule seed (default 0)")
    g.add_argument("--engine", choices=("auto", "fast", "python"), default="auto",
                   help="load engine: fast (the compiled hot path, http:// and tcp://), "
                   "python (the reference engine) or auto (fast where it applies; default)")
    g = p.add_argument_group("results")
    g.add_argument("--slo", action="append", default=[], metavar="EXPR",
                   help="objective, e.g. 'p999<5ms', 'p99<20ms', 'error_rate<0.1%%', "
                   "'service.p99<1ms', 'rate>=9900' (repeatable; exit 1 if one fails)")
    g.add_argument("--json", metavar="FILE", help="write the result JSON to FILE ('-': stdout)")
    g.add_argument("--html", metavar="FILE",
                   help="write a self-contained HTML page: figures and percentile spectra")
    g.add_argument("--hdr", metavar="FILE",
                   help="write the latency histogram as an HdrHistogram log (HISTFAAA...)")
    g.add_argument("--hdr-interval", default="1s",
                   help="interval of the --hdr log's histograms (default 1s)")
    g.add_argument("--log", metavar="FILE", help="write one CSV record per request to FILE "
                   "(openai+ targets: with token columns)")
    g.add_argument("--spectrum", action="store_true",
                   help="print the detailed percentile spectrum (as wrk2 does)")
    g.add_argument("--percentiles", metavar="LIST", type=parse_percentiles,
                   help="the percentile columns of the table, e.g. 50,90,95,99,99.9 (1 to "
                   "99.9999); any not in the JSON already (p75, p995) are added to it with "
                   "their confidence intervals")
    g.add_argument("--min-tail-samples", type=int, default=10,
                   help="warn when fewer samples than this lie above a tail percentile")
    g.add_argument("--quiet", action="store_true", help="no live progress display")


MAX_BODY_FILE = 2**30  # one request body

def parse_size(text: str) -> int:
    """Bytes in ``text`` (``"256KiB"``, ``"1GiB"``, ``"4096"``); the rule of tailgate.units."""
    from ..units import parse_size as parse

    return parse(text)


def parse_limits(args: argparse.Namespace) -> Any:
    """The protocol buffer limits from the command line (ValueError when malformed)."""
    from ..bench.http1 import Limits

    defaults = {"max-header-bytes": "256KiB", "max-body-bytes": "1GiB",
                "max-event-bytes": "16MiB"}
    sizes = {flag: parse_size(getattr(args, flag.replace("-", "_"), None) or default)
             for flag, default in defaults.items()}
    for flag, n in sizes.items():
        if n < 64:
            raise ValueError(f"--{flag} must be at least 64 bytes, not {n}")
    return Limits(max_header_bytes=sizes["max-header-bytes"],
                  max_body_bytes=sizes["max-body-bytes"])


# Which protocols each request/LLM option applies to (a flag given for any other is a
# usage error naming both: nothing is silently ignored). Load, limit and output options
# apply to every protocol and are not listed.
FLAG_PROTOCOLS: dict[str, tuple[str, ...]] = {
    "--method": ("http",), "--body": ("http", "grpc"), "--body-file": ("http", "grpc"),
    "--header": ("http", "openai", "grpc"),
    "--payload": ("tcp",), "--delimiter": ("tcp",), "--response-length": ("tcp",),
    "--max-event-bytes": ("openai",), "--max-tokens-per-stream": ("openai",),
    **{f: ("openai",) for f in (
        "--model", "--api", "--workload", "--input-len", "--output-len", "--range-ratio",
        "--conversations", "--turns", "--system-len", "--trace", "--allow-no-done",
        "--trace-token-scale", "--trace-time-scale", "--no-usage", "--ignore-eos",
        "--concurrency")},
}
PROTOCOLS = {"http": "http", "https": "http", "tcp": "tcp", "grpc": "grpc", "grpcs": "grpc",
             "openai+http": "openai", "openai+https": "openai"}
# LLM options that only one kind of workload reads.
WORKLOAD_FLAGS: dict[str, tuple[str, ...]] = {
    "--input-len": ("fixed", "random", "multiturn"),
    "--output-len": ("fixed", "random", "multiturn"),
    "--range-ratio": ("random",),
    **{f: ("multiturn",) for f in ("--conversations", "--turns", "--system-len")},
    **{f: ("trace",) for f in ("--trace", "--trace-token-scale", "--trace-time-scale")},
}


def _defaults() -> dict[str, Any]:
    """The bench parser's default of every option (what "not given" looks like)."""
    p = argparse.ArgumentParser(add_help=False)
    add_load_options(p)
    add_request_options(p)
    return {a.dest: a.default for a in p._actions}


def protocol_of(url: str) -> str:
    """``http``, ``tcp``, ``grpc`` or ``openai`` (by URL scheme; TLS or not), else a usage
    error."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in PROTOCOLS:
        return PROTOCOLS[scheme]
    raise UsageError("target must be http(s)://host:port/path, tcp://host:port, "
                     "grpc(s)://host:port/package.Service/Method or "
                     f"openai+http(s)://host:port/v1, not {url!r}")


def refuse_flags(args: argparse.Namespace, protocol: str) -> None:
    """A flag given for a protocol it does not apply to is a usage error."""
    defaults = _defaults()
    for flag, protos in FLAG_PROTOCOLS.items():
        dest = flag[2:].replace("-", "_")
        if protocol in protos or not hasattr(args, dest):
            continue
        if getattr(args, dest) != defaults.get(dest):
            scheme = {"openai": "openai+http"}.get(protocol, protocol)
            raise UsageError(f"{flag} does not apply to {scheme}:// targets (it is for "
                             + ", ".join({"openai": "openai+http"}.get(p, p) + "://"
                                         for p in protos) + ")")
    if protocol != "openai":
        return
    for flag, kinds in WORKLOAD_FLAGS.items():
        dest = flag[2:].replace("-", "_")
        if args.workload not in kinds and getattr(args, dest) != defaults.get(dest):
            raise UsageError(f"{flag} does not apply to --workload {args.workload} (it is for "
                             f"--workload {' or '.join(kinds)})")


def tls_options(args: argparse.Namespace) -> Any:
    """--insecure/--cacert/--cert/--key/--sni as a TlsOptions (None when none is given)."""
    from ..bench.tls import TlsOptions

    opts = TlsOptions(insecure=bool(getattr(args, "insecure", False)),
                      cacert=getattr(args, "cacert", None), cert=getattr(args, "cert", None),
                      key=getattr(args, "key", None), sni=getattr(args, "sni", None))
    if opts.insecure and opts.cacert:
        raise ValueError("give --insecure or --cacert, not both")
    return None if opts == TlsOptions() else opts


def _parse(args: argparse.Namespace) -> tuple[Any, Any, list[Any], Any, dict[str, Any]]:
    """(run description, target, SLOs, global schedule or None, further engine fields)."""
    from ..bench.confidence import parse_targets
    from ..bench.result import RunInfo
    from ..bench.slo import SloError
    from ..bench.slo import parse_slo as bench_slo
    from ..bench.target import TargetError, parse_header, parse_target
    from ..bench.tls import client_context
    from ..bench.units import parse_duration, parse_rate, unescape
    from ..bench.workers import default_workers
    from ..llm.accounting import parse_slo as llm_slo

    protocol = protocol_of(args.target)
    refuse_flags(args, protocol)
    llm = protocol == "openai"
    trace = llm and args.workload == "trace"
    if llm and args.concurrency is not None:
        raise UsageError("--concurrency (closed loop) is gone: the engine is open-loop for "
                         "every protocol; to bound the requests in flight use --rate with "
                         "--max-connections C (requests beyond C queue, their latency still "
                         "counted from their intended start)")
    if args.rate is None and not trace:
        raise UsageError("--rate is required" + (" (or --workload trace)" if llm else ""))
    requests = getattr(args, "requests", None)
    if args.duration is None and requests is None and not trace:
        raise UsageError("give --duration D and/or --requests N")
    if requests is not None and requests < 1:
        raise UsageError("--requests must be >= 1")
    try:
        rate = parse_rate(args.rate) if args.rate is not None else None
        duration = parse_duration(args.duration) if args.duration is not None else None
        warmup = parse_duration(args.warmup or "0s")
        timeout = parse_duration(args.timeout or ("60s" if llm else "2s"))
        limits = parse_limits(args)
        max_event = parse_size(getattr(args, "max_event_bytes", None) or "16MiB")
        hdr_interval = parse_duration(args.hdr_interval)
        slos = [(llm_slo if llm else bench_slo)(e) for e in args.slo]  # ttft_…: LLM only
        confidence = tuple(t for text in getattr(args, "confidence", None) or []
                           for t in parse_targets(text))
        headers = [parse_header(h) for h in args.header]
        if args.body is not None and args.body_file:
            raise UsageError("give --body or --body-file, not both")
        body = args.body.encode() if args.body is not None else b""
        if args.body_file:
            from ..host import TooLarge, read_regular
            from ..model import SourceError

            try:  # a regular file under the body cap: a FIFO or /dev/zero never ends
                body = read_regular(os.path.realpath(args.body_file), MAX_BODY_FILE,
                                    what=args.body_file)
            except (TooLarge, SourceError) as exc:
                raise UsageError(f"--body-file: {exc}") from None
        tls = tls_options(args)
        target = parse_target(
            args.target, method=args.method, headers=headers, body=body,
            payload=unescape(args.payload) if args.payload is not None else None,
            delimiter=unescape(args.delimiter) if args.delimiter is not None else None,
            response_length=args.response_length, api=getattr(args, "api", "completions"),
            tls=tls)
        if target.tls is not None:
            client_context(target.tls)  # unreadable certificate files: a usage error now
    except (ValueError, SloError, TargetError) as exc:
        raise UsageError(str(exc)) from None
    if (duration is not None and duration <= 0) or timeout <= 0 or warmup < 0 \
            or hdr_interval <= 0:
        raise UsageError("--duration, --timeout and --hdr-interval must be > 0, --warmup >= 0")
    if rate is not None and rate <= 0:
        raise UsageError("--rate must be > 0")
    from ..bench.fastpath import EngineUnavailable, choose

    engine = getattr(args, "engine", "auto")
    try:
        choose(engine, target.scheme)
    except EngineUnavailable as exc:
        raise UsageError(str(exc)) from None
    workers = args.workers if args.workers is not None else default_workers()
    if workers < 1 or args.connections < 0 or args.max_connections < 1:
        raise UsageError("--workers and --max-connections must be >= 1, --connections >= 0")
    if args.max_connections < workers:
        raise UsageError(f"--max-connections {args.max_connections} is fewer than --workers "
                         f"{workers} (each worker needs one)")
    # The schedule and a done-flag per request are held in memory (~9 bytes each).
    if rate is not None and duration is not None and rate * (duration + warmup) > 100_000_000:
        raise UsageError("more than 100 million requests in one run: shorten it")
    if requests is not None and requests > 100_000_000:
        raise UsageError("more than 100 million requests in one run: fewer --requests")
    info = RunInfo(target=args.target, protocol=target.scheme, rate=rate or 0.0,
                   duration_s=duration if duration is not None else 0.0,
                   arrival="trace" if trace and rate is None else args.arrival,
                   warmup_s=warmup, workers=workers,
                   connections=args.connections, max_connections=args.max_connections,
                   timeout_s=timeout, seed=args.seed, min_tail_samples=args.min_tail_samples,
                   hdr_interval_s=hdr_interval if args.hdr else None, limits=limits,
                   retry_stale=args.retry_stale, requests=requests,
                   confidence=confidence, engine=engine)
    schedule = None
    extra: dict[str, Any] = {}
    if llm:
        from ..llm.command import llm_requests

        info, schedule, extra = llm_requests(args, info, target, slos, max_event)
    elif requests is not None:
        from ..bench.workers import global_schedule

        total = duration + warmup if duration is not None else None
        schedule = global_schedule(rate, total, args.arrival, requests, args.seed)  # type: ignore[arg-type]
        info = _span(info, schedule)
    # At most ~600 intervals in the --hdr log, whatever the duration; without --hdr,
    # 20..100 for the stationarity test (0.25 s ones up to 25 s: a --confidence run
    # may stop early).
    span = info.duration_s
    info = replace(info, hdr_interval_s=max(hdr_interval, (span + 1e-9) / 600) if args.hdr
                   else max(span / 100, min(span / 20, 0.25), 1e-6))
    return info, target, slos, schedule, extra


def _span(info: Any, schedule: Any) -> Any:
    """With --requests and no --duration the measured span is the schedule's."""
    if info.duration_s or not len(schedule):
        return info
    last = float(schedule[-1]) - info.warmup_s
    gap = 1.0 / info.rate if info.rate else 0.0
    return replace(info, duration_s=max(last + gap, 1e-9))


def run(args: argparse.Namespace) -> int:
    import os
    import time

    from ..bench.result import build_result, merge_logs, owed_by_worker, summary_text, write_hdr
    from ..bench.slo import evaluate
    from ..bench.workers import WorkerFailure, plan, run_workers
    from .bench_fleet import run_fleet, wanted

    if wanted(args):  # --ray / --scenario: many generators, one report
        return run_fleet(args)
    if args.target is None:
        raise UsageError("give TARGET (or --scenario FILE)")
    if getattr(args, "sweep", None):
        return _sweep(args)
    info, target, slos, schedule, extra = _parse(args)
    check_writable(args.json, args.hdr, args.log, args.html)
    parts = [f"{args.log}.part{k}" for k in range(info.workers)] if args.log else None
    cfgs = plan(info, target, parts, schedule=schedule, **extra)

    from rich.console import Console

    console = Console(stderr=True)
    live = None
    progress = None
    started: dict[str, float] = {}

    watch = None
    if info.confidence:
        from ..bench.confidence import ConfidenceWatch

        watch = ConfidenceWatch(list(info.confidence), info.spec, info.warmup_s, info.workers)

    def on_progress(worker: int, msg: dict[str, Any]) -> None:
        if progress is not None:
            progress.update(worker, msg)
        if watch is not None:
            watch.update(worker, msg)

    def on_start(start: float) -> None:
        nonlocal live
        started["mono"] = start
        if watch is not None:
            watch.start = start
        started["epoch"] = time.time() + (start - time.monotonic())
        if progress is not None:
            from rich.live import Live

            progress.start = start
            live = Live(get_renderable=progress.render, console=console,
                        refresh_per_second=4, transient=True)
            live.start()

    if not args.quiet and console.is_terminal:
        from ..bench.progress import Progress

        progress = Progress(info.rate, info.duration_s, info.warmup_s, info.spec)
    try:
        results, interrupted, missing = run_workers(
            cfgs, on_progress=on_progress if progress or watch else None, on_start=on_start,
            ready_timeout_s=info.timeout_s + 30.0,
            end_when=watch.reached if watch is not None else None)
    except WorkerFailure as exc:
        raise UsageError(str(exc)) from None
    finally:
        if live is not None:
            live.stop()
    if not results:
        print("tailgate bench: no worker returned a result", file=sys.stderr)
        return 130 if interrupted else 2

    result = build_result(info, results, interrupted, missing,
                          confidence_after_s=watch.after_s if watch is not None else None,
                          owed=owed_by_worker(cfgs))
    if args.percentiles:
        add_percentiles(result, args.percentiles)
    result.json["slo"] = evaluate(slos, result.json)
    # CLOCK_MONOTONIC of the log's time 0: `tailgate diagnose` lines requests up with probes.
    result.json["clock"] = {"start_monotonic_s": started.get("mono"),
                            "start_epoch_s": started.get("epoch")}
    out_json = _dumps(result.json)
    if args.json:
        write_output(args.json, out_json)
    if args.html:
        from ..report.bench_html import bench_page

        write_output(args.html, bench_page(result.json))
    if args.hdr:
        with open(args.hdr, "w", encoding="ascii") as f:
            write_hdr(f, result, started.get("epoch", time.time()))
    if parts:
        with open(args.log, "w", encoding="ascii") as f:
            merge_logs(f, parts, llm=info.llm is not None)
        for path in parts:
            if os.path.exists(path):
                os.unlink(path)
    stream = sys.stderr if args.json == "-" else sys.stdout
    print(summary_text(result, spectrum=args.spectrum,
                       columns=[n for n, _ in args.percentiles or ()] or None), file=stream)
    failed = [s["expr"] for s in result.json["slo"] if not s["pass"]]
    if failed:
        print("SLO failed: " + ", ".join(failed), file=stream)
    conf = result.json.get("confidence")
    if conf is not None and not conf["reached"]:
        # like an SLO nobody could measure: the figures are not as precise as asked
        print("confidence not reached: " + ", ".join(
            t["expr"] for t in conf["targets"] if not t["reached"]), file=stream)
    nothing = no_success(result.json)
    if nothing:
        print(f"tailgate bench: {nothing}", file=sys.stderr)
    if result.json["interrupted"] and interrupted:
        return 130
    return 0 if result.exit_ok and not nothing else 1


def percentile_name(p: float) -> str:
    """The JSON key of percentile ``p``: 50 -> p50, 99.9 -> p999, 99.5 -> p995, 5 -> p05
    (the digits with the point dropped, as bench's own p999 and p9999)."""
    text = f"{p:.10g}"
    return "p" + ("0" if p < 10 else "") + text.replace(".", "")


def parse_percentiles(text: str) -> list[tuple[str, float]]:
    """``50,90,95,99,99.9`` -> ``[("p50", 50.0), ...]``, in the order given, once each."""
    import argparse as _argparse
    import math

    out: dict[str, float] = {}
    for part in text.split(","):
        try:
            p = float(part.strip())
        except ValueError:
            raise _argparse.ArgumentTypeError(f"{part.strip()!r} is not a number "
                                              "(e.g. 50,90,95,99,99.9)") from None
        if not math.isfinite(p) or not 1 <= p < 100 or len(f"{p:.10g}".replace(".", "")) > 6:
            raise _argparse.ArgumentTypeError(f"{part.strip()}: a percentile is 1 to 99.9999")
        out.setdefault(percentile_name(p), p)
    return list(out.items())


def add_percentiles(result, chosen: list[tuple[str, float]]) -> None:
    """Put the chosen percentiles bench does not write by default into the JSON blocks,
    each with its confidence interval, from the merged histograms (nothing re-run)."""
    from ..bench.confidence import quantile_ci
    from ..bench.result import CI_LEVEL, NS_PER_MS

    hists = {"latency_ms": result.latency, "service_time_ms": result.service,
             "lateness_ms": result.lateness}
    if result.tokens is not None:
        hists.update({f"{k}_ms": h for k, h in result.tokens.hists.items()
                      if f"{k}_ms" in result.json})
    for key, h in hists.items():
        block = result.json[key]
        for name, p in chosen:
            if name in block:
                continue
            block[name] = round(min(h.value_at_percentile(p), h.max) / NS_PER_MS, 6) \
                if h.total else None
            ci = quantile_ci(h, p, CI_LEVEL)
            block.setdefault("ci", {})[name] = (
                {"lo": round(ci.lo / NS_PER_MS, 6), "hi": round(ci.hi / NS_PER_MS, 6),
                 "measurable": True} if ci.measurable else
                {"lo": None, "hi": None, "measurable": False, "reason": ci.reason})


def no_success(data: dict[str, Any]) -> str | None:
    """Why a run in which no request succeeded fails, SLO or not; None when one did."""
    req = data.get("requests") or {}
    if req.get("ok"):
        return None
    errors = {k: v for k, v in (req.get("errors") or {}).items() if v}
    examples = req.get("error_examples") or {}
    first = next((ex[0].get("reason") for k in errors for ex in [examples.get(k) or []] if ex), None)
    detail = ", ".join(f"{n:,} {k}" for k, n in sorted(errors.items(), key=lambda kv: -kv[1]))
    return (f"no request succeeded ({req.get('sent', 0):,} sent"
            + (f": {detail}" if detail else "") + (f"; e.g. {first}" if first else "") + ")")


def _dumps(data: dict[str, Any]) -> str:
    import json

    return json.dumps(data, indent=2) + "\n"


def _sweep(args: argparse.Namespace) -> int:
    from ..bench.units import parse_rate
    from ..plan.sweep import SweepError, run_sweep

    check_writable(args.json, args.sweep_html)
    if args.rate is None:
        args.rate = "1"  # checked per run; the sweep sets it
    try:
        return run_sweep(args, run, parse_rate, write_output)
    except SweepError as exc:
        raise UsageError(str(exc)) from None
