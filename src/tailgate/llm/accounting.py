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
* ITL (``itl_ms``, per chunk): every gap between consecutive content chunks (a chunk
  carrying several tokens, as with speculative decoding, is one gap).
* ITL per token (``itl_per_token_ms``): a content chunk after the first that carries
  *k* tokens counts *k* times, at its gap / *k* (its tokens spread evenly over the gap;
  the first chunk's tokens are TTFT's). *k* is what the server says of that chunk (the
  difference of a cumulative ``usage`` sent with every chunk, else its ``logprobs``
  entries), else one: ``token_check`` says how many chunks were counted and how many
  assumed. With one token a chunk both figures are the same samples.
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

Token truth (``token_check``): for every successful request with a
``usage.completion_tokens``, the client's own count (its content chunks, each counted
as above) is compared with it; a mismatch is counted (and shown) — the per-chunk
figures then do not describe tokens. ``prefix_cache``: the prompt tokens the server
says it served from its prefix cache (``usage.prompt_tokens_details.cached_tokens``)
over the prompt tokens of the requests that reported them: the hit rate as the client
sees it. See docs/llm-tokens.md.
"""

from __future__ import annotations

import math
import socket
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..hist import Histogram, HistogramSpec, IntervalHistograms
from ..slo import Slo, SloError
from ..slo import parse_slo as _bench_parse_slo
from .engine_phases import PLACED, anchor, queue_and_held
from .engine_tokens import engine_tokens

METRICS = ("ttft", "itl", "itl_per_token", "tpot", "e2e")
# The engine's own phases where it sends a record of each request (llama-server's timings):
# its wait from its send to the prefill's start on tailgate's clock, split into queue (the
# engine busy with other requests, or its stated queue) and held (the engine idle: the
# request still in the server's hands; llm.engine_phases), the prefill and the decode.
# The generator's lateness is the bench's own figure (lateness_ms), in neither.
ENGINE = ("engine_queue", "engine_held", "engine_prefill", "engine_decode")
HISTS = (*METRICS, "first_chunk", *ENGINE)
_STATS = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9, "p9999": 99.99,
          "max": 100.0}
# SLOs are parsed and evaluated by tailgate.slo (one grammar for every bench); the
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
        metric, _, stat = s.metric.rpartition("_")
        if metric in METRICS and stat in _STATS:
            out.append(GoodSlo(metric, _STATS[stat], s.op, s.limit))
    return tuple(out)


class _Added(NamedTuple):
    """What one ok request added to a TokenBook's counts of ok requests (see `relabel`)."""

    output: int
    input: int
    good: bool
    slot: int  # its interval of throughput over time, or -1
    usage_out: bool
    usage_in: bool
    mismatch: bool
    cache_reported: bool
    cache_prompt: int
    cache_tokens: int


