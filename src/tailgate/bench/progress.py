"""The live display: rate achieved, errors, running P99/P999 (rich, on stderr)."""

from __future__ import annotations

import time
from typing import Any

from ..hist import Histogram, HistogramSpec
from .outcome import KINDS


class Progress:
    """Accumulates the workers' progress messages; :meth:`render` draws one panel."""

    def __init__(self, rate: float, duration_s: float, warmup_s: float,
                 spec: HistogramSpec | None = None) -> None:
        self.rate = rate
        self.duration_s = duration_s
        self.warmup_s = warmup_s
        self.latency = Histogram(spec or HistogramSpec())
        self.ttft = Histogram(spec or HistogramSpec())  # openai+ runs: time to first token
        self.outcomes = [0] * len(KINDS)
        self.dispatched = 0
        self.open: dict[int, int] = {}
        self.queued: dict[int, int] = {}
        self.start: float | None = None
        self.last_t = 0.0  # the latest worker flush time: rates are counted up to it

    def update(self, worker: int, msg: dict[str, Any]) -> None:
        self.latency.add_sparse(msg["lat_idx"], msg["lat_cnt"], msg["lat_lo"], msg["lat_hi"])
        if "ttft" in msg:
            self.ttft.add_sparse(*msg["ttft"])
        for i, c in enumerate(msg["outcomes"]):
            self.outcomes[i] += c
        self.dispatched += msg["dispatched"]
        self.open[worker] = msg["open"]
        self.queued[worker] = msg["queued"]
        self.last_t = max(self.last_t, msg.get("t", 0.0))

    def render(self) -> Any:
        from rich.table import Table

        now = time.monotonic()
        elapsed = max(now - (self.start or now) - self.warmup_s, 0.0)
        counted = max(self.last_t - (self.start or now) - self.warmup_s, 0.0)
        done = sum(self.outcomes)
        errors = done - self.outcomes[0]
        p99, p999 = self.latency.values_at_percentiles([99.0, 99.9])
        t = Table(title=None, show_header=True, box=None)
        cols = ["elapsed", "rate/s", "done", "errors", "p99 ms", "p999 ms", "open", "queued"]
        if self.ttft.total:
            cols[6:6] = ["ttft p99 ms"]
        for col in cols:
            t.add_column(col, justify="right")
        phase = "warm-up" if self.start and now - self.start < self.warmup_s else ""
        cells = [f"{min(elapsed, self.duration_s):.1f}/{self.duration_s:g}s {phase}",
                 f"{self.dispatched / counted:,.0f}" if counted > 0 else "-",
                 f"{done:,}", f"{errors:,}", f"{p99 / 1e6:.3f}", f"{p999 / 1e6:.3f}",
                 f"{sum(self.open.values())}", f"{sum(self.queued.values())}"]
        if self.ttft.total:
            cells[6:6] = [f"{self.ttft.value_at_percentile(99.0) / 1e6:.3f}"]
        t.add_row(*cells)
        return t
