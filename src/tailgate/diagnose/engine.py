"""The engine's phases of each request on tailgate's clock, and what they say of the tail
(pure: arrays in, phases, causes and bands out).

The engine's record of a request gives durations on its own clock: the prefill
(``prompt_ms``, over ``prompt_n`` computed and ``cache_n`` cached prompt tokens), the decode
after the first token (``predicted_ms``) and, where the engine says it, its queue
(``queue_ms``). Three engines' records take this one path: llama-server's ``timings``
(:mod:`tailgate.llm.engine_records`, in the load's per-request log) and vLLM's and SGLang's
request spans (:mod:`tailgate.sources.otlp`, received during the run and joined by the
trace or request id tailgate sent: :func:`join_spans`; a vLLM span's whole prompt is
``prompt_n``, with ``cache_n`` not said; SGLang's says its cached tokens). They are placed
on tailgate's clock by the instant ``E`` at which the engine finished the prefill and
sampled the first token, which both sides bound:

* the first token cannot be read before it was made: ``E <= first_token`` (a1), and the
  last token neither: ``E + predicted_ms <= last_token``, so ``E <= last_token -
  predicted_ms`` (a2). Each anchor is E plus the delay from the engine's write to
  tailgate's read, so ``E = min(a1, a2)`` and ``|a1 - a2|`` is how far the two reads of
  the same instant disagree (``error_bound_ms``). With llama-server's per-token timings
  (:mod:`tailgate.llm.engine_tokens`) every token read bounds the engine's start of the
  request, so ``E <= min_i(read_i - engine_ms_i) + prompt_ms`` (a3) and E is the least of
  the three. E lies between ``sent + prompt_ms [+ queue_ms]`` and that: the span is how late
  E may be placed, stated per request (``bound_ms``);
* the prefill (or, where the engine states its queue, the queue) cannot start before the
  request was sent: ``E - prompt_ms [- queue_ms] >= sent``. A
  record that breaks this by more than :data:`MAX_SKEW_NS`, or whose anchors disagree by
  more, does not belong to tailgate's view of the request (another clock, another
  request): it is refused, with the offset, and the request's phases are unknown.

Then: the wait ``[sent, E - prompt_ms]`` is, where the engine states its queue (vLLM),
queue for the stated ``queue_ms`` before the prefill and held before that (the server's
front end: parsing, tokenizing, handing over); else queue where the engine worked on other
requests meanwhile (their prefill to their decode's end: exact with one slot, an upper bound
with several, where a slot may have been free) and held (the server's request handling, or
its threads held up, with the engine idle) for the rest; prefill = ``[E - prompt_ms, E]``,
decode = ``[E, E + predicted_ms]``, delivery = ``[E, first_token]``. Generator lateness
(intended start -> sent) comes from the bench.

Attribution follows :mod:`.attribution`'s rule, but per request: a phase belongs to its own
request (never co-occurrence with someone else's), so a request's TTFT is split into
lateness, queue, held, prefill and delivery, and a part is claimed when it makes a large share
of the slow requests' TTFT (``min_share``, at least ``min_ms`` each), covers most of them
(``min_cover``: half their TTFT or more in that part; and no fewer of them than of all
requests) and lasted markedly longer in them
than in the requests at large (``min_lift``, on its mean time: a phase every request has
alike — the prefill of a healthy run — explains no tail; but the queue, which no request
needs, is claimed also as a saturating cause where it lasted half the slow requests' time:
a queue every request waited in is the engine offered more than it serves). ITL
spikes (each request's longest gap between chunks, the longest tenth) are set against other
requests' prefills on the same clock: a spike another request's prefill overlapped is that
prefill's interference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from ..llm.engine_phases import (
    MAX_SKEW_NS,
    PLACED,
    READS_DISAGREE,
    anchor,
    queue_and_held,
)
from ..spans import merge_spans, overlap_ns
from .attribution import MIN_TAIL, PERVASIVE_SHARE, Attribution, Cause

if TYPE_CHECKING:
    from ..sources.otlp import Received, RequestSpan
MAX_BANDS = 4000  # bands in the document (the slowest requests' first)
SLOWEST = 20  # rows of the per-request table

QUEUE = Cause("engine_queue", "L4", "waited in the engine's queue for a slot (sent -> "
              "the engine starting its prefill)",
              "Add slots or replicas (llama-server --parallel), cap long generations "
              "(max_tokens) or route long prompts apart: short requests queue behind them; "
              "a queue every request waits in is a rate above what the engine serves "
              "(bench --sweep finds its capacity).")
PREFILL = Cause("engine_prefill", "L4", "the engine computed their prompts (prefill)",
                "Shorten prompts or keep their prefixes cached (a larger prefix cache, "
                "cache-aware routing, llama-server --cache-reuse / slot prompt similarity).")
INTERFERENCE = Cause("engine_prefill_interference", "L4", "another request's prefill ran "
                     "in the same batch window (chunked prefill sharing the step with the "
                     "decode)", "Cap the prefill per step (chunked prefill / --ubatch-size) "
                     "or separate prefill from decode (disaggregated serving).")
HELD = Cause("engine_held", "L3", "waited in the server before its engine took it, the "
             "engine busy with no other request (sent -> the engine starting its prefill: "
             "the server reading, parsing and tokenizing it, or its threads held up)",
             "See the host's causes of the server's threads (run queue, throttling); else the "
             "server is slow to read requests (its HTTP threads: llama-server --threads-http).")
PARTS = ("late", "queue", "held", "prefill", "delivery")
LABEL = {QUEUE.key: "queue wait", PREFILL.key: "prefill compute",
         INTERFERENCE.key: "another request's prefill",
         HELD.key: "waiting in the server, its engine idle"}


LLAMA = "llama.cpp"  # Requests.engine: llama-server's `timings`
VLLM = "vLLM (OTLP spans)"
SGLANG = "SGLang (OTLP spans)"
SPANS = {"vLLM": VLLM, "SGLang": SGLANG}  # sources.otlp's RequestSpan.engine -> this


@dataclass(frozen=True)
class Requests:
    """Each request's client times (ns, CLOCK_MONOTONIC; 0 where not known) and the
    engine's record (NaN where none; ``state`` "ok", "bad" or "")."""

    ids: np.ndarray
    intended: np.ndarray
    sent: np.ndarray
    first_token: np.ndarray
    last_token: np.ndarray
    end: np.ndarray
    gap_from: np.ndarray
    gap_to: np.ndarray
    state: np.ndarray  # object: "ok" | "bad" | ""
    prompt_n: np.ndarray  # float, NaN: none
    cache_n: np.ndarray
    prompt_ms: np.ndarray
    predicted_n: np.ndarray
    predicted_ms: np.ndarray
    queue_ms: np.ndarray | None = None  # the engine's own queue time (NaN/None: not said)
    engine: str = LLAMA  # whose records: llama.cpp's timings, or an engine's spans (SPANS)
    # llama-server's per-token times (llm.engine_tokens; None for all: none): their state
    # ("ok", "" none, or "bad: " and the reason), the latest the engine can have started
    # the request (ns, 0: not known) and its time between the longest gap's tokens (ms)
    tokens_state: np.ndarray | None = None
    start_bound: np.ndarray | None = None
    gap_engine_ms: np.ndarray | None = None

    @classmethod
    def from_log(cls, cols: dict[str, np.ndarray], base_ns: int) -> Requests:
        """From :func:`tailgate.bench.result.read_log`'s columns (s from the run's start at
        ``base_ns``); measured requests that ended ok (a failed one has no last chunk)."""
        keep = (cols["warmup"] == 0) & np.isfinite(cols["end_s"]) & (cols["outcome"] == "ok")
        n = int(keep.sum())

        def ns(name: str) -> np.ndarray:
            v = cols.get(name)
            if v is None:
                return np.zeros(n, np.int64)
            v = v[keep]
            return np.where(np.isfinite(v), base_ns + np.nan_to_num(v * 1e9).astype(np.int64), 0)

        def num(name: str) -> np.ndarray:
            v = cols.get(name)
            return np.full(n, np.nan) if v is None else v[keep].astype(np.float64)

        state = cols.get("engine_state")
        tstate = cols.get("engine_tokens_state")
        return cls(cols["id"][keep], ns("intended_s"), ns("send_s"), ns("first_token_s"),
                   ns("last_token_s"), ns("end_s"), ns("gap_from_s"), ns("gap_to_s"),
                   np.full(n, "", dtype=object) if state is None else state[keep],
                   num("engine_prompt_n"), num("engine_cache_n"), num("engine_prompt_ms"),
                   num("engine_predicted_n"), num("engine_predicted_ms"),
                   tokens_state=None if tstate is None else tstate[keep],
                   start_bound=ns("engine_start_bound_s"), gap_engine_ms=num("engine_gap_ms"))


