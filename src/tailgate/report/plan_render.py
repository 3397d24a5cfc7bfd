"""A ``tailgate_plan`` document (:func:`tailgate.plan.run`) as the text ``tailgate plan``
prints, and a prefix-cache capacity curve as HTML. Nothing is recomputed but the engine's
acceptance rate from its counters (one division)."""

from __future__ import annotations

import os
from typing import Any


def text(doc: dict[str, Any], explain: bool = False) -> str:
    """The terminal text of a plan; ``explain``: specdec's derivation too."""
    render = {"kv": _kv, "specdec": _specdec, "fanout": _fanout,
              "prefix-cache": _prefix_cache}[doc["kind"]]
    return "\n".join(render(doc, explain) if doc["kind"] == "specdec" else render(doc))


def _kv(doc: dict[str, Any]) -> list[str]:
    geo, fmt, tp = doc["model"], doc["format"], doc["tensor_parallel"]
    per_layer, weights, cap = doc["bytes_per_token_per_layer"], doc.get("weights"), \
        doc.get("capacity")
    mla, quantized = geo["kind"] == "mla", fmt["dtype"] in ("fp8", "int8", "int4")
    shape = (f"MLA: latent {geo['head_dim']} + RoPE key {geo['rope_dim']} per layer" if mla
             else f"{geo['kind'].upper()}: {geo['kv_heads']} KV heads x head_dim "
             f"{geo['head_dim']} ({geo['attention_heads']} query heads)")
    scales = ("per-tensor scale" if fmt["scale_block"] is None else
              f"one {fmt['scale_bytes']}-byte scale per {fmt['scale_block']} elements")
    per_token = doc["bytes_per_token"]
    lines = [f"model      {geo['model_type'] or '?'}, {geo['layers']} layers, {shape}",
             f"cache      {fmt['dtype']}" + (f", {scales}" if quantized else "")
             + (f", RoPE key in {fmt['rope_dtype']}" if mla and quantized else ""),
             f"per layer  {per_layer['total']:,} B/token (payload {per_layer['payload']:,}, "
             f"scales {per_layer['scales']:,}"
             + (f", rope {per_layer['rope']:,}" if mla else "") + ")",
             f"per token  {per_token:,} B ({per_token / 1024:,.1f} KiB) over "
             f"{geo['layers']} layers" + (f", per rank of TP {tp}" if tp > 1 else "")]
    if tp > 1 and mla:
        lines.append(f"           (the MLA latent is replicated on each of the {tp} ranks)")
    if weights is not None:
        per_rank = (f", {weights['bytes_per_rank'] / 1e9:,.1f} GB per rank" if tp > 1 else "")
        if weights["source"] == "counted":
            act = weights["active_parameters"]
            lines.append(f"weights    {weights['parameters'] / 1e9:,.2f}B parameters"
                         + (f" ({act / 1e9:,.2f}B active)" if act != weights["parameters"]
                            else "")
                         + f" in {weights['dtype']} = {weights['bytes'] / 1e9:,.1f} GB"
                         + per_rank)
        else:
            lines.append(f"weights    {weights['bytes'] / 1e9:,.1f} GB" + per_rank)
    if cap is not None:
        lines.append(f"budget     {cap['budget_bytes'] / 2**30:,.2f} GiB for KV -> "
                     f"{cap['blocks']:,} blocks of {cap['block_size']} = {cap['tokens']:,} "
                     "tokens")
        if cap["sequences"] is not None:
            lines.append(f"sequences  {cap['sequences']:,} concurrent at {cap['seq_len']:,} "
                         "tokens")
    return lines


