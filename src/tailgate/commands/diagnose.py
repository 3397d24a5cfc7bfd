"""`tailgate diagnose`: drive load (or watch passively) while taking kernel evidence over the
same window, then say which layer explains the slow requests."""

from __future__ import annotations

import argparse
import json

from ..outputs import check_writable, write_output
from .options import status


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
    e = p.add_argument_group("the engine's own records (openai+http:// targets)")
    e.add_argument("--otlp-listen", metavar="HOST:PORT",
                   help="receive the engine's request spans over OTLP/HTTP (vLLM's, SGLang's: "
                   "--otlp-traces-endpoint http://HOST:PORT/v1/traces) for the run, and join "
                   "them to the requests by the X-Request-Id and traceparent each is sent "
                   "with (HOST defaults to 127.0.0.1; port 0: any free one)")
    e.add_argument("--otlp-wait", default="6s", metavar="DURATION",
                   help="after the load, wait up to this for the last spans (an exporter "
                   "sends in batches: vLLM's every 5 s; default 6s)")
    g.add_argument("--all", action="store_true", dest="all_causes",
                   help="print every cause's sentence (by default the unclaimed ones are one "
                   "table)")
    add_load_options(p, hdr_log=False)
    add_request_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench.spec import BenchOptions
    from ..diagnose.runner import run as diagnose
    from ..diagnose.spec import DiagnoseOptions, build

    spec = build(DiagnoseOptions.from_namespace(args), BenchOptions.from_namespace(args))
    check_writable(args.json, args.html)
    with status(args, "diagnose") as say:
        doc = diagnose(spec, say)
    if args.json:
        write_output(args.json, json.dumps(doc, indent=1) + "\n")
    if args.html:
        from ..report.diagnose_html import diagnose_page

        write_output(args.html, diagnose_page(doc))
    if args.json != "-":
        from rich.console import Console

        from ..report.diagnose_render import terminal

        terminal(doc, Console(), all_causes=args.all_causes)
    return 1 if doc["verdict"]["claimed"] else 0