@dataclass(frozen=True)
class SpanJoin:
    """What the spans received over a run gave its requests: ``matched`` measured requests
    that ended ok had a span, ``missing`` had none, ``unknown_ids`` spans named a request
    this run never sent (another run's or client's id, counted by the receiver, or a
    number past this run's), ``not_measured`` were of requests left out of the figures
    (warm-up, failed), ``malformed`` lacked a phase."""

    matched: int
    missing: int
    unknown_ids: int
    not_measured: int
    malformed: int

    def to_json(self) -> dict[str, int]:
        return {"matched": self.matched, "missing": self.missing,
                "unknown_ids": self.unknown_ids, "not_measured": self.not_measured,
                "malformed": self.malformed}


def join_spans(r: Requests, spans: Mapping[int, RequestSpan], sent_ids: np.ndarray,
               unknown_ids: int = 0) -> tuple[Requests, SpanJoin]:
    """The requests with the engine's spans as its records (keyed by the request number in
    the trace or id tailgate sent: :meth:`tailgate.sources.otlp.Received.add`): queue,
    prefill and decode from the span, its prompt tokens whole (``cache_n`` not said, but
    where SGLang's span gives its cached tokens: computed and cached apart); a request
    without a span has none (its phases unknown). ``sent_ids``: every request number of
    the run's log (warm-up and failed ones too); a span of a number not among them counts
    to ``unknown_ids``, with the receiver's own count of ids of other runs."""
    n = len(r.ids)
    nan = np.full(n, np.nan)
    cols = {k: nan.copy() for k in ("prompt_n", "cache_n", "prompt_ms", "predicted_n",
                                    "predicted_ms", "queue_ms")}
    state = np.full(n, "", dtype=object)
    pos = {int(rid): i for i, rid in enumerate(r.ids)}
    known = set(np.asarray(sent_ids, dtype=np.int64).tolist())
    matched = malformed = not_measured = 0
    for num, sp in spans.items():
        i = pos.get(num)
        if i is None:
            if num in known:
                not_measured += 1
            else:
                unknown_ids += 1
            continue
        if sp.prefill_s is None or sp.decode_s is None:
            state[i] = "bad"  # (a phase made up from a default would be wrong)
            malformed += 1
            continue
        state[i] = "ok"
        matched += 1
        cols["prompt_ms"][i] = sp.prefill_s * 1e3
        cols["predicted_ms"][i] = sp.decode_s * 1e3
        if sp.queue_s is not None:
            cols["queue_ms"][i] = sp.queue_s * 1e3
        if sp.prompt_tokens is not None:
            cols["prompt_n"][i] = sp.prompt_tokens
            if sp.cached_tokens is not None and sp.cached_tokens <= sp.prompt_tokens:
                # (SGLang's span says how many its prefix cache held: computed apart)
                cols["prompt_n"][i] = sp.prompt_tokens - sp.cached_tokens
                cols["cache_n"][i] = sp.cached_tokens
        if sp.completion_tokens is not None:
            cols["predicted_n"][i] = sp.completion_tokens
    engines = {sp.engine for sp in spans.values()}
    engine = SPANS.get(engines.pop(), VLLM) if len(engines) == 1 else VLLM
    joined = replace(r, state=state, engine=engine, **cols)
    return joined, SpanJoin(matched, n - matched - malformed, unknown_ids, not_measured,
                            malformed)


