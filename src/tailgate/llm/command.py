"""``tailgate bench openai+http://HOST:PORT/v1 ...``: the LLM side of the bench command.

``commands/bench.py`` owns the parser; :func:`add_llm_arguments` adds the
options only an LLM target has (skipping any the bench parser already
defines, such as ``--rate``, ``--duration``, ``--timeout``, ``--slo``,
``--json``, ``--log``), and its ``run`` hands an ``openai+`` target to
:func:`run_llm`. Exit status: 0, 1 when an SLO fails, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

WORKLOADS = ("fixed", "random", "multiturn", "trace")


def add_llm_arguments(p: argparse.ArgumentParser) -> None:
    have = set(p._option_string_actions)  # noqa: SLF001 - to share options with the bench parser
    g = p.add_argument_group("LLM targets (openai+http://HOST:PORT/v1)")

    def add(flag: str, **kw: Any) -> None:
        if flag not in have:
            g.add_argument(flag, **kw)

    add("--model", help="model name sent in each request (LLM targets: required)")
    add("--api", choices=("completions", "chat"), default="completions",
        help="/v1/completions or /v1/chat/completions (default completions)")
    add("--rate", help="open loop: requests per second (e.g. 5, 0.5)")
    add("--arrival", choices=("constant", "poisson"), default="constant",
        help="arrival process of the open-loop schedule (default constant)")
    add("--concurrency", type=int, metavar="C",
        help="closed loop instead: keep C requests in flight")
    add("--duration", help="how long to send (e.g. 30s, 2m)")
    add("--requests", type=int, metavar="N", help="how many requests to send")
    add("--timeout", default="60s", help="per request, from its intended start (default 60s)")
    add("--workload", choices=WORKLOADS, default="fixed",
        help="fixed or random lengths, multi-turn conversations with growing shared "
        "prefixes, or a Mooncake trace replay (default fixed)")
    add("--input-len", type=int, default=128, metavar="TOKENS",
        help="prompt length in words (~tokens); multiturn: per user turn (default 128)")
    add("--output-len", type=int, default=64, metavar="TOKENS",
        help="max_tokens of each request (default 64)")
    add("--range-ratio", type=float, default=0.5,
        help="random workload: lengths uniform within +-ratio of the means (default 0.5)")
    add("--conversations", type=int, default=8, help="multiturn: concurrent conversations")
    add("--turns", type=int, default=4, help="multiturn: turns per conversation")
    add("--system-len", type=int, default=256, metavar="TOKENS",
        help="multiturn: the shared system prompt's length (default 256)")
    add("--trace", metavar="FILE", help="trace workload: a Mooncake JSONL trace")
    add("--allow-no-done", action="store_true",
        help="accept a stream whose HTTP response ends properly after a finish_reason but "
        "without data: [DONE] (servers that omit it); by default that is 'truncated'")
    add("--trace-token-scale", type=float, default=1.0,
        help="trace: multiply every length (and the 512-token blocks) by this")
    add("--trace-time-scale", type=float, default=1.0,
        help="trace: replay this many times faster than recorded")
    add("--warmup", default=None, metavar="DURATION",
        help="requests due in this first part of the run are sent but left out of the "
        "figures (reported apart)")
    add("--seed", type=int, default=0, help="seed of the workload and the Poisson schedule")
    add("--no-usage", action="store_true",
        help="do not ask for usage (stream_options); tokens are then counted as chunks")
    add("--ignore-eos", action="store_true",
        help="send ignore_eos (vLLM/SGLang): generate exactly --output-len tokens")
    add("--slo", action="append", default=[], metavar="EXPR",
        help="e.g. 'ttft_p999<2s', 'itl_p99<50ms', 'tpot_p50<20ms', 'e2e_max<30s', "
        "'error_rate<1%%', 'goodput_rps>=5' (repeatable; exit 1 when one fails)")
    g.description = ("LLM SLOs: ttft_/itl_/tpot_/e2e_ + p50|p90|p99|p999|p9999|max, "
                     "error_rate, goodput_rps, output_tokens_per_s (e.g. 'ttft_p999<2s')")
    add("--json", metavar="FILE|-", help="write the JSON results ('-' for stdout)")
    add("--log", metavar="FILE", help="write one JSON record per request (JSON lines)")


def _seconds(value: Any, what: str) -> float | None:
    from ..bench.units import parse_duration

    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return parse_duration(str(value))
    except ValueError as exc:
        raise _usage(f"{what}: {exc}") from None


def _usage(msg: str) -> Exception:
    from ..errors import UsageError

    return UsageError(msg)


def _write(path: str, text: str) -> None:
    from ..commands.options import write_output

    write_output(path, text)


def run_llm(args: argparse.Namespace) -> int:
    from ..bench.units import parse_rate
    from ..commands.options import check_writable
    from . import workload as wl
    from .client import Endpoint
    from .results import analyse, format_report, parse_slo, records_json, slo_failed
    from .run import RunConfig, run

    try:
        ep = Endpoint.parse(args.target)
    except ValueError as exc:
        raise _usage(str(exc)) from None
    if not getattr(args, "model", None):
        raise _usage("--model is required for an openai+ target")
    check_writable(args.json, args.log, args.html)
    rate = args.rate
    if rate is not None and not isinstance(rate, (int, float)):
        try:
            rate = parse_rate(str(rate))
        except ValueError as exc:
            raise _usage(f"--rate: {exc}") from None
    duration = _seconds(getattr(args, "duration", None), "--duration")
    timeout = _seconds(getattr(args, "timeout", None), "--timeout") or 60.0  # LLM default
    warmup = _seconds(getattr(args, "warmup", None), "--warmup") or 0.0
    trace_mode = args.workload == "trace"
    conc = args.concurrency
    modes = sum(x is not None for x in (rate, conc)) + (1 if trace_mode and rate is None else 0)
    if trace_mode and conc:
        raise _usage("--workload trace replays the trace's own timing: no --concurrency")
    if modes != 1:
        raise _usage("give exactly one of --rate R or --concurrency C "
                     "(--workload trace needs neither)")
    if conc is not None and conc < 1:
        raise _usage("--concurrency must be >= 1")
    if duration is None and args.requests is None and not trace_mode:
        raise _usage("give --duration D and/or --requests N")
    if args.requests is not None and args.requests < 1:
        raise _usage("--requests must be >= 1")
    if timeout <= 0:
        raise _usage("--timeout must be > 0")
    from ..commands.bench import parse_limits, parse_size

    try:
        limits = parse_limits(args)
        max_event = parse_size(getattr(args, "max_event_bytes", None) or "16MiB")
    except ValueError as exc:
        raise _usage(str(exc)) from None
    try:
        slos = [parse_slo(s) for s in args.slo]
    except ValueError as exc:
        raise _usage(str(exc)) from None
    if getattr(args, "hdr", None):
        raise _usage("--hdr is for http/tcp targets; an openai+ run's histograms are in --json")
    if warmup > 0 and duration is not None:
        duration += warmup  # the warm-up runs first, then the measured --duration
    if args.input_len < 1 or args.output_len < 1:
        raise _usage("--input-len and --output-len must be >= 1")

    chat = args.api == "chat"
    wdesc: dict[str, Any] = {"kind": args.workload, "seed": args.seed}
    if args.workload in ("fixed", "random"):
        ratio = args.range_ratio if args.workload == "random" else 0.0
        work = wl.independent(args.seed, args.input_len, args.output_len, ratio, chat=chat)
        wdesc.update(input_len=args.input_len, output_len=args.output_len, range_ratio=ratio)
    elif args.workload == "multiturn":
        if args.conversations < 1 or args.turns < 1:
            raise _usage("--conversations and --turns must be >= 1")
        work = wl.multiturn(args.seed, args.conversations, args.turns, args.system_len,
                            args.input_len, args.output_len, chat=chat)
        wdesc.update(conversations=args.conversations, turns=args.turns,
                     system_len=args.system_len, user_len=args.input_len,
                     output_len=args.output_len)
    else:
        if not args.trace:
            raise _usage("--workload trace needs --trace FILE (Mooncake JSONL)")
        try:
            entries = wl.parse_mooncake(Path(args.trace).read_text(encoding="utf-8"))
        except OSError as exc:
            raise _usage(f"--trace {args.trace}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise _usage(f"--trace {args.trace}: {exc}") from None
        if args.trace_token_scale <= 0 or args.trace_time_scale <= 0:
            raise _usage("--trace-token-scale and --trace-time-scale must be > 0")
        work = wl.trace(entries, args.seed, token_scale=args.trace_token_scale,
                        time_scale=args.trace_time_scale, chat=chat)
        wdesc.update(trace=args.trace, entries=len(entries),
                     token_scale=args.trace_token_scale, time_scale=args.trace_time_scale)

    cfg = RunConfig(endpoint=ep, api=args.api, model=args.model, timeout_s=timeout, rate=rate,
                    arrival=args.arrival, concurrency=conc, trace=trace_mode and rate is None,
                    duration_s=duration, requests=args.requests, seed=args.seed,
                    usage=not args.no_usage, ignore_eos=args.ignore_eos,
                    limits=limits, max_event_bytes=max_event,
                    require_done=not getattr(args, "allow_no_done", False))
    result = run(cfg, work)
    report = analyse(result, slos, target=args.target, model=args.model, api=args.api,
                     rate=rate, timeout_s=timeout, workload=wdesc, warmup_s=warmup)
    if args.log:
        _write(args.log, "".join(json.dumps(r) + "\n" for r in records_json(result)))
    if args.json:
        _write(args.json, json.dumps(report, indent=1) + "\n")
    if args.html:
        from ..report.bench_html import bench_page

        _write(args.html, bench_page(report))
    if args.json != "-":
        print(format_report(report))
    failed = slo_failed(report)
    if failed:
        print("SLO failed: " + ", ".join(failed), file=sys.stderr)
    if result.interrupted:
        return 130  # as the http/tcp bench: results written, marked interrupted
    return 1 if failed else 0
