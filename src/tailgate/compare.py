"""Compare: a before/after table from result documents, with honest significance.

Pure: documents in (inspect reports, bench results for HTTP/TCP/LLM, probe summaries; several
per side merge exactly from their histograms), a table out. A row is one metric: its value
before and after, the change (x and %), whether the change is beyond the noise, and the
samples behind it.

Significance of a percentile is decided by order statistics, with no assumption about the
distribution: the 95 % interval of each side is the one bench prints
(:func:`tailgate.bench.confidence.quantile_ci`, exact binomial ranks over the recorded
histogram), so a percentile bench calls not measurable (P99.99 of 5,000 samples) is ``n/m``
here too, never a significant change. Two intervals that do not overlap make the change
significant. A figure without a histogram (a maximum, a rate from one run, an
inspect value) has no noise model: its significance is ``n/a``, never ``yes``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError
from .hist import Histogram, HistogramError, decode

Z95 = 1.959964
ORDER = ("L1", "L2", "L3", "L4", "end-to-end")
PCTS = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9),
        ("p9999", 99.99))


Extracted = list[tuple["Metric", Histogram | None]]


class CompareError(InputError):
    """A document that cannot be compared (the message names the file)."""


@dataclass
class Metric:
    """One figure of one side, with what it takes to merge and test it."""

    name: str
    layer: str
    unit: str
    value: float | None
    better: str = "lower"  # or "higher"
    count: int | None = None  # samples behind a percentile
    ci: tuple[float, float] | None = None
    runs: list[float] = field(default_factory=list)
    unmeasurable: str | None = None  # why its interval cannot be formed (bench's n/m)


@dataclass(frozen=True)
class Row:
    name: str
    layer: str
    unit: str
    before: float | None
    after: float | None
    ratio: float | None
    change_pct: float | None
    significant: str  # "yes" | "no" | "n/a" | "n/m" (a side not measurable, as bench says)
    worse: bool
    before_n: int | None = None
    after_n: int | None = None
    before_ci: tuple[float, float] | None = None
    after_ci: tuple[float, float] | None = None
    not_measurable: str | None = None  # which side, and why

    def to_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


# -- order-statistic confidence intervals ----------------------------------------------------

def rank_interval(n: int, q: float, z: float = Z95) -> tuple[int, int]:
    """1-based ranks bracketing the q-quantile of n samples with ~95 % confidence."""
    half = z * math.sqrt(n * q * (1.0 - q))
    lo = max(1, math.floor(n * q - half))
    hi = min(n, math.ceil(n * q + half) + 1)
    return lo, hi


def hist_interval(h: Histogram, pct: float) -> tuple[float, float] | None:
    """The percentile's interval over a recorded histogram, by the very function bench uses
    (:func:`tailgate.bench.confidence.quantile_ci`); None where bench says not measurable."""
    ci = _quantile_ci(h, pct)
    return (float(ci.lo), float(ci.hi)) if ci.measurable else None  # type: ignore[arg-type]


def _quantile_ci(h: Histogram, pct: float):
    from .bench.confidence import quantile_ci

    return quantile_ci(h, pct)


def _set_ci(m: Metric, h: Histogram, pct: float, ns_per_unit: float) -> None:
    ci = _quantile_ci(h, pct)
    m.count = h.total
    if ci.measurable:
        m.ci = (ci.lo / ns_per_unit, ci.hi / ns_per_unit)  # type: ignore[operator]
    else:
        m.ci, m.unmeasurable = None, ci.reason


# -- reading documents -----------------------------------------------------------------------

def load(path: str) -> dict[str, Any]:
    """A result document, through the bounded loader every user file goes through."""
    from .userfiles import UserFileError, load_json

    try:
        doc = load_json(path)
    except UserFileError as exc:
        raise CompareError(str(exc)) from exc
    if not isinstance(doc, dict):
        raise CompareError(f"{path}: not a tailgate result (expected a JSON object)")
    return doc


def kind(doc: dict[str, Any]) -> str:
    if "ttft_ms" in doc and "model" in doc:  # an openai+ bench: its token figures
        return "llm"
    if doc.get("tailgate_bench") == 1:
        return "bench"
    if "findings" in doc and "verdict" in doc:
        return "inspect"
    if isinstance(doc.get("probe"), str):
        return "probe"
    raise ValueError("not a tailgate inspect, bench or probe result")


def _hists(doc: dict[str, Any]) -> dict[str, Histogram]:
    out = {}
    for name, text in (doc.get("histograms") or {}).items():
        try:
            out[name] = decode(text)
        except (HistogramError, TypeError, ValueError) as exc:
            raise ValueError(f"histogram {name!r}: {exc}") from exc
    return out


def _latency_rows(prefix: str, layer: str, summary: dict[str, Any], hist: Histogram | None,
                  ns_per_unit: float, unit: str) -> Extracted:
    """Percentile rows of a latency summary; with the recorded histogram (ns), each carries its
    order-statistic interval in the table's unit."""
    rows: Extracted = []
    for name, pct in PCTS:
        if summary.get(name) is None:
            continue
        m = Metric(f"{prefix}.{name}", layer, unit, _num(summary.get(name)),
                   count=summary.get("count"))
        if hist is not None:
            _set_ci(m, hist, pct, ns_per_unit)
        else:  # no histogram: what the document itself said (bench writes its intervals)
            said = (summary.get("ci") or {}).get(name) if isinstance(summary.get("ci"), dict) \
                else None
            if isinstance(said, dict) and said.get("measurable") is False:
                m.unmeasurable = str(said.get("reason") or "not measurable")
        rows.append((m, hist))
    if summary.get("max") is not None:
        rows.append((Metric(f"{prefix}.max", layer, unit, _num(summary["max"])), None))
    return rows


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def extract(doc: dict[str, Any]) -> tuple[str, Extracted]:
    k = kind(doc)
    h = _hists(doc)
    rows: Extracted = []
    if k == "bench":
        rows += _latency_rows("latency", "end-to-end", doc["latency_ms"], h.get("latency"),
                              1e6, "ms")
        rows += _latency_rows("service", "end-to-end", doc["service_time_ms"], h.get("service"),
                              1e6, "ms")
        req = doc.get("requests") or {}
        sent = req.get("sent") or 0
        errors = sum((req.get("errors") or {}).values())
        rows.append((Metric("rate.achieved", "end-to-end", "req/s",
                            _num((doc.get("rate") or {}).get("achieved")), "higher"), None))
        rows.append((Metric("error_rate", "end-to-end", "%",
                            100.0 * errors / sent if sent else None), None))
        rows += _packet_rows(doc.get("packets"))
    elif k == "llm":
        for m in ("ttft", "itl", "itl_per_token", "tpot", "e2e"):
            if isinstance(doc.get(f"{m}_ms"), dict):  # (older results lack itl_per_token)
                rows += _latency_rows(m, "L4", doc[f"{m}_ms"], h.get(m), 1e6, "ms")
        # the engine's own phases, where it sent a record of each request (llama-server)
        # (held: the server's own handling before its engine took the request, L3 as
        # diagnose's engine_held)
        for m, layer in (("engine_queue", "L4"), ("engine_held", "L3"),
                         ("engine_prefill", "L4"), ("engine_decode", "L4")):
            if (doc.get(f"{m}_ms") or {}).get("count"):
                rows += _latency_rows(m, layer, doc[f"{m}_ms"], h.get(m), 1e6, "ms")
        for key in ("output_tokens_per_s", "goodput_rps", "requests_per_s"):
            unit = "tokens/s" if "tokens" in key else "req/s"
            rows.append((Metric(key, "L4", unit, _num((doc.get("throughput") or {}).get(key)),
                                "higher"), None))
    elif k == "probe":
        probe = doc["probe"]
        if "p999" in doc and isinstance(doc.get("buckets"), list):
            rows += [(m, None) for m, _ in _latency_rows(probe, "L2", doc, None, 1e3, "us")]
            _loglin_ci(rows, doc)
    else:  # inspect
        for f in doc["findings"]:
            value = _num(f.get("observed"))
            if value is None:
                continue
            better = "higher" if ">=" in str(f.get("title", "")) else "lower"
            rows.append((Metric(f"{f['id']} [{f.get('subject', 'host')}]", f.get("layer", ""),
                                str(f.get("unit", "")), value, better), None))
    return k, rows


