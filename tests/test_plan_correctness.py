"""`tailgate plan` answers that were wrong: plain FP8 MLA, prefix-cache and kv agreeing on
bytes per token, prompts longer than HBM, one gamma cap, "none" for break-even, --tp."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tailgate import cli
from tailgate.plan import kv, specdec
from tailgate.plan import prefix_cache as pc

CONFIGS = Path(__file__).parent / "fixtures" / "plan" / "configs"
DSV3 = CONFIGS / "deepseek-v3.json"
QWEN72 = CONFIGS / "qwen2.5-72b.json"  # 64 query heads, 8 KV heads
MOONCAKE_HEAD = Path(__file__).parent / "fixtures" / "llm" / "mooncake_conversation_head.jsonl"


@pytest.fixture(autouse=True)
def _keep_signal_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def plan_json(capsys, *argv: str) -> dict:
    rc = cli.main(["plan", *argv, "--json", "-"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


def test_deepseek_mla_fp8_default_and_plain(capsys):
    # FlashMLA's "FP8 with scale": latent 512 B + 8 float32 scales + RoPE key in bf16 (128 B)
    default = plan_json(capsys, "kv", str(DSV3), "--dtype", "fp8")
    assert default["bytes_per_token"] == 40_992 == (512 + 32 + 128) * 61
    # plain FP8: latent and RoPE key one byte each, one per-tensor scale
    plain = plan_json(capsys, "kv", str(DSV3), "--dtype", "fp8", "--rope-dtype", "fp8",
                      "--scale-block", "tensor")
    assert plain["bytes_per_token"] == 35_136 == (512 + 64) * 61
    assert plain["bytes_per_token_per_layer"]["scales"] == 0


@pytest.mark.parametrize("config", ["deepseek-v3.json", "qwen2.5-72b.json", "llama-3.1-8b.json",
                                    "opt-13b.json"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8", "int8", "int4"])
def test_prefix_cache_bytes_per_token_is_plan_kvs_exactly(capsys, config, dtype):
    want = plan_json(capsys, "kv", str(CONFIGS / config), "--dtype", dtype)["bytes_per_token"]
    got = plan_json(capsys, "prefix-cache", str(MOONCAKE_HEAD), "--kv-config",
                    str(CONFIGS / config), "--kv-dtype", dtype, "--curve", "0")
    assert got["block_bytes"] == want * 512  # Mooncake's 512-token blocks


def test_a_prompt_longer_than_hbm_gets_no_hit_from_either_tier():
    # Two prompts of 10 blocks share everything; HBM holds 4 blocks, DRAM plenty.
    long = pc.Request(list(range(10)), 10 * 16, 0.0)
    short = pc.Request([100, 101], 2 * 16, 1.0)
    r = pc.replay([long, short, long, long], 16, 4, dram_blocks=1000)
    assert r.too_long == 3 and r.hit_tokens == 0
    assert r.to_json()["too_long_for_hbm"] == 3
    fits = pc.replay([long, short, long], 16, 10, dram_blocks=1000)
    assert fits.too_long == 0 and fits.hit_tokens == 10 * 16
    # the smallest HBM for a target never comes out below the longest prompt
    reqs = [short, short, long, long]
    need = pc.smallest_capacity(reqs, 16, 0.5, 10, dram_blocks=1000)
    assert need == 10


def test_prefix_cache_cli_says_how_many_prompts_did_not_fit(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    lines = [{"timestamp": i, "input_length": 512 * n, "output_length": 1,
              "hash_ids": list(range(n))} for i, n in enumerate((8, 8, 2, 2, 8))]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rc = cli.main(["plan", "prefix-cache", str(trace), "--hbm", "4", "--dram", "100",
                   "--curve", "0"])
    out = capsys.readouterr().out
    assert rc == 0 and "3 prompt(s) longer than the HBM tier hit nothing" in out
    doc = plan_json(capsys, "prefix-cache", str(trace), "--curve", "0", "--target", "0.5")
    # the unlimited rate needs 8 blocks: the smallest HBM is at least the longest prompt
    assert doc["smallest_hbm"]["total"]["tokens"]["hbm_blocks"] >= 8


def test_one_gamma_cap_for_the_closed_form_and_the_recommendation():
    alpha, c = 0.97, 0.01  # the optimum lies far past 8
    g, _ = specdec.optimal_gamma(alpha, c)
    rec = specdec.recommend(concurrency=1, bound="latency", domain="general",
                            candidates=specdec.candidates_from_specs([f"x:eagle:{alpha}:{c}"]))
    assert g > 8 and rec.gamma == g <= specdec.MAX_GAMMA


def test_break_even_is_none_when_nothing_breaks_even(capsys):
    assert specdec.break_even_alpha(4, 1.0) is None and specdec.break_even_alpha(4, 2.5) is None
    assert 0 < specdec.break_even_alpha(4, 0.05) < 1
    rc = cli.main(["plan", "specdec", "--alpha", "0.9", "--gamma", "4", "--cost", "1.2"])
    out = capsys.readouterr().out
    assert rc == 0 and "break-even alpha        none" in out and "1.000" not in out
    rc = cli.main(["plan", "specdec", "--candidate", "slow:draft:0.9:1.5"])
    out = capsys.readouterr().out
    assert rc == 0 and "no alpha breaks even" in out


def test_tensor_parallel_must_divide_the_heads(capsys):
    rc = cli.main(["plan", "kv", str(QWEN72), "--tp", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and "attention heads (64) must be divisible by tensor parallel size (3)" in err
    assert plan_json(capsys, "kv", str(QWEN72), "--tp", "4")["tensor_parallel"] == 4
    # 8 KV heads over 16 ranks: replicated, as vLLM does
    assert plan_json(capsys, "kv", str(QWEN72), "--tp", "16")["bytes_per_token"] > 0
    with pytest.raises(ValueError, match="divisible"):
        kv.tensor_parallel(kv.Geometry.from_config(json.loads(DSV3.read_text())), 3)
