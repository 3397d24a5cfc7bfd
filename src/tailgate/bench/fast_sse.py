"""openai+http:// on the compiled loop: the JSON half, read off the hot path.

The C loop (``fastloop.c``, kind ``openai``) frames each response (HTTP/1.1, chunked or
not) and its event stream by the rules of :mod:`tailgate.llm.sse` and
:mod:`.openai_sse`, and hands over, per event, (request id, the CLOCK_MONOTONIC time of
the read that completed it, the bytes received so far, its data); also ``data: [DONE]``
and, for every request that did not end ok, its reason, typed (an error body, an SSE
``event: error``'s data, a Content-Type, a line that is not UTF-8, a stream cut short
inside or between events) so it is worded here exactly as the Python engine words it.

:class:`Streams` reads those on the recorder thread (an idle task) or, at the end, on the
caller's, with the Python engine's parser (:func:`tailgate.llm.openai.read_chunk`: its
answer from one decode, the usual content chunk taken without building it):
per request the same token state the Python engine hands
:class:`~tailgate.llm.accounting.TokenBook` (first chunk, token times, ``[DONE]``, usage),
and the same outcome. What the loop cannot know without the JSON is decided here: a chunk
that is not JSON of the API (``malformed_sse``), an error object (``server_error``), more
than ``max_tokens`` tokens (``too_large``), a complete stream without content
(``no_token``), a stream ended by its framing after a ``finish_reason`` when ``[DONE]`` is
not required (``ok``). A request that failed on its JSON ends at the read of the failing
event with the bytes received by then, as on the Python engine, and its connection is cut
(:meth:`Streams.events` returns those still in flight).
"""

from __future__ import annotations

import math
import os
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..llm.openai import PLAIN, ChunkError, read_chunk
from ..sched import YIELD_NS
from .openai_sse import MAX_TOKENS_PER_STREAM, TokenState, apply_chunk, error_event
from .outcome import MALFORMED_SSE, NO_TOKEN, OK, TRUNCATED

EVENT = np.dtype([("rid", "<i8"), ("t", "<i8"), ("nbytes", "<i8"), ("off", "<i8"),
                  ("len", "<i4"), ("type", "<i4")])
# what an event is (fastloop.c's EV_* and R_*)
(EV_DATA, EV_DONE, R_TEXT, R_STATUS, R_EVERR, R_CTYPE, R_TRUNC_PENDING, R_TRUNC_CLEAN,
 R_UTF8) = range(9)
NO_CONTENT = "the stream finished without any content"
NAN = math.nan


class _Stream:
    """One request's stream so far (openai_sse.OpenAIConnection's per-request fields)."""

    __slots__ = ("cached", "etok", "fail", "timings", "finish_reason", "first_chunk",
                 "in_tokens", "ntok", "out_tokens", "reason", "t_done", "tok", "usage_each")

    def __init__(self) -> None:
        self.first_chunk = math.nan
        self.tok: array[float] = array("d")
        self.t_done = math.nan
        self.finish_reason: str | None = None
        self.out_tokens = -1
        self.in_tokens = -1
        self.ntok: array[int] = array("i")  # per content chunk: its tokens, -1 unknown
        self.cached = -1
        self.timings = None
        self.etok: array[float] | str | None = None  # the engine's time of each token
        self.usage_each = True  # every content chunk so far carried a cumulative usage
        self.fail: tuple[int, str, float, int] | None = None  # (outcome, reason, t, bytes)
        self.reason: tuple[int, bytes] | None = None  # the loop's typed reason

    def tokens(self) -> TokenState:
        return (self.first_chunk, self.tok, self.t_done, self.out_tokens, self.in_tokens,
                self.ntok, self.cached, self.timings, self.etok)


@dataclass(frozen=True)
class Settled:
    """A batch of records with the outcomes the Python engine would give them."""

    out: np.ndarray
    end: np.ndarray  # monotonic s
    status: np.ndarray  # 0 for a stream failed on its JSON (openai_sse: fail())
    nbytes: np.ndarray
    reasons: list[str]  # "" for ok
    toks: list[TokenState]


def _utf8_error(line: bytes) -> str:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"event-stream line is not UTF-8: {exc}"
    return "event-stream line is not UTF-8"  # (the loop and Python disagree: say so)


