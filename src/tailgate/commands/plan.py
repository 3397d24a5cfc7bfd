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

from ..errors import UsageError
from ..outputs import check_writable, write_output


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


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> int:
    # a versioned document, like bench's: {"tailgate_plan": 1, "kind": "kv", ...}
    data = {"tailgate_plan": 1, "kind": args.plan_command, **data}
    if args.json:
        write_output(args.json, json.dumps(data, indent=2) + "\n")
    if args.json != "-":
        print(text)
    return 0


MAX_INPUT_BYTES = 16 * 2**20  # a config.json, /metrics text, histogram log or bench JSON
MAX_TRACE_BYTES = 2**30  # a trace, decompressed: Mooncake's are tens of MB


def _read_text(path: str, what: str, limit: int = MAX_INPUT_BYTES) -> str:
    """A user's file through the hardened reader (a regular file under a cap, strict UTF-8):
    /dev/zero, a FIFO or Latin-1 is one line and exit 2, never a hang or a traceback."""
    from ..userfiles import UserFileError, read_user_text

    if not os.path.lexists(path):
        raise UsageError(f"cannot read {path}: no such {what}")
    try:
        return read_user_text(path, limit)
    except UserFileError as exc:
        raise UsageError(str(exc)) from None


def _read_json(path: str, what: str) -> Any:
    from ..userfiles import UserFileError, load_json

    if not os.path.lexists(path):
        raise UsageError(f"cannot read {path}: no such {what}")
    try:
        return load_json(path, MAX_INPUT_BYTES)
    except UserFileError as exc:
        raise UsageError(str(exc)) from None


def _read_trace(path: str) -> list[str]:
    """The lines of a trace (``.gz`` decompressed, to at most MAX_TRACE_BYTES)."""
    from ..plan.traces import read_lines
    from ..userfiles import UserFileError

    if not os.path.lexists(path):
        raise UsageError(f"cannot read {path}: no such trace")
    try:
        return read_lines(path, MAX_TRACE_BYTES)
    except UserFileError as exc:
        raise UsageError(str(exc)) from None


def _finite(value: float, flag: str, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False) -> float:
    """``value`` of option ``flag`` if finite and within [lo, hi] (lo excluded with lo_open)."""
    import math

    low_ok = lo is None or value > lo or (value == lo and not lo_open)
    if not math.isfinite(value) or not low_ok or (hi is not None and value > hi):
        if lo is None:
            want = "a finite number"
        elif hi is None:
            want = f"a number {'>' if lo_open else '>='} {lo:g}"
        else:
            want = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise UsageError(f"{flag} {value!r}: expected {want}")
    return value


def _at_least(value: int | None, flag: str, lo: int) -> None:
    if value is not None and value < lo:
        raise UsageError(f"{flag} {value}: must be >= {lo}")


# -- kv ---------------------------------------------------------------------------------


