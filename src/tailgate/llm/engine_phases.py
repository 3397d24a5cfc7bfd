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

MAX_SKEW_NS = 50_000_000  # a record 50 ms off the client's view is another clock's


def merge(spans: np.ndarray) -> np.ndarray:
    """The sorted, disjoint union of ``[a, b]`` rows (int64 ns)."""
    s = np.asarray(spans, np.int64).reshape(-1, 2)
    s = s[s[:, 1] > s[:, 0]]
    if not len(s):
        return s
    s = s[np.argsort(s[:, 0], kind="stable")]
    reach = np.maximum.accumulate(s[:, 1])
    new = np.ones(len(s), bool)
    new[1:] = s[1:, 0] > reach[:-1]  # starts past every earlier end: a new group
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(s)) - 1
    return np.stack([s[first, 0], reach[last]], axis=1)


def covered(a: np.ndarray, b: np.ndarray, merged: np.ndarray) -> np.ndarray:
    """For each ``[a[i], b[i]]``, how long (ns) the disjoint ``merged`` spans cover of it."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if not len(merged):
        return np.zeros(len(a), np.int64)
    before = np.concatenate([[0], np.cumsum(merged[:, 1] - merged[:, 0])])

    def upto(t: np.ndarray) -> np.ndarray:  # the spans' time before t
        i = np.searchsorted(merged[:, 0], t, side="right") - 1
        out = np.zeros(len(t), np.int64)
        ok = i >= 0
        out[ok] = before[i[ok]] + np.minimum(t[ok], merged[i[ok], 1]) - merged[i[ok], 0]
        return out

    return np.clip(upto(np.maximum(a, b)) - upto(a), 0, None)


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
    queue = np.minimum(covered(sent, pstart, merge(np.stack([pstart, decode_end], axis=1))),
                       waited)
    if queue_start is not None:
        qs = np.asarray(queue_start, np.int64)
        said = qs > 0
        queue = np.where(said, np.minimum(np.clip(pstart - qs, 0, None), waited), queue)
    return queue, waited - queue
