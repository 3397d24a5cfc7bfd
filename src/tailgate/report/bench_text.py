"""A bench run's terminal report (``tailgate bench``'s text): what was asked, what happened,
the distributions with their confidence intervals, the SLOs; a fleet bench's (``--ray``,
``--scenario``) with a row per node and one verdict. The result itself (numbers and JSON) is
:mod:`tailgate.bench.result`'s; this module only renders it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..bench.result import CI_LEVEL, PERCENTILES, BenchResult, fmt_width
from ..hist import percentile_spectrum


def _fmt_row(label: str, block: dict[str, Any], columns: Sequence[str] = tuple(PERCENTILES)) -> str:
    # a percentile without a confidence interval is not a figure: "n/m" (not measurable)
    ci = block.get("ci", {})
    cells = [f"{'n/m':>10}" if k in ci and not ci[k]["measurable"] else
             f"{'-':>10}" if block.get(k) is None else f"{block[k]:>10.3f}" for k in columns]
    cells.append(f"{block['max']:>10.3f}")
    return f"{label:<14}" + "".join(cells) + f"{block['count']:>10d}"


def _fmt_ci(label: str, block: dict[str, Any], columns: Sequence[str] = tuple(PERCENTILES)) -> str:
    """One line: each percentile's interval, or why it is not measurable."""
    ci = block.get("ci", {})
    parts, unmeasurable = [], []
    for k in columns:
        if k not in ci:
            continue
        if ci[k]["measurable"]:
            parts.append(f"{k} {ci[k]['lo']:.3f}..{ci[k]['hi']:.3f}")
        else:
            unmeasurable.append(k)
    text = f"  {label} {block.get('ci_level', CI_LEVEL) * 100:g}% CI (ms): " + (
        ", ".join(parts) or "none")
    if unmeasurable:
        text += f"; not measurable: {', '.join(unmeasurable)} ({ci[unmeasurable[0]]['reason']}" \
                + (" for " + unmeasurable[0] if len(unmeasurable) > 1 else "") + ")"
    return text