@dataclass(frozen=True)
class Phases:
    """Per request: the join (``ok``; else ``why``), and the phase bounds (ns)."""

    ok: np.ndarray  # bool
    why: list[str]  # "" where ok
    anchor: np.ndarray  # E: the engine's first token on tailgate's clock
    error_ns: np.ndarray  # |a1 - a2|, -1 where only one anchor
    prefill_start: np.ndarray
    decode_end: np.ndarray
    queue_start: np.ndarray  # where the engine states its queue; else sent
    stated: np.ndarray  # bool: the engine stated this request's queue
    # how far E may be off: E is at most the anchor and at least sent + prefill (+ the
    # stated queue), so the anchor is late by this much at most (ns, -1 where not placed)
    bound_ns: np.ndarray
    bound_first_last_ns: np.ndarray  # the same from a1 and a2 alone
    per_token: np.ndarray  # bool: the anchor is bounded by every token


def place(r: Requests, max_skew_ns: int = MAX_SKEW_NS) -> Phases:
    """Put each record on tailgate's clock (see the module doc and
    :func:`tailgate.llm.engine_phases.anchor`, the rule bench's accounting shares); refuse
    what does not fit."""
    n = len(r.ids)
    whole = np.array([st == "ok" for st in r.state], bool)
    seen = (r.sent != 0) & (r.first_token != 0)
    cand = whole & seen

    def ms_ns(v: np.ndarray) -> np.ndarray:  # (ms -> ns, rounded: no truncation)
        return np.where(cand, np.rint(np.nan_to_num(v.astype(np.float64)) * 1e6),
                        0).astype(np.int64)

    p_ns, d_ns = ms_ns(r.prompt_ms), ms_ns(r.predicted_ms)
    queue = (np.full(n, np.nan) if r.queue_ms is None
             else np.asarray(r.queue_ms, np.float64))
    stated = np.isfinite(queue)
    q_ns = np.where(stated & cand, ms_ns(np.where(stated, queue, 0.0)), 0)
    two = (r.last_token != 0) & (r.predicted_n > 1)
    sb = np.zeros(n, np.int64)
    if r.start_bound is not None and r.tokens_state is not None:
        tok_ok = np.array([st == "ok" for st in r.tokens_state], bool)
        sb = np.where(tok_ok, r.start_bound.astype(np.int64), 0)
    sent = r.sent.astype(np.int64)
    at = anchor(sent, r.first_token.astype(np.int64), r.last_token.astype(np.int64), p_ns,
                d_ns, two, q_ns, sb, max_skew_ns)
    ok = cand & (at.refused == PLACED)
    why = [""] * n
    for i in np.flatnonzero(~ok).tolist():
        if r.state[i] != "ok":
            why[i] = ("the engine's record of it was malformed" if r.state[i] == "bad" else
                      "the engine sent no record of it")
        elif not seen[i]:
            why[i] = "no first token seen: nothing to place the record by"
        elif at.refused[i] == READS_DISAGREE:
            a2 = int(r.last_token[i]) - int(d_ns[i])
            why[i] = (f"refused: its first token and its decode end place the engine's clock "
                      f"{(int(r.first_token[i]) - a2) / 1e6:+.1f} ms apart")
        else:
            what = "queue" if q_ns[i] else "prefill"
            why[i] = (f"refused: the engine's {what} would have started "
                      f"{int(at.early[i]) / 1e6:.1f} ms before the request was sent (offset "
                      "beyond the bound)")
    e = np.where(ok, at.anchor, 0)
    start = sent + p_ns + q_ns  # (the earliest E can be: E + early)
    return Phases(
        ok, why, e, np.where(ok, at.spread, -1),
        np.where(ok, np.maximum(e - p_ns, sent), 0), np.where(ok, e + d_ns, 0),
        np.where(ok, np.where(stated, np.maximum(e - p_ns - q_ns, sent), sent), 0),
        ok & stated, np.where(ok, np.maximum(-at.early, 0), -1),
        np.where(ok, np.maximum(at.by_reads - start, 0), -1), ok & at.per_token)


@dataclass(frozen=True)
class Windows:
    """Each request's engine phases on tailgate's clock (ns), in diagnose's order of requests
    (the measured ones that ended); 0 where the engine's record of it was not placed. What
    the chain of blame resolves a serving thread's wait for the engine to
    (:func:`tailgate.diagnose.chain.through_engine`)."""

    sent: np.ndarray
    prefill_start: np.ndarray
    anchor: np.ndarray  # the end of the prefill
    decode_end: np.ndarray
    # where the engine stated each request's queue began (0, or None for all: not stated)
    queue_start: np.ndarray | None = None

    @cached_property
    def busy(self) -> np.ndarray:
        """The engine's work: the placed requests' prefill start to decode end, merged."""
        placed = self.anchor > 0
        return merge_spans(np.stack([self.prefill_start[placed], self.decode_end[placed]],
                                    axis=1), keep_instants=False)

    def phase(self, i: int, a: int, b: int) -> tuple[str, int, int]:
        """The phase of request ``i`` that overlapped ``[a, b]`` most: ``("queue" | "held" |
        "prefill" | "decode", from, to)``, or ``("", a, b)`` where its record was not placed
        or no phase overlapped. Its wait before the prefill is queue where the engine
        worked on other requests (or stated the queue) and held where it did not
        (:func:`tailgate.llm.engine_phases.queue_and_held`)."""
        if not self.anchor[i]:
            return "", a, b
        best = ("", a, b, 0)
        lo, hi = max(a, int(self.sent[i])), min(b, int(self.prefill_start[i]))
        if hi > lo:
            qs = 0 if self.queue_start is None else int(self.queue_start[i])
            q = (hi - max(lo, min(qs, hi)) if qs > 0 else
                 int(overlap_ns(np.array([lo]), np.array([hi]), self.busy, merged=True)[0]))
            best = max(("queue", lo, hi, q), ("held", lo, hi, hi - lo - q),
                       key=lambda c: c[3])
        for kind, x, y in (("prefill", self.prefill_start[i], self.anchor[i]),
                           ("decode", self.anchor[i], self.decode_end[i])):
            lo, hi = max(a, int(x)), min(b, int(y))
            if hi - lo > best[3]:
                best = (kind, lo, hi, hi - lo)
        return best[:3]


