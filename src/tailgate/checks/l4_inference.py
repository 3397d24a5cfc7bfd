"""Checks of layer 4. See SPEC.md; each function is registered under its id.

They judge the inference engine's own ``/metrics`` (``inspect --engine URL``,
fact ``engine.metrics`` at t0 and t1) and an allocator dump
(``--memory-stats FILE``, fact ``engine.memory_stats``). Without ``--engine`` the
engine checks are ``skip``: nothing was named to inspect.
"""

from __future__ import annotations

from typing import Any

from ..judge import check
from ..llm import engine_metrics as em
from ..llm import specdec
from ..model import Result, Snapshot

Samples = list[list[Any]]


def _unknown(reason: str, subject: str = "engine") -> Result:
    return Result("unknown", subject=subject, reason=reason)


def _engine(snap: Snapshot) -> tuple[str, Samples | None, Samples] | Result:
    """(url, samples at t0 or None, samples at t1), or a skip/unknown Result."""
    if not snap.target.get("engine"):
        return Result("skip", subject="engine", reason="no inference engine named (--engine URL)")
    fact = snap.fact("engine.metrics")
    if not fact.ok:
        return _unknown(str(fact.missing))
    after = fact.value
    before_fact = snap.before_fact("engine.metrics")
    before = before_fact.value["samples"] if before_fact.ok else None
    why = em.impossible(after["samples"]) or (em.impossible(before) if before else None) \
        or em.impossible_window(before, after["samples"])
    if why:  # checked here too: a saved snapshot (--from) did not pass the collector
        return _unknown(f"{after['url']}: {why}")
    return after["url"], before, after["samples"]


def _pct(x: float) -> float:
    return round(100.0 * x, 3)


def _cache_config(samples: Samples) -> dict[str, str]:
    labels = em.labels_of(samples, "vllm:cache_config_info")
    return labels[0] if labels else {}


# (hits counter, queries counter, what the engine calls them), newest first.
_PREFIX_COUNTERS = (
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vLLM prefix_cache"),
    ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total",
     "vLLM gpu_prefix_cache (older names)"),
    ("sglang:cached_tokens_total", "sglang:prompt_tokens_total", "SGLang cached/prompt tokens"),
)
# Gauges some engines export instead: the hit rate of their last logging interval only.
_PREFIX_GAUGES = ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate")


@check("l4.prefix_cache.hit_rate")
def prefix_cache_hit_rate(snap: Snapshot, p: dict) -> Result:
    eng = _engine(snap)
    if isinstance(eng, Result):
        return eng
    url, before, after = eng
    limit = float(p["limit"])
    evidence: dict[str, Any] = {"engine": url}
    latency = em.latency_evidence(before, after)
    if latency:
        evidence["engine_latency"] = latency
    if _cache_config(after).get("enable_prefix_caching") == "False":
        return Result("fail", subject="engine", observed=0.0, evidence=evidence,
                      reason="prefix caching is disabled (vllm:cache_config_info "
                      "enable_prefix_caching=False): every prompt token is recomputed")
    for hits, queries, label in _PREFIX_COUNTERS:
        r = em.ratio_over_window(before, after, hits, queries, snap.interval_s)
        if r is None:
            continue
        reset = em.went_backwards(before, after, hits, queries)
        if reset:
            return _unknown(reset)
        num, den, windowed, note = r
        if den <= 0:
            return _unknown(f"{label}: no prompt tokens queried the prefix cache yet ({note})")
        rate = _pct(num / den)
        evidence.update({"hit_tokens": num, "queried_tokens": den, "windowed": windowed,
                         "metrics": [hits, queries]})
        status = "pass" if rate >= limit else "fail"
        return Result(status, subject="engine", observed=rate, evidence=evidence,
                      reason=f"{label}: {num:.0f} of {den:.0f} prompt tokens hit the cache, "
                      f"{note}")
    for gauge in _PREFIX_GAUGES:
        value = em.total(after, gauge)
        if value is None:
            continue
        rate = _pct(value)
        evidence.update({"metrics": [gauge], "windowed": False})
        status = "pass" if rate >= limit else "fail"
        return Result(status, subject="engine", observed=rate, evidence=evidence,
                      reason=f"{gauge} (a gauge: the engine's last logging interval, not the "
                      "inspection window; this engine exports no hit/query token counters)")
    return _unknown(f"{url}: no prefix-cache series (looked for "
                  + ", ".join(h for h, _, _ in _PREFIX_COUNTERS) + ", "
                  + ", ".join(_PREFIX_GAUGES) + ")")


