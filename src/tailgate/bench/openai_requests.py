"""``tailgate bench openai+http://HOST:PORT/v1 ...``: what only an LLM target adds.

``commands/bench.py`` owns the parser and the run (one engine for every
protocol); :func:`add_llm_arguments` adds the options only an LLM target has
(skipping any the bench parser already defines), and :func:`llm_requests` turns
them into the schedule and each request's bytes (the workload's prompts, from
:mod:`tailgate.llm.workload`). Bench's own (it was llm/command.py, which made llm/
import bench/ back).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .options import BenchOptions

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
    add("--arrival", choices=("constant", "poisson", "gamma"), default="constant",
        help="arrival process of the open-loop schedule (default constant)")
    add("--burstiness", type=float, default=None, metavar="B",
        help="--arrival gamma: the gaps' shape (1 is Poisson; default 1)")
    add("--concurrency", type=int, metavar="C",
        help="closed loop: refused (the engine is open-loop; bound the requests in flight "
        "with --max-connections)")
    add("--duration", help="how long to send (e.g. 30s, 2m)")
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
    add("--continuous-usage", action="store_true",
        help="ask for usage in every chunk (vLLM's stream_options.continuous_usage_stats): "
        "each chunk's tokens are then known, so ITL per token is exact when a chunk carries "
        "several (speculative decoding)")
    add("--engine-timings", choices=("final", "per-token"), default="final",
        help="per-token: ask llama-server for its timings in every chunk "
        "(\"timings_per_token\": true), so that each token's engine time is kept beside its "
        "read: diagnose then bounds the clock join by every token and splits the longest "
        "gap into the engine's time and delivery. Off by default (final: the last chunk's "
        "timings only; other servers may refuse a field they do not know)")
    add("--ignore-eos", action="store_true",
        help="send ignore_eos (vLLM/SGLang): generate exactly --output-len tokens")
    add("--slo", action="append", default=[], metavar="EXPR",
        help="e.g. 'ttft_p999<2s', 'itl_p99<50ms', 'tpot_p50<20ms', 'e2e_max<30s', "
        "'error_rate<1%%', 'goodput_rps>=5' (repeatable; exit 1 when one fails)")
    g.description = ("LLM SLOs: ttft_/itl_/tpot_/e2e_ + p50|p90|p95|p99|p999|p9999|max, "
                     "error_rate, goodput_rps, output_tokens_per_s (e.g. 'ttft_p999<2s')")
    add("--json", metavar="FILE|-", help="write the JSON results ('-' for stdout)")
    add("--log", metavar="FILE", help="write one JSON record per request (JSON lines)")


def with_request_ids(requests: Sequence[bytes], ids: Sequence[str],
                     traces: Sequence[str] | None = None) -> list[bytes]:
    """Each request's bytes with an ``X-Request-Id`` header (after the request line): the id
    an engine names the request by in its own records (vLLM's spans' ``gen_ai.request.id``),
    ``ids[i]`` for request ``i``; and, where ``traces`` is given, a ``traceparent`` header,
    ``traces[i]``, whose trace the engine's spans of the request continue."""
    if len(ids) != len(requests) or (traces is not None and len(traces) != len(requests)):
        raise ValueError(f"{len(ids)} ids for {len(requests)} requests")
    out = []
    for i, (req, rid) in enumerate(zip(requests, ids, strict=True)):
        line, rest = req.split(b"\r\n", 1)
        head = line + b"\r\nX-Request-Id: " + rid.encode("ascii")
        if traces is not None:
            head += b"\r\ntraceparent: " + traces[i].encode("ascii")
        out.append(head + b"\r\n" + rest)
    return out


def _max_tokens(args: BenchOptions) -> int:
    """--max-tokens-per-stream (a usage error below 1)."""
    from .openai_sse import MAX_TOKENS_PER_STREAM

    n = getattr(args, "max_tokens_per_stream", None)
    if n is None:
        return MAX_TOKENS_PER_STREAM
    if n < 1:
        raise _usage(f"--max-tokens-per-stream must be >= 1, not {n}")
    return int(n)


def _usage(msg: str) -> Exception:
    from ..errors import UsageError

    return UsageError(msg)


def workload(args: BenchOptions) -> tuple[Iterator[Any], dict[str, Any]]:
    """The workload the options ask for, and its description for the JSON."""
    from ..llm import workload as wl

    chat = args.api == "chat"
    if args.input_len < 1 or args.output_len < 1:
        raise _usage("--input-len and --output-len must be >= 1")
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
    return work, wdesc


def llm_requests(args: BenchOptions, info: Any, target: Any, slos: list[Any],
                 max_event: int) -> tuple[Any, np.ndarray, dict[str, Any]]:
    """An openai+ run's schedule and its requests' bytes, in intended order.

    Returns the run description (with the LLM block and, when only --requests bounds
    the run, the schedule's span as its duration), the global schedule, and the
    engine's LLM fields (see :func:`tailgate.bench.workers.plan`).
    """
    from ..llm.accounting import good_slos
    from ..llm.openai import request_body
    from .workers import global_schedule

    if not args.model:
        raise _usage("--model is required for an openai+ target")
    if args.no_usage and args.continuous_usage:
        raise _usage("--continuous-usage asks for usage in every chunk: not with --no-usage")
    work, wdesc = workload(args)
    total = info.duration_s + info.warmup_s if args.duration is not None else None
    if info.rate and total is None and info.requests is None:
        raise _usage("give --duration D and/or --requests N")
    if info.rate:  # open loop at --rate (the trace, if any, gives only its prompts)
        schedule = global_schedule(info.rate, total, info.arrival, info.requests, info.seed,
                                   burstiness=info.burstiness, ramp=info.ramp)
        pairs = list(itertools.islice(work, int(schedule.size)))
        schedule = schedule[:len(pairs)]  # a finite workload (a trace) may run out first
    else:  # a trace at its own offsets
        pairs, offs = [], []
        for req in work:
            off = req.offset_s or 0.0
            if (total is not None and off >= total) or (
                    info.requests is not None and len(pairs) >= info.requests):
                break
            pairs.append(req)
            offs.append(off)
        order = np.argsort(np.asarray(offs, dtype=np.float64), kind="stable")
        schedule = np.asarray(offs, dtype=np.float64)[order]
        pairs = [pairs[i] for i in order.tolist()]
    if not pairs:
        raise _usage("the workload has no request to send in this run")
    bodies = [target.with_body(request_body(args.api, args.model, r.prompt, r.max_tokens,
                                            usage=not args.no_usage,
                                            continuous_usage=args.continuous_usage,
                                            timings_per_token=(
                                                args.engine_timings == "per-token"),
                                            ignore_eos=args.ignore_eos)) for r in pairs]
    nominal = np.asarray([r.input_words for r in pairs], dtype=np.int64)
    info = replace(info, llm={"model": args.model, "api": args.api, "workload": wdesc,
                              "mode": "open", "engine_timings": args.engine_timings})
    if not info.duration_s:
        last = float(schedule[-1]) - info.warmup_s
        gap = 1.0 / info.rate if info.rate else 0.0
        info = replace(info, duration_s=max(last + gap, 1e-9))
    if not info.rate:
        info = replace(info, rate=round(schedule.size / max(float(schedule[-1]), 1e-9), 6))
    return info, schedule, {"requests": bodies, "nominal": nominal, "max_event_bytes": max_event,
                            "require_done": not args.allow_no_done,
                            "max_tokens_per_stream": _max_tokens(args),
                            "good_slos": good_slos(slos)}