@dataclass
class TokenBook:
    """One worker's token figures (measured requests only). Picklable, mergeable."""

    spec: HistogramSpec = field(default_factory=HistogramSpec)
    hists: dict[str, Histogram] = field(default_factory=dict)
    intervals: dict[str, IntervalHistograms] = field(default_factory=dict)  # ttft, itl, e2e
    ok: int = 0
    good: int = 0
    output: int = 0
    input: int = 0
    usage_out: int = 0  # ok requests whose usage gave completion_tokens
    usage_in: int = 0
    # token truth: chunks whose tokens the server stated / were assumed one, chunks of
    # several tokens, the most in one; ok requests with usage compared, mismatched
    chunks_counted: int = 0
    chunks_assumed: int = 0
    multi_token_chunks: int = 0
    max_chunk_tokens: int = 0
    usage_compared: int = 0
    usage_mismatch: int = 0
    # distinct (client, usage) pairs of mismatched requests, up to MAX_MISMATCH_EXAMPLES
    mismatch_examples: list[tuple[int, int]] = field(default_factory=list)
    # prefix cache: ok requests whose usage gave cached_tokens, their prompt tokens, the
    # cached ones, and how many had any
    cache_reported: int = 0
    cache_prompt: int = 0
    cache_tokens: int = 0
    cache_hit_requests: int = 0
    warmup_ok: int = 0
    last_end_s: float = 0.0  # latest end of a measured request, from the run's start
    # By the interval each measured ok request ended in (from the end of the warm-up):
    # [ok requests, good requests, output tokens], for throughput and goodput over time.
    done: dict[int, list[int]] = field(default_factory=dict)
    ttft_delta: Histogram | None = None  # the last batch's TTFTs (the live display's)
    # Per request whose engine record was placed on tailgate's clock: its send, prefill
    # start, decode end and stated queue start (monotonic ns; 0: not stated), by the host
    # whose clock they are on; split into queue and held over all of them at the end
    # (`split_waits`: a wait is queue where the engine worked on another's request). Up to
    # MAX_WAITS requests; the rest are counted in waits_left_out.
    waits: dict[str, list[np.ndarray]] = field(default_factory=dict, repr=False)
    waits_kept: int = 0
    waits_left_out: int = 0
    waits_refused: int = 0  # records the client's view refutes (MAX_SKEW_NS)
    # What the last RECENT_OK ok requests added, by request id, so a stray response that
    # later shows one out of step (Recorder.out_of_step) takes it back out of every count
    # of ok requests: ok, good, the tokens, throughput over time, the token truth's usage
    # comparison and the prefix cache (a count left behind would make `ok` disagree with
    # `usage_out` and flip `counted_by` to "chunks").
    recent: dict[int, _Added] = field(default_factory=dict, repr=False)
    relabelled_late: int = 0  # relabelled after leaving `recent`: their tokens stay counted

    def __post_init__(self) -> None:
        for k in HISTS:
            self.hists.setdefault(k, Histogram(self.spec))

    def record(self, intended: np.ndarray, end: np.ndarray, out: np.ndarray,
               measured: np.ndarray, toks: Sequence[Any], nominal: np.ndarray,
               start: float, warmup_s: float, slot_s: float | None,
               goods: tuple[GoodSlo, ...], ok_code: int, timeout_code: int,
               rids: np.ndarray | None = None, sends: np.ndarray | None = None,
               breathe: Callable[[], None] = lambda: None) -> None:
        """A batch of ended requests: ``intended``/``end`` (monotonic s), outcome codes,
        which are measured, each one's token state (see ``openai_sse.TokenState``, or
        None: no connection), the workload's input length of each, (to take one back
        later, see `relabel`) their request ids, and when each was sent (NaN: never on
        the wire; None: not known, and no wait of the engine's split). ``breathe`` is
        called between steps (a recorder thread's :class:`~tailgate.sched.Breather`)."""
        n = len(toks)
        nan = math.nan
        c0: list[float] = [nan] * n
        dn: list[float] = [nan] * n
        uo: list[int] = [-1] * n
        ui: list[int] = [-1] * n
        ca: list[int] = [-1] * n
        pre: list[float] = [nan] * n  # the engine's prefill and decode (s), NaN: no record
        dec: list[float] = [nan] * n
        pn: list[int] = [0] * n  # tokens the engine generated
        qu: list[float] = [nan] * n  # its stated queue (s)
        sb: list[float] = [nan] * n  # the latest its per-token times say it started (s)
        nl: list[int] = [0] * n
        times_l: list[np.ndarray] = []
        ntok_l: list[np.ndarray] = []
        for i, t in enumerate(toks):
            breathe()
            if t is None:
                continue
            c0[i], times, dn[i], uo[i], ui[i] = t[:5]
            if len(t) > 6:
                ca[i] = t[6]
            e = t[7] if len(t) > 7 else None
            if e is not None and not isinstance(e, str) and e.prompt_ms is not None:
                pre[i] = e.prompt_ms / 1e3
                dec[i] = math.nan if e.predicted_ms is None else e.predicted_ms / 1e3
                pn[i] = e.predicted_n
                qu[i] = math.nan if e.queue_ms is None else e.queue_ms / 1e3
            if len(t) > 8 and t[8] is not None:  # (--engine-timings per-token)
                sb[i] = engine_tokens(np.asarray(times, dtype=np.float64), t[8]).start_bound
            nc = len(times)
            if not nc:
                continue
            nl[i] = nc
            # (arrays, not lists of floats: a long stream's gaps stay 8 bytes each)
            times_l.append(np.frombuffer(times, dtype=np.float64) if type(times) is array
                           else np.asarray(times, dtype=np.float64))
            ntok = t[5] if len(t) > 5 else None
            if ntok is not None and len(ntok) == nc:
                ntok_l.append(np.frombuffer(ntok, dtype=np.int32)
                              if type(ntok) is array and ntok.typecode == "i"
                              else np.asarray(ntok, dtype=np.int64))
            else:
                ntok_l.append(np.full(nc, -1, dtype=np.int32))
        chunk0 = np.array(c0, dtype=np.float64)
        done = np.array(dn, dtype=np.float64)
        use_out = np.array(uo, dtype=np.int64)
        use_in = np.array(ui, dtype=np.int64)
        cached = np.array(ca, dtype=np.int64)
        lens = np.array(nl, dtype=np.int64)
        first = np.full(n, math.nan)
        breathe()
        # Every request's chunks in one array, owner by owner (vectorised over the batch).
        tt = np.concatenate(times_l) if times_l else np.zeros(0, dtype=np.float64)
        kk = (np.concatenate(ntok_l).astype(np.int64) if ntok_l
              else np.zeros(0, dtype=np.int64))
        owner_all = np.repeat(np.arange(n, dtype=np.int64), lens)
        has_chunks = lens > 0
        starts = np.cumsum(lens) - lens
        first[has_chunks] = tt[starts[has_chunks]]
        known = kk >= 0
        kk = np.where(known, kk, 1)  # unstated: one token
        nchunks = lens
        count = np.bincount(owner_all, weights=kk, minlength=n).astype(np.int64)
        counted_chunks = np.bincount(owner_all, weights=known, minlength=n).astype(np.int64)
        multi = np.bincount(owner_all, weights=kk > 1, minlength=n).astype(np.int64)
        biggest = np.zeros(n, dtype=np.int64)
        breathe()
        if tt.size:
            biggest[has_chunks] = np.maximum.reduceat(kk, starts[has_chunks])
        same = owner_all[1:] == owner_all[:-1]  # consecutive chunks of one request
        itl = np.diff(tt)[same]
        itl_owner = owner_all[1:][same]
        # per token: chunks of >= 1 token (one the server said has 0 is no sample)
        pos = kk > 0
        breathe()
        t2, k2, o2 = tt[pos], kk[pos], owner_all[pos]
        same2 = o2[1:] == o2[:-1]
        tw = k2[1:][same2]
        titl = np.diff(t2)[same2] / np.maximum(tw, 1)
        t_owner = o2[1:][same2]
        breathe()
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
        breathe()
        itl_keep = counted[itl_owner] if itl.size else np.zeros(0, dtype=bool)
        t_keep = counted[t_owner] if titl.size else np.zeros(0, dtype=bool)
        t_ns, t_w = np.maximum(titl[t_keep], 0.0) * 1e9, tw[t_keep]
        for i in range(0, t_ns.size, SLICE):
            breathe()
            _record_weighted(self.hists["itl_per_token"], t_ns[i:i + SLICE], t_w[i:i + SLICE])
        breathe()
        values = {
            "ttft": (ttft, counted & ~np.isnan(ttft)),
            "e2e": (e2e, counted),
            "tpot": (tpot, ~np.isnan(tpot)),
            "first_chunk": (chunk0 - intended, ok_m & ~np.isnan(chunk0)),
        }
        prefill, decode = np.array(pre), np.array(dec)
        has = ok_m & ~np.isnan(prefill) & ~np.isnan(ttft)
        if np.any(has):
            values["engine_prefill"] = (prefill, has)
            values["engine_decode"] = (decode, has & ~np.isnan(decode))
            if sends is not None:
                last = np.full(n, math.nan)
                last[has_chunks] = tt[starts[has_chunks] + lens[has_chunks] - 1]
                self._keep_waits(has & ~np.isnan(sends), sends, first, last, prefill,
                                 decode, np.array(pn), np.array(qu), np.array(sb))
        for name, (v, keep) in values.items():
            breathe()
            self._add(name, v[keep], (intended[keep] - start), warmup_s, slot_s, breathe)
        breathe()
        self._add("itl", itl[itl_keep], (intended[itl_owner[itl_keep]] - start)
                  if itl.size else itl, warmup_s, slot_s, breathe)
        breathe()
        self.ok += int(np.count_nonzero(ok_m))
        self.output += int(n_out[ok_m].sum())
        self.input += int(n_in[ok_m].sum())
        self.usage_out += int(np.count_nonzero(ok_m & (use_out >= 0)))
        self.usage_in += int(np.count_nonzero(ok_m & (use_in >= 0)))
        self.chunks_counted += int(counted_chunks[counted].sum())
        self.chunks_assumed += int((nchunks - counted_chunks)[counted].sum())
        self.multi_token_chunks += int(multi[counted].sum())
        if np.any(counted):
            self.max_chunk_tokens = max(self.max_chunk_tokens, int(biggest[counted].max()))
        compare = ok_m & (use_out >= 0)
        self.usage_compared += int(np.count_nonzero(compare))
        bad = np.flatnonzero(compare & (use_out != count))
        self.usage_mismatch += int(bad.size)
        self._examples((int(count[i]), int(use_out[i])) for i in bad.tolist())
        breathe()
        rep_c = ok_m & (cached >= 0)
        self.cache_reported += int(np.count_nonzero(rep_c))
        prompt_c = np.where(rep_c & (use_in >= 0), use_in, 0)
        self.cache_prompt += int(prompt_c.sum())
        self.cache_tokens += int(cached[rep_c].sum())
        self.cache_hit_requests += int(np.count_nonzero(rep_c & (cached > 0)))
        if np.any(measured):
            self.last_end_s = max(self.last_end_s, float(np.max(end[measured])) - start)
        breathe()
        good = ok_m.copy()
        for g in goods:
            if g.metric == "itl":
                own = np.full(n, math.nan)
                for i in np.flatnonzero(ok_m).tolist():
                    breathe()
                    mine = itl[itl_owner == i]
                    if mine.size:
                        own[i] = (float(mine.max()) if g.pct >= 100.0 else
                                  float(np.percentile(mine, g.pct, method="inverted_cdf")))
            elif g.metric == "itl_per_token":
                own = np.full(n, math.nan)
                for i in np.flatnonzero(ok_m).tolist():
                    breathe()
                    sel = t_owner == i
                    if np.any(sel):
                        own[i] = _weighted_percentile(titl[sel], tw[sel], g.pct)
            else:
                own = {"ttft": ttft, "tpot": tpot, "e2e": e2e}[g.metric]
            meets = _OPS[g.op](own * 1e3, g.limit_ms) | np.isnan(own)  # no value: no test
            good &= meets
        self.good += int(np.count_nonzero(good))
        slot = (np.maximum((end[ok_m] - start - warmup_s) // slot_s, 0).astype(np.int64)
                if slot_s and np.any(ok_m) else None)
        if slot is not None:
            g, toks_out = good[ok_m], n_out[ok_m]
            for k in np.unique(slot).tolist():
                here = slot == k
                row = self.done.setdefault(k, [0, 0, 0])
                row[0] += int(np.count_nonzero(here))
                row[1] += int(np.count_nonzero(g & here))
                row[2] += int(toks_out[here].sum())
        if rids is not None and np.any(ok_m):
            keep = self.recent
            slots = slot.tolist() if slot is not None else [-1] * int(np.count_nonzero(ok_m))
            m = ok_m  # the same terms the counts above were summed from
            cols = (n_out, n_in, good, None, use_out >= 0, use_in >= 0,
                    compare & (use_out != count), rep_c,
                    prompt_c, np.where(rep_c, cached, 0))
            for r, *added in zip(rids[m].tolist(),
                                 *(slots if c is None else c[m].tolist() for c in cols),
                                 strict=True):
                breathe()
                keep[r] = _Added(*added)
            while len(keep) > RECENT_OK:
                del keep[next(iter(keep))]

    def _keep_waits(self, has: np.ndarray, sends: np.ndarray, first: np.ndarray,
                    last: np.ndarray, prefill: np.ndarray, decode: np.ndarray,
                    generated: np.ndarray, queue: np.ndarray,
                    start_bound: np.ndarray | None = None) -> None:
        """Place each record on tailgate's clock by diagnose's rule
        (:func:`tailgate.llm.engine_phases.anchor`; ``start_bound``: the latest engine
        start each request's per-token times allow, NaN: none) and keep its wait."""
        if not np.any(has):
            return

        def ns(v: np.ndarray) -> np.ndarray:
            return np.rint(np.nan_to_num(v[has]) * 1e9).astype(np.int64)

        sent, p_ns, d_ns = ns(sends), ns(prefill), ns(decode)
        q_known = ~np.isnan(queue[has])
        q_ns = ns(queue)
        two = ~np.isnan(last[has]) & ~np.isnan(decode[has]) & (generated[has] > 1)
        sb = (np.zeros(len(sent), np.int64) if start_bound is None else
              np.where(np.isnan(start_bound[has]), 0, ns(start_bound)))
        at = anchor(sent, ns(first), ns(last), p_ns, d_ns, two, q_ns, sb)
        e, ok = at.anchor, at.refused == PLACED
        self.waits_refused += int(np.count_nonzero(~ok))
        room = max(MAX_WAITS - self.waits_kept, 0)
        keep = np.flatnonzero(ok)
        self.waits_left_out += max(len(keep) - room, 0)
        keep = keep[:room]
        if not len(keep):
            return
        pstart = np.maximum(e - p_ns, sent)
        qstart = np.where(q_known, np.maximum(e - p_ns - q_ns, sent), 0)
        rows = np.stack([sent, pstart, e + d_ns, qstart], axis=1)[keep]
        self.waits.setdefault(CLOCK, []).append(rows)
        self.waits_kept += len(rows)

    def split_waits(self) -> None:
        """The kept waits split into queue and held (llm.engine_phases.queue_and_held), over
        the requests on each host's clock together, into the engine_queue and engine_held
        histograms (made anew: the split is over every request kept so far)."""
        for k in ("engine_queue", "engine_held"):
            self.hists[k] = Histogram(self.spec)
        for parts in self.waits.values():
            w = np.concatenate(parts)
            queue, held = queue_and_held(w[:, 0], w[:, 1], w[:, 2], w[:, 3])
            self.hists["engine_queue"].record(queue.astype(np.float64))
            self.hists["engine_held"].record(held.astype(np.float64))

    def relabel(self, rids: Iterable[int]) -> None:
        """Measured requests recorded ok that were answered out of step: no longer ok or
        good, their tokens out of the totals (their latencies, as the engine's, stay)."""
        for r in rids:
            got = self.recent.pop(r, None)
            if got is None:
                self.relabelled_late += 1
                continue
            self.ok -= 1
            self.good -= int(got.good)
            self.output -= got.output
            self.input -= got.input
            self.usage_out -= got.usage_out
            self.usage_in -= got.usage_in
            self.usage_compared -= got.usage_out  # every ok request with usage is compared
            self.usage_mismatch -= got.mismatch
            if got.cache_reported:
                self.cache_reported -= 1
                self.cache_prompt -= got.cache_prompt
                self.cache_tokens -= got.cache_tokens
                self.cache_hit_requests -= int(got.cache_tokens > 0)
            if got.slot >= 0 and got.slot in self.done:
                row = self.done[got.slot]
                row[0] -= 1
                row[1] -= int(got.good)
                row[2] -= got.output

    def over_intervals(self, name: str) -> dict[int, Histogram]:
        """``name``'s (ttft, itl, e2e) histogram of each interval, by interval number."""
        book = self.intervals.get(name)
        return book.histograms() if book is not None else {}

    def _add(self, name: str, secs: np.ndarray, at: np.ndarray, warmup_s: float,
             slot_s: float | None, breathe: Callable[[], None] = lambda: None) -> None:
        ns = np.maximum(secs, 0.0) * 1e9
        for i in range(0, ns.size, SLICE):  # (a take's ITLs in one record: ~1 ms)
            breathe()
            self.hists[name].record(ns[i:i + SLICE])
        if name == "ttft":
            breathe()
            self.ttft_delta = Histogram(self.spec)
            self.ttft_delta.record(ns)
        if slot_s and name in ("ttft", "itl", "e2e") and ns.size:
            slot = ((at - warmup_s) // slot_s).astype(np.int64)
            book = self.intervals.get(name)
            if book is None:
                book = self.intervals[name] = IntervalHistograms(self.spec)
            for k in np.unique(slot).tolist():
                breathe()
                book.record(k, ns[slot == k])

    def add(self, other: TokenBook) -> None:
        for k, h in other.hists.items():
            self.hists[k].add(h)
        for name, book in other.intervals.items():
            self.intervals.setdefault(name, IntervalHistograms(self.spec)).add(book)
        for k, row in other.done.items():
            mine_row = self.done.setdefault(k, [0, 0, 0])
            for i, n in enumerate(row):
                mine_row[i] += n
        for f in ("ok", "good", "output", "input", "usage_out", "usage_in", "warmup_ok",
                  "relabelled_late",
                  "chunks_counted", "chunks_assumed", "multi_token_chunks", "usage_compared",
                  "usage_mismatch", "cache_reported", "cache_prompt", "cache_tokens",
                  "cache_hit_requests"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.max_chunk_tokens = max(self.max_chunk_tokens, other.max_chunk_tokens)
        for clock, parts in other.waits.items():
            self.waits.setdefault(clock, []).extend(parts)
        self.waits_kept += other.waits_kept
        self.waits_left_out += other.waits_left_out
        self.waits_refused += other.waits_refused
        self._examples(other.mismatch_examples)
        self.last_end_s = max(self.last_end_s, other.last_end_s)

    def _examples(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Keep up to MAX_MISMATCH_EXAMPLES distinct (client, usage) pairs."""
        for pair in pairs:
            if len(self.mismatch_examples) >= MAX_MISMATCH_EXAMPLES:
                return
            if pair not in self.mismatch_examples:
                self.mismatch_examples.append(pair)


MAX_MISMATCH_EXAMPLES = 5
# Values a histogram records between two breaths of the recorder (~0.2 ms of numpy).
SLICE = 2048
# Requests whose wait for the engine a book keeps to split it (4 ints each: 32 MB); an LLM
# run rarely has a tenth as many.
MAX_WAITS = 1_000_000
# Whose CLOCK_MONOTONIC a book's times are on: workers on one host share it, a --ray
# generator node has its own (their waits are split apart).
CLOCK = socket.gethostname()
# A stray response shows a request out of step a response or two after it ended: the
# last few thousand ok requests of a worker are plenty, and bound what a worker keeps.
RECENT_OK = 4096


def _record_weighted(h: Histogram, ns: np.ndarray, weights: np.ndarray) -> None:
    """Record value ``ns[j]`` ``weights[j]`` times (bucket counts added: no copies made,
    so a chunk that says it carries a million tokens costs one entry)."""
    if not ns.size:
        return
    keep = weights > 0
    ns, weights = ns[keep], weights[keep]
    if not ns.size:
        return
    if np.all(weights == 1):
        h.record(ns)
        return
    v = np.rint(np.clip(ns, 0.0, float(h.spec.highest))).astype(np.int64)
    h.clamped += int(weights[ns > h.spec.highest].sum())
    idx, inv = np.unique(h.spec.index_of(v), return_inverse=True)
    counts = np.bincount(inv, weights=weights.astype(np.float64)).astype(np.int64)
    h.add_sparse(idx, counts, int(v.min()), int(v.max()))


def _weighted_percentile(values: np.ndarray, weights: np.ndarray, pct: float) -> float:
    """The inverted-CDF percentile of ``values`` each counted ``weights`` times."""
    order = np.argsort(values, kind="stable")
    v, cw = values[order], np.cumsum(weights[order])
    if pct >= 100.0:
        return float(v[-1])
    idx = int(np.searchsorted(cw, pct / 100.0 * cw[-1], side="left"))
    return float(v[min(idx, v.size - 1)])


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
    book.split_waits()
    h = book.hists
    # From the end of the warm-up to the last measured response (long generations count).
    span = max(book.last_end_s - warmup_s, 1e-9)
    out: dict[str, Any] = {f"{k}_ms": summary(h[k]) for k in HISTS}
    ok = book.ok
    out["tokens"] = {"input": book.input, "output": book.output,
                     "counted_by": "usage" if ok and book.usage_out == ok else "chunks",
                     "input_counted_by": "usage" if ok and book.usage_in == ok else "workload"}
    if book.relabelled_late:  # shown out of step too long after they ended to take back
        out["tokens"]["out_of_step_still_counted"] = book.relabelled_late
    out["token_check"] = token_check(book)
    out["prefix_cache"] = prefix_cache(book)
    if book.hists["engine_prefill"].total:
        out["engine_wait"] = {
            "split": book.waits_kept, "refused": book.waits_refused,
            "left_out": book.waits_left_out,
            "method": "each request's wait from its send to the engine's prefill: queue "
                      "while the engine worked on other requests (or its stated queue), "
                      "held while it was idle (the request still in the server's hands)"}
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


def token_check(book: TokenBook) -> dict[str, Any]:
    """How the tokens of each chunk were known, and the client's count against ``usage``."""
    chunks = book.chunks_counted + book.chunks_assumed
    return {
        "chunks": chunks,
        "chunk_tokens_stated": book.chunks_counted,  # the server said (usage delta, logprobs)
        "chunk_tokens_assumed_one": book.chunks_assumed,
        "multi_token_chunks": book.multi_token_chunks,
        "max_tokens_in_chunk": book.max_chunk_tokens,
        "itl_per_token_basis": ("none" if not chunks else "stated" if not book.chunks_assumed
                                else "assumed_one" if not book.chunks_counted else "mixed"),
        "usage_compared": book.usage_compared,
        "usage_mismatch": book.usage_mismatch,
        "usage_mismatch_rate": (round(book.usage_mismatch / book.usage_compared, 6)
                                if book.usage_compared else None),
        "usage_not_reported": book.ok - book.usage_compared,
        "mismatch_examples": [{"client": c, "usage": u} for c, u in book.mismatch_examples],
    }


def prefix_cache(book: TokenBook) -> dict[str, Any]:
    """``usage.prompt_tokens_details.cached_tokens`` summed: the client's view of the hit rate."""
    return {
        "requests_reporting": book.cache_reported,
        "requests_with_hits": book.cache_hit_requests,
        "prompt_tokens": book.cache_prompt,
        "cached_tokens": book.cache_tokens,
        "hit_rate": (round(book.cache_tokens / book.cache_prompt, 6)
                     if book.cache_reported and book.cache_prompt else None),
    }


def completed_over_time(book: TokenBook, slot_s: float) -> dict[str, Any]:
    """Requests, good requests and output tokens per second, by the interval a request
    ended in: every interval from the first to the last (a zero is a fact)."""
    last = max(book.done, default=-1)
    rows = [book.done.get(k, [0, 0, 0]) for k in range(last + 1)]
    return {"by": "end", "t_s": [round(k * slot_s, 6) for k in range(last + 1)],
            "ok_per_s": [round(r[0] / slot_s, 3) for r in rows],
            "good_per_s": [round(r[1] / slot_s, 3) for r in rows],
            "output_tokens_per_s": [round(r[2] / slot_s, 3) for r in rows]}
