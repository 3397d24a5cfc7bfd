"""`tailgate serve`: a Prometheus exporter of the findings and the resident probes' histograms,
on loopback by default (or `--textfile DIR` for node_exporter's textfile collector)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from ..errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="Prometheus exporter: findings, red lines and resident probe histograms",
        description="Inspect this host every --interval seconds in the background and expose "
        "the findings, the red lines and the resident probes' histograms as Prometheus "
        "metrics. A scrape is answered from memory, never by collecting inside it.")
    p.add_argument("--listen", default="127.0.0.1:9860", metavar="ADDR:PORT",
                   help="address to serve /metrics on (default 127.0.0.1:9860: loopback only; "
                   "a wider address needs --web.config.file with TLS and authentication, "
                   "or --insecure-listen)")
    p.add_argument("--web.config.file", dest="web_config", metavar="FILE",
                   help="TLS, basic auth and response headers in the Prometheus "
                   "exporter-toolkit format (the file node_exporter reads; docs/serve.md)")
    p.add_argument("--insecure-listen", action="store_true",
                   help="serve a non-loopback address without TLS or without authentication "
                   "(anyone who reaches the port reads the host's findings; a warning says so)")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="read a host root mounted here instead of / (a container with the "
                   "host at /host: --root /host); eBPF probes still see the whole running "
                   "kernel")
    p.add_argument("--interval", type=float, default=15.0, metavar="SECONDS",
                   help="seconds between the two counter samples of each inspection; a new "
                   "inspection starts when one ends (default 15)")
    p.add_argument("--probe", default="runqlat", metavar="NAMES",
                   help="resident eBPF probes, comma-separated ('runqlat', or '' for none; "
                   "root and bpftrace; default runqlat)")
    p.add_argument("--probe-window", type=float, default=30.0, metavar="SECONDS",
                   help="length of each resident probe window; windows run back to back "
                   "(default 30)")
    p.add_argument("--pid", action="append", default=[], metavar="PID",
                   help="a latency-critical process (repeatable)")
    p.add_argument("--cgroup", metavar="PATH", help="the service's cgroup")
    p.add_argument("--iface", action="append", default=[], metavar="IFACE",
                   help="the service's network interface (repeatable; default: all non-loopback)")
    p.add_argument("--engine", metavar="URL", help="an inference engine's /metrics endpoint")
    p.add_argument("--baseline", metavar="FILE", help="YAML file overriding red lines per id")
    p.add_argument("--textfile", metavar="DIR",
                   help="also write DIR/tailgate.prom after every inspection (atomic rename), "
                   "for node_exporter's textfile collector")
    p.add_argument("--no-listen", action="store_true",
                   help="serve no port (with --textfile: no new port on the host)")
    p.add_argument("--once", action="store_true",
                   help="one inspection (and one probe window), write --textfile, exit")
    p.set_defaults(func=run, memory_stats=None)


def run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app

    from ..baseline import BaselineError, default_baseline, load_baseline
    from ..exporter import RESIDENT_PROBES, Exporter, write_textfile
    from ..fleet.web import listen_address, serving_config
    from ..host import Host
    from ..service import scope_of
    from .inspect import scope_options

    probes = tuple(p for p in (x.strip() for x in args.probe.split(",")) if p)
    for p in probes:
        if p not in RESIDENT_PROBES:
            raise UsageError(f"--probe {p}: not a resident probe (one of: "
                             f"{', '.join(RESIDENT_PROBES)})")
    if not 0 < args.interval <= 3600:
        raise UsageError("--interval must be between 0 and 3600 seconds")
    if not 0 < args.probe_window <= 3600:
        raise UsageError("--probe-window must be between 0 and 3600 seconds")
    if args.textfile and not os.path.isdir(args.textfile):
        raise UsageError(f"--textfile {args.textfile}: not a directory")
    if args.no_listen and not args.textfile:
        raise UsageError("--no-listen needs --textfile (else the metrics go nowhere)")
    addr = None if args.no_listen or args.once else listen_address(args.listen)
    if not os.path.isdir(args.root):
        raise UsageError(f"--root {args.root}: not a directory")
    web, missing = serving_config(args.web_config, addr, args.listen, args.insecure_listen)
    if missing:
        print(f"tailgate serve: WARNING: {args.listen} is served without "
              f"{' and '.join(missing)}: anyone who reaches it reads this host's findings",
              file=sys.stderr, flush=True)
    try:
        baseline = load_baseline(args.baseline) if args.baseline else default_baseline()
    except BaselineError as exc:
        raise UsageError(str(exc)) from exc
    host = Host(args.root)
    # The resident probes stand in for inspect's probe window: the collection itself runs none.
    scope = scope_of(host, **{**scope_options(args), "probe_window": None})
    exporter = Exporter(host, scope, baseline, args.interval, probes, args.probe_window)
    registry = CollectorRegistry()
    registry.register(exporter)

    if args.once:
        from .options import status

        with status(args, "serve --once") as say:
            for name in probes:
                say(f"running the {name} probe for {args.probe_window:g} s")
                exporter.probe_once(name)
            say(f"inspecting (two samples {args.interval:g} s apart)")
            exporter.inspect_once()
        text = generate_latest(registry).decode()
        if args.textfile:
            print(write_textfile(args.textfile, text))
        else:
            print(text, end="")
        return 0

    if addr is not None:
        from ..fleet.web import start_server

        try:
            start_server(addr, make_wsgi_app(registry), web)
        except OSError as exc:
            raise UsageError(f"--listen {args.listen}: {exc.strerror or exc}") from exc
        scheme = "https" if web.tls else "http"
        print(f"tailgate serve: metrics on {scheme}://{args.listen}/metrics"
              + (f" (basic auth: {len(web.users)} user(s))" if web.users else "")
              + (" (client certificates required)" if web.client_certificates else ""),
              flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    exporter.start()
    last = -1
    while not stop.wait(0.5):
        if args.textfile and exporter.cycles != last:
            last = exporter.cycles
            write_textfile(args.textfile, generate_latest(registry).decode())
    exporter.stop.set()
    return 0
