"""The diagnose summary on the terminal: the claimed causes in full (sentence and remedy),
the unclaimed ones as one table (``all_causes``: each with its sentence, as the JSON has it)."""

from __future__ import annotations

from typing import Any


def terminal(doc: dict[str, Any], console, all_causes: bool = False) -> None:
    v = doc["verdict"]
    tail = doc.get("tail") or {}
    o = doc["overhead"]
    console.print(f"diagnose ({doc['mode']}): {o['window_s']:g} s window, pids "
                  f"{', '.join(map(str, doc['pids']))}; probe attached in {o['startup_s']:g} s, "
                  f"bpftrace used {o['probe_cpu_s']:g} s CPU "
                  f"({o.get('probe_window_cpu_s', 0):g} s of it in the window) over "
                  f"{o['context_switches']} "
                  "context switches; the counter polls used "
                  f"{o.get('poll_cpu_s', 0):g} s CPU; the service {o.get('service_cpu_s', 0):g} s",
                  highlight=False)
    if tail.get("requests"):
        console.print(f"requests: {tail['requests']}, P99 {tail['p99_ms']:.3f} ms "
                      f"({tail['tail_p99']} above), P999 {tail['p999_ms']:.3f} ms "
                      f"({tail['tail_p999']} above)", highlight=False)
    if tail.get("note"):
        console.print(tail["note"], highlight=False, markup=False)
    sw = (doc.get("evidence") or {}).get("switches")
    if sw:
        console.print(f"context switches of the service's threads: {sw['voluntary']} voluntary, "
                      f"{sw['involuntary']} involuntary (preempted)", highlight=False)
    tl = doc.get("timeline") or {}
    if tl.get("series") is not None:
        console.print(f"timeline: {len(tl['t_ms'])} bins of {tl['bin_ms']:g} ms, "
                      f"{len(tl['series'])} counter series", highlight=False)
    for source, why in (tl.get("unknown") or {}).items():
        console.print(f"UNKNOWN {source}: {why}", highlight=False, markup=False)
    unclaimed = []
    for c in doc["causes"]:
        if not (c["claimed"] or all_causes):
            unclaimed.append(c)
            continue
        mark = "CAUSE " if c["claimed"] else "      "
        console.print(f"{mark}{c['layer']}  {c['cause']:<10} {c['sentence']}", highlight=False,
                      markup=False)
        if c["claimed"]:
            console.print(f"              remedy: {c['remedy']}", highlight=False, markup=False)
    unclaimed_table(unclaimed, doc.get("evidence") or {}, console)
    if v["first"]:
        console.print(f"verdict: {v['first']} ({v['layer']}) explains the tail first"
                      + (f"; also: {', '.join(v['claimed'][1:])}" if len(v["claimed"]) > 1
                         else ""), highlight=False)
    else:
        console.print(f"verdict: nothing claimed - {v['unexplained']}", highlight=False,
                      markup=False)
    if v.get("unknown") and v["first"]:  # (else it is the unexplained above)
        console.print(f"UNKNOWN {v['unknown']}", highlight=False, markup=False)
    chain = v.get("chain")
    if chain:
        console.print(f"chain: {chain['sentence']}", highlight=False, markup=False)
        console.print(f"       remedy (its last link): {chain['remedy']}", highlight=False,
                      markup=False)
    engine(doc.get("engine"), console)
    accounting(doc.get("accounting"), console)
    profile(doc.get("profile"), console)


def unclaimed_table(causes: list[dict[str, Any]], evidence: dict[str, Any], console) -> None:
    """The causes not claimed, one row each: the share of the slow requests and of all
    requests in flight while it happened, the share of the slow requests' latency it lasted,
    its events and time (--all: their sentences)."""
    if not causes:
        return

    def pct(v: Any) -> str:
        return "-" if v is None else f"{100 * v:.1f}"

    w = max(11, *(len(c["cause"]) + 1 for c in causes))  # (the engine's causes: 28)
    console.print("not claimed (--all prints each one's sentence):", highlight=False)
    console.print(f"  {'layer':<6}{'cause':<{w}}{'tail':<5}{'in tail %':>10}{'in all %':>9}"
                  f"{'lasted %':>9}{'events':>8}{'total ms':>10}", highlight=False)
    for c in causes:
        total = c.get("total_ms", (evidence.get(c["cause"]) or {}).get("total_ms"))
        console.print(f"  {c['layer']:<6}{c['cause']:<{w}}{c.get('tail') or '-':<5}"
                      f"{pct(c.get('tail_p99_cover')):>10}{pct(c.get('all_cover')):>9}"
                      f"{pct(c.get('tail_time_share')):>9}"
                      f"{c.get('events', '-'):>8}{'-' if total is None else f'{total:.1f}':>10}",
                      highlight=False, markup=False)