def _llm_rows(d: dict[str, Any], columns: Sequence[str] = tuple(PERCENTILES)) -> list[str]:
    """An openai+ run's token figures under the latency rows."""
    if "ttft_ms" not in d:
        return []

    def row(label: str, b: dict[str, Any]) -> str:
        cells = "".join(f"{'-' if b.get(k) is None else format(b[k], '.3f'):>10}"
                        for k in (*columns, "max"))
        return f"{label:<14}" + cells + f"{b['count']:>10d}"

    def center(label: str, b: dict[str, Any]) -> str:
        return (f"{label} mean {'-' if b.get('mean') is None else format(b['mean'], '.3f')}, "
                f"median {'-' if b.get('median') is None else format(b['median'], '.3f')}")

    out = [row(name, d[key]) for key, name in (
        ("ttft_ms", "TTFT ms"), ("itl_ms", "ITL/chunk ms"), ("itl_per_token_ms", "ITL/token ms"),
        ("tpot_ms", "TPOT ms"), ("e2e_ms", "E2E ms"), ("first_chunk_ms", "1st chunk ms"))
        if key in d]
    out.append("centre (ms): " + "; ".join(center(name, d[key]) for key, name in (
        ("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))))
    t, tp = d["tokens"], d["throughput"]
    out.append(f"model {d.get('model')}, api {d.get('api')}, workload "
               f"{(d.get('workload') or {}).get('kind')}: tokens input {t['input']} "
               f"({t['input_counted_by']}), output {t['output']} ({t['counted_by']})")
    out.append(f"throughput: {tp['output_tokens_per_s']:.1f} output tok/s, "
               f"{tp['total_tokens_per_s']:.1f} total tok/s, {tp['requests_per_s']:.2f} req/s, "
               f"goodput {tp['goodput_rps']:.2f} req/s (good {d['requests']['good']})")

    out += token_lines(d)
    return out


def token_lines(d: dict[str, Any]) -> list[str]:
    """The token-truth lines of an openai+ result (terminal and HTML page): what its
    ``token_check`` and ``prefix_cache`` blocks hold, computed by :mod:`tailgate.llm.accounting`."""
    out = []
    tc = d.get("token_check")
    if tc:
        line = (f"token check: {tc['usage_mismatch']} of {tc['usage_compared']} request(s) "
                f"streamed a token count that disagrees with usage.completion_tokens")
        if tc["usage_not_reported"]:
            line += f" ({tc['usage_not_reported']} without usage, not compared)"
        line += (f"; chunks {tc['chunks']}: tokens stated for {tc['chunk_tokens_stated']}, "
                 f"assumed one for {tc['chunk_tokens_assumed_one']}, "
                 f"{tc['multi_token_chunks']} of several tokens (max "
                 f"{tc['max_tokens_in_chunk']})")
        out.append(line)
    pc = d.get("prefix_cache")
    if pc and pc["requests_reporting"]:
        rate = "-" if pc["hit_rate"] is None else f"{pc['hit_rate'] * 100:.1f}%"
        out.append(f"prefix cache (server's usage): {pc['cached_tokens']} of "
                   f"{pc['prompt_tokens']} prompt tokens cached ({rate}) in "
                   f"{pc['requests_reporting']} request(s) reporting, "
                   f"{pc['requests_with_hits']} with a hit")
    return out


def _packet_rows(d: dict[str, Any]) -> list[str]:
    """udp://: the datagram figures (bench.udp's ``packets`` block)."""
    p = d.get("packets")
    if not p:
        return []
    return [f"datagrams: {p['size']} B, batch {p['batch']}, {p['io']}: sent {p['pps_sent']:,.0f}/s,"
            f" echoed {p['pps_echoed']:,.0f}/s, lost {p['lost']:,} ({p['loss_pct'] or 0:.3g} %), "
            f"reordered {p['reordered']:,}, duplicate {p['duplicate']:,}, malformed "
            f"{p['malformed']:,}; {p['datagrams_per_send_call']:g} a send call, "
            f"{p['cpu_ns_per_packet']:,.0f} ns CPU a datagram"]


def summary_text(result: BenchResult, spectrum: bool = False,
                 columns: Sequence[str] | None = None) -> str:
    """The terminal report: what was asked, what happened, the distributions, SLOs.
    ``columns``: the percentile columns (``--percentiles``; default every PERCENTILES key)."""
    d, info = result.json, result.info
    columns = tuple(columns or PERCENTILES)
    req = d["requests"]
    errs = ", ".join(f"{k} {v}" for k, v in req["errors"].items() if v) or "none"
    lines = [
        f"tailgate bench {d['target']}  {info.arrival}"
        + (f" (burstiness {info.burstiness:g})" if info.arrival == "gamma" else "")
        + (f" {info.ramp.lo:g}..{info.ramp.hi:g} req/s (mean {info.rate:g})"
           if info.ramp is not None else " (as fast as the path takes)" if info.arrival == "max"
           else f" {info.rate:g} req/s") + " for "
        f"{info.duration_s:g} s  ({info.workers} worker(s), {info.connections}.."
        f"{info.max_connections} connections, time-out {info.timeout_s:g} s)"
        + ("  [INTERRUPTED]" if d["interrupted"] else ""),
        f"requests: sent {req['sent']}, ok {req['ok']}, errors: {errs}"
        + (f", abandoned {req['abandoned']}" if req["abandoned"] else "")
        + (f", lost {req['lost']}" if req.get("lost") else ""),
        f"rate: target {info.rate:g}/s, achieved {d['rate']['achieved']:g}/s, "
        f"ok {d['rate']['ok']:g}/s; connections opened {d['connections']['opened']}, "
        f"max open {d['connections']['max_open']}, queued requests {req['queued']}",
        "",
        f"{'':<14}" + "".join(f"{k:>10}" for k in (*columns, "max")) + f"{'count':>10}",
        _fmt_row("latency ms", d["latency_ms"], columns),
        _fmt_row("service ms", d["service_time_ms"], columns),
        _fmt_row("lateness ms", d["lateness_ms"], columns),
        # the loop's read after the kernel's receive stamp: in no latency above
        *([_fmt_row("read lag ms", lag, columns)]
          if (lag := d["generator"].get("read_lag_ms")) else []),
        *_llm_rows(d, columns),
        *_packet_rows(d),
        "samples above (latency): " + ", ".join(
            f"{k} {v}" for k, v in d["latency_ms"]["samples_above"].items()),
        _fmt_ci("latency", d["latency_ms"], columns),
        _fmt_ci("service", d["service_time_ms"], columns),
        _fmt_ci("lateness", d["lateness_ms"], columns),
    ]
    conn = d["connections"]
    if "handshake_ms" in conn and conn["handshake_ms"]["count"]:
        lines.insert(3, f"connection setup ms: TCP connect p50 {conn['connect_ms']['p50']:.3f} "
                        f"max {conn['connect_ms']['max']:.3f}, TLS handshake p50 "
                        f"{conn['handshake_ms']['p50']:.3f} max {conn['handshake_ms']['max']:.3f}"
                        f" ({conn['handshake_ms']['count']} connection(s))")
    detail = [f"  {kind}: " + "; ".join(f"{e['reason']} (x{e['count']})" for e in ex)
              for kind, ex in req["error_examples"].items()]
    detail += [f"  connection {kind} (no request in flight): "
               + "; ".join(f"{e['reason']} (x{e['count']})" for e in ex)
               for kind, ex in d["connections"]["error_examples"].items()]
    if req["retried"]:
        detail.append(f"  retried after a stale keep-alive connection: {req['retried']}")
    lines[2:2] = detail
    conf = d.get("confidence")
    if conf is not None:
        lines.append("confidence: " + (
            f"reached after {conf['after_s']:g} s of {info.duration_s:g} s" if conf["reached"]
            else f"NOT reached within {info.duration_s:g} s"
            + (f" (met over the completed requests at {conf['stopped_after_s']:g} s, the "
               f"schedule ended, and the requests then in flight widened it)"
               if "stopped_after_s" in conf else "")) + "; " + ", ".join(
            f"{t['expr']}: " + (f"{t['lo_ms']:.4f}..{t['hi_ms']:.4f} ms "
                                f"({fmt_width(t['width_ms'])} wide)"
                                if t["width_ms"] is not None else "not measurable")
            for t in conf["targets"]))
    # a failed test is a warning (below); a passed or untested one a plain line here
    if d["arrivals"]["verdict"] != "deviate":
        lines.append(d["arrivals"]["statement"])
    off = d.get("offered") or {}
    if off.get("ramp") and off["t_s"]:
        lines.append(_ramp_line(off))
    if d["stationarity"]["verdict"] != "drifted":
        lines.append(d["stationarity"]["statement"])
    if spectrum:
        lines += ["", "  Detailed Percentile spectrum (latency, ms):",
                  percentile_spectrum(result.latency)]
    for w in d["warnings"]:
        lines.append(f"warning: {w}")
    for s in d.get("slo", []):
        verdict = "pass" if s["pass"] else "FAIL"
        obs = s["observed"]
        if obs is None:
            shown = s.get("reason", "no value")
        elif s["unit"] == "fraction":
            shown = f"{obs * 100:.4g}%"
        else:
            shown = f"{obs:.6g} {s['unit']}"
        if obs is not None and s.get("reason"):  # e.g. a percentile that is not measurable
            shown = f"estimate {shown}, {s['reason']}"
        lines.append(f"SLO {s['expr']}: {verdict} (observed {shown})")
    return "\n".join(lines)


def _ramp_line(off: dict[str, Any]) -> str:
    """The ramp in a line: offered and sent at its start, middle and end (JSON: offered)."""
    n = len(off["t_s"])
    picks = sorted({0, n // 2, n - 1})
    cells = [f"{off['t_s'][i]:g} s: {off['target_rps'][i]:,.1f}/s offered, "
             f"{off['sent_rps'][i]:,.1f}/s sent, p99 "
             + ("-" if off["p99_ms"][i] is None else f"{off['p99_ms'][i]:.3f} ms")
             for i in picks]
    r = off["ramp"]
    return (f"ramp {r['from_rps']:g}..{r['to_rps']:g}/s over the measured part ("
            f"{off['interval_s']:g} s intervals): " + "; ".join(cells))


def fleet_text(sections: Sequence[tuple[str, BenchResult]], scenario: bool,
               failed: Sequence[dict[str, str]], lost: int, spectrum: bool = False,
               columns: Sequence[str] | None = None) -> str:
    """A fleet bench's terminal report (:mod:`tailgate.bench.fleet`): each target's report
    with its row per node, then a scenario's one verdict, or the SLOs that failed."""
    parts = []
    for name, r in sections:
        if scenario:
            parts.append(f"== target {name} ==")
        parts.append(summary_text(r, spectrum=spectrum, columns=columns))
        if "nodes" in r.json:
            parts.append(nodes_text(r.json["nodes"]))
        if scenario:
            parts.append("")
    if scenario:
        verdict = "FAIL" if failed or lost else "PASS"
        why = "; ".join(f"{f['target']}: {f['expr']}" for f in failed)
        if lost:
            why = "; ".join(x for x in (why, f"{lost} request(s) lost with their node") if x)
        parts.append(f"mixed peak ({len(sections)} targets): {verdict}"
                     + (f" ({why})" if why else ""))
    elif failed:
        parts.append("SLO failed: " + ", ".join(f["expr"] for f in failed))
    return "\n".join(parts)


def nodes_text(rows: Sequence[dict[str, Any]]) -> str:
    """The per-node table of the terminal report."""
    head = (f"{'node':<16}{'id':<14}{'workers':>8}{'target/s':>11}{'achieved/s':>12}"
            f"{'sent':>9}{'errors':>8}{'lost':>8}{'lat p99 ms':>12}{'late p99 ms':>13}"
            f"{'go ahead ms':>13}")
    lines = ["per node:", head]
    for r in rows:
        q = r["requests"]
        lines.append(f"{r['address']:<16}{r['node_id'][:12]:<14}{r['workers']:>8}"
                     f"{r['rate']['target']:>11.1f}{r['rate']['achieved']:>12.1f}"
                     f"{q['sent']:>9}{q['errors']:>8}{q['lost']:>8}"
                     f"{r['latency_ms']['p99']:>12.3f}{r['lateness_ms']['p99']:>13.3f}"
                     + (f"{r['start_margin_ms']:>13.1f}" if r["start_margin_ms"] is not None
                        else f"{'-':>13}")
                     + (f"  LOST: {r['reason']}" if r["status"] == "lost" else ""))
    return "\n".join(lines)
