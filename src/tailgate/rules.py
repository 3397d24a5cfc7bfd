"""Prometheus recording and alerting rules generated from the catalog and a baseline.

Pure: (catalog, baseline, options) -> a rules document (the YAML `promtool check rules` and
Prometheus's `rule_files` read). The expressions read the series `tailgate serve` exports
(:mod:`tailgate.report.prometheus`), so a rule fires where a report would say fail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from .baseline import Baseline, catalog

SEVERITY = {"fail": "critical", "warn": "warning"}


@dataclass(frozen=True)
class RuleOptions:
    for_fail: str = "5m"  # how long a fail must last before the alert fires
    for_warn: str = "30m"
    for_unknown: str = "1h"
    window: str = "5m"  # rate window of the histogram quantiles
    stale_after_s: float = 300.0  # no fresh report for this long: the exporter is stuck
    ttft_p99_s: float = 2.0  # engine SLO: vLLM time to first token, P99
    job: str = ""  # restrict every rule to one scrape job ('' = any)


def alert_name(check_id: str, suffix: str = "") -> str:
    """``l2.sched.runqlat`` -> ``TailgateL2SchedRunqlat``: a valid, readable alert name."""
    parts = re.split(r"[._]", check_id)
    return "Tailgate" + "".join(p[:1].upper() + p[1:] for p in parts if p) + suffix


def _sel(opts: RuleOptions, **labels: str) -> str:
    pairs = ([f'job="{opts.job}"'] if opts.job else []) + [f'{k}="{v}"' for k, v in labels.items()]
    return "{" + ",".join(pairs) + "}"


def _text(s: str) -> str:
    """Annotation text: one line, and no `{{` that Prometheus would take as a template."""
    return " ".join(s.split()).replace("{{", "{ {")


def red_line_rules(baseline: Baseline, opts: RuleOptions) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for cid, e in catalog().items():
        if cid in baseline.disabled:
            continue
        limit = baseline.get(cid).get("limit")
        shown = "" if limit is None else f" (red line {limit} {e.unit})".replace("  ", " ")
        for status, for_ in (("fail", opts.for_fail), ("warn", opts.for_warn)):
            rules.append({
                "alert": alert_name(cid, "" if status == "fail" else "Warning"),
                "expr": f"tailgate_finding_status{_sel(opts, id=cid, status=status)} == 1",
                "for": for_,
                "labels": {"severity": SEVERITY[status], "layer": e.layer, "id": cid},
                "annotations": {
                    "summary": f"{e.layer} {cid} {status} on {{{{ $labels.instance }}}} "
                               f"{{{{ $labels.subject }}}}: {_text(e.title)}{shown}",
                    "description": _text(e.rationale),
                    "remedy": _text(e.remedy),
                    "explain": f"tailgate explain {cid}",
                },
            })
    rules.append({
        "alert": "TailgateRedLineUnmeasured",
        "expr": f"tailgate_finding_status{_sel(opts, status='unknown')} == 1",
        "for": opts.for_unknown,
        "labels": {"severity": "info"},
        "annotations": {
            "summary": "{{ $labels.id }} could not be measured on {{ $labels.instance }} "
                       "{{ $labels.subject }}: a red line nobody watches",
            "explain": "tailgate inspect on that host prints the reason",
        },
    })
    rules.append({
        "alert": "TailgateCheckError",
        "expr": f"tailgate_finding_status{_sel(opts, status='error')} == 1",
        "for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "{{ $labels.id }} raised inside tailgate on {{ $labels.instance }}: a "
                       "defect of tailgate, not a fact about the host",
            "explain": "tailgate inspect on that host prints the exception; report it",
        },
    })
    return rules


def health_rules(opts: RuleOptions) -> list[dict[str, Any]]:
    return [
        {"alert": "TailgateProbeDown",
         "expr": f"tailgate_probe_up{_sel(opts)} == 0", "for": "5m",
         "labels": {"severity": "warning"},
         "annotations": {"summary": "resident probe {{ $labels.probe }} down on "
                                    "{{ $labels.instance }}: {{ $labels.reason }}"}},
        {"alert": "TailgateReportStale",
         "expr": f"time() - tailgate_report_timestamp_seconds{_sel(opts)} > "
                 f"{opts.stale_after_s:g}",
         "for": "1m", "labels": {"severity": "warning"},
         "annotations": {"summary": "no fresh tailgate report from {{ $labels.instance }} "
                                    f"for more than {opts.stale_after_s:g} s"}},
    ]


def histogram_rules(baseline: Baseline, opts: RuleOptions) -> list[dict[str, Any]]:
    """P99/P999 over the resident run-queue histogram and an engine's TTFT histogram."""
    w = opts.window
    rules: list[dict[str, Any]] = []
    for q, name in ((0.99, "p99"), (0.999, "p999")):
        rules.append({
            "record": f"instance:tailgate_runqueue_latency_seconds:{name}_{w}",
            "expr": f"histogram_quantile({q}, sum by (instance, job, le) "
                    f"(rate(tailgate_runqueue_latency_seconds_bucket{_sel(opts)}[{w}])))"})
    if "l2.sched.runqlat" not in baseline.disabled:
        limit_s = float(baseline.get("l2.sched.runqlat")["limit"]) * 1e-6
        rules.append({
            "alert": "TailgateRunqueueP999High",
            "expr": f"instance:tailgate_runqueue_latency_seconds:p999_{w} > {limit_s:g}",
            "for": opts.for_fail,
            "labels": {"severity": "critical", "layer": "L2", "id": "l2.sched.runqlat"},
            "annotations": {
                "summary": "run-queue P999 {{ $value | humanizeDuration }} over " + w +
                           f" on {{{{ $labels.instance }}}} (red line {limit_s * 1e6:g} us)",
                "remedy": _text(catalog()["l2.sched.runqlat"].remedy),
                "explain": "tailgate explain l2.sched.runqlat"}})
    # vLLM's TTFT histogram: coarse buckets, so a P99 (not a P999) is what it can give.
    for q, name in ((0.99, "p99"), (0.999, "p999")):
        rules.append({
            "record": f"job:vllm_time_to_first_token_seconds:{name}_{w}",
            "expr": f"histogram_quantile({q}, sum by (job, le) "
                    f"(rate(vllm:time_to_first_token_seconds_bucket{_sel(opts)}[{w}])))"})
    rules.append({
        "alert": "TailgateEngineTTFTP99High",
        "expr": f"job:vllm_time_to_first_token_seconds:p99_{w} > {opts.ttft_p99_s:g}",
        "for": opts.for_fail,
        "labels": {"severity": "critical", "layer": "L4"},
        "annotations": {
            "summary": "TTFT P99 {{ $value | humanizeDuration }} over " + w +
                       f" for {{{{ $labels.job }}}} (SLO {opts.ttft_p99_s:g} s)",
            "description": "The engine's own histogram has coarse buckets: confirm with "
                           "tailgate bench openai+http://... for an exact P999."}})
    return rules


def generate(baseline: Baseline, opts: RuleOptions | None = None) -> dict[str, Any]:
    opts = opts or RuleOptions()
    return {"groups": [
        {"name": "tailgate-red-lines", "rules": red_line_rules(baseline, opts)},
        {"name": "tailgate-histograms", "rules": histogram_rules(baseline, opts)},
        {"name": "tailgate-health", "rules": health_rules(opts)},
    ]}


def to_yaml(doc: dict[str, Any]) -> str:
    header = ("# Generated by `tailgate rules` from the catalog and the baseline: regenerate, "
              "don't edit.\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=False)
