"""What one plan is: its options as given (``KvOptions`` ...: the command-line flags, named
as they are, with the command's defaults) and its input read and checked, in a frozen spec
(:class:`KvSpec`, :class:`SpecdecSpec`, :class:`FanoutSpec`, :class:`PrefixCacheSpec`).

The ``plan`` command builds its spec here, and so does Python::

    from tailgate.plan import KvSpec, run
    doc = run(KvSpec.of("config.json", dtype="fp8", hbm="141GB", tp=8))
    print(doc["capacity"]["tokens"])

Every refusal is a :class:`~tailgate.errors.UsageError` naming the option or the file (exit
status 2); the input files are read here, through the hardened reader (:mod:`.inputs`).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..errors import UsageError
from . import inputs

Say = Callable[[str], None]


def _quiet(text: str) -> None:
    pass


def finite(value: float, flag: str, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False) -> float:
    """``value`` of option ``flag`` if finite and within [lo, hi] (lo excluded with lo_open)."""
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


def at_least(value: int | None, flag: str, lo: int) -> None:
    if value is not None and value < lo:
        raise UsageError(f"{flag} {value}: must be >= {lo}")


def _one_of(value: str | None, flag: str, choices: tuple[str, ...]) -> None:
    # argparse checks these on the command line; a library caller is told the same way
    if value is not None and value not in choices:
        raise UsageError(f"{flag} {value}: one of {', '.join(choices)}")


class _Options:
    """Options named as the command's flags, with the command's defaults; built from a
    parsed command line or from keywords."""

    KIND = ""

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace):
        given = vars(ns)
        return cls(**{f.name: (tuple(given[f.name]) if isinstance(given[f.name], list)
                               else given[f.name]) for f in fields(cls) if f.name in given})

    @classmethod
    def of(cls, options: dict[str, Any]):
        unknown = set(options) - {f.name for f in fields(cls)}
        if unknown:
            raise UsageError(f"no plan {cls.KIND} option {', '.join(sorted(unknown))}")
        # numbers accepted where the command line takes text: hbm=20000 blocks, tp=8
        text = {f.name for f in fields(cls) if f.type in ("str", "str | None")}
        return cls(**{k: (str(v) if k in text and isinstance(v, int | float)
                          and not isinstance(v, bool) else v) for k, v in options.items()})


# -- kv ---------------------------------------------------------------------------------


def scale_block(text: str) -> int | str:
    """``--scale-block``: a number of elements >= 1, or ``tensor``."""
    if text.strip().lower() == "tensor":
        return "tensor"
    if not (text.strip().isascii() and text.strip().isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of elements >= 1, or tensor")
    return int(text)


@dataclass(frozen=True)
class KvOptions(_Options):
    KIND = "kv"
    dtype: str = "bf16"
    scale_block: int | str | None = None
    scale_bytes: int = 4
    rope_dtype: str = "bf16"
    hbm: str | None = None
    weights: str = "auto"
    weight_dtype: str | None = None
    tp: int = 1
    reserve: str = "0"
    utilization: float = 0.9
    budget: str | None = None
    block_size: int = 16
    seq_len: int | None = None


@dataclass(frozen=True)
class KvSpec:
    """A model's config.json (``path``, parsed as ``config``) and how its cache is sized."""

    options: KvOptions
    path: str
    config: Any

    @classmethod
    def of(cls, config: str, **options: Any) -> KvSpec:
        if isinstance(options.get("scale_block"), str):  # "64" or "tensor", as on the CLI
            try:
                options["scale_block"] = scale_block(options["scale_block"])
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"--scale-block {exc}") from None
        return build_kv(config, KvOptions.of(options))


def build_kv(config: str, opts: KvOptions) -> KvSpec:
    at_least(opts.tp, "--tp", 1)
    at_least(opts.block_size, "--block-size", 1)
    at_least(opts.seq_len, "--seq-len", 1)
    at_least(opts.scale_bytes, "--scale-bytes", 1)
    finite(opts.utilization, "--utilization", 0.0, 1.0, lo_open=True)
    path = os.path.join(config, "config.json") if os.path.isdir(config) else config
    return KvSpec(opts, path, inputs.read_json(path, "config"))


# -- specdec ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecdecOptions(_Options):
    KIND = "specdec"
    alpha: float | None = None
    metrics: str | None = None
    probs: str | None = None
    top_p: float | None = None
    gamma: int | None = None
    cost: float = 0.05
    candidate: tuple[str, ...] = ()
    concurrency: int = 1
    bound: str = "latency"
    domain: str = "general"


