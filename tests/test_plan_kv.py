"""`tailgate plan kv`: KV bytes per token against the figures papers and kernels publish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tailgate.plan import kv

CONFIGS = Path(__file__).parent / "fixtures" / "plan" / "configs"


def geo(name: str) -> kv.Geometry:
    return kv.Geometry.from_config(json.loads((CONFIGS / f"{name}.json").read_text()))


def per_token(name: str, **fmt) -> int:
    return kv.token_bytes(geo(name), kv.CacheFormat(**fmt)).per_token


def test_published_bf16_per_token_figures():
    """DeepSeek-V3 70.272 KB, Qwen-2.5 72B 327.680 KB, LLaMA-3.1 405B 516.096 KB per token.

    Source: Zhao et al., "Insights into DeepSeek-V3: Scaling Challenges and
    Reflections on Hardware for AI Architectures" (ISCA 2025, arXiv:2505.09343),
    Table 1 "KV cache size comparison (BF16 precision)"; the same 70 KB vs 516 KB
    appears in secondary write-ups found with the search tool (e.g.
    taojin168.com thread 29712: "reduces KV cache size per token from 516 KB to
    70 KB"; provide.ai "The exact KV cache usage of DeepSeek V4": (512 + 64) * 2
    = 1152 bytes per layer).
    """
    assert per_token("deepseek-v3") == 70_272
    assert per_token("qwen2.5-72b") == 327_680
    assert per_token("llama-3.1-405b") == 516_096


def test_deepseek_v2_mla_equals_gqa_with_2_25_groups():
    """DeepSeek-V2 paper (arXiv:2405.04434) Table 1: MLA caches (d_c + d_h^R) * l elements
    per token, d_c = 4 d_h and d_h^R = d_h / 2, "equal to GQA with only 2.25 groups"."""
    g = geo("deepseek-v2")
    assert g.kind == "mla" and g.layers == 60
    mla = kv.token_bytes(g, kv.CacheFormat("bf16"))
    assert mla.per_layer == (512 + 64) * 2
    # a GQA layer with n_g groups stores 2 * n_g * d_h elements: 2.25 groups of d_h=128
    assert mla.per_layer == 2 * 2.25 * 128 * 2
    assert mla.per_token == 60 * 1152 == 69_120


def test_opt_13b_800_kb_per_token_vllm_paper():
    """Kwon et al., "Efficient Memory Management for LLM Serving with PagedAttention"
    (SOSP 2023, the vLLM paper) §3: for OPT-13B "the KV cache of a single token demands
    800 KB of space, calculated as 2 (key and value vectors) x 5120 (hidden state size)
    x 40 (number of layers) x 2 (bytes per FP16)"."""
    g = geo("opt-13b")
    assert g.kind == "mha" and g.kv_heads == 40
    assert per_token("opt-13b", dtype="fp16") == 2 * 5120 * 40 * 2


def test_llama3_8b_128_kib_and_fp8_halves_it():
    """Llama-3 8B: 128 KiB per token in bf16 (32 layers x 8 KV heads x 128 x 2 x 2 B);
    vLLM's FP8 KV cache (per-tensor scale, docs "Quantized KV Cache") halves it."""
    assert per_token("llama-3.1-8b") == 128 * 1024
    assert per_token("llama-3.1-8b", dtype="fp8") == 64 * 1024


@pytest.mark.parametrize("model,max_len,needed_gib,available_gib,vllm_estimate", [
    ("qwen2.5-14b", 131072, "24.00", 10.91, 59584),
    ("qwen3-8b", 32768, "4.50", 4.47, 32560),
    ("qwen3-8b", 40960, "5.62", 4.50, 32768),
])
def test_vllm_reported_kv_sizes(model, max_len, needed_gib, available_gib, vllm_estimate):
    """vLLM v1's start-up check (vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory)
    as captured in public logs found with the search tool: "To serve at least one request
    with the models's max seq len (N), X GiB KV cache is needed, which is larger than the
    available KV cache memory (Y GiB). Based on the available memory, the estimated maximum
    model length is M."
    * Qwen2.5-14B-Instruct: N=131072, X=24.00, Y=10.91, M=59584 (a research log of
      github.com/reinthal/model-organisms-for-EM, 2026-02-27);
    * DeepSeek-R1-0528-Qwen3-8B (Qwen3-8B shape): N=32768, X=4.50, Y=4.47, M=32560 (a
      deployment note, vllm serve ... --max-model-len 32560);
    * a Qwen3-8B fine-tune: N=40960, X=5.62, Y=4.50, M=32768 (hzqjgthy/vllm,
      KV_Cache_显存不足错误解决方案.md).
    vLLM prints GiB to two decimals, so the available memory is known to +-0.005 GiB: the
    engine's M must lie between tailgate's capacities at those two bounds (whole 16-token
    blocks), and X must be tailgate's bytes for N tokens, printed the same way."""
    tb = kv.token_bytes(geo(model), kv.CacheFormat("bf16"))
    assert f"{tb.per_token * max_len / 2**30:.2f}" == needed_gib
    lo = kv.capacity(tb, int((available_gib - 0.005) * 2**30), 16).tokens
    hi = kv.capacity(tb, int((available_gib + 0.005) * 2**30), 16).tokens
    assert lo <= vllm_estimate <= hi, (lo, vllm_estimate, hi)
    assert hi - lo < 0.003 * vllm_estimate  # the check is tight: two-decimal rounding only