def _scale_block(text: str) -> int | str:
    if text.strip().lower() == "tensor":
        return "tensor"
    if not (text.strip().isascii() and text.strip().isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of elements >= 1, or tensor")
    return int(text)


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
    p.add_argument("--scale-block", type=_scale_block, default=None, metavar="N|tensor",
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
    p.set_defaults(func=run_kv)


def run_kv(args: argparse.Namespace) -> int:
    from ..plan import kv

    check_writable(args.json)
    _at_least(args.tp, "--tp", 1)
    _at_least(args.block_size, "--block-size", 1)
    _at_least(args.seq_len, "--seq-len", 1)
    _at_least(args.scale_bytes, "--scale-bytes", 1)
    _finite(args.utilization, "--utilization", 0.0, 1.0, lo_open=True)
    path = os.path.join(args.config, "config.json") if os.path.isdir(args.config) else args.config
    cfg = _read_json(path, "config")
    try:
        geo = kv.Geometry.from_config(cfg)
        fmt = kv.cache_format(geo, args.dtype, args.scale_block, args.scale_bytes,
                              args.rope_dtype)
        rank_geo = kv.tensor_parallel(geo, args.tp)
        tb = kv.token_bytes(rank_geo, fmt)
        budget = None
        weights: dict[str, Any] | None = None
        if args.budget is not None:
            budget = kv.parse_size(args.budget)
        elif args.hbm is not None:
            weights = _weights(args, cfg)
            budget = kv.kv_budget(kv.parse_size(args.hbm), weights["bytes_per_rank"],
                                  args.utilization, kv.parse_size(args.reserve))
            if budget <= 0:
                raise UsageError(f"nothing left for the KV cache: {args.hbm} x "
                                 f"{args.utilization} minus weights "
                                 f"{weights['bytes_per_rank'] / 1e9:,.2f} GB per rank and "
                                 f"reserve {args.reserve} is {budget} bytes")
        cap = None if budget is None else kv.capacity(tb, budget, args.block_size, args.seq_len)
    except ValueError as exc:  # ModelConfigError included
        raise UsageError(f"{path}: {exc}" if isinstance(exc, kv.ModelConfigError) else str(exc)) \
            from None
    data = kv.plan_json(geo, fmt, tb, cap)
    data["tensor_parallel"] = args.tp
    if weights is not None:
        data["weights"] = weights
    return _emit(args, data, _kv_text(geo, fmt, tb, cap, args.tp, weights))


def _weights(args: argparse.Namespace, cfg: Any) -> dict[str, Any]:
    from ..plan import kv

    if args.tp < 1:
        raise UsageError("--tp must be >= 1")
    if args.weights != "auto":
        total = kv.parse_size(args.weights)
        return {"source": "given", "bytes": total, "bytes_per_rank": -(-total // args.tp)}
    try:
        params = kv.parameters(cfg)
        wdtype = kv.canonical_dtype(args.weight_dtype) if args.weight_dtype else \
            kv.weights_dtype(cfg)
    except kv.ModelConfigError as exc:
        raise UsageError(f"--weights auto: {exc}") from None
    total = params.total * kv.DTYPE_BITS[wdtype] // 8
    return {"source": "counted", "parameters": params.total, "active_parameters": params.active,
            "dtype": wdtype, "bytes": total, "bytes_per_rank": -(-total // args.tp)}


def _kv_text(geo, fmt, tb, cap, tp=1, weights=None) -> str:
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
             f"{geo.layers} layers" + (f", per rank of TP {tp}" if tp > 1 else "")]
    if tp > 1 and geo.kind == "mla":
        lines.append(f"           (the MLA latent is replicated on each of the {tp} ranks)")
    if weights is not None:
        if weights["source"] == "counted":
            act = weights["active_parameters"]
            lines.append(f"weights    {weights['parameters'] / 1e9:,.2f}B parameters"
                         + (f" ({act / 1e9:,.2f}B active)" if act != weights["parameters"]
                            else "")
                         + f" in {weights['dtype']} = {weights['bytes'] / 1e9:,.1f} GB"
                         + (f", {weights['bytes_per_rank'] / 1e9:,.1f} GB per rank"
                            if tp > 1 else ""))
        else:
            lines.append(f"weights    {weights['bytes'] / 1e9:,.1f} GB"
                         + (f", {weights['bytes_per_rank'] / 1e9:,.1f} GB per rank"
                            if tp > 1 else ""))
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
    p.set_defaults(func=run_specdec)


def run_specdec(args: argparse.Namespace) -> int:
    from ..plan import specdec

    check_writable(args.json)
    if args.alpha is not None:
        _finite(args.alpha, "--alpha", 0.0, 1.0)
    if args.top_p is not None:
        _finite(args.top_p, "--top-p", 0.0, 1.0, lo_open=True)
    _finite(args.cost, "--cost", 0.0)
    _at_least(args.gamma, "--gamma", 1)
    _at_least(args.concurrency, "--concurrency", 1)
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
                             f"{specdec.format_break_even(r['break_even_alpha']):>12}")
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
            pos = engine.get("per_position_alpha")
            if pos:
                lines.append("per position alpha " + " ".join(f"{a:.3f}" for a in pos))
                if len(pos) > 1 and pos[-1] < pos[0] - 0.05:
                    lines.append("           alpha falls with draft depth: the i.i.d. closed "
                                 "forms overstate the gain of longer drafts")
        if args.probs:
            alpha, est = _alpha_from_probs(args.probs, args.top_p)
            data["estimate"] = est
            lines.append(f"estimate   alpha {alpha:.4f} from {est['positions']:,} logged "
                         f"positions ({est['method']})")
        if alpha is None:
            raise UsageError("give --alpha, --metrics, --probs or --candidate")
        gamma = 4 if gamma is None else gamma
        s = specdec.summary(alpha, gamma, args.cost)
        data["closed_form"] = s
        lines += [f"alpha {alpha:.4g}, gamma {gamma}, c {args.cost:g}",
                  f"  tokens per target step  {s['expected_tokens_per_step']:.3f}",
                  f"  speedup                 {s['speedup']:.3f}x",
                  f"  optimal gamma           {s['optimal_gamma']} "
                  f"({s['optimal_speedup']:.3f}x)",
                  f"  break-even alpha        {specdec.format_break_even(s['break_even_alpha'])}"
                  + ("" if s["break_even_alpha"] is not None else
                     f" (c={args.cost:g}: a draft step costs a target step or more)")]
        if args.explain:
            lines += ["", specdec.explain(alpha, gamma, args.cost)]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return _emit(args, data, "\n".join(lines))


def _alpha_from_probs(path: str, top_p: float | None) -> tuple[float, dict[str, Any]]:
    from ..plan import specdec

    sampled_p, sampled_q, dists_p, dists_q = [], [], [], []
    import math

    def prob(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
            and 0 <= v <= 1

    for n, line in enumerate(_read_text(path, "probabilities file", MAX_TRACE_BYTES)
                             .splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError):
            obj = None
        if isinstance(obj, dict) and "target_prob" in obj:
            if not (prob(obj["target_prob"]) and prob(obj.get("draft_prob"))):
                raise UsageError(f"{path}: line {n}: target_prob and draft_prob must be "
                                 "probabilities in [0, 1]")
            sampled_p.append(float(obj["target_prob"]))
            sampled_q.append(float(obj["draft_prob"]))
        elif isinstance(obj, dict) and "target" in obj and "draft" in obj:
            for key in ("target", "draft"):
                v = obj[key]
                if not isinstance(v, list) or not v or not all(prob(x) for x in v):
                    raise UsageError(f"{path}: line {n}: {key} must be a list of "
                                     "probabilities in [0, 1]")
            dists_p.append(obj["target"])
            dists_q.append(obj["draft"])
        else:
            raise UsageError(f"{path}: line {n}: expected target_prob/draft_prob or "
                             "target/draft")
    if sampled_p and dists_p:
        raise UsageError(f"{path}: mixes sampled probabilities and distributions")
    if sampled_p:
        if top_p is not None:
            raise UsageError("--top-p needs whole distributions (target/draft lists)")
        return (specdec.acceptance_from_sampled(sampled_p, sampled_q),
                {"positions": len(sampled_p), "method": "mean of min(1, p(x)/q(x))"})
    if not dists_p:
        raise UsageError(f"{path}: no logged positions")
    try:
        alpha = specdec.acceptance_from_distributions(dists_p, dists_q, top_p)
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return alpha, {"positions": len(dists_p), "method": "mean of sum min(p, q)"
                   + (f", both truncated to top-p {top_p:g}" if top_p is not None else "")}


def _alpha_from_metrics(path: str, gamma: int | None) -> tuple[float, int, dict[str, Any]]:
    from ..llm.engine_metrics import impossible, total
    from ..model import ParseError
    from ..plan import specdec
    from ..sources.engine import parse_exposition

    try:
        samples = parse_exposition(_read_text(path, "metrics file"))
    except ParseError as exc:
        raise UsageError(f"{path}: {exc}") from None
    why = impossible(samples)
    if why:
        raise UsageError(f"{path}: {why}")
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

MAX_MONTE_CARLO = 10_000_000
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
    p.set_defaults(func=run_fanout)


def _leaf_dist(path: str):
    import math

    from ..hist import HistogramError, merged, parse_log
    from ..plan import fanout

    text = _read_text(path, "histogram or bench JSON")
    if text.lstrip().startswith("{"):
        doc = _read_json(path, "bench JSON")
        table = doc.get("latency_ms") if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            raise UsageError(f"{path}: latency_ms: expected an object of percentiles "
                             f"(a tailgate bench JSON), got {type(table).__name__}")
        for k, v in table.items():
            if isinstance(v, int | float) and not isinstance(v, bool) \
                    and not (math.isfinite(v) and v >= 0):
                raise UsageError(f"{path}: latency_ms.{k}: {v!r} is not a latency")
        try:
            return fanout.from_percentiles({k: v * 1e6 for k, v in table.items()
                                            if isinstance(v, int | float)
                                            and not isinstance(v, bool)}), \
                "bench JSON percentiles"
        except (KeyError, TypeError, ValueError) as exc:
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


def _table_has(leaf, q: float, asked: str) -> None:
    """A leaf read from a percentile table knows only its rows: any other percentile would
    silently read as the next row up (p95 as p99). Refused, naming what would work."""
    import numpy as np

    rows = np.cumsum(leaf.probs)
    if not np.any(np.isclose(rows, q, rtol=0, atol=1e-9)):
        have = ", ".join(f"p{100 * c:g}" for c in rows if c < 1.0)
        raise UsageError(f"--hedge-after {asked}: the leaf is a bench JSON's percentile table "
                         f"({have}, max), which has no {asked} (it would read as the next row "
                         "up); name one of those, a time (5ms), or give a histogram (bench "
                         "--hdr FILE)")


def run_fanout(args: argparse.Namespace) -> int:
    import numpy as np

    from ..bench.units import parse_duration
    from ..plan import fanout

    check_writable(args.json)
    if args.fanout < 1 or args.hops < 1:
        raise UsageError("--fanout and --hops must be >= 1")
    _at_least(args.monte_carlo, "--monte-carlo", 0)
    if args.monte_carlo > MAX_MONTE_CARLO:
        raise UsageError(f"--monte-carlo {args.monte_carlo}: at most {MAX_MONTE_CARLO:,} "
                         "simulated requests (each holds fan-out x hops samples in memory)")
    leaf, what = _leaf_dist(args.source)
    delay = None
    if args.hedge_after:
        h = args.hedge_after.strip().lower()
        try:
            if h.startswith("p"):
                digits = h[1:]
                if not digits or not digits.replace(".", "", 1).isdigit():
                    raise ValueError(h)
                # p95 = 0.95, p999 = 0.999; p99.9 = 99.9 %
                q = (float(digits) / 100 if "." in digits
                     else float("0." + digits) if not digits.startswith("100") else 1.0)
                if not 0 < q <= 1:
                    raise ValueError(h)
                if what == "bench JSON percentiles":
                    _table_has(leaf, q, args.hedge_after)
                delay = leaf.quantile(q)
            else:
                delay = parse_duration(h) * 1e9
        except ValueError:
            raise UsageError(f"--hedge-after {args.hedge_after}: a percentile (p95, p99, "
                             "p99.9) or a time (5ms)") from None
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
    # where the leaf's own tail lands: the end-to-end percentile that equals its P99, P999
    for key, q in (("p99", 0.99), ("p999", 0.999)):
        v = leaf.quantile(q)
        share = float(res.end_to_end.cdf(v))
        lines.append(f"the leaf's {key.upper()} ({v / 1e6:.3f} ms) is the end-to-end "
                     f"P{share * 100:.3g}: {1 - share:.1%} of requests are slower")
        data[f"leaf_{key}_is_end_to_end_quantile"] = share
    return _emit(args, data, "\n".join(lines))


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
    p.set_defaults(func=run_prefix_cache)


def _capacity(text: str, block_bytes: int | None, what: str, block: int = 1) -> int:
    """Blocks from '20000' (blocks), '2M tokens' / '500ktok' (whole blocks), or '40GB'."""
    from ..plan.kv import parse_size

    t = text.strip().lower()
    if t.isdigit():
        return int(t)
    for suffix in ("tokens", "token", "tok"):
        if t.endswith(suffix):
            num = t[:-len(suffix)].strip()
            if num.endswith("b"):
                raise UsageError(f"{what} {text}: tokens are a count (2M tokens), not bytes")
            try:
                return parse_size(num) // block  # '2M' is 2,000,000 tokens; whole blocks
            except ValueError as exc:
                raise UsageError(f"{what}: {exc}") from None
    if block_bytes is None:
        raise UsageError(f"{what} {text}: a size in bytes needs --kv-config or "
                         "--bytes-per-token (or give a number of blocks)")
    try:
        return parse_size(t) // block_bytes
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None


def run_prefix_cache(args: argparse.Namespace) -> int:
    from .options import status

    with status(args, "plan prefix-cache") as say:  # the replays take seconds on big traces
        data, text = _prefix_cache(args, say)
    return _emit(args, data, text)


def _prefix_cache(args: argparse.Namespace, say) -> tuple[dict[str, Any], str]:
    from ..bench.units import parse_duration
    from ..plan import kv, plot, traces
    from ..plan import prefix_cache as pc

    check_writable(args.json, args.html)
    if args.limit is not None and args.limit <= 0:
        raise UsageError("--limit must be > 0")
    if not 0 < args.target <= 1:
        raise UsageError("--target must be in (0, 1]")
    try:
        r, f, d = (_finite(float(x), "--weights") for x in args.weights.split(","))
        policy = pc.Policy(args.policy, r, f, d)
    except ValueError:
        raise UsageError(f"--weights {args.weights}: expected R,F,D numbers") from None
    _at_least(args.block_size, "--block-size", 1)
    _at_least(args.curve, "--curve", 0)
    _at_least(args.bytes_per_token, "--bytes-per-token", 1)
    _finite(args.target, "--target", 0.0, 1.0, lo_open=True)
    say(f"reading {os.path.basename(args.trace)}")
    try:
        fmt, block, reqs = traces.load_lines(_read_trace(args.trace), args.format,
                                             args.block_size, args.limit)
    except ValueError as exc:
        raise UsageError(f"{args.trace}: {exc}") from None
    if not reqs:
        raise UsageError(f"{args.trace}: no requests")
    per_token = args.bytes_per_token
    if args.kv_config:
        try:
            geo = kv.Geometry.from_config(_read_json(args.kv_config, "config"))
            # the format `plan kv --dtype` sizes, scales included: the two always agree
            per_token = kv.token_bytes(geo, kv.cache_format(geo, args.kv_dtype)).per_token
        except ValueError as exc:
            raise UsageError(f"{args.kv_config}: {exc}") from None
    block_bytes = per_token * block if per_token else None
    say(f"replaying {len(reqs):,} requests through an unlimited cache")
    # the HBM that never evicts: every distinct block, and at least the longest prompt (an
    # engine holds all of a sequence's blocks, its partial last one too, in HBM at once)
    distinct = pc.unique_blocks(reqs)
    unique = max(distinct, max(-(-q.input_tokens // block) for q in reqs))
    full = pc.replay(reqs, block, None)
    top = full.rate(full.hit_tokens)
    blocks = sum(len(q.chain) for q in reqs)
    data: dict[str, Any] = {
        "trace": {"path": args.trace, "format": fmt, "requests": len(reqs), "blocks": blocks,
                  "block_size": block, "distinct_blocks": distinct,
                  "input_tokens": full.input_tokens},
        "unlimited": {"hit_rate": top}, "policy": policy.name, "block_bytes": block_bytes}

    def size(n: int) -> str:
        return f"{n:,} blocks" + (f" ({n * block_bytes / 1e9:,.2f} GB)" if block_bytes else "")

    lines = [f"trace      {fmt}: {len(reqs):,} requests, {full.input_tokens:,} prompt tokens, "
             f"{blocks:,} full blocks of {block} tokens, {distinct:,} distinct",
             f"unlimited  {top:.2%} of prompt tokens hit (the most any cache can reach)"]
    if fmt == "azure":
        lines.append("           (Azure traces carry no content: every prompt counts as unique)")
    dram = _capacity(args.dram, block_bytes, "--dram", block)
    if args.hbm:
        hbm = _capacity(args.hbm, block_bytes, "--hbm", block)
        say(f"replaying with HBM {hbm:,} blocks" + (f" + DRAM {dram:,}" if dram else ""))
        res = pc.replay(reqs, block, hbm, dram, policy)
        data["replay"] = {"hbm_blocks": hbm, "dram_blocks": dram, **res.to_json()}
        data["replay"]["share_of_unlimited"] = res.hit_tokens / full.hit_tokens \
            if full.hit_tokens else None
        lines.append(f"replay     HBM {size(hbm)}" + (f" + DRAM {size(dram)}" if dram else "")
                     + f", {policy.name}: HBM {res.rate(res.hbm_hit_tokens):.2%}, DRAM "
                     f"{res.rate(res.dram_hit_tokens):.2%}, total {res.rate(res.hit_tokens):.2%}"
                     + (f" = {res.hit_tokens / full.hit_tokens:.1%} of unlimited"
                        if full.hit_tokens else "")
                     + (f"; {res.too_long:,} prompt(s) longer than the HBM tier hit nothing "
                        "(an engine cannot hold them)" if res.too_long else ""))
        if args.prefetch_bandwidth:
            if not block_bytes:
                raise UsageError("--prefetch-bandwidth needs --kv-config or --bytes-per-token")
            try:
                bw = kv.parse_size(args.prefetch_bandwidth.removesuffix("/s"))
                window = parse_duration(args.prefetch_window) * 1000.0
                pf = pc.prefetch(reqs, res.dram_hits_per_request, block_bytes, bw, window)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            data["prefetch"] = {"bandwidth_bytes_s": bw, "window_ms": window,
                                "loaded_bytes": pf.loaded_bytes,
                                "in_time_share": pf.in_time_share,
                                "delay_p50_ms": pf.delay_p50_ms, "delay_p99_ms": pf.delay_p99_ms}
            lines.append(f"prefetch   {pf.loaded_bytes / 1e9:,.1f} GB from DRAM at "
                         f"{bw / 1e9:g} GB/s: load delay p50 {pf.delay_p50_ms:.1f} ms, p99 "
                         f"{pf.delay_p99_ms:.1f} ms; {pf.in_time_share:.1%} of DRAM hits "
                         f"ready within {window:g} ms")
    else:
        hbm = None
    targets = {"tokens": args.target, "of_unlimited": args.target * top}
    data["smallest_hbm"] = {}
    # with a DRAM tier: the HBM that reaches the target with DRAM hits counted, and the
    # HBM that reaches it alone (no loads from host memory on the way)
    for tier in (("total", "hbm") if dram else ("total",)):
        found = data["smallest_hbm"].setdefault(tier, {})
        for name, goal in targets.items():
            say(f"searching the smallest HBM for a {goal:.2%} hit rate ({tier})")
            need = (pc.smallest_capacity(reqs, block, goal, unique, dram if tier == "total"
                                         else 0, policy) if goal > 0 else 0)
            found[name] = {"target_hit_rate": goal, "hbm_blocks": need}
            label = (f"{args.target:.0%} of tokens" if name == "tokens"
                     else f"{args.target:.0%} of unlimited ({goal:.2%})")
            how = ("" if not dram else " with the DRAM tier" if tier == "total"
                   else " from HBM alone")
            lines.append(f"smallest   HBM for {label}{how}: "
                         + (size(need) if need is not None else
                            f"unreachable (the trace's maximum is {top:.2%})"))
    if args.curve > 0:
        # doubling steps up to the distinct-block count: the knee is usually far below it
        caps = sorted({max(1, unique >> (args.curve - 1 - i)) for i in range(args.curve)})
        say(f"replaying {len(caps)} capacities for the curve")
        curve = pc.capacity_curve(reqs, block, caps, dram, policy)
        data["curve"] = [{"hbm_blocks": c.hbm_blocks, "hit_rate": c.hit_rate,
                          "hbm_hit_rate": c.hbm_hit_rate, "dram_hit_rate": c.dram_hit_rate}
                         for c in curve]
        lines.append(f"{'HBM blocks':>12}{'hit rate':>10}" + (f"{'HBM':>9}{'DRAM':>9}"
                                                             if dram else ""))
        for c in curve:
            lines.append(f"{c.hbm_blocks:>12,}{c.hit_rate:>10.2%}"
                         + (f"{c.hbm_hit_rate:>9.2%}{c.dram_hit_rate:>9.2%}" if dram else ""))
        if args.html:
            series = [("total hit rate", [c.hbm_blocks for c in curve],
                       [c.hit_rate for c in curve])]
            if dram:
                series.append(("HBM hit rate", [c.hbm_blocks for c in curve],
                               [c.hbm_hit_rate for c in curve]))
            write_output(args.html, plot.line_chart_html(
                f"prefix cache: {os.path.basename(args.trace)}",
                "HBM capacity (blocks, log scale)", "share of prompt tokens hit", series,
                notes=lines[:2] + [f"policy {policy.name}, DRAM {dram:,} blocks"],
                hline=("unlimited", top), log_x=True))
    elif args.html:
        raise UsageError("--html draws the capacity curve: give --curve > 0")
    return data, "\n".join(lines)