@dataclass(frozen=True)
class SpecdecSpec:
    """The acceptance rate ``alpha`` (given, from an engine's counters or from logged
    probabilities; None when only candidates are compared), the draft length, and the
    measured candidates."""

    options: SpecdecOptions
    candidates: tuple[Any, ...]  # specdec.Candidate
    alpha: float | None
    gamma: int
    engine: dict[str, Any] | None  # --metrics: the counters
    estimate: dict[str, Any] | None  # --probs: how alpha was estimated

    @classmethod
    def of(cls, **options: Any) -> SpecdecSpec:
        if isinstance(options.get("candidate"), list):
            options["candidate"] = tuple(options["candidate"])
        return build_specdec(SpecdecOptions.of(options))


def build_specdec(opts: SpecdecOptions) -> SpecdecSpec:
    from . import specdec

    if opts.alpha is not None:
        finite(opts.alpha, "--alpha", 0.0, 1.0)
    if opts.top_p is not None:
        finite(opts.top_p, "--top-p", 0.0, 1.0, lo_open=True)
    finite(opts.cost, "--cost", 0.0)
    at_least(opts.gamma, "--gamma", 1)
    at_least(opts.concurrency, "--concurrency", 1)
    try:
        candidates = tuple(specdec.candidates_from_specs(opts.candidate))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    alpha, gamma = opts.alpha, opts.gamma
    engine = estimate = None
    if candidates and alpha is None and opts.metrics is None:
        return SpecdecSpec(opts, candidates, None, 4 if gamma is None else gamma, None, None)
    if opts.metrics:
        alpha, gamma, engine = inputs.alpha_from_metrics(opts.metrics, gamma)
    if opts.probs:
        alpha, estimate = inputs.alpha_from_probs(opts.probs, opts.top_p)
    if alpha is None:
        raise UsageError("give --alpha, --metrics, --probs or --candidate")
    return SpecdecSpec(opts, candidates, alpha, 4 if gamma is None else gamma, engine,
                       estimate)


# -- fanout -----------------------------------------------------------------------------

MAX_MONTE_CARLO = 10_000_000


@dataclass(frozen=True)
class FanoutOptions(_Options):
    KIND = "fanout"
    fanout: int = 1
    hops: int = 1
    hedge_after: str | None = None
    monte_carlo: int = 0
    seed: int = 0


@dataclass(frozen=True)
class FanoutSpec:
    """The leaf's latency (``leaf``, in ns, read from ``source``: ``what`` says which kind
    of file) and the request's shape; ``delay_ns`` is the hedge's, resolved against it."""

    options: FanoutOptions
    source: str
    leaf: Any  # fanout.Dist
    what: str
    delay_ns: float | None

    @classmethod
    def of(cls, source: str, **options: Any) -> FanoutSpec:
        return build_fanout(source, FanoutOptions.of(options))


def build_fanout(source: str, opts: FanoutOptions) -> FanoutSpec:
    if opts.fanout < 1 or opts.hops < 1:
        raise UsageError("--fanout and --hops must be >= 1")
    at_least(opts.monte_carlo, "--monte-carlo", 0)
    if opts.monte_carlo > MAX_MONTE_CARLO:
        raise UsageError(f"--monte-carlo {opts.monte_carlo}: at most {MAX_MONTE_CARLO:,} "
                         "simulated requests (each holds fan-out x hops samples in memory)")
    leaf, what = inputs.leaf(source)
    delay = _hedge_delay(opts.hedge_after, leaf, what) if opts.hedge_after else None
    return FanoutSpec(opts, source, leaf, what, delay)


def _hedge_delay(asked: str, leaf, what: str) -> float:
    """``--hedge-after``: a leaf percentile (p95, p99.9) or a time (5ms), in ns."""
    from ..bench.units import parse_duration

    h = asked.strip().lower()
    try:
        if not h.startswith("p"):
            return parse_duration(h) * 1e9
        digits = h[1:]
        if not digits or not digits.replace(".", "", 1).isdigit():
            raise ValueError(h)
        # p95 = 0.95, p999 = 0.999; p99.9 = 99.9 %
        q = (float(digits) / 100 if "." in digits
             else float("0." + digits) if not digits.startswith("100") else 1.0)
        if not 0 < q <= 1:
            raise ValueError(h)
        if what == "bench JSON percentiles":
            _table_has(leaf, q, asked)
        return leaf.quantile(q)
    except ValueError:
        raise UsageError(f"--hedge-after {asked}: a percentile (p95, p99, p99.9) or a time "
                         "(5ms)") from None


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


# -- prefix-cache -----------------------------------------------------------------------


