"""Speculative decoding ROI: closed forms, the choice of drafter, acceptance from probabilities.

Closed forms (Leviathan, Kalman, Matias, "Fast Inference from Transformers via
Speculative Decoding", ICML 2023). A draft model proposes ``gamma`` tokens; the
target verifies them in one step. With ``alpha`` the probability that a drafted
token is accepted (i.i.d. per position, their Assumption) and ``c`` the cost of
one draft step over one target step:

* expected tokens per target step (their Eq. 1)::

      E[tokens] = (1 - alpha**(gamma + 1)) / (1 - alpha)

  — a geometric series: position i is reached only if the i-1 drafts before it
  were accepted, and the step always yields one token of its own (the target's
  correction or its bonus token after a clean sweep);
* walltime speedup (Theorem 3.8): one step costs ``gamma * c + 1`` target-step
  times, so ``speedup = E[tokens] / (gamma * c + 1)``;
* optimal gamma: the integer maximising that speedup (their Figure 3);
* break-even alpha: the alpha where speedup is exactly 1, i.e.
  ``E[tokens] = 1 + gamma * c``; with gamma = 1 it is alpha = c (Corollary 3.9:
  speculation pays for some gamma iff alpha > c).

alpha itself is ``E[beta]``, ``beta = sum_x min(p(x), q(x)) = 1 - TV(p, q)``
for target ``p`` and draft ``q`` (their Definition 3.1 and Theorem 3.5), which
is what :func:`acceptance_from_distributions` estimates from logged
probabilities. The sampling that makes this exact (accept ``x ~ q`` with
``min(1, p/q)``, else draw from ``norm(max(0, p - q))``) is :func:`verify`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..llm.specdec import alpha_from_tau, expected_tokens_per_step


def _check(alpha: float, gamma: int | None = None, c: float | None = None) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], not {alpha}")
    if gamma is not None and (gamma < 1 or int(gamma) != gamma):
        raise ValueError(f"gamma must be an integer >= 1, not {gamma}")
    if c is not None and not 0.0 <= c:
        raise ValueError(f"cost ratio c must be >= 0, not {c}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Leviathan et al. Eq. 1: tokens per target step, (1 - alpha^(gamma+1)) / (1 - alpha)."""
    _check(alpha, gamma)
    return expected_tokens_per_step(alpha, gamma)


def speedup(alpha: float, gamma: int, c: float) -> float:
    """Theorem 3.8: expected walltime improvement factor (1-a^(g+1)) / ((1-a)(g c + 1))."""
    _check(alpha, gamma, c)
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


# The longest draft any answer here considers (one cap, for the closed forms and the
# recommendation): engines run 1-8 in practice, and past ~32 E[tokens] has converged.
MAX_GAMMA = 32


def optimal_gamma(alpha: float, c: float, max_gamma: int = MAX_GAMMA) -> tuple[int, float]:
    """(gamma, speedup) maximising the speedup over 1..max_gamma (ties: the shorter draft)."""
    _check(alpha, None, c)
    best = (1, speedup(alpha, 1, c))
    for g in range(2, max_gamma + 1):
        s = speedup(alpha, g, c)
        if s > best[1] + 1e-12:
            best = (g, s)
    return best


def break_even_alpha(gamma: int, c: float) -> float | None:
    """The alpha at which speculation neither gains nor loses: speedup(alpha, gamma, c) = 1.

    E[tokens] rises with alpha from 1 to gamma + 1, so the root is unique when
    ``gamma * c < gamma``, i.e. c < 1; with c >= 1 no alpha gains (None: not 1.0, which
    would read as "breaks even at perfect acceptance").
    """
    _check(0.0, gamma, c)
    if c >= 1.0:
        return None
    return alpha_from_tau(1.0 + gamma * c, gamma)


def format_break_even(be: float | None, digits: int = 3) -> str:
    return "none" if be is None else f"{be:.{digits}f}"


