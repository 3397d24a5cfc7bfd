"""`tailgate plan specdec`: closed forms against a Monte Carlo of draft/verify, residual
sampling against the target distribution (chi-square, fixed seed), the decision rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tailgate.plan import specdec

PROM = (Path(__file__).parent / "fixtures" / "llm"
        / "vllm_0.32.0_cpu_metrics_real_specdecode_ngram.prom")


def pair(rng: np.random.Generator, vocab: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """A peaked target and a broader, related draft (as a small model would be)."""
    logits = rng.normal(size=vocab) * 2.0
    p = np.exp(logits) / np.exp(logits).sum()
    ql = logits * 0.6 + rng.normal(size=vocab) * 0.5
    q = np.exp(ql) / np.exp(ql).sum()
    return p, q


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_expected_tokens_matches_monte_carlo_of_draft_and_verify(gamma):
    rng = np.random.default_rng(1234)
    p, q = pair(rng)
    alpha = specdec.acceptance_from_distributions(p, q)
    assert 0.3 < alpha < 0.95  # a non-trivial pair
    tokens = specdec.simulate_steps(p, q, gamma, 200_000, rng)
    closed = specdec.expected_tokens(alpha, gamma)
    # standard error of the mean is < 0.005 here; allow 4 of them
    assert tokens.mean() == pytest.approx(closed, abs=4 * tokens.std() / np.sqrt(tokens.size))
    # walltime: each step costs gamma*c + 1 target steps
    c = 0.1
    mc_speedup = tokens.sum() / (tokens.size * (gamma * c + 1))
    assert mc_speedup == pytest.approx(specdec.speedup(alpha, gamma, c), rel=0.01)


def test_residual_sampling_preserves_the_target_distribution():
    """Leviathan et al. Theorem 3.5 / Chen et al. 2023: accept x~q with min(1, p/q), else
    draw from norm(max(0, p - q)), and the output is distributed as p. Chi-square
    goodness of fit on 400k draws with a fixed seed; a broken variant (resampling from
    q on rejection) is rejected by the same test, so the test has power."""
    rng = np.random.default_rng(7)
    p, q = pair(rng, vocab=20)
    n = 400_000
    drafted = rng.choice(q.size, size=n, p=q)
    accepted, out = specdec.verify(p, q, drafted, rng)
    observed = np.bincount(out, minlength=p.size)
    assert stats.chisquare(observed, n * p).pvalue > 0.001
    assert accepted.mean() == pytest.approx(np.minimum(p, q).sum(), abs=0.005)
    broken = out.copy()
    broken[~accepted] = rng.choice(q.size, size=int((~accepted).sum()), p=q)
    assert stats.chisquare(np.bincount(broken, minlength=p.size), n * p).pvalue < 1e-6


def test_acceptance_from_sampled_probabilities_is_unbiased():
    rng = np.random.default_rng(3)
    p, q = pair(rng)
    drafted = rng.choice(q.size, size=100_000, p=q)
    est = specdec.acceptance_from_sampled(p[drafted], q[drafted])
    assert est == pytest.approx(specdec.acceptance_from_distributions(p, q), abs=0.01)


def test_top_p_aligned_acceptance():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    assert specdec.top_p_filter(p, 0.8) == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0, 0])
    assert specdec.top_p_filter(p, 0.81) == pytest.approx(np.array([0.5, 0.3, 0.15, 0]) / 0.95)
    q = np.array([0.3, 0.5, 0.1, 0.1])
    full = specdec.acceptance_from_distributions(p, q)
    assert full == pytest.approx(0.3 + 0.3 + 0.1 + 0.05)
    # with top_p=0.8 both keep {0, 1}: target (0.625, 0.375), draft (0.375, 0.625)
    assert specdec.acceptance_from_distributions(p, q, top_p=0.8) == pytest.approx(0.75)
    # the truncated target is what verification preserves: residual sampling against it
    rng = np.random.default_rng(11)
    pt, qt = specdec.top_p_filter(p, 0.8), specdec.top_p_filter(q, 0.8)
    drafted = rng.choice(4, size=200_000, p=qt)
    _, out = specdec.verify(pt, qt, drafted, rng)
    counts = np.bincount(out, minlength=4)
    assert counts[2:].sum() == 0
    assert stats.chisquare(counts[:2], 200_000 * pt[:2]).pvalue > 0.001


def test_closed_form_identities():
    # Corollary 3.9: at gamma = 1, break-even alpha equals c
    for c in (0.01, 0.1, 0.5):
        assert specdec.break_even_alpha(1, c) == pytest.approx(c, abs=1e-9)
        assert specdec.speedup(c, 1, c) == pytest.approx(1.0)
    assert specdec.expected_tokens(0.0, 5) == 1.0 and specdec.expected_tokens(1.0, 5) == 6.0
    be = specdec.break_even_alpha(4, 0.2)
    assert specdec.speedup(be, 4, 0.2) == pytest.approx(1.0, abs=1e-9)
    g, s = specdec.optimal_gamma(0.8, 0.05)
    assert all(specdec.speedup(0.8, k, 0.05) <= s + 1e-12 for k in range(1, 33))
    assert g == 8
    # a draft as slow as the target never pays
    assert specdec.optimal_gamma(0.99, 1.0)[1] < 1.0
    with pytest.raises(ValueError):
        specdec.expected_tokens(1.2, 3)
    with pytest.raises(ValueError):
        specdec.speedup(0.5, 0, 0.1)


def test_engine_counters_real_vllm_ngram_run():
    """vLLM 0.32.0 CPU with ngram k=3 (shared corpus): 524 drafts, 1449 drafted,
    per-position accepted 471/427/319."""
    assert specdec.tokens_from_positions(524, [471, 427, 319]) == pytest.approx(
        1 + 1217 / 524)
    cond = specdec.conditional_acceptance(524, [471, 427, 319])
    assert cond == pytest.approx([471 / 524, 427 / 471, 319 / 427])
    with pytest.raises(ValueError, match="position 1"):
        specdec.tokens_from_positions(10, [5, 6])
    r = subprocess.run([sys.executable, "-m", "tailgate", "plan", "specdec", "--metrics",
                        str(PROM), "--cost", "0.02", "--json", "-"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["engine"]["accepted"] == 1217
    cf = data["closed_form"]
    # alpha solved from tokens/step at the engine's mean draft length reproduces it
    assert cf["gamma"] == 3
    from tailgate.llm.specdec import expected_tokens_per_step
    assert expected_tokens_per_step(cf["alpha"], 1449 / 524) == pytest.approx(1 + 1217 / 524)


def C(name, kind, a, c):  # noqa: N802 - reads like a table row
    return specdec.Candidate(name, kind, a, c)


def test_decision_rule():
    heads, draft = C("eagle3", "eagle", 0.7, 0.04), C("small", "draft", 0.85, 0.12)
    # memory-bound, many sequences, general traffic: heads
    rec = specdec.recommend(concurrency=128, bound="memory", domain="general",
                            candidates=[heads, draft])
    assert specdec.optimal_gamma(0.85, 0.12)[1] > 1.0
    assert rec.choice == "eagle3" and any("heads" in w for w in rec.why)
    # reasoning at low concurrency: the independent draft model
    rec = specdec.recommend(concurrency=4, bound="latency", domain="reasoning",
                            candidates=[heads, draft])
    assert rec.choice == "small" and any("draft model" in w for w in rec.why)
    # compute-bound at high concurrency: gamma capped at 2
    rec = specdec.recommend(concurrency=256, bound="compute", domain="code",
                            candidates=[heads, draft])
    assert rec.gamma <= 2 and rec.choice == "eagle3"
    # nothing above break-even: no speculation, and the reason names the candidate
    rec = specdec.recommend(concurrency=1, bound="latency", domain="general",
                            candidates=[C("slow", "draft", 0.1, 0.3)])
    assert rec.choice is None and "slow" in rec.why[0]
    # the preferred kind absent: the fastest viable one, said so
    rec = specdec.recommend(concurrency=64, bound="memory", domain="chat",
                            candidates=[draft, C("ng", "ngram", 0.5, 0.0)])
    assert rec.choice in ("small", "ng") and any("no viable" in w for w in rec.why)
    with pytest.raises(ValueError, match="bound"):
        specdec.recommend(concurrency=1, bound="io", domain="general", candidates=[])


def test_cli_recommend_and_errors():
    base = [sys.executable, "-m", "tailgate", "plan", "specdec"]
    r = subprocess.run(base + ["--concurrency", "64", "--bound", "memory", "--candidate",
                               "eagle3:eagle:0.75:0.04", "--candidate", "q:draft:0.8:0.15"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "recommendation: eagle3" in r.stdout
    r = subprocess.run(base + ["--candidate", "x:warp:0.5:0.1"], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 2 and "kind must be one of" in r.stderr
    r = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "--alpha" in r.stderr


def test_cli_alpha_from_logged_probabilities(tmp_path):
    rng = np.random.default_rng(5)
    p, q = pair(rng)
    drafted = rng.choice(q.size, size=20_000, p=q)
    sampled = tmp_path / "sampled.jsonl"
    sampled.write_text("".join(json.dumps({"target_prob": float(p[x]), "draft_prob": float(q[x])})
                               + "\n" for x in drafted))
    base = [sys.executable, "-m", "tailgate", "plan", "specdec", "--gamma", "4", "--json", "-"]
    r = subprocess.run(base + ["--probs", str(sampled)], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    exact = specdec.acceptance_from_distributions(p, q)
    assert data["closed_form"]["alpha"] == pytest.approx(exact, abs=0.01)
    dists = tmp_path / "dists.jsonl"
    dists.write_text(json.dumps({"target": [0.5, 0.3, 0.15, 0.05],
                                 "draft": [0.3, 0.5, 0.1, 0.1]}) + "\n")
    r = subprocess.run(base + ["--probs", str(dists), "--top-p", "0.8"], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["closed_form"]["alpha"] == pytest.approx(0.75)
    r = subprocess.run(base + ["--probs", str(sampled), "--top-p", "0.8"], capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 2 and "whole distributions" in r.stderr
