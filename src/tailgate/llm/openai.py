"""The OpenAI-compatible wire format: request bodies and streamed chunks (pure).

``/v1/completions`` streams ``choices[0].text``; ``/v1/chat/completions``
streams ``choices[0].delta.content`` (its first chunk usually carries only the
role, no content). With ``stream_options: {"include_usage": true}`` vLLM,
SGLang and OpenAI end the stream with a chunk whose ``usage`` gives the exact
prompt and completion token counts; servers that ignore the option (llama.cpp's
Python server) send none, and tokens are then counted as content chunks.

How many tokens one chunk carries (speculative decoding and batching engines send
several) is known only when the server says so in the chunk: a cumulative ``usage``
in every chunk (vLLM's ``stream_options.continuous_usage_stats``; the connection takes
the difference), or the chunk's ``logprobs`` (one entry per token). Otherwise it is
unknown (:attr:`Chunk.tokens` is None) and the accounting assumes one
(:mod:`tailgate.llm.accounting`, docs/llm-tokens.md).
"""

from __future__ import annotations

import json
from typing import Any, Literal, NamedTuple

import msgspec

from ..errors import ProtocolError
from ..model import ParseError
from .engine_records import EngineTimings, LlamacppTimings, parse_llamacpp_timings

Api = Literal["completions", "chat"]
PATHS = {"completions": "/completions", "chat": "/chat/completions"}


def request_body(api: Api, model: str, prompt: str | list[dict[str, str]], max_tokens: int,
                 *, usage: bool = True, ignore_eos: bool = False,
                 continuous_usage: bool = False, timings_per_token: bool = False,
                 extra: dict[str, Any] | None = None) -> bytes:
    """The JSON body of one streamed request."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True}
    if api == "chat":
        body["messages"] = (prompt if isinstance(prompt, list)
                            else [{"role": "user", "content": prompt}])
    else:
        body["prompt"] = prompt if isinstance(prompt, str) else "\n".join(
            m["content"] for m in prompt)
    if usage:
        body["stream_options"] = {"include_usage": True}
        if continuous_usage:  # vLLM: usage in every chunk, so each chunk's tokens are known
            body["stream_options"]["continuous_usage_stats"] = True
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM/SGLang extension: generate exactly max_tokens
    if timings_per_token:  # llama-server: its `timings` in every chunk, not only the last
        body["timings_per_token"] = True
    if extra:
        body.update(extra)
    return json.dumps(body, separators=(",", ":")).encode()


class ChunkError(ProtocolError):
    """A data event that is not a chunk of this API (malformed JSON or shape): the
    request's outcome."""


class Chunk(NamedTuple):  # (a tuple: built once per chunk, at 100,000 chunks/s)
    text: str  # content carried ("" for a role-only, usage-only or final chunk)
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from ``usage`` when present
    completion_tokens: int | None = None
    error: str | None = None  # an in-stream {"error": ...} object
    tokens: int | None = None  # tokens in this chunk as the server lists them (logprobs)
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    # llama-server's per-request ``timings`` (its last chunk; every chunk when asked):
    # the engine's phases, or the reason its object could not be read
    timings: EngineTimings | str | None = None


# What :func:`read_chunk` answers for the usual content chunk: one token of unknown count
# with some text, nothing else (a Chunk, so that apply_chunk takes it as the chunk it is).
PLAIN = Chunk("(plain text)")


def parse_chunk(data: str | bytes | memoryview, api: Api) -> Chunk:
    """Interpret one ``data:`` payload (not ``[DONE]``).

    The usual chunk is decoded straight into the fields read here (:data:`_FAST`, typed,
    with no tolerance); anything else, or anything odd about it, goes through the full
    rules below, which decide every case. The typed decode only ever gives their answer
    faster (``tests/test_llm_units.py`` checks the two agree on generated chunks)."""
    return _read(data, api, False)


def read_chunk(data: str | bytes | memoryview, api: Api) -> Chunk:
    """:func:`parse_chunk`'s answer from one decode, except that the usual content chunk
    (``Chunk(text)`` with some text and nothing else: no finish reason, usage, logprobs,
    timings or error) is the shared :data:`PLAIN`, its text not built: a stream's token
    state takes it as one token of unknown count at its time, which a loop at 100,000
    chunks/s does without building a :class:`Chunk` (``tests/test_llm_units.py`` checks
    PLAIN is only ever such a chunk)."""
    return _read(data, api, True)


