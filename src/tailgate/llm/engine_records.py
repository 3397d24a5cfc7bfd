"""The inference engine's own per-request records (pure parsers).

Each engine keeps, per request, how long it spent where; tailgate reads the record the
engine hands back with the response, so it belongs to that response and needs no id:

* llama.cpp's native server (``llama-server``): the ``timings`` object of a response
  (streamed: of its last chunk; every chunk with ``timings_per_token``). ``prompt_n`` is
  the prompt tokens the engine computed, ``cache_n`` those it took from the slot's cache,
  ``prompt_ms`` the prefill (from the slot starting the prompt to its last batch, which
  samples the first token), ``predicted_n`` / ``predicted_ms`` the decode after it
  (tools/server/server-common.{h,cpp}, ``server_slot_stats``). No queue time: that is the
  gap before the prefill, found on tailgate's clock (:mod:`tailgate.diagnose.engine`).
* TGI: the ``x-queue-time``, ``x-inference-time`` and ``x-time-per-token`` headers (ms),
  with ``x-prompt-tokens`` and ``x-generated-tokens`` (router/src/server.rs). Only a
  non-streamed ``/generate`` has them: a stream's headers leave before the times exist.

Each parser takes the decoded object and returns a frozen value, or raises
:class:`~tailgate.model.ParseError` naming the key that is missing or malformed: a record
that is not believable is no phase at all (the request's phases are then unknown with that
reason), never a phase read from a default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from ..model import ParseError

# A request that spent longer than this in one phase is not a plausible record.
MAX_PHASE_MS = 24 * 3600 * 1000.0


@dataclass(frozen=True)
class EngineTimings:
    """One request's phases as the engine measured them (ms on the engine's own clock;
    token counts). ``queue_ms`` is None where the engine does not say (llama.cpp)."""

    engine: str  # "llama.cpp", "tgi"
    prompt_n: int  # prompt tokens computed (prefill work)
    cache_n: int | None  # prompt tokens served from the prefix cache; None: not said
    prompt_ms: float | None  # prefill; None: not said (TGI folds it into inference)
    predicted_n: int
    predicted_ms: float | None  # decode after the first token
    queue_ms: float | None = None
    inference_ms: float | None = None  # prefill + decode where only their sum is given


def _count(obj: Mapping[str, Any], key: str, where: str) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ParseError(f"{where}.{key}: {v!r} is not a token count")
    return v


def _ms(obj: Mapping[str, Any], key: str, where: str, scale: float = 1.0) -> float:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ParseError(f"{where}.{key}: {v!r} is not a duration")
    ms = float(v) * scale
    if not math.isfinite(ms) or ms < 0 or ms > MAX_PHASE_MS:
        raise ParseError(f"{where}.{key}: {v!r} is not a plausible duration")
    return ms


def parse_llamacpp_timings(obj: Any) -> EngineTimings:
    """llama-server's ``timings`` object."""
    if not isinstance(obj, Mapping):
        raise ParseError(f"timings: {type(obj).__name__} is not an object")
    return EngineTimings("llama.cpp", _count(obj, "prompt_n", "timings"),
                         _count(obj, "cache_n", "timings"),
                         _ms(obj, "prompt_ms", "timings"),
                         _count(obj, "predicted_n", "timings"),
                         _ms(obj, "predicted_ms", "timings"))


# The typed decode of llama-server's `timings` in a streamed chunk (llm/openai.py's fast
# path, one per chunk with --engine-timings per-token): it accepts exactly what
# parse_llamacpp_timings accepts, so a record it takes is the parser's; anything else
# (a key missing, a bool, a negative count, an implausible duration) fails the decode and
# the parser, on the generic path, words the reason. Other keys are skipped unread.
_Count = Annotated[int, msgspec.Meta(ge=0)]
_Ms = Annotated[float, msgspec.Meta(ge=0, le=MAX_PHASE_MS)]


class LlamacppTimings(msgspec.Struct):
    prompt_n: _Count
    cache_n: _Count
    prompt_ms: _Ms
    predicted_n: _Count
    predicted_ms: _Ms

    def record(self) -> EngineTimings:
        return EngineTimings("llama.cpp", self.prompt_n, self.cache_n, self.prompt_ms,
                             self.predicted_n, self.predicted_ms)


TGI_HEADERS = ("x-queue-time", "x-inference-time", "x-time-per-token", "x-prompt-tokens",
               "x-generated-tokens")


def parse_tgi_headers(headers: Mapping[str, str]) -> EngineTimings:
    """TGI's timing headers of one response (names case-insensitive; times in ms)."""
    h = {k.lower(): v for k, v in headers.items()}
    vals: dict[str, Any] = {}
    for key in TGI_HEADERS:
        raw = h.get(key)
        if raw is None:
            raise ParseError(f"header {key}: missing")
        try:
            vals[key] = int(raw.strip())
        except ValueError:
            raise ParseError(f"header {key}: {raw[:40]!r} is not an integer") from None
    # TGI gives prefill and decode together (x-time-per-token is their mean over the
    # generated tokens): no split of them is made up here
    gen = _count(vals, "x-generated-tokens", "header")
    return EngineTimings("tgi", _count(vals, "x-prompt-tokens", "header"), None, None, gen,
                         None, queue_ms=_ms(vals, "x-queue-time", "header"),
                         inference_ms=_ms(vals, "x-inference-time", "header"))