def tokens_from_positions(drafts: float, accepted_per_position: Sequence[float]) -> float:
    """Tokens per step from per-position acceptance counts (vLLM ``..._per_pos_total``).

    Position i is accepted in ``accepted[i]`` of ``drafts`` steps, so the mean number
    accepted is their sum over drafts; plus the step's own token.
    """
    if drafts <= 0:
        raise ValueError("no drafts")
    prev = drafts
    for i, a in enumerate(accepted_per_position):
        if a < 0 or a > prev:
            raise ValueError(f"position {i}: {a:g} accepted is outside [0, {prev:g}] "
                             "(a position is reached only through the one before it)")
        prev = a
    return 1.0 + sum(accepted_per_position) / drafts


def conditional_acceptance(drafts: float, accepted_per_position: Sequence[float]) -> list[float]:
    """alpha at each position given the ones before it were accepted (i.i.d. means flat)."""
    tokens_from_positions(drafts, accepted_per_position)  # validates
    out, prev = [], float(drafts)
    for a in accepted_per_position:
        out.append(a / prev if prev > 0 else 0.0)
        prev = a
    return out


# -- acceptance from logged probabilities ---------------------------------------------


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Nucleus truncation along the last axis: keep the smallest set whose mass >= top_p,
    renormalised (the distribution an engine samples from with ``top_p``)."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], not {top_p}")
    p = np.asarray(probs, dtype=np.float64)
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    before = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass of the tokens ranked above
    keep_sorted = before < top_p  # a token stays if the nucleus was not full before it
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    out = np.where(keep, p, 0.0)
    return out / out.sum(axis=-1, keepdims=True)


def acceptance_from_distributions(target: np.ndarray, draft: np.ndarray,
                                  top_p: float | None = None) -> float:
    """alpha = mean over positions of sum_x min(p(x), q(x)) (Leviathan Theorem 3.5).

    ``target`` and ``draft`` are (positions, vocab) probability rows. With
    ``top_p`` both are nucleus-truncated first — the top-p-aligned variant: when
    the engine samples the target with top-p, the verifier accepts against the
    truncated target, and a draft sampled with the same top-p is what it sees.
    """
    p, q = _rows(target, "target"), _rows(draft, "draft")
    if p.shape != q.shape:
        raise ValueError(f"target {p.shape} and draft {q.shape} differ in shape")
    if top_p is not None:
        p, q = top_p_filter(p, top_p), top_p_filter(q, top_p)
    return float(np.minimum(p, q).sum(axis=-1).mean())


