"""``run(spec) -> document``: one plan from a checked spec (:mod:`.spec`), as the
``tailgate_plan`` document ``--json`` writes: ``{"tailgate_plan": 1, "kind": "kv", ...}``.

It prints nothing (``say`` is told what a long replay is doing); a value the computation
refuses is a :class:`~tailgate.errors.UsageError`. The text and HTML renderings of the
document are :mod:`tailgate.report.plan_render`'s.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .spec import FanoutSpec, KvOptions, KvSpec, PrefixCacheSpec, Say, Spec, SpecdecSpec

QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999), ("p9999", 0.9999))
KINDS = {KvSpec: "kv", SpecdecSpec: "specdec", FanoutSpec: "fanout",
         PrefixCacheSpec: "prefix-cache"}


def run(spec: Spec, say: Say = lambda text: None) -> dict[str, Any]:
    """Plan as ``spec`` says and return the ``tailgate_plan`` document."""
    if isinstance(spec, KvSpec):
        data = _kv(spec)
    elif isinstance(spec, SpecdecSpec):
        data = _specdec(spec)
    elif isinstance(spec, FanoutSpec):
        data = _fanout(spec)
    else:
        data = _prefix_cache(spec, say)
    # a versioned document, like bench's
    return {"tailgate_plan": 1, "kind": KINDS[type(spec)], **data}


def _kv(spec: KvSpec) -> dict[str, Any]:
    from . import kv

    o = spec.options
    try:
        geo = kv.Geometry.from_config(spec.config)
        fmt = kv.cache_format(geo, o.dtype, o.scale_block, o.scale_bytes, o.rope_dtype)
        tb = kv.token_bytes(kv.tensor_parallel(geo, o.tp), fmt)
        budget = None
        weights: dict[str, Any] | None = None
        if o.budget is not None:
            budget = kv.parse_size(o.budget)
        elif o.hbm is not None:
            weights = _weights(o, spec.config)
            budget = kv.kv_budget(kv.parse_size(o.hbm), weights["bytes_per_rank"],
                                  o.utilization, kv.parse_size(o.reserve))
            if budget <= 0:
                raise UsageError(f"nothing left for the KV cache: {o.hbm} x "
                                 f"{o.utilization} minus weights "
                                 f"{weights['bytes_per_rank'] / 1e9:,.2f} GB per rank and "
                                 f"reserve {o.reserve} is {budget} bytes")
        cap = None if budget is None else kv.capacity(tb, budget, o.block_size, o.seq_len)
    except ValueError as exc:  # ModelConfigError included
        raise UsageError(f"{spec.path}: {exc}" if isinstance(exc, kv.ModelConfigError)
                         else str(exc)) from None
    data = kv.plan_json(geo, fmt, tb, cap)
    data["tensor_parallel"] = o.tp
    if weights is not None:
        data["weights"] = weights
    return data


def _weights(o: KvOptions, cfg: Any) -> dict[str, Any]:
    """The weights' bytes, given or counted from the config, whole and per TP rank."""
    from . import kv

    if o.weights != "auto":
        total = kv.parse_size(o.weights)
        return {"source": "given", "bytes": total, "bytes_per_rank": -(-total // o.tp)}
    try:
        params = kv.parameters(cfg)
        wdtype = kv.canonical_dtype(o.weight_dtype) if o.weight_dtype else \
            kv.weights_dtype(cfg)
    except kv.ModelConfigError as exc:
        raise UsageError(f"--weights auto: {exc}") from None
    total = params.total * kv.DTYPE_BITS[wdtype] // 8
    return {"source": "counted", "parameters": params.total, "active_parameters": params.active,
            "dtype": wdtype, "bytes": total, "bytes_per_rank": -(-total // o.tp)}


def _specdec(spec: SpecdecSpec) -> dict[str, Any]:
    from . import specdec

    o = spec.options
    data: dict[str, Any] = {}
    try:
        if spec.candidates:
            rec = specdec.recommend(concurrency=o.concurrency, bound=o.bound, domain=o.domain,
                                    candidates=spec.candidates)
            data["recommendation"] = {"choice": rec.choice, "gamma": rec.gamma,
                                      "speedup": rec.speedup, "why": rec.why,
                                      "candidates": rec.table}
        if spec.alpha is None:  # candidates compared, nothing else asked
            return data
        if spec.engine is not None:
            data["engine"] = spec.engine
        if spec.estimate is not None:
            data["estimate"] = spec.estimate
        data["closed_form"] = specdec.summary(spec.alpha, spec.gamma, o.cost)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return data


def _fanout(spec: FanoutSpec) -> dict[str, Any]:
    import numpy as np

    from . import fanout

    o, leaf, delay = spec.options, spec.leaf, spec.delay_ns
    try:
        res = fanout.plan(leaf, o.fanout, o.hops, delay)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    rows = {k: {"leaf_ms": leaf.quantile(q) / 1e6,
                "end_to_end_ms": res.end_to_end.quantile(q) / 1e6} for k, q in QUANTILES}
    data: dict[str, Any] = {"source": spec.source, "input": spec.what, "fanout": o.fanout,
                            "hops": o.hops, "percentiles": rows,
                            "mean_ms": {"leaf": leaf.mean() / 1e6,
                                        "end_to_end": res.end_to_end.mean() / 1e6}}
    if delay is not None:
        data["hedge"] = {"after_ms": delay / 1e6, "extra_load": res.hedge_extra_load}
    if o.monte_carlo:
        sims = fanout.monte_carlo(leaf, o.fanout, o.hops, delay, o.monte_carlo,
                                  np.random.default_rng(o.seed))
        for k, q in QUANTILES:
            rows[k]["monte_carlo_ms"] = float(np.quantile(sims, q, method="inverted_cdf")) / 1e6
    # where the leaf's own tail lands: the end-to-end percentile that equals its P99, P999
    for key, q in (("p99", 0.99), ("p999", 0.999)):
        data[f"leaf_{key}_is_end_to_end_quantile"] = float(res.end_to_end.cdf(leaf.quantile(q)))
    return data


def _prefix_cache(spec: PrefixCacheSpec, say: Say) -> dict[str, Any]:
    from . import prefix_cache as pc

    o, reqs, block, policy = spec.options, spec.requests, spec.block, spec.policy
    dram, hbm = spec.dram_blocks, spec.hbm_blocks
    say(f"replaying {len(reqs):,} requests through an unlimited cache")
    # the HBM that never evicts: every distinct block, and at least the longest prompt (an
    # engine holds all of a sequence's blocks, its partial last one too, in HBM at once)
    distinct = pc.unique_blocks(reqs)
    unique = max(distinct, max(-(-q.input_tokens // block) for q in reqs))
    full = pc.replay(reqs, block, None)
    top = full.rate(full.hit_tokens)
    data: dict[str, Any] = {
        "trace": {"path": spec.trace, "format": spec.format, "requests": len(reqs),
                  "blocks": sum(len(q.chain) for q in reqs), "block_size": block,
                  "distinct_blocks": distinct, "input_tokens": full.input_tokens},
        "unlimited": {"hit_rate": top}, "policy": policy.name, "block_bytes": spec.block_bytes}
    if hbm is not None:
        say(f"replaying with HBM {hbm:,} blocks" + (f" + DRAM {dram:,}" if dram else ""))
        res = pc.replay(reqs, block, hbm, dram, policy)
        data["replay"] = {"hbm_blocks": hbm, "dram_blocks": dram, **res.to_json()}
        data["replay"]["share_of_unlimited"] = res.hit_tokens / full.hit_tokens \
            if full.hit_tokens else None
        if spec.prefetch is not None:
            bw, window = spec.prefetch
            try:
                pf = pc.prefetch(reqs, res.dram_hits_per_request, spec.block_bytes, bw, window)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            data["prefetch"] = {"bandwidth_bytes_s": bw, "window_ms": window,
                                "loaded_bytes": pf.loaded_bytes,
                                "in_time_share": pf.in_time_share,
                                "delay_p50_ms": pf.delay_p50_ms, "delay_p99_ms": pf.delay_p99_ms}
    targets = {"tokens": o.target, "of_unlimited": o.target * top}
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
    if o.curve > 0:
        # doubling steps up to the distinct-block count: the knee is usually far below it
        caps = sorted({max(1, unique >> (o.curve - 1 - i)) for i in range(o.curve)})
        say(f"replaying {len(caps)} capacities for the curve")
        data["curve"] = [{"hbm_blocks": c.hbm_blocks, "hit_rate": c.hit_rate,
                          "hbm_hit_rate": c.hbm_hit_rate, "dram_hit_rate": c.dram_hit_rate}
                         for c in pc.capacity_curve(reqs, block, caps, dram, policy)]
    return data