def records(cols: dict[str, np.ndarray], start_monotonic_s: float,
            spans: Received | None = None, workers: int = 1
            ) -> tuple[Requests, SpanJoin | None]:
    """The requests of a bench run's log with the engine's records: the log's own
    (llama-server's timings), or, where an OTLP receiver ran (``spans``), its spans. Then
    each request is named by its number in the run (the one its X-Request-Id carries): a
    worker's request ``j`` is the run's ``j * workers + worker`` (bench.workers.plan deals
    the run's requests round-robin)."""
    if spans is None:
        return Requests.from_log(cols, int(round(start_monotonic_s * 1e9))), None
    cols = {**cols, "id": cols["id"].astype(np.int64) * workers + cols["worker"].astype(
        np.int64)}
    r = Requests.from_log(cols, int(round(start_monotonic_s * 1e9)))
    return join_spans(r, spans.request_spans(), cols["id"], spans.unknown_ids)


def windows(log_text: str, start_monotonic_s: float, max_skew_ns: int = MAX_SKEW_NS,
            spans: Received | None = None, workers: int = 1) -> Windows | None:
    """The engine's phases of every request of a bench run's log (``None``: a log without
    the engine's columns, or no record placed)."""
    from ..bench.result import read_log

    cols = read_log(log_text)
    if "engine_state" not in cols:
        return None
    ended = (cols["warmup"] == 0) & np.isfinite(cols["end_s"])
    ok = np.flatnonzero((cols["outcome"] == "ok")[ended])  # Requests.from_log's, among them
    r, _ = records(cols, start_monotonic_s, spans, workers)
    ph = place(r, max_skew_ns)
    if not ph.ok.any():
        return None
    n = int(ended.sum())
    out = [np.zeros(n, np.int64) for _ in range(5)]
    qstart = np.where(ph.stated, ph.queue_start, 0)
    for arr, v in zip(out, (r.sent, ph.prefill_start, ph.anchor, ph.decode_end, qstart),
                      strict=True):
        arr[ok[ph.ok]] = v[ph.ok]
    return Windows(*out)


def _pct(v: np.ndarray, q: float) -> float:
    return float(np.percentile(v, q, method="inverted_cdf"))


def _score(cause: Cause, part: np.ndarray, whole: np.ndarray, tail: np.ndarray,
           crit: dict[str, float], level: str, cut_ns: float, what: str,
           saturating: bool = False) -> Attribution:
    """The per-request rule: ``part`` of each request's ``whole`` (ns). A ``saturating``
    part (the queue: no request needs it, so one every request has is the engine over
    capacity) is claimed also without its lift, where it lasted half of the slow requests'
    time, as a saturating kernel cause is (:mod:`.attribution`)."""
    whole = np.maximum(whole, 1)
    frac = np.clip(part / whole, 0.0, 1.0)
    n_tail = int(tail.sum())
    hit = frac >= 0.5
    tail_cover = float(hit[tail].mean()) if n_tail else 0.0
    all_cover = float(hit.mean()) if len(hit) else 0.0
    share = float(frac[tail].mean()) if n_tail else 0.0
    # how much longer the part was in the slow requests than in all of them: a phase every
    # request has in the same measure (the prefill of a healthy run) explains no tail
    every = float(part.mean()) if len(part) else 0.0
    lift = (float(part[tail].mean()) / every if every > 0 else
            (float("inf") if share else 0.0)) if n_tail else 0.0
    mean_ms = float(part[tail].mean()) / 1e6 if n_tail else 0.0
    # ... and it made most of the slow requests' time no less often than of all requests': a
    # part that is most of every request's time but of fewer of the slow ones (the server's
    # own handling of a clean run's small requests) is not what made them slow
    everywhere = saturating and lift < crit["min_lift"] and share >= PERVASIVE_SHARE
    claimed = (n_tail >= MIN_TAIL and tail_cover >= crit["min_cover"]
               and share >= crit["min_share"] and mean_ms >= crit["min_ms"]
               and (lift >= crit["min_lift"] or everywhere) and tail_cover >= all_cover)
    a = Attribution(cause, tail_cover, share, None, all_cover, lift, n_tail,
                    float(part[tail].sum()) / 1e6, claimed)
    a.extra["tail"] = level
    a.sentence = (f"{what} {level}: {100 * share:.0f} % of the {n_tail} slow requests' time "
                  f"(>= {cut_ns / 1e6:.2f} ms) was {LABEL[cause.key]}"
                  f" ({mean_ms:.2f} ms each, {lift:.1f}x its mean over all {len(part)}; it was "
                  f"most of {100 * tail_cover:.0f} % of them, vs {100 * all_cover:.0f} % of all)"
                  + ("; a queue every request waited in: more was offered than the engine "
                     "serves" if claimed and everywhere else ""))
    return a


