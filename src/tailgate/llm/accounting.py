"""Token accounting of streamed requests: TTFT, ITL, TPOT, E2E, tokens, goodput, LLM SLOs.

The bench engine (:mod:`tailgate.bench.engine`) runs ``openai+`` targets like
any other protocol; per request its connection keeps the token times
(:mod:`tailgate.bench.openai_sse`), and at each flush the engine hands the batch
to :meth:`TokenBook.record`, which turns it into histograms (vectorised, in ns).

Definitions (every time from the request's *intended* start):

* TTFT: to the first chunk that carries non-empty content. A role-only or empty
  first chunk (chat's ``{"role": "assistant"}``, llama.cpp's empty first text)
  does not count: the user has seen nothing yet. Engines that time the first
  *chunk* report a smaller TTFT; ``first_chunk_ms`` gives that figure too.
* ITL: every gap between consecutive content chunks (a chunk carrying several
  tokens, as with speculative decoding, is one gap).
* TPOT: ``(E2E - TTFT) / (output tokens - 1)``, per request with >= 2 tokens.
* E2E: to ``data: [DONE]`` (or, with ``--allow-no-done``, the end of the response).
* Output tokens: the server's ``usage.completion_tokens`` when it sent one for
  every successful request (``counted_by: "usage"``), else one per content chunk
  (``counted_by: "chunks"``). Input tokens likewise, else the workload's word
  count (``input_counted_by: "workload"``).

A request that timed out counts in TTFT and E2E at its time-out (if no token had
come) so the tail keeps it; other failures are counted by kind only (the bench's
``latency_ms`` counts every request, from intended start to its end).
Goodput: successful requests per second whose own TTFT, TPOT, E2E and ITLs meet
every latency SLO given (for ``itl_pXX`` the request's own XX-th percentile gap).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bench.slo import Slo, SloError
from ..bench.slo import parse_slo as _bench_parse_slo
from ..hist import Histogram, HistogramSpec

METRICS = ("ttft", "itl", "tpot", "e2e")
HISTS = (*METRICS, "first_chunk")
_STATS = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9, "p9999": 99.99,
          "max": 100.0}
# SLOs are parsed and evaluated by tailgate.bench.slo (one grammar for every bench); the
# LLM figures are its "custom" metrics, looked up in the result's "metrics" block.
CUSTOM_METRICS: dict[str, str] = {
    **{f"{m}_{stat}": "ms" for m in METRICS for stat in _STATS},
    "goodput_rps": "rate", "requests_per_s": "rate", "output_tokens_per_s": "rate",
}
SLO_EXAMPLES = ("ttft_p999<2s, itl_p99<50ms, tpot_p50<20ms, e2e_max<30s, error_rate<1%, "
                "goodput_rps>=5")
_OPS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


def parse_slo(expr: str) -> Slo:
    """``ttft_p999<2s``, ``itl_p99<=50ms``, ``e2e_max<30s``, ``error_rate<1%``,
    ``goodput_rps>=5`` (and every bench SLO: ``p99<...`` is the request latency)."""
    try:
        return _bench_parse_slo(expr, CUSTOM_METRICS)
    except SloError as exc:
        raise SloError(f"{exc} (LLM targets also: {SLO_EXAMPLES})") from None


@dataclass(frozen=True)
class GoodSlo:
    """One per-request latency objective for goodput: metric, percentile, op, limit (ms)."""

    metric: str
    pct: float
    op: str
    limit_ms: float


def good_slos(slos: Iterable[Slo]) -> tuple[GoodSlo, ...]:
    """The latency SLOs a single request can meet or miss (``ttft_p99<2s`` -> TTFT < 2 s)."""
    out = []
    for s in slos:
        metric, _, stat = s.metric.partition("_")
        if metric in METRICS and stat in _STATS:
            out.append(GoodSlo(metric, _STATS[stat], s.op, s.limit))
    return tuple(out)


@dataclass
class TokenBook:
    """One worker's token figures (measured requests only). Picklable, mergeable."""

    spec: HistogramSpec = field(default_factory=HistogramSpec)
    hists: dict[str, Histogram] = field(default_factory=dict)
    intervals: dict[str, dict[int, Histogram]] = field(default_factory=dict)
    ok: int = 0
    good: int = 0
    output: int = 0
    input: int = 0
    usage_out: int = 0  # ok requests whose usage gave completion_tokens
    usage_in: int = 0
    warmup_ok: int = 0
    last_end_s: float = 0.0  # latest end of a measured request, from the run's start
    # By the interval each measured ok request ended in (from the end of the warm-up):
    # [ok requests, good requests, output tokens], for throughput and goodput over time.
    done: dict[int, list[int]] = field(default_factory=dict)
    ttft_delta: Histogram | None = None  # the last batch's TTFTs (the live display's)

    def __post_init__(self) -> None:
        for k in HISTS:
            self.hists.setdefault(k, Histogram(self.spec))

    def record(self, intended: np.ndarray, end: np.ndarray, out: np.ndarray,
               measured: np.ndarray, toks: Sequence[Any], nominal: np.ndarray,
               start: float, warmup_s: float, slot_s: float | None,
               goods: tuple[GoodSlo, ...], ok_code: int, timeout_code: int) -> None:
        """A batch of ended requests: ``intended``/``end`` (monotonic s), outcome codes,
        which are measured, each one's token state (see ``openai_sse.TokenState``, or
        None: no connection), and the workload's input length of each."""
        n = len(toks)
        first = np.full(n, math.nan)
        chunk0 = np.full(n, math.nan)
        done = np.full(n, math.nan)
        count = np.zeros(n, dtype=np.int64)
        use_out = np.full(n, -1, dtype=np.int64)
        use_in = np.full(n, -1, dtype=np.int64)
        gaps: list[np.ndarray] = []
        owner: list[np.ndarray] = []
        for i, t in enumerate(toks):
            if t is None:
                continue
            chunk0[i], times, done[i], use_out[i], use_in[i] = t
            if times:
                first[i] = times[0]
                count[i] = len(times)
                if len(times) > 1:
                    # (arrays, not lists of floats: a long stream's gaps stay 8 bytes each)
                    gaps.append(np.diff(np.frombuffer(times, dtype=np.float64)
                                        if isinstance(times, array) else np.asarray(times)))
                    owner.append(np.full(len(times) - 1, i, dtype=np.int64))
        ok = out == ok_code
        self.warmup_ok += int(np.count_nonzero(ok & ~measured))
        timed_out = out == timeout_code
        counted = measured & (ok | timed_out)
        ok_m = measured & ok
        e2e = np.where(ok_m & ~np.isnan(done), done, end) - intended
        ttft = first - intended
        ttft = np.where(timed_out & np.isnan(ttft), e2e, ttft)  # no token by the time-out
        n_out = np.where(use_out >= 0, use_out, count)
        n_in = np.where(use_in >= 0, use_in, nominal)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(ok_m & (n_out >= 2), (e2e - ttft) / (n_out - 1), math.nan)
        itl = np.concatenate(gaps) if gaps else np.zeros(0, dtype=np.float64)
        itl_owner = np.concatenate(owner) if owner else np.zeros(0, dtype=np.int64)
        itl_keep = counted[itl_owner] if itl.size else np.zeros(0, dtype=bool)
        values = {
            "ttft": (ttft, counted & ~np.isnan(ttft)),
            "e2e": (e2e, counted),
            "tpot": (tpot, ~np.isnan(tpot)),
            "first_chunk": (chunk0 - intended, ok_m & ~np.isnan(chunk0)),
        }
        for name, (v, keep) in values.items():
            self._add(name, v[keep], (intended[keep] - start), warmup_s, slot_s)
        self._add("itl", itl[itl_keep], (intended[itl_owner[itl_keep]] - start)
                  if itl.size else itl, warmup_s, slot_s)
        self.ok += int(np.count_nonzero(ok_m))
        self.output += int(n_out[ok_m].sum())
        self.input += int(n_in[ok_m].sum())
        self.usage_out += int(np.count_nonzero(ok_m & (use_out >= 0)))
        self.usage_in += int(np.count_nonzero(ok_m & (use_in >= 0)))
        if np.any(measured):
            self.last_end_s = max(self.last_end_s, float(np.max(end[measured])) - start)
        good = ok_m.copy()
        for g in goods:
            if g.metric == "itl":
                own = np.full(n, math.nan)
                for i in np.flatnonzero(ok_m).tolist():
                    mine = itl[itl_owner == i]
                    if mine.size:
                        own[i] = (float(mine.max()) if g.pct >= 100.0 else
                                  float(np.percentile(mine, g.pct, method="inverted_cdf")))
            else:
                own = {"ttft": ttft, "tpot": tpot, "e2e": e2e}[g.metric]
            meets = _OPS[g.op](own * 1e3, g.limit_ms) | np.isnan(own)  # no value: no test
            good &= meets
        self.good += int(np.count_nonzero(good))
        if slot_s and np.any(ok_m):
            slot = np.maximum((end[ok_m] - start - warmup_s) // slot_s, 0).astype(np.int64)
            g, toks_out = good[ok_m], n_out[ok_m]
            for k in np.unique(slot).tolist():
                here = slot == k
                row = self.done.setdefault(k, [0, 0, 0])
                row[0] += int(np.count_nonzero(here))
                row[1] += int(np.count_nonzero(g & here))
                row[2] += int(toks_out[here].sum())

    def _add(self, name: str, secs: np.ndarray, at: np.ndarray, warmup_s: float,
             slot_s: float | None) -> None:
        ns = np.maximum(secs, 0.0) * 1e9
        self.hists[name].record(ns)
        if name == "ttft":
            self.ttft_delta = Histogram(self.spec)
            self.ttft_delta.record(ns)
        if slot_s and name in ("ttft", "itl", "e2e") and ns.size:
            slot = ((at - warmup_s) // slot_s).astype(np.int64)
            book = self.intervals.setdefault(name, {})
            for k in np.unique(slot).tolist():
                h = book.get(k)
                if h is None:
                    h = book[k] = Histogram(self.spec)
                h.record(ns[slot == k])

    def add(self, other: TokenBook) -> None:
        for k, h in other.hists.items():
            self.hists[k].add(h)
        for name, book in other.intervals.items():
            mine = self.intervals.setdefault(name, {})
            for k, h in book.items():
                mine.setdefault(k, Histogram(self.spec)).add(h)
        for k, row in other.done.items():
            mine_row = self.done.setdefault(k, [0, 0, 0])
            for i, n in enumerate(row):
                mine_row[i] += n
        for f in ("ok", "good", "output", "input", "usage_out", "usage_in", "warmup_ok"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.last_end_s = max(self.last_end_s, other.last_end_s)


def summary(h: Histogram) -> dict[str, Any]:
    """Percentiles in ms (None without samples), the mean and the median (= p50, named as
    `vllm bench serve` prints it), with the sample counts behind the tail."""
    out: dict[str, Any] = {}
    names = ("p50", "p90", "p95", "p99", "p999", "p9999")
    vals = h.values_at_percentiles([_STATS[n] for n in names])
    for name, v in zip(names, vals, strict=True):
        # HdrHistogram's value may pass the exact max by part of a bucket: show at most max.
        out[name] = round(min(v, h.max) / 1e6, 3) if h.total else None
    out["max"] = round(h.max / 1e6, 3) if h.total else None
    out["mean"] = round(h.mean() / 1e6, 3) if h.total else None
    out["median"] = out["p50"]
    out["count"] = h.total
    out["samples_above"] = {"p99": h.samples_above_percentile(99.0),
                            "p999": h.samples_above_percentile(99.9)}
    return out


def llm_block(book: TokenBook, warmup_s: float) -> dict[str, Any]:
    """The LLM part of a bench result: per-metric summaries, tokens, throughput, metrics."""
    h = book.hists
    # From the end of the warm-up to the last measured response (long generations count).
    span = max(book.last_end_s - warmup_s, 1e-9)
    out: dict[str, Any] = {f"{k}_ms": summary(h[k]) for k in HISTS}
    ok = book.ok
    out["tokens"] = {"input": book.input, "output": book.output,
                     "counted_by": "usage" if ok and book.usage_out == ok else "chunks",
                     "input_counted_by": "usage" if ok and book.usage_in == ok else "workload"}
    out["throughput"] = {"output_tokens_per_s": round(book.output / span, 3),
                         "total_tokens_per_s": round((book.input + book.output) / span, 3),
                         "requests_per_s": round(ok / span, 3),
                         "goodput_rps": round(book.good / span, 3),
                         "span_s": round(span, 6)}
    metrics: dict[str, float | None] = {}
    for m in METRICS:
        for stat, pct in _STATS.items():
            hist = h[m]
            if not hist.total:
                metrics[f"{m}_{stat}"] = None
            elif stat in out[f"{m}_ms"]:
                metrics[f"{m}_{stat}"] = out[f"{m}_ms"][stat]
            else:
                metrics[f"{m}_{stat}"] = round(min(hist.value_at_percentile(pct),
                                                   hist.max) / 1e6, 3)
    metrics.update({k: out["throughput"][k] for k in ("goodput_rps", "requests_per_s",
                                                      "output_tokens_per_s")})
    out["metrics"] = metrics
    out["good"] = book.good
    return out


def completed_over_time(book: TokenBook, slot_s: float) -> dict[str, Any]:
    """Requests, good requests and output tokens per second, by the interval a request
    ended in: every interval from the first to the last (a zero is a fact)."""
    last = max(book.done, default=-1)
    rows = [book.done.get(k, [0, 0, 0]) for k in range(last + 1)]
    return {"by": "end", "t_s": [round(k * slot_s, 6) for k in range(last + 1)],
            "ok_per_s": [round(r[0] / slot_s, 3) for r in rows],
            "good_per_s": [round(r[1] / slot_s, 3) for r in rows],
            "output_tokens_per_s": [round(r[2] / slot_s, 3) for r in rows]}
