"""The user's files a plan reads (a config.json, a trace, a histogram or bench JSON, an
engine's /metrics text, logged probabilities), each through the hardened reader: a regular
file under a cap, strict UTF-8. Anything wrong is one :class:`~tailgate.errors.UsageError`
naming the file (and the line), never a hang or a traceback."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ..errors import UsageError

MAX_INPUT_BYTES = 16 * 2**20  # a config.json, /metrics text, histogram log or bench JSON
MAX_TRACE_BYTES = 2**30  # a trace, decompressed: Mooncake's are tens of MB


def _exists(path: str, what: str) -> None:
    if not os.path.lexists(path):
        raise UsageError(f"cannot read {path}: no such {what}")


def read_text(path: str, what: str, limit: int = MAX_INPUT_BYTES) -> str:
    """A user's text file: /dev/zero, a FIFO or Latin-1 is one line and exit 2."""
    from ..userfiles import UserFileError, read_user_text

    _exists(path, what)
    try:
        return read_user_text(path, limit)
    except UserFileError as exc:
        raise UsageError(str(exc)) from None


def read_json(path: str, what: str) -> Any:
    from ..userfiles import UserFileError, load_json

    _exists(path, what)
    try:
        return load_json(path, MAX_INPUT_BYTES)
    except UserFileError as exc:
        raise UsageError(str(exc)) from None


def read_trace(path: str) -> list[str]:
    """The lines of a trace (``.gz`` decompressed, to at most MAX_TRACE_BYTES)."""
    from ..userfiles import UserFileError
    from .traces import read_lines

    _exists(path, "trace")
    try:
        return read_lines(path, MAX_TRACE_BYTES)
    except UserFileError as exc:
        raise UsageError(str(exc)) from None


def leaf(path: str):
    """The leaf latency of ``plan fanout``: a :class:`~.fanout.Dist` in ns from an
    HdrHistogram log or a bench JSON's percentile table, and which of the two it was."""
    from ..hist import HistogramError, merged, parse_log
    from . import fanout

    text = read_text(path, "histogram or bench JSON")
    if text.lstrip().startswith("{"):
        doc = read_json(path, "bench JSON")
        table = doc.get("latency_ms") if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            raise UsageError(f"{path}: latency_ms: expected an object of percentiles "
                             f"(a tailgate bench JSON), got {type(table).__name__}")
        for k, v in table.items():
            if isinstance(v, int | float) and not isinstance(v, bool) \
                    and not (math.isfinite(v) and v >= 0):
                raise UsageError(f"{path}: latency_ms.{k}: {v!r} is not a latency")
        try:
            return fanout.from_percentiles({k: v * 1e6 for k, v in table.items()
                                            if isinstance(v, int | float)
                                            and not isinstance(v, bool)}), \
                "bench JSON percentiles"
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{path}: not a tailgate bench JSON with latency_ms ({exc})") from None
    try:
        _, intervals = parse_log(text)
    except HistogramError as exc:
        raise UsageError(f"{path}: {exc}") from None
    if not intervals:
        raise UsageError(f"{path}: no histogram intervals")
    h = merged((iv.histogram for iv in intervals), intervals[0].histogram.spec)
    try:
        return fanout.Dist.from_histogram(h), f"histogram of {h.total:,} samples"
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None


def alpha_from_probs(path: str, top_p: float | None) -> tuple[float, dict[str, Any]]:
    """The acceptance rate from logged probabilities (JSON lines), and how it was found."""
    from . import specdec

    sampled_p, sampled_q, dists_p, dists_q = [], [], [], []

    def prob(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
            and 0 <= v <= 1

    for n, line in enumerate(read_text(path, "probabilities file", MAX_TRACE_BYTES)
                             .splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError):
            obj = None
        if isinstance(obj, dict) and "target_prob" in obj:
            if not (prob(obj["target_prob"]) and prob(obj.get("draft_prob"))):
                raise UsageError(f"{path}: line {n}: target_prob and draft_prob must be "
                                 "probabilities in [0, 1]")
            sampled_p.append(float(obj["target_prob"]))
            sampled_q.append(float(obj["draft_prob"]))
        elif isinstance(obj, dict) and "target" in obj and "draft" in obj:
            for key in ("target", "draft"):
                v = obj[key]
                if not isinstance(v, list) or not v or not all(prob(x) for x in v):
                    raise UsageError(f"{path}: line {n}: {key} must be a list of "
                                     "probabilities in [0, 1]")
            dists_p.append(obj["target"])
            dists_q.append(obj["draft"])
        else:
            raise UsageError(f"{path}: line {n}: expected target_prob/draft_prob or "
                             "target/draft")
    if sampled_p and dists_p:
        raise UsageError(f"{path}: mixes sampled probabilities and distributions")
    if sampled_p:
        if top_p is not None:
            raise UsageError("--top-p needs whole distributions (target/draft lists)")
        return (specdec.acceptance_from_sampled(sampled_p, sampled_q),
                {"positions": len(sampled_p), "method": "mean of min(1, p(x)/q(x))"})
    if not dists_p:
        raise UsageError(f"{path}: no logged positions")
    try:
        alpha = specdec.acceptance_from_distributions(dists_p, dists_q, top_p)
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return alpha, {"positions": len(dists_p), "method": "mean of sum min(p, q)"
                   + (f", both truncated to top-p {top_p:g}" if top_p is not None else "")}


def alpha_from_metrics(path: str, gamma: int | None) -> tuple[float, int, dict[str, Any]]:
    """The acceptance rate and draft length from a vLLM /metrics text's spec_decode
    counters, with the counters themselves (the ``engine`` part of the document)."""
    from ..llm.engine_metrics import impossible, total
    from ..model import ParseError
    from ..sources.engine import parse_exposition
    from . import specdec

    try:
        samples = parse_exposition(read_text(path, "metrics file"))
    except ParseError as exc:
        raise UsageError(f"{path}: {exc}") from None
    why = impossible(samples)
    if why:
        raise UsageError(f"{path}: {why}")
    drafts = total(samples, "vllm:spec_decode_num_drafts_total")
    drafted = total(samples, "vllm:spec_decode_num_draft_tokens_total")
    accepted = total(samples, "vllm:spec_decode_num_accepted_tokens_total")
    if not drafts or not drafted or accepted is None:
        raise UsageError(f"{path}: no vLLM spec_decode counters with drafts (is speculative "
                         "decoding on?)")
    per_pos: dict[int, float] = {}
    for name, labels, value in samples:
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = int(labels.get("position", -1))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    positions = [per_pos[i] for i in sorted(per_pos)]
    k = drafted / drafts
    engine: dict[str, Any] = {"drafts": drafts, "draft_tokens": drafted, "accepted": accepted,
                              "acceptance_rate": accepted / drafted,
                              "tokens_per_step": 1 + accepted / drafts, "draft_length": k}
    if positions:
        engine["per_position_alpha"] = specdec.conditional_acceptance(drafts, positions)
    alpha = specdec.alpha_from_counts(drafts, drafted, accepted)
    return alpha, gamma if gamma is not None else max(1, round(k)), engine