def _behind(i_tail: np.ndarray, qa: np.ndarray, qb: np.ndarray, pa: np.ndarray,
            pb: np.ndarray, db: np.ndarray, ok: np.ndarray, r: Requests) -> dict[str, Any]:
    """What the slow requests' queue waits were behind: the other requests whose prefill or
    decode overlapped each wait (counts and their tokens, per slow request on average)."""
    others_ok = np.flatnonzero(ok)
    n_pre, tok_pre, n_dec, tok_dec = [], [], [], []
    for i in i_tail:
        a, b = qa[i], qb[i]
        if b <= a:
            n_pre.append(0)
            tok_pre.append(0.0)
            n_dec.append(0)
            tok_dec.append(0.0)
            continue
        j = others_ok[others_ok != i]
        pre = j[(pa[j] < b) & (pb[j] > a)]
        dec = j[(pb[j] < b) & (db[j] > a)]
        n_pre.append(len(pre))
        tok_pre.append(float(np.nansum(r.prompt_n[pre])))
        n_dec.append(len(dec))
        tok_dec.append(float(np.nansum(r.predicted_n[dec])))
    m = max(len(i_tail), 1)
    return {"prefills": round(sum(n_pre) / m, 2), "prefill_tokens": round(sum(tok_pre) / m, 1),
            "decodes": round(sum(n_dec) / m, 2), "decode_tokens": round(sum(tok_dec) / m, 1)}


def analyse(r: Requests, t0_ns: int, min_cover: float = 0.5, min_lift: float = 1.5,
            min_share: float = 0.1, min_ms: float = 1.0,
            max_skew_ns: int = MAX_SKEW_NS) -> tuple[dict[str, Any], list[Attribution],
                                                     list[dict[str, Any]]]:
    """The engine section of the diagnose document, its causes (claimed first) and the
    timeline's bands (ms from ``t0_ns``)."""
    n = len(r.ids)
    states = {k: int(np.count_nonzero(r.state == k)) for k in ("ok", "bad", "")}
    out: dict[str, Any] = {"engine": r.engine, "requests": n,  # (ok ones)
                           "records": {"ok": states["ok"], "malformed": states["bad"],
                                       "none": states[""]}}
    if states["ok"] == 0:
        none = ("the engine sent no per-request record in any of the "
                f"{n} responses (llama-server's `timings`)" if r.engine == LLAMA else
                f"no request span (vLLM's `llm_request`, SGLang's request root) of any of the "
                f"{n} requests came to the OTLP receiver (is the engine started with "
                "--otlp-traces-endpoint at it?)")
        out["unknown"] = (f"{none}: its phases are unknown; the /metrics timeline stands"
                          if not states["bad"] else
                          f"every record the engine sent was malformed ({states['bad']})")
        return out, [], []
    ph = place(r, max_skew_ns)
    ok = ph.ok
    refused = [w for w in ph.why if w.startswith("refused")]
    out["join"] = _join(r, ph, refused)
    if not ok.any():
        out["unknown"] = f"no record could be placed on tailgate's clock: {ph.why[0]}"
        return out, [], []
    q_a, q_b = r.sent, ph.prefill_start
    p_a, p_b, d_b = ph.prefill_start, ph.anchor, ph.decode_end
    idx = np.flatnonzero(ok)
    ttft = (r.first_token - r.intended)[idx]
    # the wait is queue while the engine worked on other requests (or where it stated its
    # queue), held where it was idle: the request still in the server's hands
    queue, held = queue_and_held(q_a[idx], q_b[idx], d_b[idx],
                                 np.where(ph.stated, ph.queue_start, 0)[idx])
    parts = {"late": np.clip(r.sent - r.intended, 0, None)[idx],
             "queue": queue, "held": held,
             "prefill": np.clip(p_b - p_a, 0, None)[idx],
             "delivery": np.clip(r.first_token - p_b, 0, None)[idx]}
    crit = {"min_cover": min_cover, "min_lift": min_lift, "min_share": min_share,
            "min_ms": min_ms}
    p99 = _pct(ttft, 99)
    tail = ttft >= p99
    if int(tail.sum()) < MIN_TAIL:  # a small run: the P90 then
        p99 = _pct(ttft, 90)
        tail = ttft >= p99
    level = "P99" if _pct(ttft, 99) == p99 else "P90"
    causes = []
    qa_ = _score(QUEUE, parts["queue"], ttft, tail, crit, level, p99, "TTFT", saturating=True)
    behind = _behind(idx[tail], q_a, q_b, p_a, p_b, d_b, ok, r)
    qa_.extra.update(behind)
    qa_.sentence += (f"; each waited behind {behind['prefills']:g} prefills of "
                     f"{behind['prefill_tokens']:,.0f} tokens and {behind['decodes']:g} "
                     f"decodes of {behind['decode_tokens']:,.0f} tokens on average")
    causes.append(qa_)
    causes.append(_score(HELD, parts["held"], ttft, tail, crit, level, p99, "TTFT"))
    pa_ = _score(PREFILL, parts["prefill"], ttft, tail, crit, level, p99, "TTFT")
    computed = float(np.nansum(r.prompt_n[idx][tail]))
    cached = float(np.nansum(r.cache_n[idx][tail]))
    split = bool(np.isfinite(r.cache_n[idx][tail]).all())  # vLLM's spans: prompt tokens only
    pa_.extra.update(computed_tokens=int(computed) if split else None,
                     cached_tokens=int(cached) if split else None,
                     prompt_tokens=int(computed + cached))
    # prefill compute explains the tail only where the slow requests computed more: a prefill
    # that was long for the usual tokens was slow, not large (its thread waited: a host cause)
    every_n = float(np.nanmean(r.prompt_n[idx]))
    tok_lift = (float(np.nanmean(r.prompt_n[idx][tail])) / every_n if every_n > 0 else 0.0)
    pa_.extra["computed_lift"] = round(tok_lift, 3)
    slow_not_large = pa_.claimed and tok_lift < min_lift
    if slow_not_large:
        pa_.claimed = False
    pa_.sentence += ((f"; {computed:,.0f} of their {computed + cached:,.0f} prompt tokens "
                      f"computed, {cached:,.0f} from the prefix cache"
                      + (" (prefix-cache misses)"
                         if pa_.claimed and computed > 4 * max(cached, 1) else ""))
                     if split else
                     f"; {computed:,.0f} prompt tokens (the engine's record does not say how "
                     "many came from the prefix cache)")
    pa_.sentence += (f"; but they computed only {tok_lift:.1f}x the average prompt tokens: "
                     "the prefill was slow, not large (its thread was held up: see the "
                     "host's causes)" if slow_not_large else "")
    causes.append(pa_)
    causes.append(_interference(r, ph, idx, crit))
    causes.sort(key=lambda a: (not a.claimed, -a.time_share))
    out["ttft"] = {"tail": level, "cut_ms": round(p99 / 1e6, 3), "slow": int(tail.sum()),
                   "parts_ms": {k: round(float(v[tail].sum()) / 1e6, 3) for k, v in parts.items()},
                   "share": {k: round(float(v[tail].sum() / max(ttft[tail].sum(), 1)), 4)
                             for k, v in parts.items()}}
    out["slowest"] = _table(r, ph, idx, ttft, parts)
    out["preemption"] = {"unknown": "llama.cpp's records carry no preemption (a slot keeps "
                         "its request to the end)"}
    return out, causes, _bands(r, ph, idx, ttft, t0_ns)


