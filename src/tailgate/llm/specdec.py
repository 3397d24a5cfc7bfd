"""Speculative decoding: the engine's acceptance rate vs the literature's alpha.

Engines report an *acceptance rate*: accepted draft tokens / drafted tokens
(vLLM ``spec_decode_num_accepted_tokens / spec_decode_num_draft_tokens``, SGLang
``spec_accept_rate``). The speculative-decoding literature (Leviathan et al.,
"Fast Inference from Transformers via Speculative Decoding", 2023) uses
*alpha*, the probability that one drafted token is accepted given that every
token before it was. With k tokens drafted per step and i.i.d. acceptance the
expected number of tokens emitted per verification step (the "mean acceptance
length", accepted drafts + the target model's bonus token) is::

    tau = (1 - alpha**(k + 1)) / (1 - alpha)

and the acceptance rate is ``(alpha + alpha**2 + ... + alpha**k) / k``, which
is <= alpha: the two differ, and the more tokens are drafted the more. We
recover alpha by solving tau for alpha from the measured tau and k.
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens_per_step(alpha: float, k: float) -> float:
    """tau(alpha, k) = 1 + alpha + ... + alpha**k (continuous in k)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)


def alpha_from_tau(tau: float, k: float) -> float:
    """Solve tau = (1 - a**(k+1)) / (1 - a) for a in [0, 1] (bisection; tau rises with a)."""
    if k <= 0:
        raise ValueError("draft length k must be > 0")
    if tau <= 1.0:
        return 0.0
    if tau >= k + 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_tokens_per_step(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class SpecDecodeStats:
    """Both figures, derived from one set of counts."""

    acceptance_rate: float  # accepted / drafted tokens (what engines print)
    alpha: float  # per-token acceptance probability (the literature's alpha)
    mean_acceptance_length: float  # tau: tokens emitted per verification step
    draft_length: float  # k: tokens drafted per step (mean)

    def to_json(self) -> dict[str, float]:
        return {"acceptance_rate": self.acceptance_rate, "alpha": self.alpha,
                "mean_acceptance_length": self.mean_acceptance_length,
                "draft_length": self.draft_length}


def from_counts(drafts: float, draft_tokens: float, accepted: float) -> SpecDecodeStats:
    """From vLLM's counters: drafts (steps), drafted tokens, accepted tokens."""
    if drafts <= 0 or draft_tokens <= 0:
        raise ValueError("no drafts")
    if accepted < 0 or accepted > draft_tokens:
        raise ValueError(f"accepted tokens {accepted:g} outside [0, drafted {draft_tokens:g}]")
    k = draft_tokens / drafts
    tau = 1.0 + accepted / drafts
    return SpecDecodeStats(accepted / draft_tokens, alpha_from_tau(tau, k), tau, k)


def from_rate_and_length(rate: float, tau: float) -> SpecDecodeStats:
    """From SGLang's gauges: acceptance rate and mean acceptance length (incl. bonus token).

    accepted per step = tau - 1 = rate * k, so k = (tau - 1) / rate.
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"acceptance rate {rate:g} outside (0, 1]")
    if tau < 1.0:
        raise ValueError(f"acceptance length {tau:g} < 1")
    k = (tau - 1.0) / rate
    if k <= 0:
        raise ValueError("acceptance length 1 with a non-zero rate: inconsistent gauges")
    return SpecDecodeStats(rate, alpha_from_tau(tau, k), tau, k)


def per_position_rates(drafts: float, accepted_per_pos: list[float]) -> list[float]:
    """Conditional acceptance at each draft position: a_0/N, a_1/a_0, ...

    With drafts of varying length (n-gram proposals can be shorter than k) a
    later position is not drafted every time, so these are lower bounds there.
    """
    rates: list[float] = []
    prev = drafts
    for a in accepted_per_pos:
        rates.append(a / prev if prev > 0 else 0.0)
        prev = a
    return rates