def _packet_rows(p: Any) -> Extracted:
    """A udp:// load's datagram figures (L3: the data plane's packet rate, what a syscall
    batch or io_uring changes): echoed datagrams per second, loss, CPU per datagram."""
    if not isinstance(p, dict):
        return []
    pps = _num(p.get("pps_echoed"))
    return [(Metric("packet_rate", "L3", "Mpps", pps / 1e6 if pps is not None else None,
                    "higher"), None),
            (Metric("packet_loss", "L3", "%", _num(p.get("loss_pct"))), None),
            (Metric("cpu_per_packet", "L3", "ns", _num(p.get("cpu_ns_per_packet"))), None)]


def _pct_of(name: str) -> float | None:
    stat = name.rsplit(".", 1)[-1]
    return dict(PCTS).get(stat)


def _loglin_ci(rows: Extracted, doc: dict[str, Any]) -> None:
    """Intervals for a probe summary's percentiles from its log-linear buckets."""
    from .probes import loglin

    keyed: dict[int, int] = {}
    for b in doc["buckets"]:
        keyed[loglin.bucket_key(round(float(b["min"]) * 1000))] = int(b["count"])
    n = sum(keyed.values())
    for m, _ in rows:
        pct = _pct_of(m.name)
        if pct is None or n < 2:
            continue
        lo, hi = rank_interval(n, pct / 100.0)
        m.ci = (loglin.quantile(keyed, lo / n) / 1e3, loglin.quantile(keyed, hi / n) / 1e3)
        m.count = n