NO_TOKENS = ("the engine sent no per-token timings (llama-server sends them when asked: "
             "--engine-timings per-token)")
NO_TOKENS_SPANS = ("{}'s request spans carry no per-token times (per-token timings come "
                   "only from llama-server's `timings_per_token`, asked with --engine-timings "
                   "per-token)")


def no_tokens(engine: str) -> str:
    """Why there are no per-token times, true of the engine whose records these are: only
    llama-server can be asked for them."""
    if engine == LLAMA:
        return NO_TOKENS
    for name, label in SPANS.items():
        if engine == label:
            return NO_TOKENS_SPANS.format(name)
    return (f"the engine's records ({engine}) carry no per-token times (per-token timings "
            "come only from llama-server's `timings_per_token`, asked with --engine-timings "
            "per-token)")


def _tokens_why(r: Requests, i: int) -> str | None:
    """Why request ``i``'s per-token times are unknown (None: they are known)."""
    st = "" if r.tokens_state is None else r.tokens_state[i]
    if st == "ok":
        return None
    return no_tokens(r.engine) if not st else f"its per-token timings were malformed: {st[5:]}"


def _dist(v: np.ndarray) -> dict[str, float]:
    return {"p50": round(_pct(v, 50) / 1e6, 4), "p99": round(_pct(v, 99) / 1e6, 4),
            "max": round(float(v.max()) / 1e6, 4)}


def _join(r: Requests, ph: Phases, refused: list[str]) -> dict[str, Any]:
    e = ph.error_ns[ph.ok & (ph.error_ns >= 0)]
    out: dict[str, Any] = {
        "placed": int(ph.ok.sum()), "refused": len(refused),
        "refused_examples": refused[:3],
        "method": "E = min(first token read, last token read - decode, and with per-token "
                  "timings every token's read - its engine time + prefill): the instant the "
                  "engine finished the prefill on tailgate's clock, at most E and at least "
                  "sent + prefill (+ the stated queue); bound per request = the span between "
                  "the two (how late E may be); error bound = how far the first and last "
                  "token's reads disagree"}
    if len(e):
        out["error_bound_ms"] = _dist(e)
    placed = ph.ok
    if not placed.any():
        return out
    out["bound_ms"] = _dist(ph.bound_ns[placed])
    pt = placed & ph.per_token
    tokens: dict[str, Any] = {"requests": int(pt.sum())}
    if pt.any():
        tokens["bound_ms"] = _dist(ph.bound_ns[pt])
        tokens["bound_ms_first_last"] = _dist(ph.bound_first_last_ns[pt])
    st = (np.full(len(ph.ok), "", dtype=object) if r.tokens_state is None
          else r.tokens_state)
    bad = [str(x) for x in st[ph.ok] if x not in ("", "ok")]
    tokens["malformed"] = len(bad)
    if bad:
        tokens["malformed_examples"] = bad[:3]
    if not pt.any():
        tokens["unknown"] = (no_tokens(r.engine) if not bad else
                             f"every request's per-token timings were malformed: {bad[0]}")
    out["per_token"] = tokens
    keep = np.flatnonzero(placed)[:MAX_BANDS]
    out["per_request"] = {"request": [int(x) for x in r.ids[keep]],
                          "bound_ms": [round(float(x) / 1e6, 4) for x in ph.bound_ns[keep]],
                          "per_token": [bool(x) for x in ph.per_token[keep]]}
    return out