@dataclass(frozen=True)
class PrefixCacheOptions(_Options):
    KIND = "prefix-cache"
    format: str | None = None
    block_size: int = 16
    limit: int | None = None
    hbm: str | None = None
    dram: str = "0"
    kv_config: str | None = None
    kv_dtype: str = "bf16"
    bytes_per_token: int | None = None
    policy: str = "lru"
    weights: str = "1,1,0.01"
    target: float = 0.9
    curve: int = 8
    prefetch_bandwidth: str | None = None
    prefetch_window: str = "50ms"


@dataclass(frozen=True)
class PrefixCacheSpec:
    """A trace's requests as block chains, and the cache they replay through: tiers in
    blocks, the eviction policy, the prefetch model (bytes/s and window in ms)."""

    options: PrefixCacheOptions
    trace: str
    format: str
    block: int  # tokens per block (the trace's own for Mooncake)
    requests: tuple[Any, ...]  # prefix_cache.Request
    block_bytes: int | None  # KV bytes of one block, when the size per token is known
    policy: Any  # prefix_cache.Policy
    dram_blocks: int
    hbm_blocks: int | None  # None: no --hbm replay
    prefetch: tuple[float, float] | None  # (bandwidth bytes/s, window ms)

    @classmethod
    def of(cls, trace: str, *, say: Say = _quiet, **options: Any) -> PrefixCacheSpec:
        return build_prefix_cache(trace, PrefixCacheOptions.of(options), say)


def build_prefix_cache(trace: str, opts: PrefixCacheOptions, say: Say = _quiet
                       ) -> PrefixCacheSpec:
    from . import kv, traces
    from . import prefix_cache as pc

    if opts.limit is not None and opts.limit <= 0:
        raise UsageError("--limit must be > 0")
    if not 0 < opts.target <= 1:
        raise UsageError("--target must be in (0, 1]")
    _one_of(opts.policy, "--policy", ("lru", "block-lru", "weighted"))
    _one_of(opts.format, "--format", ("mooncake", "tokens", "azure"))
    try:
        r, f, d = (finite(float(x), "--weights") for x in opts.weights.split(","))
        policy = pc.Policy(opts.policy, r, f, d)
    except ValueError:
        raise UsageError(f"--weights {opts.weights}: expected R,F,D numbers") from None
    at_least(opts.block_size, "--block-size", 1)
    at_least(opts.curve, "--curve", 0)
    at_least(opts.bytes_per_token, "--bytes-per-token", 1)
    finite(opts.target, "--target", 0.0, 1.0, lo_open=True)
    say(f"reading {os.path.basename(trace)}")
    try:
        fmt, block, reqs = traces.load_lines(inputs.read_trace(trace), opts.format,
                                             opts.block_size, opts.limit)
    except ValueError as exc:
        raise UsageError(f"{trace}: {exc}") from None
    if not reqs:
        raise UsageError(f"{trace}: no requests")
    per_token = opts.bytes_per_token
    if opts.kv_config:
        try:
            geo = kv.Geometry.from_config(inputs.read_json(opts.kv_config, "config"))
            # the format `plan kv --dtype` sizes, scales included: the two always agree
            per_token = kv.token_bytes(geo, kv.cache_format(geo, opts.kv_dtype)).per_token
        except ValueError as exc:
            raise UsageError(f"{opts.kv_config}: {exc}") from None
    block_bytes = per_token * block if per_token else None
    dram = capacity(opts.dram, block_bytes, "--dram", block)
    hbm = capacity(opts.hbm, block_bytes, "--hbm", block) if opts.hbm else None
    prefetch = None
    if hbm is not None and opts.prefetch_bandwidth:
        prefetch = _prefetch(opts, block_bytes)
    return PrefixCacheSpec(opts, trace, fmt, block, tuple(reqs), block_bytes, policy, dram,
                           hbm, prefetch)


def _prefetch(opts: PrefixCacheOptions, block_bytes: int | None) -> tuple[float, float]:
    from ..bench.units import parse_duration
    from .kv import parse_size

    if not block_bytes:
        raise UsageError("--prefetch-bandwidth needs --kv-config or --bytes-per-token")
    try:
        return (parse_size(opts.prefetch_bandwidth.removesuffix("/s")),
                parse_duration(opts.prefetch_window) * 1000.0)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def capacity(text: str, block_bytes: int | None, what: str, block: int = 1) -> int:
    """Blocks from '20000' (blocks), '2M tokens' / '500ktok' (whole blocks), or '40GB'."""
    from .kv import parse_size

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


Spec = KvSpec | SpecdecSpec | FanoutSpec | PrefixCacheSpec
