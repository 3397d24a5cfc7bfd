"""The engine's phases of requests on tailgate's clock (pure, ns): where each request's wait
for the engine was queue and where it was held. One rule for the bench's accounting
(:class:`tailgate.llm.accounting.TokenBook`) and diagnose's (:mod:`tailgate.diagnose.engine`).

A request's wait runs from its send to the engine starting its prefill. Where the engine
states its queue (vLLM's spans, TGI's ``x-queue-time``), the stated queue, just before the
prefill, is ``queue`` and the wait before it ``held``. Else the wait is ``queue`` while the
engine worked on other requests (their prefill start to their decode's end: exact with one
slot, an upper bound with several, where a slot may have been free) and ``held`` for the
rest: the engine was idle, and the request still in the server's hands (its HTTP thread
reading, parsing or tokenizing it, or held up). A request's own busy span starts where its
wait ends, so it never counts against itself.
"""

from __future__ import annotations

import numpy as np

from ..spans import merge_spans, overlap_ns

MAX_SKEW_NS = 50_000_000  # a record 50 ms off the client's view is another clock's


def queue_and_held(sent: np.ndarray, prefill_start: np.ndarray, decode_end: np.ndarray,
                   queue_start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each request's wait ``[sent, prefill_start]`` split into ``(queue, held)`` (ns; they
    add up to the wait): see the module doc. ``decode_end``: where the engine's work on
    each request ended (the busy spans are every request's ``[prefill_start,
    decode_end]``); ``queue_start``: where the engine stated the request's queue began
    (0 or less: not stated)."""
    sent = np.asarray(sent, np.int64)
    pstart = np.asarray(prefill_start, np.int64)
    waited = np.clip(pstart - sent, 0, None)
    busy = merge_spans(np.stack([pstart, decode_end], axis=1), keep_instants=False)
    queue = np.minimum(overlap_ns(sent, np.maximum(sent, pstart), busy, merged=True), waited)
    if queue_start is not None:
        qs = np.asarray(queue_start, np.int64)
        said = qs > 0
        queue = np.where(said, np.minimum(np.clip(pstart - qs, 0, None), waited), queue)
    return queue, waited - queue
