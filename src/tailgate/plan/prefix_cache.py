"""A two-tier prefix cache (HBM, then host DRAM) over block-hash chains, for trace replay.

Theory of operation. A prompt is a chain of block hashes: block i's hash
covers every token up to the end of block i (vLLM hashes ``(parent, tokens)``;
Mooncake's traces ship the chain as ``hash_ids``), so two prompts share a cached
block exactly when they share the whole prefix up to it. The cache is a radix
tree over those chains with path compression (SGLang's RadixAttention): a node
holds a run of blocks (its edge) that no request has ever split, so matching a
long prompt costs one dictionary probe and one list comparison per node, not
per block, and a node is split only where two prompts diverge.

Each node lives in one tier: HBM (the engine's KV cache), DRAM (host memory,
offloaded KV) or nowhere (removed). The HBM set is kept prefix-closed —
evictions take HBM *leaves* only (nodes with no child in HBM) — so the cached
part of a prompt is always a prefix. An HBM leaf evicted is demoted to DRAM
when there is a DRAM tier (and removed otherwise); a DRAM leaf evicted is
removed. A request:

1. walks the tree from the root as far as its chain matches (splitting the
   last node if the match ends inside its edge); blocks on that path in HBM
   are HBM hits, blocks in DRAM are DRAM hits (they must be loaded);
2. pins the path, promotes the DRAM part to HBM and inserts the blocks it
   missed as a new HBM leaf, evicting (never a pinned node) to make room; a
   prompt longer than HBM caches only the prefix that fits.

Which leaf goes first is the policy: ``lru`` (least recently used leaf, whole
nodes: the tree's own leaf-first pruning as in SGLang), ``block-lru`` (the same
order, but only as many blocks as needed, from the leaf's tail: vLLM frees a
request's blocks tail first into an LRU queue and reuses them one by one) or
``weighted`` (lowest ``R * last_use + F * hits - D * depth_in_blocks``: recency,
frequency, and deep, specific prefixes before shallow shared ones). Priorities sit in a heap
with lazy invalidation: a node pushes a new entry when its priority changes,
stale entries are skipped when popped.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

NONE, HBM, DRAM = 0, 1, 2
POLICIES = ("lru", "block-lru", "weighted")


class Node:
    __slots__ = ("children", "depth", "hbm_children", "hits", "key", "last", "parent", "pin",
                 "tier", "version")

    def __init__(self, key: list, parent: Node | None, tier: int, depth: int) -> None:
        self.key = key  # the edge: block hashes from the parent to here
        self.parent = parent
        self.children: dict = {}  # first hash of a child's edge -> child
        self.tier = tier
        self.depth = depth  # blocks from the root to the end of this edge
        self.hbm_children = 0
        self.hits = 0
        self.last = 0
        self.pin = -1
        self.version = 0


@dataclass(frozen=True)
class Policy:
    name: str = "lru"  # "lru", "block-lru" or "weighted"
    recency: float = 1.0
    frequency: float = 1.0
    depth: float = 0.01

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"eviction policy must be one of {', '.join(POLICIES)}, "
                             f"not {self.name!r}")

    @property
    def per_block(self) -> bool:
        """Evict only the blocks needed, from a leaf's tail (vLLM's free-block queue)."""
        return self.name == "block-lru"

    def score(self, node: Node) -> float:
        if self.name != "weighted":
            return node.last
        return self.recency * node.last + self.frequency * node.hits - self.depth * node.depth


class RadixCache:
    """The two-tier tree. Capacities are in blocks; ``None`` is unlimited."""

    def __init__(self, hbm_blocks: int | None, dram_blocks: int = 0,
                 policy: Policy | None = None) -> None:
        if hbm_blocks is not None and hbm_blocks < 0 or dram_blocks < 0:
            raise ValueError("capacities must be >= 0")
        self.hbm_cap = hbm_blocks
        self.dram_cap = dram_blocks
        self.policy = policy or Policy()
        self.root = Node([], None, NONE, 0)
        self.hbm_used = 0
        self.dram_used = 0
        self.nodes = 0
        self._heaps: dict[int, list] = {HBM: [], DRAM: []}
        self._seq = 0
        self._clock = 0

    # -- matching -----------------------------------------------------------------------

    def match(self, chain: Sequence) -> list[Node]:
        """Nodes on the longest cached prefix of ``chain`` (the last one split to fit)."""
        node, i, n, path = self.root, 0, len(chain), []
        children = node.children
        while i < n:
            child = children.get(chain[i])
            if child is None:
                break
            key = child.key
            k = len(key)
            if chain[i:i + k] == key:
                path.append(child)
                i += k
                children = child.children
                continue
            m = 1  # the first block matched (it is the dictionary key)
            while m < k and i + m < n and chain[i + m] == key[m]:
                m += 1
            path.append(self._split(child, m))
            break
        return path

    def lookup(self, chain: Sequence) -> int:
        """Blocks of ``chain`` cached in any tier, without changing the tree (no split)."""
        children, i, n = self.root.children, 0, len(chain)
        while i < n:
            child = children.get(chain[i])
            if child is None:
                return i
            key = child.key
            k = len(key)
            if chain[i:i + k] != key:
                m = 1
                while m < k and i + m < n and chain[i + m] == key[m]:
                    m += 1
                return i + m
            i += k
            children = child.children
        return i

    def _split(self, node: Node, m: int) -> Node:
        """Cut node's edge after m blocks; returns the new upper node (same tier)."""
        parent = node.parent
        upper = Node(node.key[:m], parent, node.tier, node.depth - len(node.key) + m)
        upper.hits, upper.last = node.hits, node.last
        node.key = node.key[m:]
        node.parent = upper
        upper.children[node.key[0]] = node
        upper.hbm_children = 1 if node.tier == HBM else 0
        parent.children[upper.key[0]] = upper
        self.nodes += 1
        return upper  # not a leaf of any tier: no heap entry needed

    # -- one request --------------------------------------------------------------------

    def access(self, chain: Sequence) -> tuple[int, int]:
        """Replay one prompt: (blocks hit in HBM, blocks hit in DRAM); then cache it."""
        self._clock += 1
        now = self._clock
        path = self.match(chain)
        hbm_hit = dram_hit = 0
        for p in path:
            if p.tier == HBM:
                hbm_hit += len(p.key)
            else:
                dram_hit += len(p.key)
            p.pin = now
            p.hits += 1
            p.last = now
        matched = hbm_hit + dram_hit
        # promote the DRAM part of the path (it is a suffix of the path: HBM is prefix-closed)
        pinned = hbm_hit
        if dram_hit:
            for p in path:
                if p.tier == DRAM:
                    if not self._make_room(HBM, len(p.key), now):
                        break
                    self._move(p, HBM)
                    pinned += len(p.key)
        # insert what was missed, as much as fits
        rest = len(chain) - matched
        parent = path[-1] if path else self.root
        if rest > 0 and (not path or parent.tier == HBM):
            room = rest if self.hbm_cap is None else min(rest, self.hbm_cap - pinned)
            if room > 0 and self._make_room(HBM, room, now):
                leaf = Node(list(chain[matched:matched + room]), parent, HBM, matched + room)
                leaf.hits, leaf.last, leaf.pin = 1, now, now
                parent.children[leaf.key[0]] = leaf
                self.nodes += 1
                self.hbm_used += room
                if parent is not self.root:
                    parent.hbm_children += 1
                self._push(leaf)
        for p in path:  # re-rank the path's leaves (inner nodes are never evicted first)
            if p.hbm_children == 0 if p.tier == HBM else not p.children:
                self._push(p)
        return hbm_hit, dram_hit

    # -- tiers and eviction ----------------------------------------------------------------

    def _is_leaf(self, node: Node) -> bool:
        if node.tier == HBM:
            return node.hbm_children == 0
        return not node.children

    def _push(self, node: Node) -> None:
        if node.tier == NONE or not self._is_leaf(node):
            return
        node.version += 1
        self._seq += 1
        heapq.heappush(self._heaps[node.tier],
                       (self.policy.score(node), self._seq, node.version, node))

    def _move(self, node: Node, tier: int) -> None:
        """Change a node's tier, keeping the counts and the parent's leaf status right."""
        size = len(node.key)
        parent = node.parent
        if node.tier == HBM:
            self.hbm_used -= size
            if parent is not self.root:
                parent.hbm_children -= 1
        elif node.tier == DRAM:
            self.dram_used -= size
        node.tier = tier
        if tier == HBM:
            self.hbm_used += size
            if parent is not self.root:
                parent.hbm_children += 1
        elif tier == DRAM:
            self.dram_used += size
        if tier == NONE:
            del parent.children[node.key[0]]
            node.parent = None
            self.nodes -= 1
        if parent is not self.root:
            self._push(parent)  # it may have become a leaf of its tier
        self._push(node)

    def _make_room(self, tier: int, blocks: int, now: int) -> bool:
        """Evict leaves of ``tier`` until ``blocks`` fit; False if pinned nodes block it."""
        cap = self.hbm_cap if tier == HBM else self.dram_cap
        if cap is None:
            return True
        if blocks > cap:
            return False
        heap = self._heaps[tier]
        skipped = []
        ok = True
        while (self.hbm_used if tier == HBM else self.dram_used) + blocks > cap:
            if not heap:
                ok = False
                break
            entry = heapq.heappop(heap)
            node = entry[3]
            if entry[2] != node.version or node.tier != tier or not self._is_leaf(node):
                continue
            if node.pin == now:
                skipped.append(entry)
                continue
            excess = (self.hbm_used if tier == HBM else self.dram_used) + blocks - cap
            if self.policy.per_block and len(node.key) > excess:
                self._split(node, len(node.key) - excess)  # node keeps the tail it loses
            self._evict(node, now)
        for entry in skipped:
            heapq.heappush(heap, entry)
        return ok

    def _evict(self, node: Node, now: int) -> None:
        if node.tier == HBM and self.dram_cap > 0 and len(node.key) <= self.dram_cap:
            if self._make_room(DRAM, len(node.key), now):
                self._move(node, DRAM)
                return
        # removed: a DRAM subtree below it goes too (it would be unreachable)
        for child in list(node.children.values()):
            self._drop(child)
        self._move(node, NONE)

    def _drop(self, node: Node) -> None:
        for child in list(node.children.values()):
            self._drop(child)
        self._move(node, NONE)


