"""What the load engines take and give, at the bottom of bench/: a worker's configuration
(:class:`EngineConfig`), what it measured (:class:`WorkerResult`), the per-request log's
headers and the compiled loop's record layout. The Python engine (:mod:`.engine`), the
compiled one (:mod:`.fastpath`), the recorder they share (:mod:`.recording`) and everything
that merges their results import these from here, never from an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..hist import Histogram, HistogramSpec
from .http1 import Limits
from .target import Target

# Connection attempts in flight at once: each costs the generator ~100 µs of CPU, so a
# short hiccup must not turn into hundreds of new connections (which would make the
# hiccup longer); a stalled server still gets its burst, 16 connections at a time.
MAX_CONNECTING = 16
LOG_HEADER = "worker,id,intended_s,dispatch_s,send_s,end_s,outcome,status,bytes,warmup,arrive_s\n"
# openai+ targets: the same columns, then each request's token times and counts.
LLM_LOG_HEADER = (LOG_HEADER[:-1] + ",first_chunk_s,first_token_s,last_token_s,done_s,"
                  "chunks,output_tokens,input_tokens,gap_from_s,gap_to_s,engine_state,"
                  "engine_prompt_n,engine_cache_n,engine_prompt_ms,engine_predicted_n,"
                  "engine_predicted_ms,engine_tokens_state,engine_tokens,"
                  "engine_start_bound_s,engine_gap_ms\n")
# gap_from_s/gap_to_s: the request's longest gap between content chunks. engine_*: the
# engine's own record of the request (llama-server's timings; llm/engine_records.py),
# engine_state "ok", "bad" (the object was there but not readable) or "" (none sent).
# engine_tokens*: its per-token times (llm/engine_tokens.py; --engine-timings per-token):
# state "ok", "" (none) or "bad: " and the reason they are unknown; the content chunks
# with a time; the latest the engine can have started the request; the engine's time
# between the longest gap's two tokens.
LLM_LOG_HEADER_V2 = LLM_LOG_HEADER[:LLM_LOG_HEADER.index(",engine_tokens_state")] + "\n"
ENGINE_COLUMNS = ("engine_prompt_n", "engine_cache_n", "engine_prompt_ms",
                  "engine_predicted_n", "engine_predicted_ms")
# one request's record as the compiled loop writes it (fastpath checks its RECORD_SIZE)
RECORD = np.dtype([("rid", "<i8"), ("send", "<i8"), ("end", "<i8"), ("bytes", "<i8"),
                   ("arrive", "<i8"), ("status", "<i4"), ("out", "<i4")])


@dataclass(frozen=True)
class EngineConfig:
    """What one process does. ``times`` are intended offsets in seconds from the start."""

    target: Target
    times: np.ndarray
    warmup_s: float = 0.0
    connections: int = 1
    max_connections: int = 1024
    timeout_s: float = 2.0
    log_path: str | None = None
    hdr_interval_s: float | None = None
    progress_s: float = 0.25  # also how often records become histograms (short: no hiccups)
    worker: int = 0
    spec: HistogramSpec = field(default_factory=HistogramSpec)
    limits: Limits = field(default_factory=Limits)
    retry_stale: bool = False  # resend a stale_connection request once (see module doc)
    coalesce_s: float = 0.0  # a due request may wait this long for others due (fast engine)
    check_seq: bool = False  # test mode: stamp requests, check responses carry the stamp
    # openai+ targets: each request's own bytes (by request id) and the workload's input
    # length of each (tokens when the server sends no usage); see tailgate.llm.accounting.
    requests: tuple[bytes, ...] | None = None
    nominal_input: np.ndarray | None = None
    max_event_bytes: int = 16 << 20
    require_done: bool = True  # a stream is complete at data: [DONE]
    max_tokens_per_stream: int = 1_000_000  # openai_sse.MAX_TOKENS_PER_STREAM
    good_slos: tuple[Any, ...] = ()  # per-request latency SLOs for goodput (GoodSlo)
    engine: str = "auto"  # "fast" (compiled hot path, fastpath.py), "python" or "auto"


@dataclass
class WorkerResult:
    """What one process measured (measured window only; warm-up excluded). Picklable."""

    worker: int
    counts: list[int]  # per outcome code, see outcome.KINDS
    latency: Histogram
    service: Histogram
    lateness: Histogram
    intervals: dict[int, Histogram]
    scheduled: int  # measured requests in the schedule
    dispatched: int  # measured requests the generator got to
    abandoned: int  # dispatched but without an outcome when stopped (interrupt only)
    last_dispatch_s: float  # offset of the last measured dispatch from the start
    queued: int  # measured requests that waited for a connection
    connections: dict[str, int]
    interrupted: bool
    precise_timer: bool
    log_path: str | None
    warmup_requests: int = 0
    connect_errors: dict[str, int] = field(default_factory=dict)  # reason -> attempts
    cpu_s: float = 0.0  # CPU time of this process during the run (user + system)
    sent: int = 0  # measured requests that got an outcome (its own counter)
    error_examples: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> reasons
    conn_errors: dict[str, dict[str, int]] = field(default_factory=dict)  # no request charged
    retried: int = 0  # measured requests resent after a stale connection
    schedule_ended: bool = False  # end_schedule() cut the schedule short
    arrivals_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # dispatch offsets
    tick_s: float = 0.0  # the wake-up timer's period (0: one wake-up per due time)
    tokens: Any = None  # openai+: tailgate.llm.accounting.TokenBook
    # per successful connection attempt, ns: TCP connect, and TLS handshake (TLS targets)
    connect_time: Histogram | None = None
    handshake_time: Histogram | None = None
    engine: str = "python"  # which engine measured: "python" (this module) or "fast"
    # openai+ on the compiled engine: times the loop stopped reading, the JSON behind it
    read_pauses: int = 0
    read_paused_s: float = 0.0
    # compiled engine: each reply's kernel receive stamp -> the loop's read of it (ns);
    # None: none (the python engine's latencies end at its read; streams are timed at
    # each chunk's stamp)
    read_lag: Histogram | None = None
    # compiled: the most it polled before a due time instead of sleeping (learnt from how
    # late its timed wake-ups came; 0 on the Python engine)
    spin_s: float = 0.0