def acceptance_from_sampled(p_of_token: Sequence[float], q_of_token: Sequence[float]) -> float:
    """alpha from what engines log per drafted token: p(x) and q(x) of the drafted x.

    x was drawn from q, and it is accepted with probability min(1, p(x)/q(x)), whose
    expectation under q is sum_x min(p, q): the mean is an unbiased estimate of alpha.
    """
    p = np.asarray(p_of_token, dtype=np.float64)
    q = np.asarray(q_of_token, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1 or p.size == 0:
        raise ValueError("need two equal-length, non-empty lists of probabilities")
    if np.any(q <= 0) or np.any(p < 0) or np.any(p > 1) or np.any(q > 1):
        raise ValueError("probabilities must be in [0, 1], with q(x) > 0 for a drafted x")
    return float(np.minimum(1.0, p / q).mean())


def _rows(a: np.ndarray, name: str) -> np.ndarray:
    x = np.atleast_2d(np.asarray(a, dtype=np.float64))
    if x.ndim != 2 or np.any(x < 0) or not np.allclose(x.sum(axis=-1), 1.0, atol=1e-6):
        raise ValueError(f"{name}: each row must be a probability distribution")
    return x


def verify(p: np.ndarray, q: np.ndarray, drafted: np.ndarray,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Speculative sampling of one position for many independent trials (vectorised).

    Accept drafted token ``x ~ q`` with probability ``min(1, p(x)/q(x))``; on
    rejection draw from the residual ``norm(max(0, p - q))``. Returns
    (accepted mask, emitted token); the emitted token is distributed exactly as p.
    """
    ratio = np.minimum(1.0, p[drafted] / q[drafted])
    accepted = rng.random(drafted.shape) < ratio
    residual = np.maximum(p - q, 0.0)
    mass = residual.sum()
    out = drafted.copy()
    n_rej = int((~accepted).sum())
    if n_rej:
        out[~accepted] = rng.choice(p.size, size=n_rej, p=residual / mass)
    return accepted, out


def simulate_steps(p: np.ndarray, q: np.ndarray, gamma: int, steps: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Monte Carlo of draft-then-verify: tokens emitted by each of ``steps`` target steps.

    Every position uses the same (p, q), so acceptance is i.i.d. with
    alpha = sum min(p, q) — the closed forms' assumption, tested here from sampling.
    """
    drafted = rng.choice(q.size, size=(steps, gamma), p=q)
    ratio = np.minimum(1.0, p[drafted] / q[drafted])
    accepted = rng.random((steps, gamma)) < ratio
    # accepted prefix length: index of the first rejection, or gamma if none
    first_reject = np.where(accepted.all(axis=1), gamma, np.argmin(accepted, axis=1))
    return first_reject + 1  # + the correction or bonus token


# -- the method's decision rule ---------------------------------------------------------

HEADS = ("eagle", "medusa", "mtp")  # drafters that ride on the target's own hidden states
DRAFT_MODEL = ("draft",)  # an independent small model
NGRAM = ("ngram",)  # prompt lookup: free to draft, good where output copies input
KINDS = HEADS + DRAFT_MODEL + NGRAM
BOUNDS = ("compute", "memory", "latency")
DOMAINS = ("general", "chat", "reasoning", "code", "summarization")


@dataclass(frozen=True)
class Candidate:
    """A drafter with its measured per-token acceptance and draft-to-target step cost."""

    name: str
    kind: str  # one of KINDS
    alpha: float
    cost_ratio: float

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"candidate {self.name}: kind must be one of {', '.join(KINDS)}")
        _check(self.alpha, None, self.cost_ratio)


@dataclass(frozen=True)
class Recommendation:
    choice: str | None  # a candidate's name, or None: do not speculate
    gamma: int | None
    speedup: float
    why: list[str] = field(default_factory=list)
    table: list[dict] = field(default_factory=list)


HIGH_CONCURRENCY = 32  # sequences per replica beyond which a step is no longer latency-bound


def recommend(*, concurrency: int, bound: str, domain: str,
              candidates: Sequence[Candidate], max_gamma: int = MAX_GAMMA) -> Recommendation:
    """Which drafter to run, and how far ahead, with the reasons.

    The method's rule, made explicit:

    1. Each candidate's best gamma and speedup come from the closed forms with its
       measured alpha and cost; one that cannot beat 1.0 (alpha below break-even)
       is out.
    2. Compute-bound at high concurrency, verification is not free any more: each
       extra token verified costs real FLOPs for every sequence in the batch, so the
       draft length is capped at 2 and a drafter needing its own model (extra
       weights, KV cache and steps) loses to heads that share the target's forward.
    3. Memory- or compute-bound with high concurrency on general traffic: heads
       (EAGLE/Medusa/MTP) — cheap drafts, no second KV cache.
    4. Deep reasoning and code (long outputs, predictable continuations): an
       independent draft model, whose high alpha on such text pays for its cost;
       n-gram lookup competes where the output copies the prompt.
    5. Otherwise, or when the preferred kind is absent: the highest speedup.
    """
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {', '.join(BOUNDS)}, not {bound!r}")
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {', '.join(DOMAINS)}, not {domain!r}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, not {concurrency}")
    high = concurrency >= HIGH_CONCURRENCY
    cap = 2 if bound == "compute" and high else max_gamma
    why: list[str] = []
    if cap < max_gamma:
        why.append(f"compute-bound at concurrency {concurrency} (>= {HIGH_CONCURRENCY}): "
                   f"verifying costs FLOPs for every sequence, so gamma <= {cap}")
    table, viable = [], []
    for cand in candidates:
        g, s = optimal_gamma(cand.alpha, cand.cost_ratio, cap)
        be = break_even_alpha(g, cand.cost_ratio)
        row = {"name": cand.name, "kind": cand.kind, "alpha": cand.alpha,
               "cost_ratio": cand.cost_ratio, "gamma": g, "speedup": round(s, 4),
               "break_even_alpha": None if be is None else round(be, 4)}
        table.append(row)
        if s > 1.0:
            viable.append((cand, g, s))
        else:
            why.append(f"{cand.name}: alpha {cand.alpha:.2f} is not above break-even "
                       f"{format_break_even(be, 2)} at gamma {g} with c={cand.cost_ratio:g}: "
                       "no gain" if be is not None else
                       f"{cand.name}: a draft step costs at least a target step "
                       f"(c={cand.cost_ratio:g}): no alpha breaks even")
    if not viable:
        why.append("no candidate speeds decoding up: run without speculation")
        return Recommendation(None, None, 1.0, why, table)
    prefer: tuple[str, ...] = ()
    if domain in ("reasoning", "code") and not (bound == "compute" and high):
        prefer = DRAFT_MODEL + NGRAM
        why.append(f"{domain}: long, predictable outputs where an independent draft model "
                   "(or prompt lookup) reaches a high alpha")
    elif high and bound in ("compute", "memory"):
        prefer = HEADS
        why.append(f"{bound}-bound at concurrency {concurrency}: heads (EAGLE/Medusa/MTP) "
                   "draft from the target's hidden states, with no second model or KV cache")
    elif bound == "latency":
        why.append("latency-bound: the spare compute of small batches makes the fastest "
                   "drafter the best")
    pool = [v for v in viable if v[0].kind in prefer] or viable
    if prefer and pool is viable:
        why.append(f"no viable {'/'.join(prefer)} candidate: taking the fastest instead")
    cand, g, s = max(pool, key=lambda v: v[2])
    why.append(f"{cand.name}: alpha {cand.alpha:.2f}, c={cand.cost_ratio:g} -> gamma {g}, "
               f"{expected_tokens(cand.alpha, g):.2f} tokens per step, speedup {s:.2f}x")
    return Recommendation(cand.name, g, s, why, table)


def alpha_from_counts(drafts: float, draft_tokens: float, accepted: float) -> float:
    """alpha from an engine's counters: solve E[tokens] = 1 + accepted/drafts for alpha."""
    if drafts <= 0 or draft_tokens <= 0:
        raise ValueError("no drafts")
    if not 0 <= accepted <= draft_tokens:
        raise ValueError(f"accepted {accepted:g} outside [0, drafted {draft_tokens:g}]")
    return alpha_from_tau(1.0 + accepted / drafts, draft_tokens / drafts)


def summary(alpha: float, gamma: int, c: float) -> dict:
    g_opt, s_opt = optimal_gamma(alpha, c)
    return {"alpha": alpha, "gamma": gamma, "cost_ratio": c,
            "expected_tokens_per_step": expected_tokens(alpha, gamma),
            "speedup": speedup(alpha, gamma, c),
            "optimal_gamma": g_opt, "optimal_speedup": s_opt,
            "break_even_alpha": break_even_alpha(gamma, c)}


def candidates_from_specs(specs: Sequence[str] | Mapping[str, str]) -> list[Candidate]:
    """'NAME:KIND:ALPHA:COST' strings (the CLI's --candidate) as candidates."""
    out = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 4:
            raise ValueError(f"candidate {spec!r}: expected NAME:KIND:ALPHA:COST "
                             "(e.g. eagle3:eagle:0.8:0.05)")
        try:
            alpha, cost = float(parts[2]), float(parts[3])
        except ValueError:
            raise ValueError(f"candidate {spec!r}: ALPHA and COST must be numbers") from None
        if math.isnan(alpha) or math.isnan(cost):
            raise ValueError(f"candidate {spec!r}: not a number")
        out.append(Candidate(parts[0], parts[1], alpha, cost))
    return out