def _specdec(doc: dict[str, Any], explain: bool) -> list[str]:
    from ..plan import specdec

    lines: list[str] = []
    rec = doc.get("recommendation")
    if rec is not None:
        lines.append(f"{'candidate':<16}{'kind':<8}{'alpha':>7}{'c':>7}{'gamma':>7}"
                     f"{'speedup':>9}{'break-even':>12}")
        for r in rec["candidates"]:
            lines.append(f"{r['name']:<16}{r['kind']:<8}{r['alpha']:>7.3f}"
                         f"{r['cost_ratio']:>7.3f}{r['gamma']:>7}{r['speedup']:>8.2f}x"
                         f"{specdec.format_break_even(r['break_even_alpha']):>12}")
        lines.append(f"recommendation: {rec['choice'] or 'no speculation'}"
                     + (f" with gamma {rec['gamma']} ({rec['speedup']:.2f}x)" if rec["choice"]
                        else ""))
        lines += [f"  - {w}" for w in rec["why"]]
    s = doc.get("closed_form")
    if s is None:
        return lines
    engine, est = doc.get("engine"), doc.get("estimate")
    if engine is not None:
        alpha = specdec.alpha_from_counts(engine["drafts"], engine["draft_tokens"],
                                          engine["accepted"])
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
    alpha, gamma, cost = s["alpha"], s["gamma"], s["cost_ratio"]
    if est is not None:
        lines.append(f"estimate   alpha {alpha:.4f} from {est['positions']:,} logged "
                     f"positions ({est['method']})")
    lines += [f"alpha {alpha:.4g}, gamma {gamma}, c {cost:g}",
              f"  tokens per target step  {s['expected_tokens_per_step']:.3f}",
              f"  speedup                 {s['speedup']:.3f}x",
              f"  optimal gamma           {s['optimal_gamma']} ({s['optimal_speedup']:.3f}x)",
              f"  break-even alpha        {specdec.format_break_even(s['break_even_alpha'])}"
              + ("" if s["break_even_alpha"] is not None else
                 f" (c={cost:g}: a draft step costs a target step or more)")]
    if explain:
        lines += ["", _explain(alpha, gamma, cost)]
    return lines


def _explain(alpha: float, gamma: int, c: float) -> str:
    """The derivation with these numbers, for `tailgate plan specdec --explain`."""
    from ..plan.specdec import break_even_alpha, expected_tokens, format_break_even, optimal_gamma

    e = expected_tokens(alpha, gamma)
    terms = " + ".join(f"{alpha:.3g}^{i}" for i in range(gamma + 1))
    g_opt, s_opt = optimal_gamma(alpha, c)
    return "\n".join([
        "Speculative decoding (Leviathan, Kalman, Matias, ICML 2023):",
        f"  a step drafts gamma={gamma} tokens; drafted token i survives only if tokens "
        f"1..i-1 did, each with alpha={alpha:g}, and the target adds one token of its own:",
        f"  E[tokens] = {terms} = (1 - a^(g+1)) / (1 - a) = {e:.4f}",
        f"  a step costs gamma*c + 1 = {gamma}*{c:g} + 1 = {gamma * c + 1:.4f} target steps",
        f"  speedup = E[tokens] / (gamma*c + 1) = {e / (gamma * c + 1):.4f}",
        f"  optimal gamma for alpha={alpha:g}, c={c:g}: {g_opt} (speedup {s_opt:.4f})",
        f"  break-even alpha at gamma={gamma}: {format_break_even(break_even_alpha(gamma, c), 4)} "
        f"(at gamma=1 it is c itself: speculation pays for some gamma iff alpha > c)",
    ])


def _fanout(doc: dict[str, Any]) -> list[str]:
    rows, hedge = doc["percentiles"], doc.get("hedge")
    mc = "monte_carlo_ms" in rows["p50"]
    lines = [f"leaf: {doc['input']} from {doc['source']}",
             f"request: {doc['hops']} hop(s) x fan-out {doc['fanout']}"
             + (f", each leaf hedged after {hedge['after_ms']:.3f} ms "
                f"(+{hedge['extra_load']:.1%} requests)" if hedge is not None else ""),
             f"{'':<8}{'leaf ms':>12}{'end-to-end ms':>16}" + (f"{'Monte Carlo ms':>16}"
                                                              if mc else "")]
    for k, r in rows.items():
        lines.append(f"{k:<8}{r['leaf_ms']:>12.3f}{r['end_to_end_ms']:>16.3f}"
                     + (f"{r['monte_carlo_ms']:>16.3f}" if "monte_carlo_ms" in r else ""))
    for key in ("p99", "p999"):
        share = doc[f"leaf_{key}_is_end_to_end_quantile"]
        lines.append(f"the leaf's {key.upper()} ({rows[key]['leaf_ms']:.3f} ms) is the "
                     f"end-to-end P{share * 100:.3g}: {1 - share:.1%} of requests are slower")
    return lines


