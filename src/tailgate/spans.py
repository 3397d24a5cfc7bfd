"""Arithmetic on time spans: ``[a, b]`` rows of int64 ns (pure numpy), for diagnose's
evidence and for the engine's phases of requests (:mod:`tailgate.llm.engine_phases`)."""

from __future__ import annotations

import numpy as np


def merge_spans(spans: np.ndarray, keep_instants: bool = True) -> np.ndarray:
    """Sorted, disjoint union of ``[a, b]`` rows (``b >= a``), vectorised: a run's worth
    of requests is up to a million. An instant (``a == b``) stays a row, since a probe's
    event at one instant still touches the windows it falls in; ``keep_instants=False``
    drops them first, where only time counts (the engine's busy spans)."""
    s = np.asarray(spans, np.int64).reshape(-1, 2)
    if not keep_instants:
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


def subtract_spans(spans: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """``spans`` minus the union of ``cut`` (both ``[a, b]`` rows)."""
    spans, cut = merge_spans(spans), merge_spans(cut)
    if len(cut) == 0 or len(spans) == 0:
        return spans
    out = []
    for a, b in spans:
        i = int(np.searchsorted(cut[:, 1], a, side="left"))
        cur = a
        while i < len(cut) and cut[i, 0] <= b:
            if cut[i, 0] > cur:
                out.append((cur, cut[i, 0]))
            cur = max(cur, cut[i, 1])
            i += 1
        if cur < b:
            out.append((cur, b))
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def touched(starts: np.ndarray, ends: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """For each ``[starts[i], ends[i]]``: does any span overlap or touch it? (bool)"""
    m = merge_spans(spans)
    if len(m) == 0:
        return np.zeros(len(starts), dtype=bool)
    idx = np.searchsorted(m[:, 0], ends, side="right") - 1
    ok = idx >= 0
    out = np.zeros(len(starts), dtype=bool)
    out[ok] = m[idx[ok], 1] >= starts[ok]
    return out


def overlap_ns(starts: np.ndarray, ends: np.ndarray, spans: np.ndarray,
               merged: bool = False) -> np.ndarray:
    """For each ``[starts[i], ends[i]]``, how long (ns) the union of ``spans`` covers of it
    (``merged``: ``spans`` is a union already, from :func:`merge_spans`)."""
    m = spans if merged else merge_spans(spans)
    if len(m) == 0:
        return np.zeros(len(starts), dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(m[:, 1] - m[:, 0])])

    def upto(t: np.ndarray) -> np.ndarray:  # total span time before t
        i = np.searchsorted(m[:, 0], t, side="right") - 1
        out = np.zeros(len(t), dtype=np.int64)
        ok = i >= 0
        out[ok] = before[i[ok]] + np.minimum(t[ok], m[i[ok], 1]) - m[i[ok], 0]
        return out

    return upto(ends) - upto(starts)
