"""The engine's own time of each streamed token (llama-server's per-token ``timings``),
beside the client's read of it (pure).

Asked with ``"timings_per_token": true`` (``bench --engine-timings per-token``),
llama-server puts its ``timings`` object in every chunk, not only the last. At a content
chunk, ``prompt_ms + predicted_ms`` is the time from the slot starting the request's prompt
to the sampling of the chunk's token on the engine's clock (``server_slot_stats``:
``t_gen_last - t_start``; the chunk is sent after its token is sampled). So every content
chunk ``i`` read at ``read_i`` bounds the instant the engine started the request on
tailgate's clock: ``start <= read_i - engine_ms_i``; the tightest is the least of them
(:attr:`EngineTokens.start_bound`), which :func:`tailgate.diagnose.engine.place` joins the
record by. And a gap between two chunks splits into the engine's own time between their
tokens (the difference of their ``engine_ms``) and the rest: delivery (the server's HTTP
thread, the network, the client).

A stream keeps one double per content chunk (NaN for a chunk without timings), as many as
its token times (``--max-tokens-per-stream``). A chunk whose ``timings`` cannot be read, or
times that go backwards, make the request's per-token times unknown with the reason: no
bound and no split are made from them.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from .engine_records import EngineTimings


def add_time(times: array[float] | str | None, timings: EngineTimings | str | None,
             n: int) -> array[float] | str | None:
    """``times`` (of a stream's first ``n - 1`` content chunks) with its ``n``-th chunk's
    ``timings`` (None: the chunk had none; a str: the reason they were unreadable)."""
    if isinstance(times, str):
        return times
    if isinstance(timings, str):
        return f"content chunk {n}: {timings}"
    if times is None:
        if timings is None:
            return None
        times = array("d", [math.nan]) * (n - 1)
    if timings is None or timings.prompt_ms is None or timings.predicted_ms is None:
        times.append(math.nan)
    else:
        times.append(timings.prompt_ms + timings.predicted_ms)
    return times


@dataclass(frozen=True)
class EngineTokens:
    """What one request's per-token engine times say. ``state``: "ok", "" (none sent) or
    the reason they are unknown; ``timed``: content chunks with a time; ``start_bound``:
    the latest instant (the reads' clock, s) the engine can have started the request, NaN
    where not known; ``gap_engine_ms``: the engine's time between the tokens of the two
    chunks of the longest gap (NaN: not known, e.g. one of them had no timings)."""

    state: str
    timed: int = 0
    start_bound: float = math.nan
    gap_engine_ms: float = math.nan


NONE = EngineTokens("")


def engine_tokens(reads: np.ndarray, times: array[float] | str | None,
                  gap: int = -1) -> EngineTokens:
    """A request's per-token engine times against its content chunks' reads (s, one per
    chunk); ``gap``: the index of the longest gap's first chunk (-1: none)."""
    if times is None:
        return NONE
    if isinstance(times, str):
        return EngineTokens(times)
    reads = np.asarray(reads, dtype=np.float64)
    ms = np.frombuffer(times, dtype=np.float64) if isinstance(times, array) else np.asarray(
        times, dtype=np.float64)
    if len(ms) != len(reads):
        return EngineTokens(f"{len(ms)} engine times for {len(reads)} content chunks")
    timed = np.isfinite(ms)
    n = int(timed.sum())
    if n == 0:
        return NONE
    t = ms[timed]
    back = np.flatnonzero(np.diff(t) < 0)
    if back.size:
        k = int(np.flatnonzero(timed)[back[0] + 1])
        return EngineTokens(f"content chunk {k + 1}: the engine's time went back from "
                            f"{t[back[0]]:.3f} to {t[back[0] + 1]:.3f} ms")
    bound = float(np.min(reads[timed] - t / 1e3))
    g = math.nan
    if 0 <= gap < len(ms) - 1 and timed[gap] and timed[gap + 1]:
        g = float(ms[gap + 1] - ms[gap])
    return EngineTokens("ok", n, bound, g)