def test_flashmla_fp8_with_scale_format_is_656_bytes():
    """deepseek-ai/FlashMLA README, "FP8 KV Cache": each token's KV cache is 656 bytes:
    512 float8_e4m3 latent values, 4 float32 scales (one per 128 values), and the RoPE
    part as 64 bfloat16 values, "not quantized for accuracy"."""
    tb = kv.token_bytes(geo("deepseek-v3"), kv.CacheFormat("fp8", scale_block=128))
    assert (tb.payload, tb.scales, tb.rope, tb.per_layer) == (512, 16, 128, 656)


def test_mla_block64_scales_int4_and_fp8():
    g = geo("deepseek-v3")
    fp8 = kv.token_bytes(g, kv.CacheFormat("fp8", scale_block=64))
    assert (fp8.payload, fp8.scales, fp8.rope) == (512, 8 * 4, 128)
    int4 = kv.token_bytes(g, kv.CacheFormat("int4", scale_block=64, scale_bytes=2))
    assert (int4.payload, int4.scales, int4.rope) == (256, 8 * 2, 128)
    bf16 = kv.token_bytes(g, kv.CacheFormat("bf16"))
    # the RoPE key does not shrink: int4 saves less than the 4x of the latent alone
    assert bf16.per_layer / int4.per_layer == pytest.approx(1152 / 400)


def test_gqa_int4_block_scales_per_head_vector():
    tb = kv.token_bytes(geo("mistral-7b-v0.1"), kv.CacheFormat("int4", scale_block=64,
                                                             scale_bytes=2))
    # 16 vectors (K and V for 8 heads) of 128 int4 = 64 B each, 2 scales of 2 B each
    assert (tb.payload, tb.scales) == (16 * 64, 16 * 2 * 2)


def test_capacity_whole_blocks_and_sequences():
    tb = kv.token_bytes(geo("llama-3.1-8b"), kv.CacheFormat("bf16"))
    block = 16 * 128 * 1024
    cap = kv.capacity(tb, 10 * block + block - 1, block_size=16, seq_len=33)
    assert (cap.blocks, cap.tokens) == (10, 160)
    assert cap.sequences == 3  # 33 tokens take 3 blocks of 16
    budget = kv.kv_budget(80 * 2**30, 16 * 10**9, 0.9)
    assert budget == int(80 * 2**30 * 0.9) - 16 * 10**9


def params(name: str) -> kv.Parameters:
    return kv.parameters(json.loads((CONFIGS / f"{name}.json").read_text()))


def test_parameter_counts_match_published_sizes():
    """Model cards and papers: Llama-3.1-8B 8.03B (Hugging Face's count 8,030,261,248),
    Llama-3.1-405B 405.85B, Qwen2.5-72B "Number of Parameters: 72.7B" (model card),
    Mistral-7B-v0.1 7.24B; DeepSeek-V2 "236B total parameters, of which 21B are
    activated for each token" (arXiv:2405.04434 abstract); DeepSeek-V3 "671B total
    parameters with 37B activated for each token" (arXiv:2412.19437 abstract; the
    Hugging Face checkpoint's 685B adds the 14B multi-token-prediction module)."""
    assert params("llama-3.1-8b").total == 8_030_261_248
    assert params("llama-3.1-405b").total == pytest.approx(405.85e9, rel=1e-3)
    assert params("qwen2.5-72b").total == pytest.approx(72.7e9, rel=1e-3)
    assert params("mistral-7b-v0.1").total == pytest.approx(7.24e9, rel=1e-3)
    v2, v3 = params("deepseek-v2"), params("deepseek-v3")
    assert v2.total == pytest.approx(236e9, rel=0.005) and v2.active == pytest.approx(21e9,
                                                                                      rel=0.03)
    assert v3.total == pytest.approx(671e9, rel=0.001) and v3.active == pytest.approx(37e9,
                                                                                      rel=0.02)
    assert kv.weights_dtype(json.loads((CONFIGS / "deepseek-v3.json").read_text())) == "fp8"
    with pytest.raises(kv.ModelConfigError, match="model_type 'opt'"):
        params("opt-13b")