def _read(data: str | bytes | memoryview, api: Api, plain: bool) -> Chunk:
    try:
        c = _FAST[api].decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):  # (ValidationError is a DecodeError)
        c = None
    if c is None or c.error is not msgspec.UNSET:
        return _parse_chunk(data if isinstance(data, str) else bytes(data).decode(), api)
    usage = c.usage
    if not c.choices:
        choice = None
        text = None
    else:
        choice = c.choices[0]
        text = choice.text if api == "completions" else (  # type: ignore[union-attr]
            choice.delta.content if choice.delta is not None else None)  # type: ignore[union-attr]
        if (plain and text and usage is None and c.timings is None
                and choice.finish_reason is None and choice.logprobs is None):
            return PLAIN
    prompt = completion = cached = None
    if usage is not None:
        prompt, completion = _count(usage.prompt_tokens), _count(usage.completion_tokens)
        if usage.prompt_tokens_details is not None:
            cached = _count(usage.prompt_tokens_details.cached_tokens)
    timings = None if c.timings is None else c.timings.record()
    if choice is None:
        return Chunk("", None, prompt, completion, cached_tokens=cached, timings=timings)
    return Chunk(text or "", choice.finish_reason, prompt, completion,
                 tokens=_logprob_tokens(choice.logprobs, api), cached_tokens=cached,
                 timings=timings)


def _timings(obj: Any) -> EngineTimings | str:
    try:
        return parse_llamacpp_timings(obj)
    except ParseError as exc:
        return str(exc)


def _parse_chunk(data: str, api: Api) -> Chunk:
    """:func:`parse_chunk`'s rules for any payload: lenient where a field is only informative
    (a count that is not a count is none), strict where the content is concerned."""
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise ChunkError(f"data is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ChunkError("data is not a JSON object")
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        return Chunk("", error=str(msg)[:200])
    usage = obj.get("usage")
    prompt = completion = cached = None
    if isinstance(usage, dict):
        p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
        prompt = _count(p)
        completion = _count(c)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = _count(details.get("cached_tokens"))
    timings = _timings(obj["timings"]) if obj.get("timings") is not None else None
    choices = obj.get("choices")
    if not isinstance(choices, list):
        raise ChunkError("chunk has no 'choices' list")
    if not choices:  # the usage-only final chunk
        return Chunk("", None, prompt, completion, cached_tokens=cached, timings=timings)
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ChunkError("choices[0] is not an object")
    if api == "chat":
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
    else:
        text = choice.get("text")
    if text is not None and not isinstance(text, str):
        raise ChunkError("chunk content is not a string")
    return Chunk(text or "", choice.get("finish_reason"), prompt, completion,
                 tokens=_logprob_tokens(choice.get("logprobs"), api), cached_tokens=cached,
                 timings=timings)


def _count(v: Any) -> int | None:
    """A token count: a non-negative int (a bool or a negative number is no count)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _logprob_tokens(lp: Any, api: Api) -> int | None:
    """The tokens a chunk's ``logprobs`` lists: chat ``{"content": [...]}``, completions
    ``{"tokens": [...]}`` (one entry per token); None without logprobs."""
    if not isinstance(lp, dict):
        return None
    items = lp.get("content") if api == "chat" else lp.get("tokens")
    return len(items) if isinstance(items, list) else None


def chunk_tokens(chunk: Chunk, usage_before: int, usage_each: bool) -> int:
    """Tokens in a content chunk as the server tells, -1 when it does not.

    ``usage_before``: the cumulative ``completion_tokens`` of the stream's chunks so far
    (-1: none); ``usage_each``: every earlier content chunk carried one. The difference
    of cumulative counts is used only then (a usage on the last content chunk alone is a
    total, not this chunk's share); else the chunk's logprobs entries."""
    c = chunk.completion_tokens
    if c is not None and usage_each:
        return max(c - max(usage_before, 0), 0)
    return chunk.tokens if chunk.tokens is not None else -1


# The typed decode of the usual chunk (parse_chunk): no field may be of another type, and an
# error object, a non-object or a value JSON's own rules would read otherwise (NaN, a lone
# surrogate) fails it, for _parse_chunk to decide. Unknown keys are skipped unread.
class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class _ChatChoice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class _Completion(msgspec.Struct):
    choices: list[_Choice]
    usage: _Usage | None = None
    timings: LlamacppTimings | None = None  # llama-server's, as its parser accepts them
    error: Any = msgspec.UNSET  # present at all (even null): the full rules


class _ChatCompletion(msgspec.Struct):
    choices: list[_ChatChoice]
    usage: _Usage | None = None
    timings: LlamacppTimings | None = None
    error: Any = msgspec.UNSET


_FAST = {"completions": msgspec.json.Decoder(_Completion),
         "chat": msgspec.json.Decoder(_ChatCompletion)}