def engine(eng: dict[str, Any] | None, console) -> None:
    """The engine's own phases of the slowest requests (diagnose.engine)."""
    if not eng:
        return
    if "unknown" in eng:
        console.print(f"UNKNOWN engine phases: {eng['unknown']}", highlight=False, markup=False)
        return
    rec, join = eng["records"], eng["join"]
    err = join.get("error_bound_ms")
    console.print(f"engine ({eng['engine']}): {rec['ok']} of {eng['requests']} requests with "
                  f"its record ({rec['malformed']} malformed), {join['placed']} placed on "
                  f"tailgate's clock, {join['refused']} refused"
                  + (f"; join error bound P50 {err['p50']:.3f} ms, P99 {err['p99']:.3f} ms"
                     if err else ""), highlight=False)
    for why in join.get("refused_examples", ()):
        console.print(f"  {why}", highlight=False, markup=False)
    line = join_bound_line(join)
    if line:
        console.print(f"  {line}", highlight=False, markup=False)
    otlp = eng.get("otlp")
    if otlp:
        j, got = otlp["join"], otlp["received"]
        console.print(f"spans at {otlp.get('endpoint', '?')}: {j['matched']} joined, "
                      f"{j['missing']} requests without one, {j['unknown_ids']} of ids this "
                      f"run never sent (ignored), {j['malformed']} malformed, "
                      f"{got['refused_bodies']} bodies refused, {got['dropped']} dropped"
                      + (f", {got['without_queue_span']} SGLang spans without their "
                         "prefill_waiting span (not used)" if got.get("without_queue_span")
                         else ""),
                      highlight=False, markup=False)
    t = eng.get("ttft")
    if not t:
        return
    share = ", ".join(f"{k} {100 * v:.0f} %" for k, v in t["share"].items())
    console.print(f"TTFT above the {t['tail']} ({t['cut_ms']:.2f} ms, {t['slow']} requests): "
                  f"{share}", highlight=False)
    console.print(f"  {'request':>8}{'TTFT ms':>10}{'late':>8}{'queue':>9}{'held':>8}"
                  f"{'prefill':>9}{'decode':>9}{'computed':>9}{'cached':>8}{'out':>6}",
                  highlight=False)
    for row in eng.get("slowest", [])[:10]:
        console.print(f"  {row['request']:>8}{row['ttft_ms']:>10.2f}{row['late_ms']:>8.2f}"
                      f"{row['queue_ms']:>9.2f}{row.get('held_ms', 0.0):>8.2f}"
                      f"{row['prefill_ms']:>9.2f}{row['decode_ms']:>9.2f}"
                      f"{_n(row['prompt_computed']):>9}{_n(row['prompt_cached']):>8}"
                      f"{_n(row['generated']):>6}", highlight=False)


def join_bound_line(join: dict[str, Any]) -> str:
    """How late the engine's placed records may be on tailgate's clock (diagnose.engine's
    per-request bound), and how many were bounded by every token ("" without placements)."""
    b = join.get("bound_ms")
    if not b:
        return ""
    pt = join.get("per_token") or {}
    line = (f"join bound (how late the engine's prefill end may be placed) P50 {b['p50']:.3f} "
            f"ms, P99 {b['p99']:.3f} ms, max {b['max']:.3f} ms")
    if pt.get("requests"):
        fl, t = pt["bound_ms_first_last"], pt["bound_ms"]
        line += (f"; {pt['requests']} requests bounded by every token (P50 {t['p50']:.3f} ms, "
                 f"P99 {t['p99']:.3f} ms; by their first and last token alone P50 "
                 f"{fl['p50']:.3f} ms, P99 {fl['p99']:.3f} ms)")
    elif pt.get("unknown"):
        line += f"; per-token: unknown ({pt['unknown']})"
    if pt.get("malformed") and pt.get("requests"):
        line += f"; {pt['malformed']} with malformed per-token timings"
    return line