def _interference(r: Requests, ph: Phases, idx: np.ndarray,
                  crit: dict[str, float]) -> Attribution:
    """Each request's longest inter-chunk gap against the other requests' prefills."""
    has = idx[(r.gap_from[idx] > 0) & (r.gap_to[idx] > r.gap_from[idx])]
    gap = (r.gap_to - r.gap_from)[has]
    # (a request's own prefill ends at its first token, before any of its gaps: all the
    # prefills together are the others')
    spans = merge_spans(np.stack([ph.prefill_start[idx], ph.anchor[idx]], axis=1))
    over = overlap_ns(r.gap_from[has], r.gap_to[has], spans)
    if len(gap) == 0:
        a = Attribution(INTERFERENCE, 0.0, 0.0, None, 0.0, 0.0, 0, 0.0, False,
                        "ITL: no request had two content chunks")
        a.extra["tail"] = "P90"
        return a
    cut = _pct(gap, 90)
    tail = gap >= cut
    a = _score(INTERFERENCE, over, gap, tail, crit, "P90", cut, "ITL (longest gap per request)")
    # whose prefills the slow gaps overlapped: how many, and the prompt tokens they computed
    n_pre, tok_pre = [], []
    for i, x, y in zip(has[tail], r.gap_from[has][tail], r.gap_to[has][tail], strict=True):
        j = idx[(idx != i) & (ph.prefill_start[idx] < y) & (ph.anchor[idx] > x)]
        n_pre.append(len(j))
        tok_pre.append(float(np.nansum(r.prompt_n[j])))
    m = max(len(n_pre), 1)
    a.extra.update(prefills=round(sum(n_pre) / m, 2), prefill_tokens=round(sum(tok_pre) / m, 1),
                   tokens_per_prefill=round(sum(tok_pre) / max(sum(n_pre), 1), 1))
    a.sentence += (f"; each overlapped {a.extra['prefills']:g} prefills of "
                   f"{a.extra['tokens_per_prefill']:,.0f} computed prompt tokens on average "
                   f"(vs {float(np.nanmean(r.prompt_n[idx])):,.0f} a request's on average)")
    split = _gap_split(r, has[tail], gap[tail])
    a.extra["gap_split"] = split
    a.sentence += (f"; of those gaps the engine itself spent {split['engine_ms']:.2f} ms each "
                   f"between the two tokens ({100 * split['engine_share']:.0f} %), delivery "
                   f"(the server's HTTP thread, the network, the client) {split['delivery_ms']:.2f}"
                   f" ms ({split['with_engine_times']} of {split['gaps']} gaps with the "
                   "engine's times)"
                   if "engine_share" in split else
                   f"; how much of those gaps was the engine's own is unknown: "
                   f"{split['unknown']}")
    return a


def _gap_split(r: Requests, rows: np.ndarray, gap: np.ndarray) -> dict[str, Any]:
    """The slow gaps (``gap`` ns, of requests ``rows``) split into the engine's time between
    their two tokens and delivery (the rest), over those whose per-token times are known."""
    eng = (np.full(len(rows), np.nan) if r.gap_engine_ms is None
           else r.gap_engine_ms[rows] * 1e6)
    known = np.isfinite(eng) & np.array([_tokens_why(r, int(i)) is None for i in rows],
                                        dtype=bool)
    out: dict[str, Any] = {"gaps": len(rows), "with_engine_times": int(known.sum())}
    if not known.any():
        whys = [_tokens_why(r, int(i)) for i in rows]
        none = no_tokens(r.engine)
        out["unknown"] = next((w for w in whys if w and w != none), None) or (
            none if any(whys) else "the longest gaps' chunks carried no engine times")
        return out
    e, g = eng[known], gap[known].astype(np.float64)
    # (delivery may be negative: the gap's first chunk was read late, its second not)
    out.update(engine_ms=round(float(e.mean()) / 1e6, 4),
               delivery_ms=round(float((g - e).mean()) / 1e6, 4),
               engine_share=round(float(e.sum() / max(g.sum(), 1.0)), 4))
    return out


