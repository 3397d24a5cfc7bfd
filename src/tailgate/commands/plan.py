"""`tailgate plan kv | specdec | fanout | prefix-cache`: sizing answers before the hardware.

Each subcommand reads its input (a config.json, a trace, a histogram), hands it
to a pure module in ``tailgate.plan`` and prints the result as text, or as JSON
with ``--json FILE`` (``-`` for standard output). Exit status 0, or 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..cli import UsageError, check_writable, write_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="size KV cache, speculative decoding, fan-out tails and "
                       "prefix caches before deploying",
                       description="Planning calculators for layer 4 (see `tailgate plan SUB -h`).")
    plan_sub = p.add_subparsers(dest="plan_command", metavar="SUB", required=True)
    _register_kv(plan_sub)
    _register_specdec(plan_sub)
    _register_fanout(plan_sub)


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the result as JSON to FILE ('-': stdout)")


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> int:
    if args.json:
        write_output(args.json, json.dumps(data, indent=2) + "\n")
    if args.json != "-":
        print(text)
    return 0


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise UsageError(f"no such {what}: {path}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None


# -- kv ---------------------------------------------------------------------------------


def _register_kv(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "kv", help="KV-cache bytes per token and what fits in HBM, from a config.json",
        description="KV-cache bytes per token, per layer and in total, for MHA/GQA/MQA and "
        "DeepSeek MLA (latent + RoPE key), in bf16/fp8/int8/int4 with block scales; with "
        "--hbm, the tokens and sequences that fit after the weights (vLLM's paged blocks).",
        epilog="examples:\n  tailgate plan kv config.json --dtype fp8\n"
        "  tailgate plan kv deepseek-v3/config.json --dtype fp8 --scale-block 64 "
        "--hbm 141GB --weights 85GB --seq-len 32768",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", metavar="CONFIG", help="a Hugging Face config.json "
                   "(or the model directory holding one)")
    p.add_argument("--dtype", default="bf16", help="cache dtype: bf16, fp16, fp8, int8, int4 "
                   "(default bf16)")
    p.add_argument("--scale-block", type=int, default=None, metavar="N",
                   help="elements per quantization scale (default: per-tensor for GQA fp8, "
                   "64 for int8/int4 and for a quantized MLA latent)")
    p.add_argument("--scale-bytes", type=int, default=4, metavar="B",
                   help="bytes per scale (default 4, float32)")
    p.add_argument("--rope-dtype", default="bf16", help="MLA: precision of the RoPE key in a "
                   "quantized cache (default bf16)")
    p.add_argument("--hbm", metavar="SIZE", help="accelerator memory, e.g. 80GiB, 141GB")
    p.add_argument("--weights", metavar="SIZE", default="0",
                   help="memory taken by the weights on this device (e.g. 16GB)")
    p.add_argument("--reserve", metavar="SIZE", default="0",
                   help="activation peak and graphs to leave free (default 0)")
    p.add_argument("--utilization", type=float, default=0.9,
                   help="share of --hbm the engine may use (vLLM's gpu_memory_utilization, "
                   "default 0.9)")
    p.add_argument("--budget", metavar="SIZE", help="KV bytes directly (instead of --hbm)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per cache block "
                   "(default 16)")
    p.add_argument("--seq-len", type=int, metavar="TOKENS",
                   help="tokens per sequence, for the concurrency that fits")
    _add_json(p)
    p.set_defaults(func=run_kv)


def run_kv(args: argparse.Namespace) -> int:
    from ..plan import kv

    check_writable(args.json)
    path = os.path.join(args.config, "config.json") if os.path.isdir(args.config) else args.config
    cfg = _read_json(path, "config")
    try:
        geo = kv.Geometry.from_config(cfg)
        dtype = kv.canonical_dtype(args.dtype)
        block = args.scale_block
        if block is None and dtype in ("int8", "int4") or (
                block is None and dtype in kv.QUANTIZED and geo.kind == "mla"):
            block = 64
        fmt = kv.CacheFormat(dtype, block, args.scale_bytes, args.rope_dtype)
        tb = kv.token_bytes(geo, fmt)
        budget = None
        if args.budget is not None:
            budget = kv.parse_size(args.budget)
        elif args.hbm is not None:
            budget = kv.kv_budget(kv.parse_size(args.hbm), kv.parse_size(args.weights),
                                  args.utilization, kv.parse_size(args.reserve))
            if budget <= 0:
                raise UsageError(f"nothing left for the KV cache: {args.hbm} x "
                                 f"{args.utilization} minus weights {args.weights} "
                                 f"and reserve {args.reserve} is {budget} bytes")
        cap = None if budget is None else kv.capacity(tb, budget, args.block_size, args.seq_len)
    except ValueError as exc:  # ConfigError included
        raise UsageError(f"{path}: {exc}" if isinstance(exc, kv.ConfigError) else str(exc)) \
            from None
    data = kv.plan_json(geo, fmt, tb, cap)
    return _emit(args, data, _kv_text(geo, fmt, tb, cap))


def _kv_text(geo, fmt, tb, cap) -> str:
    shape = (f"MLA: latent {geo.head_dim} + RoPE key {geo.rope_dim} per layer"
             if geo.kind == "mla" else
             f"{geo.kind.upper()}: {geo.kv_heads} KV heads x head_dim {geo.head_dim} "
             f"({geo.attention_heads} query heads)")
    scales = ("per-tensor scale" if fmt.scale_block is None else
              f"one {fmt.scale_bytes}-byte scale per {fmt.scale_block} elements")
    lines = [f"model      {geo.model_type or '?'}, {geo.layers} layers, {shape}",
             f"cache      {fmt.dtype}" + (f", {scales}" if fmt.dtype in ("fp8", "int8", "int4")
                                         else "")
             + (f", RoPE key in {fmt.rope_dtype}" if geo.kind == "mla"
                and fmt.dtype in ("fp8", "int8", "int4") else ""),
             f"per layer  {tb.per_layer:,} B/token (payload {tb.payload:,}, scales {tb.scales:,}"
             + (f", rope {tb.rope:,}" if geo.kind == "mla" else "") + ")",
             f"per token  {tb.per_token:,} B ({tb.per_token / 1024:,.1f} KiB) over "
             f"{geo.layers} layers"]
    if cap is not None:
        lines.append(f"budget     {cap.budget_bytes / 2**30:,.2f} GiB for KV -> {cap.blocks:,} "
                     f"blocks of {cap.block_size} = {cap.tokens:,} tokens")
        if cap.sequences is not None:
            lines.append(f"sequences  {cap.sequences:,} concurrent at {cap.seq_len:,} tokens")
    return "\n".join(lines)


# -- specdec ----------------------------------------------------------------------------


def _register_specdec(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "specdec", help="speculative decoding: tokens per step, speedup, optimal draft "
        "length, break-even acceptance, and which drafter to run",
        description="Leviathan et al. (2023) closed forms from alpha (or an engine's "
        "counters), draft length gamma and cost ratio c; with --candidate, the method's "
        "choice between EAGLE/Medusa heads, a draft model and n-gram lookup.",
        epilog="examples:\n  tailgate plan specdec --alpha 0.8 --gamma 4 --cost 0.05 --explain\n"
        "  tailgate plan specdec --metrics vllm.prom --cost 0.05\n"
        "  tailgate plan specdec --concurrency 64 --bound memory --domain general "
        "--candidate eagle3:eagle:0.75:0.04 --candidate qwen-0.5b:draft:0.8:0.15",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alpha", type=float, help="per-token acceptance probability")
    p.add_argument("--metrics", metavar="FILE", help="alpha from an engine's /metrics text "
                   "(vLLM spec_decode_* counters)")
    p.add_argument("--gamma", type=int, default=None, help="draft length (default: the "
                   "engine's, or 4)")
    p.add_argument("--cost", type=float, default=0.05, help="cost of a draft step over a "
                   "target step, c (default 0.05)")
    p.add_argument("--explain", action="store_true", help="print the derivation")
    g = p.add_argument_group("choosing a drafter")
    g.add_argument("--candidate", action="append", default=[], metavar="NAME:KIND:ALPHA:COST",
                   help="a measured drafter; KIND one of eagle, medusa, mtp, draft, ngram "
                   "(repeatable)")
    g.add_argument("--concurrency", type=int, default=1, help="sequences per replica")
    g.add_argument("--bound", default="latency", help="compute, memory or latency")
    g.add_argument("--domain", default="general",
                   help="general, chat, reasoning, code or summarization")
    _add_json(p)
    p.set_defaults(func=run_specdec)


def run_specdec(args: argparse.Namespace) -> int:
    from ..plan import specdec

    check_writable(args.json)
    data: dict[str, Any] = {}
    lines: list[str] = []
    try:
        if args.candidate:
            rec = specdec.recommend(concurrency=args.concurrency, bound=args.bound,
                                    domain=args.domain,
                                    candidates=specdec.candidates_from_specs(args.candidate))
            data["recommendation"] = {"choice": rec.choice, "gamma": rec.gamma,
                                      "speedup": rec.speedup, "why": rec.why,
                                      "candidates": rec.table}
            lines.append(f"{'candidate':<16}{'kind':<8}{'alpha':>7}{'c':>7}{'gamma':>7}"
                         f"{'speedup':>9}{'break-even':>12}")
            for r in rec.table:
                lines.append(f"{r['name']:<16}{r['kind']:<8}{r['alpha']:>7.3f}"
                             f"{r['cost_ratio']:>7.3f}{r['gamma']:>7}{r['speedup']:>8.2f}x"
                             f"{r['break_even_alpha']:>12.3f}")
            lines.append(f"recommendation: {rec.choice or 'no speculation'}"
                         + (f" with gamma {rec.gamma} ({rec.speedup:.2f}x)" if rec.choice else ""))
            lines += [f"  - {w}" for w in rec.why]
            if args.alpha is None and args.metrics is None:
                return _emit(args, data, "\n".join(lines))
        alpha, gamma = args.alpha, args.gamma
        if args.metrics:
            alpha, gamma, engine = _alpha_from_metrics(args.metrics, gamma)
            data["engine"] = engine
            lines.append(f"engine     {engine['drafts']:,.0f} drafts, "
                         f"{engine['draft_tokens']:,.0f} drafted, {engine['accepted']:,.0f} "
                         f"accepted: acceptance rate {engine['acceptance_rate']:.3f}, "
                         f"{engine['tokens_per_step']:.3f} tokens/step -> alpha {alpha:.3f}")
            if engine.get("per_position_alpha"):
                lines.append("per position alpha " + " ".join(
                    f"{a:.3f}" for a in engine["per_position_alpha"]))
        if alpha is None:
            raise UsageError("give --alpha, --metrics or --candidate")
        gamma = 4 if gamma is None else gamma
        s = specdec.summary(alpha, gamma, args.cost)
        data["closed_form"] = s
        lines += [f"alpha {alpha:.4g}, gamma {gamma}, c {args.cost:g}",
                  f"  tokens per target step  {s['expected_tokens_per_step']:.3f}",
                  f"  speedup                 {s['speedup']:.3f}x",
                  f"  optimal gamma           {s['optimal_gamma']} "
                  f"({s['optimal_speedup']:.3f}x)",
                  f"  break-even alpha        {s['break_even_alpha']:.3f}"]
        if args.explain:
            lines += ["", specdec.explain(alpha, gamma, args.cost)]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _emit(args, data, "\n".join(lines))


def _alpha_from_metrics(path: str, gamma: int | None) -> tuple[float, int, dict[str, Any]]:
    from ..llm.engine_metrics import total
    from ..plan import specdec
    from ..sources.engine import parse_exposition

    try:
        with open(path, encoding="utf-8") as fh:
            samples = parse_exposition(fh.read())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    drafts = total(samples, "vllm:spec_decode_num_drafts_total")
    drafted = total(samples, "vllm:spec_decode_num_draft_tokens_total")
    accepted = total(samples, "vllm:spec_decode_num_accepted_tokens_total")
    if not drafts or not drafted or accepted is None:
        raise UsageError(f"{path}: no vLLM spec_decode counters with drafts (is speculative "
                         "decoding on?)")
    per_pos: dict[int, float] = {}
    for name, labels, value in samples:
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = int(labels.get("position", -1))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    positions = [per_pos[i] for i in sorted(per_pos)]
    k = drafted / drafts
    engine: dict[str, Any] = {"drafts": drafts, "draft_tokens": drafted, "accepted": accepted,
                              "acceptance_rate": accepted / drafted,
                              "tokens_per_step": 1 + accepted / drafts, "draft_length": k}
    if positions:
        engine["per_position_alpha"] = specdec.conditional_acceptance(drafts, positions)
    alpha = specdec.alpha_from_counts(drafts, drafted, accepted)
    return alpha, gamma if gamma is not None else max(1, round(k)), engine


# -- fanout -----------------------------------------------------------------------------

_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999), ("p9999", 0.9999))


def _register_fanout(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fanout", help="tail at scale: a measured leaf latency behind fan-out, hops, hedging",
        description="End-to-end latency of a request that fans out to N leaves (the slowest "
        "wins), passes sequential hops (latencies add), optionally hedging each leaf "
        "after a delay, computed exactly from a measured histogram.",
        epilog="examples:\n  tailgate bench http://127.0.0.1:8080/ --rate 2000 --duration 20s "
        "--hdr leaf.hlog\n  tailgate plan fanout --from leaf.hlog --fanout 100\n"
        "  tailgate plan fanout --from leaf.hlog --fanout 100 --hops 2 --hedge-after p95",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="source", required=True, metavar="FILE",
                   help="an HdrHistogram log (tailgate bench --hdr, values in ns), or a bench "
                   "JSON (its percentile table: coarse, upper bounds)")
    p.add_argument("--fanout", type=int, default=1, metavar="N", help="leaves per hop")
    p.add_argument("--hops", type=int, default=1, help="sequential hops (default 1)")
    p.add_argument("--hedge-after", metavar="PNN|DURATION",
                   help="send a second copy to a leaf that has not answered by this leaf "
                   "percentile (p95) or time (5ms)")
    p.add_argument("--monte-carlo", type=int, default=0, metavar="REQUESTS",
                   help="also simulate this many requests and print their percentiles")
    p.add_argument("--seed", type=int, default=0, help="Monte Carlo seed (default 0)")
    _add_json(p)
    p.set_defaults(func=run_fanout)


def _leaf_dist(path: str):
    from ..hist import HistogramError, merged, parse_log
    from ..plan import fanout

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
            table = doc["latency_ms"]
            return fanout.from_percentiles({k: v * 1e6 for k, v in table.items()
                                            if isinstance(v, int | float)}), "bench JSON percentiles"
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{path}: not a tailgate bench JSON with latency_ms ({exc})") from None
    try:
        _, intervals = parse_log(text)
    except HistogramError as exc:
        raise UsageError(f"{path}: {exc}") from None
    if not intervals:
        raise UsageError(f"{path}: no histogram intervals")
    h = merged((iv.histogram for iv in intervals), intervals[0].histogram.spec)
    try:
        return fanout.Dist.from_histogram(h), f"histogram of {h.total:,} samples"
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None


def run_fanout(args: argparse.Namespace) -> int:
    import numpy as np

    from ..bench.units import parse_duration
    from ..plan import fanout

    check_writable(args.json)
    if args.fanout < 1 or args.hops < 1:
        raise UsageError("--fanout and --hops must be >= 1")
    leaf, what = _leaf_dist(args.source)
    delay = None
    if args.hedge_after:
        h = args.hedge_after.strip().lower()
        try:
            if h.startswith("p"):
                digits = h[1:]
                q = float("0." + digits) if not digits.startswith("100") else 1.0
                delay = leaf.quantile(q)
            else:
                delay = parse_duration(h) * 1e9
        except ValueError:
            raise UsageError(f"--hedge-after {args.hedge_after}: a percentile (p95, p99) or "
                             "a time (5ms)") from None
    try:
        res = fanout.plan(leaf, args.fanout, args.hops, delay)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    rows = {k: {"leaf_ms": leaf.quantile(q) / 1e6, "end_to_end_ms": res.end_to_end.quantile(q) / 1e6}
            for k, q in _QUANTILES}
    data: dict[str, Any] = {"source": args.source, "input": what, "fanout": args.fanout,
                            "hops": args.hops, "percentiles": rows,
                            "mean_ms": {"leaf": leaf.mean() / 1e6,
                                        "end_to_end": res.end_to_end.mean() / 1e6}}
    if delay is not None:
        data["hedge"] = {"after_ms": delay / 1e6, "extra_load": res.hedge_extra_load}
    lines = [f"leaf: {what} from {args.source}",
             f"request: {args.hops} hop(s) x fan-out {args.fanout}"
             + (f", each leaf hedged after {delay / 1e6:.3f} ms (+{res.hedge_extra_load:.1%} "
                "requests)" if delay is not None else ""),
             f"{'':<8}{'leaf ms':>12}{'end-to-end ms':>16}"]
    if args.monte_carlo:
        sims = fanout.monte_carlo(leaf, args.fanout, args.hops, delay, args.monte_carlo,
                                  np.random.default_rng(args.seed))
        for k, q in _QUANTILES:
            rows[k]["monte_carlo_ms"] = float(np.quantile(sims, q, method="inverted_cdf")) / 1e6
        lines[-1] += f"{'Monte Carlo ms':>16}"
    for k, _ in _QUANTILES:
        r = rows[k]
        lines.append(f"{k:<8}{r['leaf_ms']:>12.3f}{r['end_to_end_ms']:>16.3f}"
                     + (f"{r['monte_carlo_ms']:>16.3f}" if "monte_carlo_ms" in r else ""))
    # where the leaf's own tail lands: the end-to-end percentile that equals the leaf P99
    p99 = leaf.quantile(0.99)
    share = float(res.end_to_end.cdf(p99))
    lines.append(f"the leaf's P99 ({p99 / 1e6:.3f} ms) is the end-to-end P{share * 100:.3g}: "
                 f"{1 - share:.1%} of requests are slower")
    data["leaf_p99_is_end_to_end_quantile"] = share
    return _emit(args, data, "\n".join(lines))