@check("l4.prefix_cache.match_time")
def prefix_match_time(snap: Snapshot, p: dict) -> Result:
    eng = _engine(snap)
    if isinstance(eng, Result):
        return eng
    return Result("unknown", subject="engine",
                  reason="neither vLLM nor SGLang exports the time of a prefix lookup (no such "
                  "series in /metrics); time the engine's radix-tree match with its profiler "
                  "(vLLM: torch profiler around KVCacheManager.get_computed_blocks; SGLang: "
                  "RadixCache.match_prefix)")


@check("l4.specdec.acceptance")
def specdec_acceptance(snap: Snapshot, p: dict) -> Result:
    eng = _engine(snap)
    if isinstance(eng, Result):
        return eng
    url, before, after = eng
    limit = float(p["limit"])
    judged_on = ("judged on the engine's acceptance rate (accepted / drafted tokens), which "
                 "is <= alpha for chain drafts, so the stricter of the two")
    reset = em.went_backwards(before, after, "vllm:spec_decode_num_drafts_total",
                              "vllm:spec_decode_num_draft_tokens_total",
                              "vllm:spec_decode_num_accepted_tokens_total")
    if reset:
        return _unknown(reset)
    drafts = em.window(before, after, "vllm:spec_decode_num_drafts_total")
    if drafts[0] is not None:
        drafted = em.window(before, after, "vllm:spec_decode_num_draft_tokens_total")
        accepted = em.window(before, after, "vllm:spec_decode_num_accepted_tokens_total")
        windowed = all(x[1] is not None for x in (drafts, drafted, accepted)) and drafts[1] > 0
        pick = 1 if windowed else 0
        n, d, a = drafts[pick], drafted[pick], accepted[pick]
        if n is None or d is None or a is None:
            return _unknown(f"{url}: incomplete vllm:spec_decode_* counters")
        if n <= 0 or d <= 0:
            return _unknown(f"{url}: speculative decoding made no drafts yet")
        stats = specdec.from_counts(n, d, a)
        per_pos = _per_position(before if windowed else None, after)
        evidence = {"engine": url, **stats.to_json(), "drafts": n, "draft_tokens": d,
                    "accepted_tokens": a, "windowed": windowed,
                    "per_position_acceptance": specdec.per_position_rates(n, per_pos)
                    if per_pos else None}
        note = (f"over the {snap.interval_s:.1f} s window" if windowed
                else "totals since the engine started (no drafts in the window)")
    elif em.total(after, "vllm:spec_decode_num_draft_tokens_total") is not None:
        # vLLM v0: drafted/accepted counters but no count of drafts, so k (and alpha) is
        # unknown; the acceptance rate is still exact.
        r = em.ratio_over_window(before, after, "vllm:spec_decode_num_accepted_tokens_total",
                                 "vllm:spec_decode_num_draft_tokens_total", snap.interval_s)
        if r is None:
            return _unknown(f"{url}: incomplete vllm:spec_decode_* counters")
        a, d, windowed, note = r
        if d <= 0:
            return _unknown(f"{url}: speculative decoding drafted no tokens yet")
        observed = _pct(a / d)
        return Result("pass" if observed >= limit else "fail", subject="engine", observed=observed,
                      evidence={"engine": url, "acceptance_rate": a / d, "alpha": None,
                                "draft_tokens": d, "accepted_tokens": a, "windowed": windowed},
                      reason=f"acceptance rate {observed:.1f} % (accepted/drafted, {note}); "
                      "alpha not derivable: these (v0) counters do not count drafts, so the "
                      f"draft length is unknown; {judged_on}")
    else:
        rate = em.total(after, "sglang:spec_accept_rate")
        length = em.total(after, "sglang:spec_accept_length")
        if rate is None and length is None:
            return Result("skip", subject="engine",
                          reason="the engine runs without speculative decoding (no "
                          "vllm:spec_decode_* or sglang:spec_accept_* series)")
        if rate is None or length is None:
            return _unknown(f"{url}: only one of sglang:spec_accept_rate/length is exported")
        if rate <= 0 and length <= 1:
            return _unknown(f"{url}: SGLang's speculative-decoding gauges are zero (no decode "
                          "step has run since they were last set)")
        stats = specdec.from_rate_and_length(rate, length)
        evidence = {"engine": url, **stats.to_json(), "windowed": False}
        note = ("SGLang gauges of the last logging interval; alpha assumes chain drafts of "
                "k = (length - 1) / rate tokens")
    observed = _pct(stats.acceptance_rate)
    status = "pass" if observed >= limit else "fail"
    return Result(status, subject="engine", observed=observed, evidence=evidence,
                  reason=f"acceptance rate {observed:.1f} % (accepted/drafted), alpha "
                  f"{_pct(stats.alpha):.1f} % (per-token), {stats.mean_acceptance_length:.2f} "
                  f"tokens per step with {stats.draft_length:.2f} drafted; {note}; {judged_on}")


