"""KV-cache sizing from a Hugging Face ``config.json``: bytes per token, and what fits.

Two attention families are cached differently:

* **MHA / GQA / MQA** (Llama, Qwen, Mistral, OPT, GPT-2): every layer keeps a
  key and a value vector per KV head, so one token costs
  ``2 * num_key_value_heads * head_dim`` elements per layer.
* **MLA** (DeepSeek-V2/V3, Kimi K2): every layer keeps one compressed latent
  ``c_KV`` of ``kv_lora_rank`` elements plus the decoupled RoPE key of
  ``qk_rope_head_dim`` elements (DeepSeek-V2 paper, Table 1:
  ``(d_c + d_h^R) * l`` elements per token). Quantizing it (FlashMLA's "FP8 with
  scale" format) quantizes the latent in blocks with one scale per block and
  keeps the RoPE key in bf16, because quantizing the position signal hurts
  accuracy.

A quantized dtype pays for its scales: with ``scale_block`` elements per scale
and ``scale_bytes`` per scale, a vector of ``n`` elements carries
``ceil(n / scale_block) * scale_bytes`` extra bytes. ``scale_block=None`` is a
per-tensor scale (vLLM's ``--kv-cache-dtype fp8``): no per-token overhead.

Capacity follows vLLM's paged allocator: the budget is cut into blocks of
``block_size`` tokens across all layers; whole blocks only, and a sequence
occupies ``ceil(len / block_size)`` of them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from .. import units
from ..errors import InputError

# bits per element of each cache dtype
DTYPE_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
_DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                  "auto": "bf16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8": "fp8"}
QUANTIZED = ("fp8", "int8", "int4")


class ModelConfigError(InputError):
    """A config.json that does not describe a decoder we can size (the message says why)."""


def canonical_dtype(name: str) -> str:
    d = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if d not in DTYPE_BITS:
        raise ModelConfigError(f"unknown dtype {name!r} (one of {', '.join(DTYPE_BITS)})")
    return d


parse_size = units.parse_size  # one rule for every command: see tailgate.units


@dataclass(frozen=True)
class Geometry:
    """The attention shape of a decoder, as far as its KV cache is concerned."""

    kind: str  # "mha" | "gqa" | "mqa" | "mla"
    layers: int
    attention_heads: int
    kv_heads: int  # MLA: 1 (one latent shared by every head)
    head_dim: int  # MHA/GQA: per KV head; MLA: kv_lora_rank
    rope_dim: int = 0  # MLA only: qk_rope_head_dim
    model_type: str = ""
    weights_dtype: str = "bf16"

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Geometry:
        """Read the fields every engine reads from a Hugging Face config.json."""
        if not isinstance(cfg, dict):
            raise ModelConfigError("config.json is not a JSON object")
        if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers nest the decoder
            cfg = {**cfg["text_config"], "model_type": cfg.get("model_type", "")}

        def first(*names: str) -> Any:
            for n in names:
                if cfg.get(n) is not None:
                    return cfg[n]
            return None

        def positive(name: str, value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ModelConfigError(f"{name} must be a positive integer, not {value!r}")
            return value

        layers = first("num_hidden_layers", "n_layer", "num_layers")
        heads = first("num_attention_heads", "n_head")
        if layers is None or heads is None:
            raise ModelConfigError("config.json lacks num_hidden_layers or num_attention_heads")
        layers, heads = positive("num_hidden_layers", layers), positive("num_attention_heads", heads)
        mtype = str(cfg.get("model_type", ""))
        wdtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bf16")
        try:
            wdtype = canonical_dtype(wdtype)
        except ModelConfigError:
            wdtype = "bf16"
        if cfg.get("kv_lora_rank") is not None:
            rank = positive("kv_lora_rank", cfg["kv_lora_rank"])
            rope = positive("qk_rope_head_dim", cfg.get("qk_rope_head_dim"))
            return cls("mla", layers, heads, 1, rank, rope, mtype, wdtype)
        kv = first("num_key_value_heads", "num_kv_heads")
        kv = heads if kv is None else positive("num_key_value_heads", kv)
        if heads % kv:
            raise ModelConfigError(f"num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv}")
        hd = cfg.get("head_dim")
        if hd is None:
            hidden = first("hidden_size", "n_embd", "d_model")
            if hidden is None:
                raise ModelConfigError("config.json lacks head_dim and hidden_size")
            hidden = positive("hidden_size", hidden)
            if hidden % heads:
                raise ModelConfigError(f"hidden_size {hidden} is not a multiple of heads {heads}")
            hd = hidden // heads
        hd = positive("head_dim", hd)
        kind = "mha" if kv == heads else ("mqa" if kv == 1 else "gqa")
        return cls(kind, layers, heads, kv, hd, 0, mtype, wdtype)


@dataclass(frozen=True)
class CacheFormat:
    """How the cache is stored: element dtype and, when quantized, its block scales."""

    dtype: str = "bf16"
    scale_block: int | None = None  # elements per scale; None: per-tensor scale
    scale_bytes: int = 4  # a float32 scale (FlashMLA); 2 for fp16 scales, 1 for e8m0
    rope_dtype: str = "bf16"  # MLA: the RoPE key is kept at this precision

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "rope_dtype", canonical_dtype(self.rope_dtype))
        if self.scale_block is not None and self.scale_block <= 0:
            raise ValueError(f"scale block must be > 0, not {self.scale_block}")
        if self.scale_bytes <= 0:
            raise ValueError(f"scale bytes must be > 0, not {self.scale_bytes}")
        if self.dtype not in QUANTIZED and self.scale_block is not None:
            raise ValueError(f"{self.dtype} is not quantized: it has no scales")


def _elements_bytes(n: int, dtype: str) -> int:
    bits = n * DTYPE_BITS[dtype]
    return (bits + 7) // 8  # int4: two elements a byte, an odd tail padded


def _scale_bytes(n: int, fmt: CacheFormat) -> int:
    if fmt.dtype not in QUANTIZED or fmt.scale_block is None:
        return 0
    return math.ceil(n / fmt.scale_block) * fmt.scale_bytes


PER_TENSOR = "tensor"  # --scale-block tensor: one scale for the whole cache


def cache_format(geo: Geometry, dtype: str, scale_block: int | str | None = None,
                 scale_bytes: int = 4, rope_dtype: str = "bf16") -> CacheFormat:
    """The cache format ``plan kv`` and ``plan prefix-cache`` both size (one rule).

    ``scale_block`` None takes the default: int8/int4 need block scales to be usable and a
    quantized MLA latent has one per 64 (FlashMLA's block-64 format), while fp8 GQA uses a
    per-tensor scale (vLLM); ``"tensor"`` asks for a per-tensor scale explicitly (plain FP8
    MLA: with ``rope_dtype`` fp8 too, latent and RoPE key are one byte each, no scales).
    """
    dtype = canonical_dtype(dtype)
    if scale_block == PER_TENSOR:
        block = None
    elif scale_block is None:
        block = 64 if dtype in ("int8", "int4") or (dtype in QUANTIZED and geo.kind == "mla") \
            else None
    else:
        block = int(scale_block)
    return CacheFormat(dtype, block, scale_bytes, rope_dtype)


@dataclass(frozen=True)
class TokenBytes:
    """One token's cache in one layer, by part, and over all layers."""

    payload: int  # K and V (or the MLA latent) in the cache dtype
    scales: int  # block scales of the quantized parts
    rope: int  # MLA: the RoPE key at its own precision
    layers: int

    @property
    def per_layer(self) -> int:
        return self.payload + self.scales + self.rope

    @property
    def per_token(self) -> int:
        return self.per_layer * self.layers


def token_bytes(geo: Geometry, fmt: CacheFormat) -> TokenBytes:
    """Bytes one token occupies in the cache (each K/V head vector scaled on its own)."""
    if geo.kind == "mla":
        # The latent is quantized; the RoPE key stays at rope_dtype unless the cache is
        # not quantized at all (then both parts share the cache dtype).
        rope_dtype = fmt.rope_dtype if fmt.dtype in QUANTIZED else fmt.dtype
        return TokenBytes(_elements_bytes(geo.head_dim, fmt.dtype),
                          _scale_bytes(geo.head_dim, fmt),
                          _elements_bytes(geo.rope_dim, rope_dtype), geo.layers)
    vectors = 2 * geo.kv_heads  # one K and one V per KV head
    return TokenBytes(vectors * _elements_bytes(geo.head_dim, fmt.dtype),
                      vectors * _scale_bytes(geo.head_dim, fmt), 0, geo.layers)


@dataclass(frozen=True)
class Capacity:
    """What a KV budget holds, in vLLM's paged terms."""

    budget_bytes: int
    block_size: int
    block_bytes: int  # one block across every layer
    blocks: int
    tokens: int  # blocks * block_size: what vLLM logs as "KV cache size: N tokens"
    seq_len: int | None
    sequences: int | None  # concurrent sequences of seq_len tokens

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def capacity(tb: TokenBytes, budget_bytes: int, block_size: int = 16,
             seq_len: int | None = None) -> Capacity:
    """Whole blocks of ``block_size`` tokens that fit ``budget_bytes``; sequences of seq_len."""
    if block_size <= 0:
        raise ValueError(f"block size must be > 0, not {block_size}")
    if seq_len is not None and seq_len <= 0:
        raise ValueError(f"sequence length must be > 0, not {seq_len}")
    block_bytes = tb.per_token * block_size
    blocks = max(budget_bytes, 0) // block_bytes
    seqs = None if seq_len is None else blocks // math.ceil(seq_len / block_size)
    return Capacity(max(budget_bytes, 0), block_size, block_bytes, blocks,
                    blocks * block_size, seq_len, seqs)


def kv_budget(hbm_bytes: int, weights_bytes: int, utilization: float = 0.9,
              reserve_bytes: int = 0) -> int:
    """Bytes left for the KV cache: vLLM's ``gpu_memory_utilization * total - weights - peak``.

    ``reserve_bytes`` stands for the activation peak and CUDA graphs, which an
    engine measures at start-up and a plan can only estimate.
    """
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"utilization must be in (0, 1], not {utilization}")
    return int(hbm_bytes * utilization) - weights_bytes - reserve_bytes


