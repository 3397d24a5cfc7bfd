"""A bench's options as a user gives them (:class:`BenchOptions`), at the bottom of bench/:
:mod:`.spec` checks them into a :class:`~.spec.BenchSpec`, and the modules that build a
part of it (the protocols' refusals, an openai+ target's requests) read them from here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class BenchOptions:
    """A bench's options as a user gives them: text where the command line takes text
    (``rate="20k"``, ``duration="30s"``), named as the command-line flags are
    (``--max-connections`` is ``max_connections``). The defaults are the command's;
    ``tests/test_bench_spec.py`` checks the parser against them."""

    target: str | None = None
    # the schedule and the connection pool
    rate: str | None = None
    duration: str | None = None
    arrival: str = "constant"
    burstiness: float | None = None
    warmup: str = "0s"
    coalesce: str = "0s"
    connections: int = 16
    max_connections: int = 1024
    workers: int | None = None
    timeout: str | None = None
    requests: int | None = None
    seed: int = 0
    engine: str = "auto"
    confidence: tuple[str, ...] = ()
    # objectives and outputs
    slo: tuple[str, ...] = ()
    json: str | None = None
    html: str | None = None
    hdr: str | None = None
    hdr_interval: str = "1s"
    log: str | None = None
    spectrum: bool = False
    percentiles: tuple[tuple[str, float], ...] | None = None
    min_tail_samples: int = 10
    quiet: bool = False
    # what each request is (the protocol's options: see bench.protocols)
    method: str = "GET"
    header: tuple[str, ...] = ()
    body: str | None = None
    body_file: str | None = None
    payload: str | None = None
    delimiter: str | None = None
    response_length: int | None = None
    insecure: bool = False
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    sni: str | None = None
    max_header_bytes: str = "256KiB"
    max_body_bytes: str = "1GiB"
    max_event_bytes: str = "16MiB"
    max_tokens_per_stream: int | None = None
    retry_stale: bool = False
    # udp:// datagrams (bench.udp; None: its default)
    size: str | None = None
    batch: int | None = None
    io: str | None = None
    # LLM targets (openai+http://)
    model: str | None = None
    api: str = "completions"
    concurrency: int | None = None
    workload: str = "fixed"
    input_len: int = 128
    output_len: int = 64
    range_ratio: float = 0.5
    conversations: int = 8
    turns: int = 4
    system_len: int = 256
    trace: str | None = None
    allow_no_done: bool = False
    trace_token_scale: float = 1.0
    trace_time_scale: float = 1.0
    no_usage: bool = False
    continuous_usage: bool = False
    engine_timings: str = "final"  # "per-token": llama-server's timings in every chunk
    ignore_eos: bool = False

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> BenchOptions:
        """The bench options of a parsed command line (other commands' flags ignored)."""
        given = vars(ns)
        kw = {f.name: _frozen(given[f.name]) for f in fields(cls) if f.name in given}
        return cls(**kw)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in fields(cls)}

    def with_(self, **changes: Any) -> BenchOptions:
        return replace(self, **{k: _frozen(v) for k, v in changes.items()})


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value