# -- merging several runs per side ---------------------------------------------------------

def spectra(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]
            ) -> dict[str, list[tuple[str, Histogram]]]:
    """The latency histograms of both sides (their documents), merged per side, for the
    spectrum plots."""
    out: dict[str, list[tuple[str, Histogram]]] = {}
    for label, docs in (("before", before), ("after", after)):
        merged: dict[str, Histogram] = {}
        for d in docs:
            for name, text in (d.get("histograms") or {}).items():
                if name == "lateness":
                    continue
                h = decode(text)
                if name in merged:
                    merged[name].add(h)
                else:
                    merged[name] = h
        for name, h in merged.items():
            out.setdefault(name, []).append((label, h))
    return out


def side(paths: Sequence[str], docs: Sequence[dict[str, Any]] | None = None
         ) -> tuple[str, list[Metric]]:
    """One side of the comparison: its kind and metrics, several runs merged. ``docs``:
    the files already loaded (else they are read)."""
    docs = [load(p) for p in paths] if docs is None else list(docs)
    kinds, extracted = [], []
    for p, d in zip(paths, docs, strict=True):
        try:
            k, rows = extract(d)
        except (KeyError, TypeError, ValueError) as exc:
            raise CompareError(f"{p}: {exc}") from exc
        kinds.append(k)
        extracted.append(rows)
    if len(set(kinds)) != 1:
        raise CompareError(f"one side mixes kinds of results: {', '.join(sorted(set(kinds)))}")
    if len(docs) == 1:
        return kinds[0], [m for m, _ in extracted[0]]
    return kinds[0], _merge(docs, extracted)


def _merge(docs: list[dict[str, Any]], extracted: list[Extracted]) -> list[Metric]:
    out: dict[str, Metric] = {}
    hists: dict[str, list[Histogram]] = {}
    for rows in extracted:
        for m, hist in rows:
            slot = out.get(m.name)
            if slot is None:
                slot = out[m.name] = Metric(m.name, m.layer, m.unit, None, m.better)
            if m.value is not None:
                slot.runs.append(m.value)
            if hist is not None:
                hists.setdefault(m.name, []).append(hist)
    for m in out.values():
        pct = _pct_of(m.name)
        same = hists.get(m.name, [])
        if pct is not None and len(same) == len(docs):  # every run has its histogram: exact
            total = same[0].copy()
            for h in same[1:]:
                total.add(h)
            scale = 1e6  # bench and LLM histograms record ns; their tables are in ms
            m.value = min(total.value_at_percentile(pct), total.max) / scale
            _set_ci(m, total, pct, scale)
        elif m.runs:
            m.value = (max(m.runs) if m.name.endswith(".max") else sum(m.runs) / len(m.runs))
    return list(out.values())


# -- what the sides measured alike -----------------------------------------------------------

def _how(doc: dict[str, Any]) -> dict[str, str]:
    """How a bench result measured (what moves its figures besides the system): the engine,
    where an HTTP/TCP latency ends, the --coalesce window. Only what the document says."""
    gen, cfg = doc.get("generator"), doc.get("config")
    if doc.get("tailgate_bench") != 1 or not isinstance(gen, dict):
        return {}
    out = {"engine": str(gen.get("engine"))}
    if kind(doc) == "bench" and gen.get("engine") in ("fast", "python"):
        # (the compiled engine's latencies end at the reply's kernel receive stamp since
        # read_lag_ms exists; before it, and on the python engine, at the loop's read)
        out["latency ends at"] = ("the reply's kernel receive stamp"
                                  if gen.get("engine") == "fast" and "read_lag_ms" in gen
                                  else "the generator's read")
    if isinstance(cfg, dict):
        out["--coalesce"] = f"{1e6 * float(cfg.get('coalesce_s') or 0.0):g} µs"
    return out


