"""`tailgate bench TARGET`: open-loop load with coordinated-omission-correct tail latency.

Exit status: 0 every SLO held, 1 an SLO failed or a ``--confidence`` target was not
reached within ``--duration`` (named on the terminal and in the JSON), 2 bad usage,
130 interrupted (results for the completed requests are
still written, marked ``"interrupted": true``).
"""

from __future__ import annotations

import argparse
import sys

from ..bench.spec import spec_of
from ..bench.units import parse_percentiles
from ..errors import UsageError
from ..outputs import check_writable
from ..slo import no_success


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
        "  tailgate bench udp://10.46.0.2:9000 --rate max --duration 10s --batch 32 "
        "--size 64\n"
        "  mpirun -np 4 tailgate bench allreduce --backend mpi --sizes 8B..1MB  "
        "(collectives: tailgate bench allreduce --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="http(s)://host:port/path, "
                   "tcp://host:port, grpc(s)://host:port/package.Service/Method (unary), "
                   "an OpenAI-compatible LLM server: openai+http://host:port/v1, or a UDP echo "
                   "server: udp://host:port")
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
    g = p.add_argument_group("UDP datagrams (udp:// targets: an echo server; --rate max: as "
                             "fast as the path takes)")
    g.add_argument("--size", metavar="SIZE", help="bytes of each datagram's payload, 16 to "
                   "65507 (default 64)")
    g.add_argument("--batch", type=int, metavar="N", help="datagrams a syscall at most: 1 "
                   "sends with send/recv, more with sendmmsg/recvmmsg or one io_uring_enter; "
                   "never waits to fill a batch (default 32)")
    g.add_argument("--io", choices=("syscalls", "io_uring"), help="how datagrams reach the "
                   "kernel: syscalls (default) or io_uring (a multishot receive into "
                   "registered buffers)")
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
    from ..bench.openai_requests import add_llm_arguments

    add_llm_arguments(p)  # streamed LLM load: --model, --api, --workload, ... (tailgate.llm)


def add_load_options(p: argparse.ArgumentParser, hdr_log: bool = True) -> None:
    """The schedule, connection, SLO and output options (shared with other bench kinds).
    ``hdr_log=False``: a command that writes no HdrHistogram log (diagnose) still parses
    --hdr and --hdr-interval, to refuse them with the reason, but does not offer them."""
    g = p.add_argument_group("load")
    # Required for http/tcp (checked in _parse); an openai+ target may use --concurrency
    # or --requests instead.
    g.add_argument("--rate", help="requests per second, all workers together "
                   "(e.g. 1000, 20k); LO..HI (e.g. 1k..10k) ramps linearly from LO to HI over "
                   "--duration (the warm-up at LO); udp:// also takes max (as fast as the "
                   "path takes)")
    g.add_argument("--duration", help="measured run time (e.g. 30s, 2m)")
    g.add_argument("--arrival", choices=("constant", "poisson", "gamma"), default="constant",
                   help="inter-arrival times: constant (default), exponential (Poisson) or "
                   "gamma (shape --burstiness)")
    g.add_argument("--burstiness", type=float, default=None, metavar="B",
                   help="--arrival gamma: the gaps' shape, mean 1/rate (as vllm bench serve "
                   "--burstiness): 1 is Poisson, below 1 burstier, above 1 more regular "
                   "(default 1)")
    g.add_argument("--warmup", default="0s", help="run this long first, not measured")
    g.add_argument("--coalesce", default="0s", metavar="D",
                   help="let a due request wait up to D (e.g. 50us) so that one timed wake-up "
                   "sends every request due within it: less CPU a request at high rates, "
                   "each wait counted in its lateness and latency (the compiled engine; "
                   "default 0: every request is woken for)")
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
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the Poisson and gamma schedules (default 0)")
    g.add_argument("--engine", choices=("auto", "fast", "python"), default="auto",
                   help="load engine: fast (the compiled hot path: http(s), tcp, openai+http(s)), "
                   "python (the reference engine) or auto (fast where it applies; default)")
    g = p.add_argument_group("results")
    g.add_argument("--slo", action="append", default=[], metavar="EXPR",
                   help="objective, e.g. 'p999<5ms', 'p99<20ms', 'error_rate<0.1%%', "
                   "'service.p99<1ms', 'rate>=9900' (repeatable; exit 1 if one fails)")
    g.add_argument("--json", metavar="FILE", help="write the result JSON to FILE ('-': stdout)")
    g.add_argument("--html", metavar="FILE",
                   help="write a self-contained HTML page: figures and percentile spectra")
    g.add_argument("--hdr", metavar="FILE",
                   help="write the latency histogram as an HdrHistogram log (HISTFAAA...)"
                   if hdr_log else argparse.SUPPRESS)
    g.add_argument("--hdr-interval", default="1s",
                   help="interval of the --hdr log's histograms (default 1s)"
                   if hdr_log else argparse.SUPPRESS)
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


def run(args: argparse.Namespace) -> int:
    from ..bench.fleet import wanted
    from ..bench.runner import Hooks
    from ..bench.runner import run as run_spec
    from ..report.bench_outputs import save
    from ..report.bench_text import summary_text
    from .bench_fleet import run_fleet

    if wanted(args):  # --ray / --scenario: many generators, one report
        return run_fleet(args)
    if args.target is None:
        raise UsageError("give TARGET (or --scenario FILE)")
    if getattr(args, "sweep", None):
        return _sweep(args)
    spec = spec_of(args)
    check_writable(args.json, args.hdr, args.log, args.html)

    from rich.console import Console

    console = Console(stderr=True)
    live = None
    progress = None
    if not args.quiet and console.is_terminal:
        from ..bench.progress import Progress

        info = spec.info
        progress = Progress(info.rate, info.duration_s, info.warmup_s, info.spec)

    def on_start(start: float) -> None:
        nonlocal live
        if progress is not None:
            from rich.live import Live

            progress.start = start
            live = Live(get_renderable=progress.render, console=console,
                        refresh_per_second=4, transient=True)
            live.start()

    hooks = Hooks(on_progress=progress.update if progress is not None else None,
                  on_start=on_start)
    try:
        result = run_spec(spec, hooks)
    finally:
        if live is not None:
            live.stop()
    save(result, args.json, args.html, args.hdr)
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
    if result.json["interrupted"] and result.stopped:
        return 130
    return 0 if result.passed else 1


def _sweep(args: argparse.Namespace) -> int:
    from ..bench.options import BenchOptions
    from ..plan.sweep import Point, SweepError, SweepSpec, run_sweep
    from ..report.sweep_render import progress_line, save, text

    check_writable(args.json, args.sweep_html)

    def on_point(rate: float, p: Point) -> None:
        if not getattr(args, "quiet", False):
            print(progress_line(rate, p), file=sys.stderr, flush=True)

    try:
        spec = SweepSpec.of(args.sweep, BenchOptions.from_namespace(args),
                            steps=args.sweep_steps, bisect=args.sweep_bisect)
        sweep = run_sweep(spec, on_point)
    except SweepError as exc:
        raise UsageError(str(exc)) from None
    save(sweep, args.json, args.sweep_html)
    if args.json != "-":
        print(text(sweep))
    return 0 if sweep.passed else 1