def _n(v: int | None) -> str:
    return "-" if v is None else str(v)


def accounting(acc: dict[str, Any] | None, console) -> None:
    """The slow requests' time by part, ranked by its share of their latency."""
    if not acc or not acc.get("sets"):
        return
    tail, every = acc["sets"]["p99"], acc["sets"]["all"]
    console.print(f"time of the {tail['requests']} requests above the P99 ({acc['p99_ms']:.3f} ms)"
                  f", by part ({tail['exact']} on one thread: exact, {tail['apportioned']} "
                  f"apportioned over several, {tail['unserved']} served by none):",
                  highlight=False)
    labels = acc.get("labels") or {}  # (engine_wait: "waits on the engine (futex)")
    ranked = [p for p in sorted(acc["parts"], key=lambda p: -(tail["parts"][p]["share"] or 0))
              if tail["parts"][p]["share"] or every["parts"][p]["share"]]
    w = max([14, *(len(labels.get(p, p)) + 1 for p in ranked)])
    console.print(f"  {'part':<{w}}{'median ms':>10}{'P90 ms':>9}{'max ms':>9}{'tail %':>8}"
                  f"{'all %':>7}", highlight=False)
    for p in ranked:
        t, a = tail["parts"][p], every["parts"][p]
        mark = " <- grows most" if p == acc.get("grows_most") else ""
        console.print(f"  {labels.get(p, p):<{w}}{t['median_ms']:>10.3f}{t['p90_ms']:>9.3f}"
                      f"{t['max_ms']:>9.3f}"
                      f"{100 * t['share']:>8.1f}{100 * a['share']:>7.1f}{mark}", highlight=False)
    console.print(f"accounting: {acc['sentence']}", highlight=False, markup=False)


def profile(prof: dict[str, Any] | None, console) -> None:
    """What is over-represented in the service's time while the slowest requests were in
    flight, ranked (diagnose.profile)."""
    if not prof:
        return
    if "unknown" in prof:
        console.print(f"UNKNOWN profile: {prof['unknown']}", highlight=False, markup=False)
        return
    sp, t, r = prof["split"], prof["tail"], prof["rest"]
    console.print(f"profile: {prof['hz']} on-CPU samples/s, off-CPU waits of 200 us or more; "
                  f"{sp['slow_requests']} requests above the P99 ({prof['p99_ms']:.3f} ms) "
                  f"followed {sp['how']} ({sp['per_thread']} on one thread, "
                  f"{sp['service_wide']} over the service's busy threads, {sp['unserved']} on "
                  f"none);\n  serving time: tail {t['serving_ms']:.1f} ms ({t['profiled_ms']:.1f} "
                  f"profiled), rest {r['serving_ms']:.1f} ms ({r['profiled_ms']:.1f} profiled)",
                  highlight=False, markup=False)
    if prof["ranked"]:
        console.print(f"  {'tail %':>7}{'rest %':>7}  {'tail ms':>8}  over-represented in the "
                      "tail", highlight=False)
    for row in prof["ranked"][:10]:
        what = (f"on CPU in {row['from']}" if row["state"] == "on CPU" else
                f"off CPU in {row['syscall']}" + (f" ({row['site']})" if row["site"] else "")
                + f" from {row['from']}")
        console.print(f"  {100 * row['tail_share']:>7.1f}{100 * row['rest_share']:>7.1f}  "
                      f"{row['tail_ms']:>8.2f}  {what}", highlight=False, markup=False)
    if prof.get("named_by_tailgate"):
        console.print(f"  {prof['named_by_tailgate']} user frames bpftrace left as addresses "
                      "(their threads had exited) named by tailgate from the ELF symbols",
                      highlight=False)
    d = prof["dropped"]
    if d["samples"] or d["waits"]:
        console.print(f"  the probe's maps were full: {d['samples']} samples and {d['waits']} "
                      "waits were not kept", highlight=False, markup=False)
    for note in prof["notes"]:
        console.print(f"  note: {note}", highlight=False, markup=False)
    console.print(f"profile: {prof['sentence']}", highlight=False, markup=False)
