"""The OpenAI-compatible wire format: request bodies and streamed chunks (pure).

``/v1/completions`` streams ``choices[0].text``; ``/v1/chat/completions``
streams ``choices[0].delta.content`` (its first chunk usually carries only the
role, no content). With ``stream_options: {"include_usage": true}`` vLLM,
SGLang and OpenAI end the stream with a chunk whose ``usage`` gives the exact
prompt and completion token counts; servers that ignore the option (llama.cpp's
Python server) send none, and tokens are then counted as content chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Api = Literal["completions", "chat"]
PATHS = {"completions": "/completions", "chat": "/chat/completions"}


def request_body(api: Api, model: str, prompt: str | list[dict[str, str]], max_tokens: int,
                 *, usage: bool = True, ignore_eos: bool = False,
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
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM/SGLang extension: generate exactly max_tokens
    if extra:
        body.update(extra)
    return json.dumps(body, separators=(",", ":")).encode()


class ChunkError(ValueError):
    """A data event that is not a chunk of this API (malformed JSON or shape)."""


@dataclass(frozen=True)
class Chunk:
    text: str  # content carried ("" for a role-only, usage-only or final chunk)
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from ``usage`` when present
    completion_tokens: int | None = None
    error: str | None = None  # an in-stream {"error": ...} object


def parse_chunk(data: str, api: Api) -> Chunk:
    """Interpret one ``data:`` payload (not ``[DONE]``)."""
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
    prompt = completion = None
    if isinstance(usage, dict):
        p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
        prompt = p if isinstance(p, int) else None
        completion = c if isinstance(c, int) else None
    choices = obj.get("choices")
    if not isinstance(choices, list):
        raise ChunkError("chunk has no 'choices' list")
    if not choices:  # the usage-only final chunk
        return Chunk("", None, prompt, completion)
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
    return Chunk(text or "", choice.get("finish_reason"), prompt, completion)
