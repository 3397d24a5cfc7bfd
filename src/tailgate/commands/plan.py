"""`tailgate plan kv | specdec | fanout | prefix-cache`: sizing answers before the hardware.

Each subcommand's options become a checked spec (``tailgate.plan.spec``, which reads the
input: a config.json, a trace, a histogram), ``tailgate.plan.run`` computes the document,
and it is printed as text (``tailgate.report.plan_render``) or written as JSON with ``--json
FILE`` (``-`` for standard output). Exit status 0, or 2 for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json

from ..errors import UsageError
from ..outputs import check_writable, write_output
from ..plan import spec as plan
from .options import status


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="size KV cache, speculative decoding, fan-out tails and "
                       "prefix caches before deploying",
                       description="Planning calculators for layer 4 (see `tailgate plan SUB -h`).")
    plan_sub = p.add_subparsers(dest="plan_command", metavar="SUB", required=True)
    _register_kv(plan_sub)
    _register_specdec(plan_sub)
    _register_fanout(plan_sub)
    _register_prefix_cache(plan_sub)


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the result as JSON to FILE ('-': stdout)")


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
    p.add_argument("--dtype", default="bf16", metavar="DTYPE",
                   help="cache dtype: bf16, fp16, fp8, int8, int4 "
                   "(default bf16)")
    p.add_argument("--scale-block", type=plan.scale_block, default=None, metavar="N|tensor",
                   help="elements per quantization scale, or tensor: one per-tensor scale "
                   "(default: per-tensor for GQA fp8, 64 for int8/int4 and for a quantized "
                   "MLA latent; plain FP8 MLA: --dtype fp8 --rope-dtype fp8 --scale-block "
                   "tensor)")
    p.add_argument("--scale-bytes", type=int, default=4, metavar="B",
                   help="bytes per scale (default 4, float32)")
    p.add_argument("--rope-dtype", default="bf16", metavar="DTYPE",
                   help="MLA: precision of the RoPE key in a quantized cache (default bf16)")
    p.add_argument("--hbm", metavar="SIZE", help="memory of one accelerator, e.g. 80GiB, 141GB")
    p.add_argument("--weights", metavar="SIZE", default="auto",
                   help="memory the weights take on the whole deployment (e.g. 16GB), or auto: "
                   "parameters counted from the config x --weight-dtype (default auto)")
    p.add_argument("--weight-dtype", metavar="DTYPE",
                   help="dtype of the weights for --weights auto (default: the checkpoint's)")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor-parallel ranks: weights and GQA KV heads split across them, an "
                   "MLA latent is replicated; sizes are per rank (default 1)")
    p.add_argument("--reserve", metavar="SIZE", default="0",
                   help="activation peak and graphs to leave free (default 0)")
    p.add_argument("--utilization", type=float, default=0.9, metavar="FRACTION",
                   help="share of --hbm the engine may use (vLLM's gpu_memory_utilization, "
                   "default 0.9)")
    p.add_argument("--budget", metavar="SIZE", help="KV bytes directly (instead of --hbm)")
    p.add_argument("--block-size", type=int, default=16, metavar="TOKENS",
                   help="tokens per cache block (default 16)")
    p.add_argument("--seq-len", type=int, metavar="TOKENS",
                   help="tokens per sequence, for the concurrency that fits")
    _add_json(p)
    p.set_defaults(func=run)


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
    p.add_argument("--alpha", type=float, metavar="ALPHA", help="per-token acceptance probability")
    p.add_argument("--metrics", metavar="FILE", help="alpha from an engine's /metrics text "
                   "(vLLM spec_decode_* counters)")
    p.add_argument("--probs", metavar="FILE",
                   help="alpha from logged probabilities, JSON lines: {\"target_prob\": p(x), "
                   "\"draft_prob\": q(x)} per drafted token x, or {\"target\": [...], "
                   "\"draft\": [...]} distributions per position")
    p.add_argument("--top-p", type=float, metavar="P", help="with --probs distributions: "
                   "truncate both to the nucleus first (the top-p-aligned estimate)")
    p.add_argument("--gamma", type=int, default=None, metavar="N", help="draft length (default: the "
                   "engine's, or 4)")
    p.add_argument("--cost", type=float, default=0.05, metavar="C", help="cost of a draft step over a "
                   "target step, c (default 0.05)")
    p.add_argument("--explain", action="store_true", help="print the derivation")
    g = p.add_argument_group("choosing a drafter")
    g.add_argument("--candidate", action="append", default=[], metavar="NAME:KIND:ALPHA:COST",
                   help="a measured drafter; KIND one of eagle, medusa, mtp, draft, ngram "
                   "(repeatable)")
    g.add_argument("--concurrency", type=int, default=1, metavar="N",
                   help="sequences per replica (default 1)")
    g.add_argument("--bound", default="latency", choices=("compute", "memory", "latency"),
                   help="what limits the deployment (default latency)")
    g.add_argument("--domain", default="general",
                   choices=("general", "chat", "reasoning", "code", "summarization"),
                   help="the traffic (default general)")
    _add_json(p)
    p.set_defaults(func=run)


# -- fanout -----------------------------------------------------------------------------

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
    p.add_argument("--fanout", type=int, default=1, metavar="N",
                   help="leaves per hop (default 1)")
    p.add_argument("--hops", type=int, default=1, metavar="K", help="sequential hops (default 1)")
    p.add_argument("--hedge-after", metavar="PNN|DURATION",
                   help="send a second copy to a leaf that has not answered by this leaf "
                   "percentile (p95) or time (5ms)")
    p.add_argument("--monte-carlo", type=int, default=0, metavar="REQUESTS",
                   help="also simulate this many requests and print their percentiles")
    p.add_argument("--seed", type=int, default=0, metavar="SEED",
                   help="Monte Carlo seed (default 0)")
    _add_json(p)
    p.set_defaults(func=run)


# -- prefix-cache -----------------------------------------------------------------------


def _register_prefix_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prefix-cache", help="replay a trace through a two-tier (HBM + DRAM) radix prefix "
        "cache: hit rates, capacity curve, smallest capacity for a target",
        description="Replay a trace (Mooncake JSONL with hash_ids, token-id JSONL, or an "
        "Azure LLM CSV) through a radix-tree prefix cache with an HBM tier and an optional "
        "host DRAM tier. Capacities are in blocks, or in bytes with the KV size per token "
        "(--kv-config or --bytes-per-token).",
        epilog="examples:\n  tailgate plan prefix-cache mooncake_conversation_trace.jsonl\n"
        "  tailgate plan prefix-cache trace.jsonl --kv-config config.json --kv-dtype fp8 "
        "--hbm 40GB --dram 400GB --prefetch-bandwidth 25GB --html curve.html",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", metavar="TRACE", help="trace file (.gz accepted)")
    p.add_argument("--format", choices=("mooncake", "tokens", "azure"),
                   help="trace format (default: from the first line)")
    p.add_argument("--block-size", type=int, default=16, metavar="TOKENS",
                   help="tokens per block for token and Azure traces (default 16; Mooncake's "
                   "is 512)")
    p.add_argument("--limit", type=int, metavar="N", help="replay the first N requests only")
    p.add_argument("--hbm", metavar="CAP", help="HBM tier: blocks (20000), tokens (2Mtok) or "
                   "bytes (40GB)")
    p.add_argument("--dram", metavar="CAP", default="0", help="host DRAM tier: blocks, tokens "
                   "or bytes (default 0: no second tier)")
    p.add_argument("--kv-config", metavar="CONFIG", help="a model's config.json, to turn "
                   "bytes into blocks (see `tailgate plan kv`)")
    p.add_argument("--kv-dtype", default="bf16", metavar="DTYPE",
                   help="cache dtype with --kv-config (default bf16)")
    p.add_argument("--bytes-per-token", type=int, metavar="BYTES", help="KV bytes per token (instead of "
                   "--kv-config)")
    p.add_argument("--policy", choices=("lru", "block-lru", "weighted"), default="lru",
                   help="eviction: lru (leaf-first LRU of whole nodes, SGLang's), block-lru "
                   "(LRU one block at a time from the tail, vLLM's) or weighted (default lru)")
    p.add_argument("--weights", default="1,1,0.01", metavar="R,F,D",
                   help="weighted score R*last_use + F*hits - D*depth (default 1,1,0.01)")
    p.add_argument("--target", type=float, default=0.9, metavar="RATE",
                   help="hit-rate target for the smallest capacity (default 0.9)")
    p.add_argument("--curve", type=int, default=8, metavar="POINTS",
                   help="points on the capacity curve (default 8; 0: none)")
    p.add_argument("--prefetch-bandwidth", metavar="SIZE",
                   help="DRAM->HBM bytes per second (e.g. 25GB), for the prefetch model")
    p.add_argument("--prefetch-window", default="50ms", metavar="DURATION",
                   help="a load finished this soon after arrival is hidden (default 50ms)")
    p.add_argument("--html", metavar="FILE", help="write the capacity curve as HTML")
    _add_json(p)
    p.set_defaults(func=run)


def _spec(args: argparse.Namespace, say) -> plan.Spec:
    kind = args.plan_command
    if kind == "kv":
        return plan.build_kv(args.config, plan.KvOptions.from_namespace(args))
    if kind == "specdec":
        return plan.build_specdec(plan.SpecdecOptions.from_namespace(args))
    if kind == "fanout":
        return plan.build_fanout(args.source, plan.FanoutOptions.from_namespace(args))
    spec = plan.build_prefix_cache(args.trace, plan.PrefixCacheOptions.from_namespace(args),
                                   say)
    if args.html and spec.options.curve <= 0:
        raise UsageError("--html draws the capacity curve: give --curve > 0")
    return spec


def run(args: argparse.Namespace) -> int:
    from ..plan.runner import run as compute
    from ..report.plan_render import prefix_cache_html, text

    html = getattr(args, "html", None)
    check_writable(args.json, html)
    # a status line for the replays only: they take seconds on big traces
    shown = (status(args, "plan prefix-cache") if args.plan_command == "prefix-cache"
             else contextlib.nullcontext(lambda text: None))
    with shown as say:
        spec = _spec(args, say)
        doc = compute(spec, say)
    if html:
        write_output(html, prefix_cache_html(doc, spec.dram_blocks))
    if args.json:
        write_output(args.json, json.dumps(doc, indent=2) + "\n")
    if args.json != "-":
        print(text(doc, explain=getattr(args, "explain", False)))
    return 0