def _per_position(before: Samples | None, after: Samples) -> list[float]:
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

    def by_pos(samples: Samples) -> dict[int, float]:
        out: dict[int, float] = {}
        for s in samples:
            if s[0] == name and "position" in s[1]:
                pos = int(s[1]["position"])
                out[pos] = out.get(pos, 0.0) + s[2]
        return out

    a1 = by_pos(after)
    a0 = by_pos(before) if before is not None else {}
    return [a1[i] - a0.get(i, 0.0) for i in sorted(a1)]


@check("l4.memory.fragmentation")
def memory_fragmentation(snap: Snapshot, p: dict) -> Result | list[Result]:
    if not snap.target.get("memory_stats"):
        if not snap.target.get("engine"):
            return Result("skip", subject="engine",
                          reason="no inference engine named (--engine URL, --memory-stats FILE)")
        return _unknown("no engine exports allocator fragmentation in /metrics; give "
                      "--memory-stats FILE (torch.cuda.memory_stats() dumped as JSON)")
    fact = snap.fact("engine.memory_stats")
    if not fact.ok:
        return _unknown(str(fact.missing))
    devices = fact.value
    limit = float(p["limit"])
    return [_fragmentation(name, stats, limit) for name, stats in sorted(devices.items())]


def _fragmentation(device: str, s: dict[str, float], limit: float) -> Result:
    reserved = s.get("reserved_bytes.all.current", 0.0)
    inactive = s.get("inactive_split_bytes.all.current")
    if inactive is None:
        return Result("unknown", subject=device,
                      reason="the dump has no 'inactive_split_bytes.all.current'")
    if reserved <= 0:
        return Result("unknown", subject=device,
                      reason="the allocator holds no memory (reserved_bytes.all.current = 0)")
    allocated = s.get("allocated_bytes.all.current")
    requested = s.get("requested_bytes.all.current")
    evidence: dict[str, Any] = {
        "reserved_bytes": reserved, "inactive_split_bytes": inactive,
        "allocated_bytes": allocated, "requested_bytes": requested,
        "num_alloc_retries": s.get("num_alloc_retries"), "num_ooms": s.get("num_ooms"),
    }
    if allocated is not None:
        evidence["cached_free_pct"] = _pct((reserved - allocated) / reserved)
        if requested is not None and allocated > 0:
            evidence["rounding_waste_pct"] = _pct((allocated - requested) / allocated)
    frag = _pct(inactive / reserved)
    status = "pass" if frag <= limit else "fail"
    return Result(status, subject=device, observed=frag, evidence=evidence,
                  reason=f"{inactive / 2**20:.1f} MiB of {reserved / 2**20:.1f} MiB reserved "
                  "is free space inside split segments (inactive_split_bytes / reserved_bytes)")


_QUANTISED = ("fp8", "int8", "int4", "nvfp4", "fp4")


@check("l4.kv.quantization")
def kv_quantization(snap: Snapshot, p: dict) -> Result:
    eng = _engine(snap)
    if isinstance(eng, Result):
        return eng
    url, _before, after = eng
    cfg = _cache_config(after)
    dtype = cfg.get("cache_dtype")
    if dtype is None:
        return Result("unknown", subject="engine",
                      reason="the engine does not export its KV-cache dtype (vLLM does in "
                      "vllm:cache_config_info; SGLang: see its --kv-cache-dtype argument)")
    evidence = {"engine": url, "cache_dtype": dtype, "block_size": cfg.get("block_size")}
    if dtype.lower().startswith(_QUANTISED):
        return Result("pass", subject="engine", observed=dtype, evidence=evidence,
                      reason=f"KV cache stored as {dtype}; the per-64 block scaling and the "
                      "RoPE key's precision are not exported and were not verified")
    stored = f"KV cache stored in {'the model dtype' if dtype == 'auto' else dtype} " \
        f"(cache_dtype={dtype}): not quantised, so it is twice the size of FP8"
    if p.get("require_quantized"):
        return Result("fail", subject="engine", observed=dtype, evidence=evidence,
                      reason=stored + " (the baseline sets require_quantized)")
    # vLLM's default (auto) is a sound choice: FP8 KV trades accuracy for memory, a trade
    # the operator makes, so only a baseline that asks for it gates on it.
    return Result("skip", subject="engine", observed=dtype, evidence=evidence,
                  reason=stored + "; the engine's default, not a fault: "
                  "`require_quantized: true` in the baseline fails it")
