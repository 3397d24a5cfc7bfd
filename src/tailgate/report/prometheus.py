"""Render a report (and resident probe histograms) as Prometheus metric families.

Pure: a Report in, ``prometheus_client`` metric families out; `tailgate serve` exposes them,
`--textfile` writes them for node_exporter. Names follow Prometheus conventions: base units
(seconds, ratios, bytes) in the name, low-cardinality labels (id, layer, subject).

* ``tailgate_finding_status{id,layer,subject,status}``: a state set, 1 for the finding's
  status and 0 for the others, so a rule reads ``{status="fail"} == 1``.
* ``tailgate_finding_observed_<unit>{id,layer,subject}``: the observed value in base units;
  ``tailgate_red_line_<unit>{id,layer}``: the baseline's limit, so rules and dashboards can
  compare the two. Units without a base unit keep the catalog's in a ``unit`` label.
* ``tailgate_finding_rate_window_seconds{id,layer,subject,source}``: for a finding whose
  observed value is a rate of counters (FEC blocks per hour, AER errors), the window it was
  computed over: ``source="history"`` since the last stored run (the counter history), or
  ``"interval"``, this inspection's own two samples.
* ``tailgate_verdict{status}``, ``tailgate_layer_failing{layer}``, ``tailgate_report_timestamp_seconds``.
* ``tailgate_runqueue_latency_seconds``: the resident runqlat histogram (cumulative).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping
from typing import Any, get_args

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ..model import LAYERS, STATUSES, Report, VerdictStatus

# catalog unit -> (metric suffix, factor to the base unit)
BASE_UNITS: dict[str, tuple[str, float]] = {
    "ns": ("seconds", 1e-9),
    "us": ("seconds", 1e-6),
    "ms": ("seconds", 1e-3),
    "s": ("seconds", 1.0),
    "%": ("ratio", 0.01),
    "% of RAM": ("ratio", 0.01),
    "bytes": ("bytes", 1.0),
}


def base_unit(unit: str) -> tuple[str, float]:
    """``(suffix, factor)``: ``("", 1.0)`` for units with no base unit (counts, dBm, ...)."""
    return BASE_UNITS.get(unit, ("", 1.0))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _family(kind: str, suffix: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    name = f"tailgate_{kind}" + (f"_{suffix}" if suffix else "")
    return GaugeMetricFamily(name, doc, labels=labels)


def report_metrics(report: Report, baseline_limits: Mapping[str, tuple[Any, str]] | None = None
                   ) -> list[Metric]:
    """Metric families of one report. ``baseline_limits``: ``{id: (limit, unit)}`` for the red
    lines (every catalog id, also those with no finding value)."""
    status = GaugeMetricFamily(
        "tailgate_finding_status", "Status of each finding: 1 for its status, 0 for the others.",
        labels=["id", "layer", "subject", "status"])
    observed: dict[str, GaugeMetricFamily] = {}
    red: dict[str, GaugeMetricFamily] = {}
    for f in report.findings:
        for s in STATUSES:
            status.add_metric([f.id, f.layer, f.subject, s], 1.0 if f.status == s else 0.0)
        value = _number(f.observed)
        if value is None:
            continue
        suffix, factor = base_unit(f.unit)
        fam = observed.get(suffix)
        if fam is None:
            fam = observed[suffix] = _family(
                "finding_observed", suffix,
                "Observed value of a finding" + (f", in {suffix}." if suffix else
                                                 ", in the catalog's unit (label unit)."),
                ["id", "layer", "subject"] + ([] if suffix else ["unit"]))
        fam.add_metric([f.id, f.layer, f.subject] + ([] if suffix else [f.unit]), value * factor)
    window = GaugeMetricFamily(
        "tailgate_finding_rate_window_seconds",
        "Window a rate finding was computed over: since the last stored run (source=history) "
        "or this inspection's two samples (source=interval).",
        labels=["id", "layer", "subject", "source"])
    for f in report.findings:
        ev = f.evidence if isinstance(f.evidence, Mapping) else {}
        span = _number(ev.get("window_s"))
        if span is not None and ev.get("window_source") in ("history", "interval"):
            window.add_metric([f.id, f.layer, f.subject, ev["window_source"]], span)
    layers = {f.id: f.layer for f in report.findings}
    for cid, (limit, unit) in sorted((baseline_limits or {}).items()):
        value = _number(limit)
        if value is None:
            continue
        suffix, factor = base_unit(unit)
        fam = red.get(suffix)
        if fam is None:
            fam = red[suffix] = _family(
                "red_line", suffix,
                "The baseline's red line (limit) of each id" + (f", in {suffix}." if suffix else
                                                               ", in the catalog's unit."),
                ["id", "layer"] + ([] if suffix else ["unit"]))
        fam.add_metric([cid, layers.get(cid, "")] + ([] if suffix else [unit]), value * factor)
    verdict = GaugeMetricFamily("tailgate_verdict", "The report's verdict: 1 for it, 0 otherwise.",
                                labels=["status"])
    for s in _verdict_states(report.verdict.status):
        verdict.add_metric([s], 1.0 if s == report.verdict.status else 0.0)
    failing = GaugeMetricFamily("tailgate_layer_failing",
                                "1 when a finding of the layer fails; the lowest such layer is "
                                "the one to fix first.", labels=["layer"])
    for layer in LAYERS:
        failing.add_metric([layer], float(any(f.layer == layer and f.status == "fail"
                                              for f in report.findings)))
    stamp = GaugeMetricFamily("tailgate_report_timestamp_seconds",
                              "When the report's samples were taken (Unix time).",
                              value=report.taken_at)
    return [status, *observed.values(), *red.values(), window, verdict, failing, stamp]


def _verdict_states(current: str) -> list[str]:
    states = list(get_args(VerdictStatus))
    return states if current in states else [*states, current]


# -- the resident run-queue histogram --------------------------------------------------------

def histogram_bounds_ns() -> list[int]:
    """Upper bounds (ns) of the exported buckets: powers of two split in 16 between 16 us and
    134 ms (around the 500 us red line: histogram_quantile's linear interpolation then stays
    within about 3 % of the bucket), in 4 elsewhere, from 1 us to 17 s. Every bound is a bound
    of the probes' log-linear buckets (64 per power of two), so the conversion is exact."""
    bounds: list[int] = []
    for e in range(10, 34):
        split = 16 if 14 <= e < 27 else 4
        step = (1 << e) // split
        bounds += [(1 << e) + i * step for i in range(split)]
    return [*bounds, 1 << 34]