# -- replay ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One prompt: its block-hash chain (full blocks only) and its token counts."""

    chain: list
    input_tokens: int
    timestamp_ms: float = 0.0


@dataclass
class Replay:
    """What a replay counted (tokens, so blocks of different requests weigh the same)."""

    block_size: int
    requests: int = 0
    blocks: int = 0
    input_tokens: int = 0
    hbm_hit_tokens: int = 0
    dram_hit_tokens: int = 0
    dram_hits_per_request: list = field(default_factory=list)  # blocks, for prefetch
    # prompts longer than the HBM tier holds: an engine cannot run them (every block of a
    # sequence must be in HBM at once), so none of their tokens is a hit from either tier
    too_long: int = 0

    @property
    def hit_tokens(self) -> int:
        return self.hbm_hit_tokens + self.dram_hit_tokens

    def rate(self, tokens: int) -> float:
        return tokens / self.input_tokens if self.input_tokens else 0.0

    def to_json(self) -> dict:
        return {"requests": self.requests, "blocks": self.blocks,
                "input_tokens": self.input_tokens, "block_size": self.block_size,
                "too_long_for_hbm": self.too_long,
                "hit_rate": {"hbm": self.rate(self.hbm_hit_tokens),
                             "dram": self.rate(self.dram_hit_tokens),
                             "total": self.rate(self.hit_tokens)}}