@dataclass(frozen=True)
class Parameters:
    total: int
    active: int  # per token: with MoE, only the routed and shared experts that run


_DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "yi", "internlm2")


def parameters(cfg: dict[str, Any]) -> Parameters:
    """Parameter count of a Llama-style dense decoder or a DeepSeek MLA + MoE one.

    Counted from the shapes the config gives: embeddings (and an untied LM head),
    per layer the attention projections (GQA q/k/v/o, Qwen2's q/k/v biases; or
    MLA's q_a/q_b/kv_a/kv_b/o with their norms), the gated MLP (gate, up, down),
    MoE experts and router, and the RMSNorm weights. Other families raise
    ModelConfigError: give the weights' size instead.
    """
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg.get("model_type", "")}
    geo = Geometry.from_config(cfg)
    mtype = str(cfg.get("model_type", ""))
    if geo.kind != "mla" and mtype not in _DENSE_TYPES and mtype != "":
        raise ModelConfigError(f"cannot count the parameters of model_type {mtype!r}: give the "
                          "weights' size (--weights SIZE)")
    try:
        h = int(cfg["hidden_size"])
        vocab = int(cfg["vocab_size"])
        inter = int(cfg["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        raise ModelConfigError("need hidden_size, vocab_size and intermediate_size to count "
                          "parameters") from None
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + h  # + final norm
    layers, heads = geo.layers, geo.attention_heads
    if geo.kind == "mla":
        try:
            q_lora = cfg.get("q_lora_rank")
            nope, rope = int(cfg["qk_nope_head_dim"]), geo.rope_dim
            v_dim = int(cfg["v_head_dim"])
        except (KeyError, TypeError, ValueError):
            raise ModelConfigError("MLA config lacks qk_nope_head_dim or v_head_dim") from None
        qk = heads * (nope + rope)
        q = h * qk if not q_lora else h * q_lora + q_lora + q_lora * qk
        attn = (q + h * (geo.head_dim + rope) + geo.head_dim
                + geo.head_dim * heads * (nope + v_dim) + heads * v_dim * h)
    else:
        hd, kv = geo.head_dim, geo.kv_heads
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
        if mtype == "qwen2":  # q, k and v carry biases
            attn += heads * hd + 2 * kv * hd
    norms = 2 * h
    mlp_dense = 3 * h * inter
    experts = cfg.get("n_routed_experts")
    if experts:
        moe_inter = int(cfg.get("moe_intermediate_size") or inter)
        shared = int(cfg.get("n_shared_experts") or 0)
        per_tok = int(cfg.get("num_experts_per_tok") or 0)
        dense_layers = int(cfg.get("first_k_dense_replace") or 0)
        expert = 3 * h * moe_inter
        router = experts * h
        moe_total = (experts + shared) * expert + router
        moe_active = (per_tok + shared) * expert + router
        n_moe = layers - dense_layers
        total = embed + layers * (attn + norms) + dense_layers * mlp_dense + n_moe * moe_total
        active = embed + layers * (attn + norms) + dense_layers * mlp_dense + n_moe * moe_active
        return Parameters(total, active)
    total = embed + layers * (attn + norms + mlp_dense)
    return Parameters(total, total)


def weights_dtype(cfg: dict[str, Any]) -> str:
    """The dtype the checkpoint ships in: an fp8 quantization_config, else torch_dtype."""
    q = cfg.get("quantization_config")
    if isinstance(q, dict) and str(q.get("quant_method", "")).lower() == "fp8":
        return "fp8"
    return Geometry.from_config(cfg).weights_dtype


def tensor_parallel(geo: Geometry, tp: int) -> Geometry:
    """The KV geometry one of ``tp`` ranks holds.

    GQA/MHA split their KV heads across ranks (replicated when there are fewer KV
    heads than ranks, as vLLM does); MLA's single latent is replicated on every
    rank, so tensor parallelism does not shrink its per-rank KV cache.
    """
    if tp < 1:
        raise ValueError(f"tensor parallel size must be >= 1, not {tp}")
    if geo.attention_heads % tp:  # vLLM refuses it too (ModelConfig.verify_with_parallel_config)
        raise ValueError(f"total number of attention heads ({geo.attention_heads}) must be "
                         f"divisible by tensor parallel size ({tp})")
    if geo.kind != "mla" and geo.kv_heads % tp and tp % geo.kv_heads:
        raise ValueError(f"{geo.kv_heads} KV heads can be neither split across nor "
                         f"replicated over {tp} tensor-parallel ranks")
    if geo.kind == "mla" or tp == 1:
        return geo
    return Geometry(geo.kind, geo.layers, max(1, geo.attention_heads // tp),
                    max(1, math.ceil(geo.kv_heads / tp)), geo.head_dim, geo.rope_dim,
                    geo.model_type, geo.weights_dtype)


def plan_json(geo: Geometry, fmt: CacheFormat, tb: TokenBytes,
              cap: Capacity | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": {**asdict(geo)},
        "format": asdict(fmt),
        "bytes_per_token_per_layer": {"payload": tb.payload, "scales": tb.scales,
                                      "rope": tb.rope, "total": tb.per_layer},
        "bytes_per_token": tb.per_token,
    }
    if cap is not None:
        out["capacity"] = cap.to_json()
    return out