def test_tensor_parallel_splits_gqa_heads_and_replicates_mla():
    llama = kv.tensor_parallel(geo("llama-3.1-405b"), 8)
    assert llama.kv_heads == 1
    assert kv.token_bytes(llama, kv.CacheFormat()).per_token == 516_096 // 8
    # 16 ranks for 8 KV heads: each head is held twice (vLLM replicates), never less than one
    assert kv.tensor_parallel(geo("llama-3.1-405b"), 16).kv_heads == 1
    ds = kv.tensor_parallel(geo("deepseek-v3"), 8)
    assert kv.token_bytes(ds, kv.CacheFormat()).per_token == 70_272


def test_cli_weights_counted_and_split_across_ranks():
    r = run_cli("kv", str(CONFIGS / "deepseek-v3.json"), "--dtype", "fp8", "--hbm", "141GB",
                "--tp", "8", "--seq-len", "32768", "--json", "-")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    w = data["weights"]
    assert w["dtype"] == "fp8" and w["bytes"] == w["parameters"]
    assert w["bytes_per_rank"] == -(-w["bytes"] // 8)
    assert data["capacity"]["budget_bytes"] == int(141e9 * 0.9) - w["bytes_per_rank"]
    r = run_cli("kv", str(CONFIGS / "opt-13b.json"), "--hbm", "80GB")
    assert r.returncode == 2 and "--weights SIZE" in r.stderr


def test_bad_configs_are_clear_errors():
    with pytest.raises(kv.ModelConfigError, match="num_hidden_layers"):
        kv.Geometry.from_config({"hidden_size": 10})
    with pytest.raises(kv.ModelConfigError, match="multiple"):
        kv.Geometry.from_config({"num_hidden_layers": 2, "num_attention_heads": 6,
                                 "num_key_value_heads": 4, "hidden_size": 60})
    with pytest.raises(kv.ModelConfigError, match="qk_rope_head_dim"):
        kv.Geometry.from_config({"num_hidden_layers": 2, "num_attention_heads": 2,
                                 "kv_lora_rank": 512})
    with pytest.raises(kv.ModelConfigError, match="unknown dtype"):
        kv.CacheFormat("fp7")
    with pytest.raises(ValueError, match="not a size"):
        kv.parse_size("lots")
    assert kv.parse_size("80GiB") == 80 * 2**30 and kv.parse_size("141GB") == 141 * 10**9


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailgate", "plan", *argv],
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_kv_json_and_text(tmp_path):
    r = run_cli("kv", str(CONFIGS / "deepseek-v3.json"), "--dtype", "fp8", "--hbm", "141GB",
                "--weights", "85GB", "--seq-len", "32768", "--json", "-")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert (data["tailgate_plan"], data["kind"]) == (1, "kv")
    assert data["bytes_per_token_per_layer"] == {"payload": 512, "scales": 32, "rope": 128,
                                                 "total": 672}
    cap = data["capacity"]
    assert cap["budget_bytes"] == int(141e9 * 0.9) - 85 * 10**9
    assert cap["tokens"] == cap["blocks"] * 16
    assert cap["sequences"] == cap["blocks"] // (32768 // 16)
    r = run_cli("kv", str(CONFIGS / "qwen2.5-72b.json"))
    assert r.returncode == 0 and "327,680 B" in r.stdout


def test_cli_kv_bad_input_exit_2(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"num_hidden_layers": 2}')
    r = run_cli("kv", str(tmp_path))
    assert r.returncode == 2 and "num_attention_heads" in r.stderr
    r = run_cli("kv", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "no such config" in r.stderr
    r = run_cli("kv", str(CONFIGS / "llama-3.1-8b.json"), "--hbm", "16GB", "--weights", "16GB")
    assert r.returncode == 2 and "nothing left" in r.stderr