def measured_differently(before: Sequence[dict[str, Any]],
                         after: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence for each way the two sides' runs were measured differently: a change in
    their figures may be that, not the system (a --coalesce window is in every latency; a
    latency at the kernel stamp ends ~10 µs before the read on loopback)."""
    def values(docs: Sequence[dict[str, Any]], key: str) -> list[str]:
        return sorted({h[key] for h in map(_how, docs) if key in h})

    out = []
    keys = dict.fromkeys(k for d in (*before, *after) for k in _how(d))
    for key in keys:
        b, a = values(before, key), values(after, key)
        if b and a and b != a:
            out.append(f"measured differently: {key} {' / '.join(b)} before, "
                       f"{' / '.join(a)} after (the figures move with it, not only with the "
                       f"system)")
    return out


# -- the table -------------------------------------------------------------------------------

def compare(before: list[Metric], after: list[Metric]) -> list[Row]:
    b = {m.name: m for m in before}
    rows = []
    for a in after:
        m = b.get(a.name)
        if m is None:
            continue
        rows.append(_row(m, a))
    order = {layer: i for i, layer in enumerate(ORDER)}
    return sorted(rows, key=lambda r: order.get(r.layer, len(ORDER)))


def _row(b: Metric, a: Metric) -> Row:
    ratio = pct = None
    if b.value is not None and a.value is not None:
        if b.value != 0:
            ratio = a.value / b.value
            pct = 100.0 * (a.value - b.value) / abs(b.value)
        elif a.value == 0:
            ratio, pct = 1.0, 0.0
    significant = "n/a"
    unmeasured = "; ".join(f"{which}: {m.unmeasurable}" for which, m in (("before", b), ("after", a))
                           if m.unmeasurable) or None
    if unmeasured:
        significant = "n/m"
    elif b.ci and a.ci:
        significant = "yes" if (a.ci[0] > b.ci[1] or a.ci[1] < b.ci[0]) else "no"
    elif len(b.runs) > 1 and len(a.runs) > 1:
        significant = "yes" if (min(a.runs) > max(b.runs) or max(a.runs) < min(b.runs)) else "no"
    worse = False
    if b.value is not None and a.value is not None:
        worse = a.value > b.value if b.better == "lower" else a.value < b.value
    return Row(b.name, b.layer, b.unit, b.value, a.value, ratio, pct, significant, worse,
               b.count, a.count, b.ci, a.ci, unmeasured)


def status_changes(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, str]]:
    """Findings of two inspect reports whose status changed, bottom-up."""
    def key(f):
        return f["id"], f.get("subject", "host")
    was = {key(f): f for f in before.get("findings", [])}
    out = []
    for f in after.get("findings", []):
        old = was.get(key(f))
        if old is not None and old.get("status") != f.get("status"):
            out.append({"id": f["id"], "subject": f.get("subject", "host"),
                        "layer": f.get("layer", ""), "before": old.get("status"),
                        "after": f.get("status"), "reason": f.get("reason", "")})
    order = {layer: i for i, layer in enumerate(ORDER)}
    return sorted(out, key=lambda c: order.get(c["layer"], 9))


# -- the regression gate ---------------------------------------------------------------------

@dataclass(frozen=True)
class Gate:
    metric: str
    max_pct: float

    def matches(self, name: str) -> bool:
        return name == self.metric or name.endswith("." + self.metric)


GATE = re.compile(r"^\s*([A-Za-z0-9_.:/\[\] -]+?)\s*=\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")


def parse_gate(text: str) -> Gate:
    m = GATE.match(text)
    if not m:
        raise ValueError(f"--max-regression {text!r}: expected METRIC=PCT%, e.g. 'p999=10%'")
    return Gate(m.group(1), float(m.group(2)))


def regressions(rows: list[Row], gates: list[Gate]) -> list[tuple[Gate, Row]]:
    """Rows that got worse by more than their gate allows, unless the change was tested and
    found within the noise (a figure without a noise model counts: the gate is conservative)."""
    out = []
    for g in gates:
        for r in rows:
            if not g.matches(r.name) or not r.worse or r.change_pct is None:
                continue
            if abs(r.change_pct) > g.max_pct and r.significant != "no":
                out.append((g, r))
    return out


def fmt_change(r: Row) -> str:
    if r.ratio is None:
        return "-"
    return f"{r.ratio:.2f}x ({r.change_pct:+.1f} %)"


def document(kind_: str, rows: list[Row], changes: list[dict[str, str]],
             failed: list[tuple[Gate, Row]], sources: dict[str, list[str]],
             differently: Sequence[str] = ()) -> dict[str, Any]:
    return {"tailgate_compare": 1, "kind": kind_, "sources": sources,
            "measured_differently": list(differently),
            "status_changes": changes, "rows": [r.to_json() for r in rows],
            "regressions": [{"gate": f"{g.metric}={g.max_pct:g}%", "metric": r.name,
                             "change_pct": r.change_pct} for g, r in failed]}