def _prefix_cache(doc: dict[str, Any]) -> list[str]:
    t, top, block_bytes = doc["trace"], doc["unlimited"]["hit_rate"], doc["block_bytes"]
    smallest = doc["smallest_hbm"]
    dram = "hbm" in smallest  # a DRAM tier: the HBM alone is searched too

    def size(n: int) -> str:
        return f"{n:,} blocks" + (f" ({n * block_bytes / 1e9:,.2f} GB)" if block_bytes else "")

    lines = _prefix_cache_head(doc)
    if t["format"] == "azure":
        lines.append("           (Azure traces carry no content: every prompt counts as unique)")
    replay = doc.get("replay")
    if replay is not None:
        rate, share = replay["hit_rate"], replay["share_of_unlimited"]
        lines.append(f"replay     HBM {size(replay['hbm_blocks'])}"
                     + (f" + DRAM {size(replay['dram_blocks'])}" if replay["dram_blocks"]
                        else "")
                     + f", {doc['policy']}: HBM {rate['hbm']:.2%}, DRAM {rate['dram']:.2%}, "
                     f"total {rate['total']:.2%}"
                     + (f" = {share:.1%} of unlimited" if share is not None else "")
                     + (f"; {replay['too_long_for_hbm']:,} prompt(s) longer than the HBM tier "
                        "hit nothing (an engine cannot hold them)"
                        if replay["too_long_for_hbm"] else ""))
    pf = doc.get("prefetch")
    if pf is not None:
        lines.append(f"prefetch   {pf['loaded_bytes'] / 1e9:,.1f} GB from DRAM at "
                     f"{pf['bandwidth_bytes_s'] / 1e9:g} GB/s: load delay p50 "
                     f"{pf['delay_p50_ms']:.1f} ms, p99 {pf['delay_p99_ms']:.1f} ms; "
                     f"{pf['in_time_share']:.1%} of DRAM hits ready within "
                     f"{pf['window_ms']:g} ms")
    target = smallest["total"]["tokens"]["target_hit_rate"]
    for tier, found in smallest.items():
        for name, row in found.items():
            need = row["hbm_blocks"]
            label = (f"{target:.0%} of tokens" if name == "tokens"
                     else f"{target:.0%} of unlimited ({row['target_hit_rate']:.2%})")
            how = ("" if not dram else " with the DRAM tier" if tier == "total"
                   else " from HBM alone")
            lines.append(f"smallest   HBM for {label}{how}: "
                         + (size(need) if need is not None else
                            f"unreachable (the trace's maximum is {top:.2%})"))
    curve = doc.get("curve")
    if curve is not None:
        lines.append(f"{'HBM blocks':>12}{'hit rate':>10}" + (f"{'HBM':>9}{'DRAM':>9}"
                                                             if dram else ""))
        for c in curve:
            lines.append(f"{c['hbm_blocks']:>12,}{c['hit_rate']:>10.2%}"
                         + (f"{c['hbm_hit_rate']:>9.2%}{c['dram_hit_rate']:>9.2%}"
                            if dram else ""))
    return lines


def _prefix_cache_head(doc: dict[str, Any]) -> list[str]:
    t = doc["trace"]
    return [f"trace      {t['format']}: {t['requests']:,} requests, {t['input_tokens']:,} "
            f"prompt tokens, {t['blocks']:,} full blocks of {t['block_size']} tokens, "
            f"{t['distinct_blocks']:,} distinct",
            f"unlimited  {doc['unlimited']['hit_rate']:.2%} of prompt tokens hit (the most "
            "any cache can reach)"]


def prefix_cache_html(doc: dict[str, Any], dram_blocks: int) -> str:
    """The capacity curve of a prefix-cache plan (it has one: ``curve`` > 0) as HTML."""
    from . import plan_plot

    curve, dram = doc["curve"], "hbm" in doc["smallest_hbm"]
    caps = [c["hbm_blocks"] for c in curve]
    series = [("total hit rate", caps, [c["hit_rate"] for c in curve])]
    if dram:
        series.append(("HBM hit rate", caps, [c["hbm_hit_rate"] for c in curve]))
    return plan_plot.line_chart_html(
        f"prefix cache: {os.path.basename(doc['trace']['path'])}",
        "HBM capacity (blocks, log scale)", "share of prompt tokens hit", series,
        notes=_prefix_cache_head(doc) + [f"policy {doc['policy']}, DRAM {dram_blocks:,} blocks"],
        hline=("unlimited", doc["unlimited"]["hit_rate"]), log_x=True)
