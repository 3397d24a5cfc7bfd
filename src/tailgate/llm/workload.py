"""What to send: prompts and output lengths, reproducible from a seed.

A workload is an iterator of :class:`LLMRequest`. Lengths are in *words*
from a list of short common English words, each one token in the usual BPE and
SentencePiece vocabularies, so a prompt of N words is close to N tokens (the
server's ``usage``, when sent, gives the exact count).

* ``fixed`` / ``random``: independent prompts; ``random`` draws input and output
  lengths uniformly within ``±range_ratio`` of the means (as vLLM's benchmark).
* ``multiturn``: conversations whose every turn re-sends the whole history (a
  system prompt, earlier user turns and assistant replies) plus a new user
  turn, so turn i+1's prompt starts with turn i's: the shared, growing prefix
  a prefix cache exists for. Assistant replies are synthetic text of the output
  length, so the workload stays open-loop and reproducible. Turns of different
  conversations interleave, giving the server time to finish a turn before its
  conversation's next one.
* ``trace``: replay of a Mooncake trace (``timestamp`` ms, ``input_length``,
  ``output_length``, ``hash_ids``). Each hash id names a block of
  ``block_tokens`` tokens whose text is derived from (seed, hash id), so
  requests that share a hash id share that block's text and the server sees
  the trace's real prefix sharing; a request's last block is cut to its length.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

# Short, common words: one token each in GPT-2/Llama/Qwen vocabularies.
WORDS = tuple("""the of and to in is you that it he was for on are as with his they at be
this have from or one had by word but not what all were we when your can said there use an
each which she do how their if will up other about out many then them these so some her would
make like him into time has look two more write go see number no way could people my than first
water been call who oil its now find long down day did get come made may part""".split())


@dataclass(frozen=True)
class LLMRequest:
    prompt: str | list[dict[str, str]]  # text, or chat messages
    max_tokens: int
    input_words: int  # the prompt's length in words (~tokens)
    offset_s: float | None = None  # intended start from the run's start (trace replay)
    conversation: int | None = None
    turn: int | None = None


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, k=n))


def _uniform(rng: random.Random, mean: int, ratio: float) -> int:
    if ratio <= 0:
        return mean
    lo, hi = max(1, round(mean * (1 - ratio))), max(1, round(mean * (1 + ratio)))
    return rng.randint(lo, hi)


def independent(seed: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                chat: bool = False) -> Iterator[LLMRequest]:
    """Fixed (range_ratio 0) or random lengths; each prompt starts differently."""
    rng = random.Random(seed)
    for i in itertools.count():
        n_in = _uniform(rng, input_len, range_ratio)
        n_out = _uniform(rng, output_len, range_ratio)
        # A request number first, so no two prompts share a prefix by accident.
        text = f"{i} " + words(rng, max(n_in - 1, 0))
        prompt: str | list[dict[str, str]] = (
            [{"role": "user", "content": text}] if chat else text)
        yield LLMRequest(prompt, n_out, n_in)


def multiturn(seed: int, conversations: int, turns: int, system_len: int, user_len: int,
              output_len: int, chat: bool = False) -> Iterator[LLMRequest]:
    """Rounds of ``conversations`` conversations x ``turns`` turns, interleaved by turn."""
    if conversations < 1 or turns < 1:
        raise ValueError("conversations and turns must be >= 1")
    rng = random.Random(seed)
    for batch in itertools.count():
        convs = []
        for c in range(conversations):
            cid = batch * conversations + c
            system = f"conversation {cid}. " + words(rng, max(system_len - 2, 0))
            convs.append({"id": cid, "messages": [{"role": "system", "content": system}]})
        for t in range(turns):
            for conv in convs:
                msgs = conv["messages"]
                msgs.append({"role": "user", "content": words(rng, user_len)})
                history = [dict(m) for m in msgs]
                n_in = sum(len(m["content"].split()) for m in history)
                prompt: str | list[dict[str, str]] = (
                    history if chat else "\n".join(m["content"] for m in history))
                yield LLMRequest(prompt, output_len, n_in, conversation=conv["id"], turn=t)
                # The reply the next turn carries: synthetic, of the output length.
                msgs.append({"role": "assistant", "content": words(rng, output_len)})


@dataclass(frozen=True)
class TraceEntry:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_mooncake(text: str) -> list[TraceEntry]:
    """Parse a Mooncake trace (JSON lines). Raises ValueError naming the bad line."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            entry = TraceEntry(float(obj["timestamp"]), int(obj["input_length"]),
                               int(obj["output_length"]),
                               tuple(int(h) for h in obj.get("hash_ids", ())))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"trace line {n}: {type(exc).__name__}: {exc}") from None
        if entry.input_length < 1 or entry.output_length < 1 or entry.timestamp_ms < 0:
            raise ValueError(f"trace line {n}: lengths must be >= 1 and timestamp >= 0")
        out.append(entry)
    if not out:
        raise ValueError("the trace is empty")
    return out


def block_text(seed: int, hash_id: int, n: int) -> list[str]:
    """The first ``n`` words of block ``hash_id``: the same for every request naming it."""
    rng = random.Random(f"{seed}:{hash_id}")
    return rng.choices(WORDS, k=n)


def trace(entries: list[TraceEntry], seed: int, block_tokens: int = 512,
          token_scale: float = 1.0, time_scale: float = 1.0,
          chat: bool = False) -> Iterator[LLMRequest]:
    """Replay ``entries``: offsets from their timestamps (divided by ``time_scale``),
    lengths multiplied by ``token_scale`` (blocks shrink with them, so sharing stays)."""
    if block_tokens < 1 or token_scale <= 0 or time_scale <= 0:
        raise ValueError("block_tokens, token_scale and time_scale must be > 0")
    block = max(1, round(block_tokens * token_scale))
    t0 = entries[0].timestamp_ms
    for e in entries:
        n_in = max(1, round(e.input_length * token_scale))
        parts: list[str] = []
        for h in e.hash_ids:
            if len(parts) >= n_in:
                break
            parts += block_text(seed, h, min(block, n_in - len(parts)))
        if len(parts) < n_in:  # a trace whose hash ids cover less than its input length
            parts += block_text(seed, -1 - len(parts), n_in - len(parts))
        text = " ".join(parts)
        n_out = max(1, round(e.output_length * token_scale))
        prompt: str | list[dict[str, str]] = (
            [{"role": "user", "content": text}] if chat else text)
        yield LLMRequest(prompt, n_out, n_in, offset_s=(e.timestamp_ms - t0) / 1000 / time_scale)