def replay(requests: Iterable[Request], block_size: int, hbm_blocks: int | None,
           dram_blocks: int = 0, policy: Policy | None = None) -> Replay:
    cache = RadixCache(hbm_blocks, dram_blocks, policy)
    out = Replay(block_size)
    access = cache.access
    per_req = out.dram_hits_per_request
    for r in requests:
        out.requests += 1
        out.blocks += len(r.chain)
        out.input_tokens += r.input_tokens
        if hbm_blocks is not None and -(-r.input_tokens // block_size) > hbm_blocks:
            out.too_long += 1  # refused by the engine: no hit, and nothing cached
            per_req.append(0)
            continue
        h, d = access(r.chain)
        out.hbm_hit_tokens += h * block_size
        out.dram_hit_tokens += d * block_size
        per_req.append(d)
    return out


def unique_blocks(requests: Iterable[Request]) -> int:
    """Distinct blocks in a trace (distinct prefixes): the capacity that never evicts."""
    cache = RadixCache(None)
    for r in requests:
        cache.access(r.chain)
    return cache.hbm_used


@dataclass(frozen=True)
class CurvePoint:
    hbm_blocks: int
    hit_rate: float
    hbm_hit_rate: float
    dram_hit_rate: float


def capacity_curve(requests: Sequence[Request], block_size: int, capacities: Sequence[int],
                   dram_blocks: int = 0, policy: Policy | None = None) -> list[CurvePoint]:
    out = []
    for cap in capacities:
        r = replay(requests, block_size, cap, dram_blocks, policy)
        out.append(CurvePoint(cap, r.rate(r.hit_tokens), r.rate(r.hbm_hit_tokens),
                              r.rate(r.dram_hit_tokens)))
    return out


def smallest_capacity(requests: Sequence[Request], block_size: int, target: float,
                      hi: int, dram_blocks: int = 0, policy: Policy | None = None,
                      tier: str = "total") -> int | None:
    """Fewest HBM blocks whose replay reaches hit rate ``target`` (bisection; None if even
    ``hi`` does not). Hit rate grows with capacity for these policies up to noise, so
    bisection finds the threshold to within one step of the curve."""

    def rate(cap: int) -> float:
        r = replay(requests, block_size, cap, dram_blocks, policy)
        return r.rate(r.hbm_hit_tokens if tier == "hbm" else r.hit_tokens)

    if rate(hi) < target:
        return None
    lo = 0
    while hi - lo > max(1, hi // 200):  # 0.5 % of the range is fine for a plan
        mid = (lo + hi) // 2
        if rate(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


# -- prefetch from DRAM ---------------------------------------------------------------------


@dataclass(frozen=True)
class Prefetch:
    loaded_bytes: int
    in_time_share: float  # of DRAM-hit tokens, loaded within the window after arrival
    delay_p50_ms: float
    delay_p99_ms: float


def prefetch(requests: Sequence[Request], dram_hits: Sequence[int], block_bytes: int,
             bandwidth_bytes_s: float, window_ms: float) -> Prefetch:
    """DRAM->HBM loads on one link of ``bandwidth_bytes_s``, first come first served.

    A request's load starts at its arrival (an asynchronous prefetch issued by the
    scheduler) or when the link frees up, whichever is later; its DRAM hits count
    as in time if the load ends within ``window_ms`` of arrival (the time its
    prefill would wait anyway). Others have to wait, or recompute.
    """
    if bandwidth_bytes_s <= 0:
        raise ValueError("bandwidth must be > 0")
    free = 0.0
    delays, in_time, total = [], 0, 0
    loaded = 0
    for r, d in zip(requests, dram_hits, strict=True):
        if d == 0:
            continue
        size = d * block_bytes
        start = max(r.timestamp_ms, free)
        free = start + 1000.0 * size / bandwidth_bytes_s
        delay = free - r.timestamp_ms
        delays.append(delay)
        loaded += size
        total += d
        if delay <= window_ms:
            in_time += d
    if not delays:
        return Prefetch(0, 1.0, 0.0, 0.0)
    delays.sort()
    return Prefetch(loaded, in_time / total, delays[len(delays) // 2],
                    delays[min(len(delays) - 1, int(0.99 * len(delays)))])
