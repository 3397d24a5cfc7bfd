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

from dataclasses import dataclass

import numpy as np

from ..spans import merge_spans, overlap_ns

MAX_SKEW_NS = 50_000_000  # a record 50 ms off the client's view is another clock's
# why a record was refused (Anchors.refused)
PLACED, READS_DISAGREE, STARTS_BEFORE_SEND = 0, 1, 2


@dataclass(frozen=True)
class Anchors:
    """Each engine record put on tailgate's clock (ns; see :func:`anchor`)."""

    anchor: np.ndarray  # E: the end of the prefill on tailgate's clock
    by_reads: np.ndarray  # E from the first and last tokens' reads alone
    spread: np.ndarray  # how far those two reads disagree; -1 where only the first placed E
    early: np.ndarray  # sent - the engine's start (E - prefill - queue): > 0 is impossible
    per_token: np.ndarray  # bool: every token's read bounded E too
    refused: np.ndarray  # PLACED, READS_DISAGREE or STARTS_BEFORE_SEND


def anchor(sent: np.ndarray, first: np.ndarray, last: np.ndarray, prefill: np.ndarray,
           decode: np.ndarray, two: np.ndarray, queue: np.ndarray, start_bound: np.ndarray,
           max_skew_ns: int = MAX_SKEW_NS) -> Anchors:
    """Where the engine finished each request's prefill on tailgate's clock, one rule for
    bench's accounting and diagnose (int64 ns arrays): E is the earliest of the first
    token's read, the last token's read less the decode (where ``two``: more than one token
    and the decode known), and, with per-token times, the latest start every token's read
    allows plus the prefill (``start_bound``, 0: none). A record whose two reads disagree,
    or whose engine start (E - prefill - the stated ``queue``, 0: none) would come before
    the send, by more than ``max_skew_ns`` is another clock's: refused."""
    a2 = np.where(two, last - decode, first)
    by_reads = np.minimum(first, a2)
    per_token = start_bound > 0
    e = np.where(per_token, np.minimum(by_reads, start_bound + prefill), by_reads)
    early = sent - (e - prefill - queue)
    spread = np.where(two, np.abs(first - a2), -1)
    refused = np.where(spread > max_skew_ns, READS_DISAGREE,
                       np.where(early > max_skew_ns, STARTS_BEFORE_SEND, PLACED))
    return Anchors(e, by_reads, spread, early, per_token, refused)


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
