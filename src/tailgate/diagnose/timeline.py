"""Bin requests and evidence on one time axis (pure): what the report's timeline shows."""

from __future__ import annotations

from typing import Any

import numpy as np


def span_time_per_bin(spans: np.ndarray, t0: int, bin_ns: int, n: int) -> np.ndarray:
    """Milliseconds of ``spans`` (merged ``[a, b]`` rows, ns) inside each bin."""
    out = np.zeros(n, dtype=np.float64)
    for a, b in spans:
        a, b = max(a, t0), min(b, t0 + n * bin_ns)
        i = (a - t0) // bin_ns
        while a < b and i < n:
            edge = min(b, t0 + (i + 1) * bin_ns)
            out[i] += (edge - a) / 1e6
            a, i = edge, i + 1
    return out


def timeline(t0: int, t1: int, bin_ns: int, starts: np.ndarray, ends: np.ndarray,
             evidence: dict[str, np.ndarray], instants: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per bin (by intended start): requests, P99 and max latency (ms); per evidence kind the
    milliseconds it lasted in the bin; per instant kind (retransmissions) its count."""
    n = max(1, int(np.ceil((t1 - t0) / bin_ns)))
    out: dict[str, Any] = {"t0_monotonic_ns": int(t0), "bin_ms": bin_ns / 1e6,
                           "t_ms": [round(i * bin_ns / 1e6, 3) for i in range(n)]}
    if len(starts):
        idx = np.clip((starts - t0) // bin_ns, 0, n - 1).astype(np.int64)
        lat = (ends - starts) / 1e6
        out["requests"] = np.bincount(idx, minlength=n).tolist()
        p99 = [None] * n
        mx = [None] * n
        order = np.argsort(idx, kind="stable")
        bounds = np.searchsorted(idx[order], np.arange(n + 1))
        for i in range(n):
            chunk = lat[order[bounds[i]:bounds[i + 1]]]
            if len(chunk):
                p99[i] = round(float(np.percentile(chunk, 99, method="inverted_cdf")), 3)
                mx[i] = round(float(chunk.max()), 3)
        out["latency_p99_ms"], out["latency_max_ms"] = p99, mx
    out["evidence_ms"] = {k: np.round(span_time_per_bin(v, t0, bin_ns, n), 3).tolist()
                          for k, v in evidence.items()}
    out["instants"] = {k: np.bincount(np.clip((v - t0) // bin_ns, 0, n - 1).astype(np.int64),
                                      minlength=n).tolist() if len(v) else [0] * n
                       for k, v in instants.items()}
    return out


def rebin(counts: dict[int, float], width_ns: int, t0: int, bin_ns: int, n: int,
          scale: float = 1.0) -> list[float]:
    """Counts kept per ``width_ns`` slot of the clock (slot ``k`` is ``[k * width_ns,
    (k + 1) * width_ns)``) spread evenly onto the timeline's bins, divided by ``scale``."""
    out = np.zeros(n, dtype=np.float64)
    edges = t0 + np.arange(n + 1, dtype=np.int64) * bin_ns
    for k, v in counts.items():
        a, b = k * width_ns, (k + 1) * width_ns
        lo, hi = np.clip(edges[:-1], a, b), np.clip(edges[1:], a, b)
        out += v * (hi - lo) / width_ns
    return np.round(out / scale, 3).tolist()