class Streams:
    """The per-request stream states of one compiled run (see the module doc)."""

    def __init__(self, api: str = "completions", max_tokens: int = MAX_TOKENS_PER_STREAM,
                 require_done: bool = True) -> None:
        self.api = api
        self.max_tokens = max_tokens
        self.require_done = require_done
        self.open: dict[int, _Stream] = {}

    def events(self, hdr: bytes, blob: bytes, start: float) -> list[int]:
        """Read one take's events in order; returns the requests that failed on their JSON
        just now (the loop cuts their connections if they are still in flight)."""
        if not hdr:
            return []
        ev = np.frombuffer(hdr, dtype=EVENT)
        cut: list[int] = []
        streams, api, limit = self.open, self.api, self.max_tokens
        mv = memoryview(blob)
        clock, last = time.monotonic_ns, time.monotonic_ns()
        for rid, t, nb, off, ln, typ in zip(ev["rid"].tolist(), ev["t"].tolist(),
                                            ev["nbytes"].tolist(), ev["off"].tolist(),
                                            ev["len"].tolist(), ev["type"].tolist(),
                                            strict=True):
            if (now_ns := clock()) - last > YIELD_NS:  # (sched.Breather, inline: per event)
                os.sched_yield()
                last = now_ns
            st = streams.get(rid)
            if st is None:
                st = streams[rid] = _Stream()
            if typ >= R_TEXT:
                st.reason = (typ, bytes(mv[off:off + ln]))
                continue
            if st.fail is not None:
                continue  # (what the loop read before the cut took effect)
            now = t * 1e-9 + start
            if typ == EV_DONE:
                st.t_done = now
                continue
            try:  # one decode (the loop checked every line is UTF-8)
                chunk = read_chunk(mv[off:off + ln], api)  # type: ignore[arg-type]
            except ChunkError as exc:
                st.fail = (MALFORMED_SSE, str(exc), now, nb)
                cut.append(rid)
                continue
            if chunk is PLAIN and len(st.tok) < limit:
                # apply_chunk's effect of the usual chunk, without building it
                if st.first_chunk != st.first_chunk:
                    st.first_chunk = now
                st.tok.append(now)
                st.ntok.append(-1)
                st.usage_each = False
                if st.etok is not None and type(st.etok) is not str:
                    st.etok.append(NAN)  # (a chunk without the engine's time)
                continue
            failed = apply_chunk(st, chunk, now, limit)
            if failed is not None:
                st.fail = (*failed, now, nb)
                cut.append(rid)
        return cut

    def settle(self, rid: np.ndarray, end: np.ndarray, out: np.ndarray, status: np.ndarray,
               nbytes: np.ndarray, breathe: Callable[[], None] = lambda: None) -> Settled:
        """The final outcome, end, bytes, reason and token state of each ended request (its
        events were read by :meth:`events` first); ``breathe`` between requests (the
        recorder's :class:`~tailgate.sched.Breather`)."""
        out, end, nbytes, status = out.copy(), end.copy(), nbytes.copy(), status.copy()
        reasons: list[str] = []
        toks: list[TokenState] = []
        for i, r in enumerate(rid.tolist()):
            breathe()
            st = self.open.pop(r, None) or _Stream()
            toks.append(st.tokens())
            if st.fail is not None:
                out[i], why, end[i], nbytes[i] = st.fail
                status[i] = 0
                reasons.append(why)
                continue
            o = int(out[i])
            typ, data = st.reason if st.reason is not None else (R_TEXT, b"")
            if o == OK or (o == TRUNCATED and typ == R_TRUNC_CLEAN and not self.require_done
                           and st.finish_reason is not None):
                if st.t_done != st.t_done:
                    st.t_done = float(end[i])  # ended by a finish_reason and the framing
                    toks[-1] = st.tokens()
                out[i] = OK if st.tok else NO_TOKEN
                reasons.append("" if st.tok else NO_CONTENT)
            elif typ == R_TRUNC_CLEAN:
                reasons.append("the response ended before data: [DONE]"
                               + ("" if self.require_done else " or a finish_reason"))
            elif typ == R_TRUNC_PENDING:
                reasons.append("the response ended inside an event")
            elif typ == R_STATUS:
                reasons.append(f"HTTP {int(status[i])}: "
                               + data.decode("utf-8", errors="replace").strip()[:200])
            elif typ == R_EVERR:
                reasons.append(f"event: error: {error_event(data.decode('utf-8'))}")
            elif typ == R_CTYPE:
                reasons.append("not an event stream (Content-Type "
                               f"{data.decode(errors='replace')})")
            elif typ == R_UTF8:
                reasons.append(_utf8_error(data))
            else:
                reasons.append(data.decode("utf-8", errors="replace"))
        return Settled(out, end, status, nbytes, reasons, toks)


def frame_stream(got: dict[str, Any], api: str, max_tokens: int,
                 require_done: bool) -> tuple[int | None, int, int, str, bool, int]:
    """``fastloop.frame("openai", ...)``'s pieces for request 0, settled as the engine
    settles them: (outcome or None, status, bytes, reason, still open, tokens)."""
    from .engine_types import RECORD

    streams = Streams(api, max_tokens, require_done)
    streams.events(got["events"], got["blob"], 0.0)
    recs = np.frombuffer(got["recs"], dtype=RECORD)
    st = streams.open.get(0)
    n_tok = len(st.tok) if st is not None else 0
    failed = st is not None and st.fail is not None
    is_open = bool(got["open"]) and not failed  # (the engine cuts a failed stream)
    if not recs.size:
        if failed:
            return st.fail[0], 0, st.fail[3], st.fail[1], False, n_tok  # type: ignore[union-attr]
        return None, 0, int(got["bytes"]), "", is_open, n_tok
    done = streams.settle(recs["rid"].astype(np.int64), recs["end"] * 1e-9,
                          recs["out"].astype(np.int64), recs["status"].astype(np.int64),
                          recs["bytes"].astype(np.int64))
    return (int(done.out[0]), int(done.status[0]), int(done.nbytes[0]), done.reasons[0],
            is_open, n_tok)