def bucket_index(bounds_ns: list[int], value_ns: int) -> int:
    """Index of the first bound >= ``value_ns`` (``len(bounds_ns)``: the +Inf bucket). A
    log-linear bucket holding the integers ``low <= v < high`` goes under ``high - 1``: every
    bound is a log-linear bound, so the whole bucket lies below it."""
    return bisect.bisect_left(bounds_ns, value_ns)


def cumulative(counts: list[int], bounds_ns: list[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (one more than bounds: the last is above every bound) as Prometheus
    ``(le, cumulative count)`` pairs in seconds, ending with ``+Inf``."""
    out: list[tuple[str, float]] = []
    running = 0
    for bound, c in zip(bounds_ns, counts, strict=False):
        running += c
        out.append((le_label(bound * 1e-9), float(running)))
    out.append(("+Inf", float(running + counts[len(bounds_ns)])))
    return out


def le_label(seconds: float) -> str:
    return repr(float(f"{seconds:.12g}"))


def runqlat_histogram(buckets: list[tuple[str, float]], sum_seconds: float) -> Metric:
    h = HistogramMetricFamily(
        "tailgate_runqueue_latency_seconds",
        "Run-queue latency of every task on the host (wake-up or preemption to running), from "
        "the resident runqlat probe.", labels=[])
    h.add_metric([], buckets, sum_seconds)
    return h


def probe_state(probes: Mapping[str, Mapping[str, Any]]) -> list[Metric]:
    up = GaugeMetricFamily("tailgate_probe_up", "1 while the resident probe runs, 0 when down.",
                           labels=["probe", "reason"])
    restarts = CounterMetricFamily("tailgate_probe_windows", "Probe windows run, by outcome "
                                   "(a failed one is retried after a back-off).",
                                   labels=["probe", "outcome"])
    events = CounterMetricFamily("tailgate_probe_events", "Context switches the resident probe "
                                 "timed (each with the wake-up or preemption before it).",
                                 labels=["probe"])
    per = GaugeMetricFamily("tailgate_probe_cost_seconds_per_event", "CPU time one event costs "
                            "the host with the probe attached (a switch and its wake-up; "
                            "measured by benchmarks/bench_observer.py, docs/benchmarks.md).",
                            labels=["probe"])
    spent = CounterMetricFamily("tailgate_probe_cpu_seconds", "CPU time the resident probe "
                                "cost the host, estimated: its events x the cost of one. It "
                                "runs inside the switching tasks, in no process of ours.",
                                labels=["probe"])
    for name, st in sorted(probes.items()):
        up.add_metric([name, _label(st.get("reason") or "")], 1.0 if st.get("up") else 0.0)
        for outcome in ("ok", "failed"):
            restarts.add_metric([name, outcome], float(st.get(outcome, 0)))
        events.add_metric([name], float(st.get("events", 0)))
        if st.get("cost_s") is not None:
            per.add_metric([name], float(st["cost_s"]))
            spent.add_metric([name], float(st.get("events", 0)) * float(st["cost_s"]))
    return [up, restarts, events, per, spent]


def _label(text: str) -> str:
    """A short, printable label value (a reason can be long and hold anything)."""
    text = re.sub(r"[^\x20-\x7e]", "?", text)
    return text[:200]


def exporter_state(cycles: int, cycle_s: float, interval_s: float) -> list[Metric]:
    done = CounterMetricFamily("tailgate_inspections", "Inspections completed by this exporter.",
                               value=float(cycles))
    took = GaugeMetricFamily("tailgate_inspection_duration_seconds",
                             "Wall time of the last inspection (two samples, interval apart).",
                             value=cycle_s)
    every = GaugeMetricFamily("tailgate_inspection_interval_seconds",
                              "Seconds between the two counter samples of each inspection.",
                              value=interval_s)
    return [done, took, every]