def _table(r: Requests, ph: Phases, idx: np.ndarray, ttft: np.ndarray,
           parts: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    order = np.argsort(-ttft, kind="stable")[:SLOWEST]
    rows = []
    for k in order:
        i = idx[k]
        rows.append({
            "request": int(r.ids[i]), "ttft_ms": round(float(ttft[k]) / 1e6, 3),
            "e2e_ms": round(float(r.end[i] - r.intended[i]) / 1e6, 3),
            **{f"{p}_ms": round(float(v[k]) / 1e6, 3) for p, v in parts.items()},
            "decode_ms": round(float(r.predicted_ms[i]), 3),
            "prompt_computed": _int(r.prompt_n[i]) if np.isfinite(r.cache_n[i]) else None,
            "prompt_cached": _int(r.cache_n[i]),
            "prompt_tokens": _int(np.nansum([r.prompt_n[i], r.cache_n[i]])
                                  if np.isfinite(r.prompt_n[i]) else np.nan),
            "generated": _int(r.predicted_n[i]),
            "join_error_ms": (None if ph.error_ns[i] < 0 else
                              round(float(ph.error_ns[i]) / 1e6, 4)),
            **_row_tokens(r, ph, int(i))})
    return rows


def _row_tokens(r: Requests, ph: Phases, i: int) -> dict[str, Any]:
    """A table row's join bound and its longest gap split (engine, delivery)."""
    why = _tokens_why(r, i)
    gap = int(r.gap_to[i] - r.gap_from[i]) if r.gap_from[i] and r.gap_to[i] else None
    eng = (r.gap_engine_ms[i] if r.gap_engine_ms is not None and why is None
           else np.nan)
    out: dict[str, Any] = {
        "join_bound_ms": (None if ph.bound_ns[i] < 0 else
                          round(float(ph.bound_ns[i]) / 1e6, 4)),
        "join_by": "every token" if ph.per_token[i] else "first and last token",
        "gap_ms": None if gap is None else round(gap / 1e6, 3),
        "gap_engine_ms": round(float(eng), 3) if np.isfinite(eng) else None,
        "gap_delivery_ms": (round(gap / 1e6 - float(eng), 3)
                            if gap is not None and np.isfinite(eng) else None)}
    if why is not None:
        out["per_token_unknown"] = why
    return out


def _int(v: float) -> int | None:
    return int(v) if np.isfinite(v) else None


def _bands(r: Requests, ph: Phases, idx: np.ndarray, ttft: np.ndarray,
           t0_ns: int) -> list[dict[str, Any]]:
    """Queue, prefill and decode bands per request, the slowest requests' first."""
    out: list[dict[str, Any]] = []
    for k in np.argsort(-ttft, kind="stable"):
        i = int(idx[k])
        rid = int(r.ids[i])
        cached = int(r.cache_n[i]) if np.isfinite(r.cache_n[i]) else 0
        computed = int(r.prompt_n[i]) if np.isfinite(r.prompt_n[i]) else 0
        kind = "prefill-cached" if cached and cached >= computed else "prefill"
        what = (f"prefill {computed} computed + {cached} cached tokens"
                if np.isfinite(r.cache_n[i]) else f"prefill {computed} prompt tokens")
        out_n = int(r.predicted_n[i]) if np.isfinite(r.predicted_n[i]) else 0
        for kind_, a, b, label in (
                ("held", r.sent[i], ph.queue_start[i], "in the server before the engine's "
                 "queue"),
                ("queue", ph.queue_start[i], ph.prefill_start[i], "queued"),
                (kind, ph.prefill_start[i], ph.anchor[i], what),
                ("decode", ph.anchor[i], ph.decode_end[i], f"decode {out_n} tokens")):
            if b <= a:
                continue
            out.append({"row": f"request {rid}", "start_ms": round((a - t0_ns) / 1e6, 4),
                        "end_ms": round((b - t0_ns) / 1e6, 4), "kind": kind_,
                        "label": label, "source": "engine", "request": rid})
        if len(out) >= MAX_BANDS:
            break
    return out


def from_log(log_text: str, start_monotonic_s: float, t0_ns: int,
             crit: dict[str, float], spans: Received | None = None, workers: int = 1
             ) -> tuple[dict[str, Any], list[Attribution], list[dict[str, Any]]]:
    """:func:`analyse` on a bench run's per-request log (its run started at
    ``start_monotonic_s`` on CLOCK_MONOTONIC); ``crit``: diagnose's min_cover, min_lift,
    min_share and min_ms; ``spans``: what an OTLP receiver took in over the run, the
    records then (see :func:`join_spans`). A log without the engine's columns makes an
    unknown section."""
    from ..bench.result import read_log

    cols = read_log(log_text)
    if "engine_state" not in cols:
        return ({"unknown": "not an openai+ run with the engine's columns: no per-request "
                 "records of the engine"}, [], [])
    r, joined = records(cols, start_monotonic_s, spans, workers)
    section, causes, bands = analyse(r, t0_ns, **crit)
    if spans is not None and joined is not None:
        section["otlp"] = {"received": spans.to_json(), "join": joined.to_json()}
    measured = (cols["warmup"] == 0) & np.isfinite(cols["end_s"])
    section["not_ok"] = int(np.count_nonzero(measured & (cols["outcome"] != "ok")))
    return section, causes, bands


def expected_numbers(log_text: str, workers: int = 1) -> set[int]:
    """The run's numbers of the measured requests of a log that ended ok: those whose span
    the join waits for."""
    from ..bench.result import read_log

    if not log_text.startswith("worker,"):
        return set()
    cols = read_log(log_text)
    keep = (cols["warmup"] == 0) & np.isfinite(cols["end_s"]) & (cols["outcome"] == "ok")
    num = cols["id"].astype(np.int64) * workers + cols["worker"].astype(np.int64)
    return set(num[keep].tolist())


def workers_of(bench_doc: dict[str, Any]) -> int:
    """How many load workers shared the run's requests (its ``config``)."""
    return int((bench_doc.get("config") or {}).get("workers") or 1)


LAYER_ORDER = {layer: i for i, layer in enumerate(("load", "L1", "L2", "L3", "L4"))}


def engine_into(doc: dict[str, Any], target: str | None, bench_doc: dict[str, Any] | None,
                log_path: str, crit: dict[str, float], spans: Received | None = None,
                endpoint: str | None = None) -> None:
    """Add the engine's phases to a diagnose document (from the log's records, or from the
    spans an OTLP receiver at ``endpoint`` took in): its section (``doc["engine"]``),
    its causes among the others (claimed first, bottom-up by layer, as attribution orders
    them), the verdict again, and the phases as the timeline's bands. Only for openai+
    loads; anything else keeps the document as it is."""
    if not (target and target.startswith("openai+")) or bench_doc is None:
        return
    start = (bench_doc.get("clock") or {}).get("start_monotonic_s")
    tl = doc.get("timeline") or {}
    with open(log_path, encoding="utf-8") as f:
        text = f.read()
    if start is None or not text.startswith("worker,"):
        doc["engine"] = {"unknown": "the run's request log has no clock or no engine columns"}
        return
    section, causes, bands = from_log(text, start, int(tl.get("t0_monotonic_ns", 0)), crit,
                                      spans, workers_of(bench_doc))
    if endpoint and "otlp" in section:
        section["otlp"]["endpoint"] = endpoint
    doc["engine"] = section
    tl.setdefault("bands", []).extend(bands)  # (beside the chains of blame's)
    if not causes:
        return
    merged = list(doc.get("causes", ())) + [a.to_json() for a in causes]
    merged.sort(key=lambda c: (not c["claimed"], c.get("tail") == "P90",
                               LAYER_ORDER.get(c["layer"], 9),
                               -(c.get("tail_time_share") or 0)))
    doc["causes"] = merged
    claimed = [c for c in merged if c["claimed"]]
    v = doc.setdefault("verdict", {})
    v["claimed"] = [c["cause"] for c in claimed]
    v["first"] = claimed[0]["cause"] if claimed else None
    v["layer"] = claimed[0]["layer"] if claimed else None
    if claimed:
        v["unexplained"] = None
