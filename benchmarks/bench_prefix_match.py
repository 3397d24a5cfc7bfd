"""Prefix matching of a long prompt against a 10,000-node tree, vs the method's 32 µs bar.

The tree holds multi-turn conversations over shared system prompts, tokenised
as random ids and cut into 16-token blocks the vLLM way (chained hashes), until
tailgate's radix tree has 10,000 nodes. The long prompt continues one of those
conversations (most of it cached). Three matchers answer "how many tokens of
this prompt are cached?" in the same run:

* tailgate's radix tree with path compression over block hashes
  (:meth:`RadixCache.lookup`: one dict probe and one list compare per node);
* a per-token trie (one dict level per token, the textbook prefix tree);
* a vLLM-style block-hash dictionary (probe ``hash -> block`` for each block in
  turn until the first miss, as vLLM's ``find_longest_cache_hit`` does).

Hashing the prompt into its block chain is timed apart (both the radix tree and
the dictionary need it; the trie does not). Then the replay speed of the
Mooncake conversation trace, in blocks per second, against the 1M/s bar.

    .venv/bin/python benchmarks/bench_prefix_match.py [--prompt-tokens 8192] [--runs 2000]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from pathlib import Path

from tailgate.plan import prefix_cache as pc
from tailgate.plan import traces

BAR_US = 32.0
BLOCK = 16
TRACE = (Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "llm"
         / "mooncake_conversation_trace.jsonl.gz")


def build(nodes: int, seed: int = 0):
    rng = random.Random(seed)
    systems = [[rng.randrange(128_000) for _ in range(rng.randrange(500, 4000))]
               for _ in range(40)]
    cache = pc.RadixCache(None)
    trie: dict = {}
    table: dict = {}
    convs: list[list[int]] = []
    while cache.nodes < nodes:
        if not convs or rng.random() < 0.3:
            convs.append(list(rng.choice(systems)))
        conv = rng.choice(convs)
        conv += [rng.randrange(128_000) for _ in range(rng.randrange(50, 400))]
        chain = traces.chain_hashes(conv, BLOCK)
        cache.access(chain)
        for h in chain:
            table[h] = True
        node = trie
        for t in conv[:len(chain) * BLOCK]:  # only full blocks are cached anywhere
            node = node.setdefault(t, {})
        conv += [rng.randrange(128_000) for _ in range(rng.randrange(50, 400))]  # the reply
    return cache, trie, table, convs


def per_call_us(fn, arg, runs: int) -> float:
    """Median over batches of the mean CPU time per call, in µs (this process's CPU clock:
    on a shared machine, what one core does, without the time spent waiting for it)."""
    batch = max(1, runs // 20)
    samples = []
    for _ in range(20):
        t0 = time.process_time_ns()
        for _ in range(batch):
            fn(arg)
        samples.append((time.process_time_ns() - t0) / batch / 1000.0)
    return statistics.median(samples)


def trie_lookup(trie: dict, tokens: list[int]) -> int:
    node, n = trie, 0
    for t in tokens:
        node = node.get(t)
        if node is None:
            break
        n += 1
    return n - n % BLOCK


def dict_lookup(table: dict, chain: list[int]) -> int:
    n = 0
    for h in chain:
        if h not in table:
            break
        n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--prompt-tokens", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    cache, trie, table, convs = build(args.nodes)
    rng = random.Random(1)
    # a conversation about 3/4 as long as the prompt, continued by new tokens: a long
    # cached prefix, then a miss
    conv = min(convs, key=lambda c: abs(len(c) - 3 * args.prompt_tokens // 4))
    prompt = (conv + [rng.randrange(128_000) for _ in range(args.prompt_tokens)])
    prompt = prompt[:args.prompt_tokens]
    chain = traces.chain_hashes(prompt, BLOCK)
    hit = cache.lookup(chain)
    assert hit == dict_lookup(table, chain) and hit * BLOCK == trie_lookup(trie, prompt)
    t_hash = per_call_us(lambda p: traces.chain_hashes(p, BLOCK), prompt, args.runs // 10)
    t_radix = per_call_us(cache.lookup, chain, args.runs)
    t_trie = per_call_us(lambda p: trie_lookup(trie, p), prompt, args.runs // 10)
    t_dict = per_call_us(lambda c: dict_lookup(table, c), chain, args.runs)
    print(f"tree: {cache.nodes:,} radix nodes ({cache.hbm_used:,} blocks of {BLOCK} tokens); "
          f"prompt {len(prompt):,} tokens = {len(chain)} blocks, {hit} cached")
    print(f"hashing the prompt into its block chain   {t_hash:9.1f} µs")
    print(f"radix tree match (tailgate)                {t_radix:9.2f} µs   "
          f"{t_radix / BAR_US:.3f}x the {BAR_US:g} µs bar")
    print(f"per-token trie match                       {t_trie:9.1f} µs   "
          f"radix is {t_trie / t_radix:.0f}x faster")
    print(f"vLLM-style block-hash dict probes          {t_dict:9.2f} µs   "
          f"radix is {t_dict / t_radix:.1f}x faster")
    print(f"hash + match: radix {t_hash + t_radix:.1f} µs, dict {t_hash + t_dict:.1f} µs, "
          f"trie {t_trie:.1f} µs")
    _, block, reqs = traces.load(str(TRACE))
    blocks = sum(len(r.chain) for r in reqs)
    unique = pc.unique_blocks(reqs)
    # best of 3, in wall time and in this process's CPU time (on a shared machine the
    # CPU time is what one core does; the wall time includes waiting for it)
    for label, cap in (("unlimited", None), ("1/8 of distinct", unique // 8)):
        wall = cpu = math.inf
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            pc.replay(reqs, block, cap)
            wall = min(wall, time.perf_counter() - t0)
            cpu = min(cpu, time.process_time() - c0)
        print(f"replay Mooncake conversation ({label}): {blocks:,} blocks; CPU "
              f"{cpu * 1000:.0f} ms = {blocks / cpu / 1e6:.2f}M blocks/s "
              f"({blocks / cpu / 1e6:.1f}x the 1M/s bar), wall {wall * 1000:.0f} ms = "
              f"{blocks / wall / 1e6:.2f}M blocks/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
