"""A target that exited, or an engine that restarted, inside the diagnose window (pure: the
counter polls and the requests' times in, a note out).

The probes watch the threads of the pids diagnose was given. A process that exits takes
them along: a server restarted on the same port (a supervisor, a crash loop) serves the
rest of the run from threads of a new pid the probes never see, so the kernel evidence
after the exit is of no thread that served those requests. "No evidence" there is not "no
cause": their host causes are unknown, and the verdict says so with the time. Two signs,
either enough: the counter poller finding a target pid gone or reused (its start time
changed), and the engine's ``/metrics`` counters going back (a new process counts from
zero: :func:`tailgate.diagnose.counters.resets`). The engine's own per-request records
(llama-server's ``timings``) come with each response, so the requests the new process
served are still joined; those in flight at the exit end as errors in the load's counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .counters import Polls, Reset, resets


@dataclass(frozen=True)
class Restart:
    """Where (ns, CLOCK_MONOTONIC) the target went away: after ``seen_ns`` (the last poll that
    found it, or the last before its counters went back) and by ``gone_ns``."""

    pids: tuple[int, ...]  # the target pids found gone ((): only the counters said it)
    seen_ns: int
    gone_ns: int
    counter_resets: tuple[Reset, ...]
    before: int  # requests that ended before ``seen_ns``: the evidence covers them
    after: int  # requests in flight at the exit or sent after it


def judge(polls: Polls, ends: np.ndarray) -> Restart | None:
    """The first restart the polls show (None: none); ``ends``: each request's end (ns)."""
    rs = resets(polls.rows)
    times = [t for t, _ in polls.rows]
    cand: list[tuple[int, int]] = []
    if polls.exits:
        gone = min(polls.exits.values())
        cand.append((max((t for t in times if t < gone), default=gone), gone))
    if rs:
        cand.append((rs[0].before_ns, rs[0].after_ns))
    if not cand:
        return None
    seen, gone = min(cand)
    pids = tuple(sorted(polls.exits))
    ends = np.asarray(ends, np.int64)
    after = int(np.count_nonzero(ends > seen))
    return Restart(pids, seen, gone, tuple(rs), len(ends) - after, after)


def sentence(r: Restart, t0_ns: int) -> str:
    def ms(t: int) -> str:
        return f"{(t - t0_ns) / 1e9:.2f} s"

    who = (f"the target process {', '.join(map(str, r.pids))} exited between {ms(r.seen_ns)} "
           f"and {ms(r.gone_ns)} into the window" if r.pids else
           f"the engine restarted between {ms(r.seen_ns)} and {ms(r.gone_ns)} into the window")
    if r.counter_resets:
        c = r.counter_resets[0]
        who += (f" (its /metrics counters went back to zero between {ms(c.before_ns)} and "
                f"{ms(c.after_ns)}: a new process served the rest)")
    return (f"{who}: the kernel evidence after it is of no thread of the engine that served "
            f"the {r.after} requests in flight then or sent after, so their host causes are "
            f"unknown (the engine's own records of them still stand); the evidence covers the "
            f"{r.before} before")


def restart_into(doc: dict[str, Any], polls: Polls, ends: np.ndarray) -> None:
    """Mark a restart in a diagnose document: its section (``doc["restart"]``), the
    timeline's marks, each host cause's sentence, and the verdict's ``unknown`` (and, where
    nothing is claimed, its ``unexplained``: never a clean "nothing claimed")."""
    r = judge(polls, ends)
    if r is None:
        return
    tl = doc.get("timeline") or {}
    t0 = int(tl.get("t0_monotonic_ns", 0))
    note = sentence(r, t0)

    def at(t: int) -> float:
        return round((t - t0) / 1e6, 3)

    doc["restart"] = {"pids": list(r.pids), "between_ms": [at(r.seen_ns), at(r.gone_ns)],
                      "counter_resets": [{"between_ms": [at(c.before_ns), at(c.after_ns)],
                                          "series": list(c.series)} for c in r.counter_resets],
                      "requests_before": r.before, "requests_after": r.after, "note": note}
    marks = tl.setdefault("marks", [])
    if r.pids:
        marks.append({"kind": "exit", "start_ms": at(r.seen_ns), "end_ms": at(r.gone_ns),
                      "label": f"target {', '.join(map(str, r.pids))} exited"})
    for c in r.counter_resets:
        marks.append({"kind": "counter_reset", "start_ms": at(c.before_ns),
                      "end_ms": at(c.after_ns), "label": "engine counters reset: "
                      + ", ".join(c.series)})
    # the probes' bins after the exit are not zero but unseen: no thread of theirs was
    # watched (the polled series of the host, its CPUs and the engine's /metrics, stand)
    after = [i for i, x in enumerate(tl.get("t_ms", ())) if t0 + x * 1e6 >= r.seen_ns]
    probed = [*tl.get("evidence_ms", {}).values(),
              *(s["values"] for k, s in (tl.get("series") or {}).items()
                if k.startswith("switches."))]
    for values in probed:
        for i in after:
            values[i] = None
    _unknown_at_restart(tl.get("unknown") or {}, polls, r, t0)
    for c in doc.get("causes", ()):
        if not str(c.get("cause", "")).startswith("engine"):
            c["restart_unknown_requests"] = r.after
            c["sentence"] += (f"; {r.after} requests ran after the target restarted: no "
                              "evidence of theirs was seen (unknown)")
    v = doc.setdefault("verdict", {})
    v["unknown"] = note
    if not v.get("claimed"):
        v["unexplained"] = note


def _unknown_at_restart(unknown: dict[str, str], polls: Polls, r: Restart, t0: int) -> None:
    """A source that failed only from the exit on says so: the engine's /metrics refused
    while the new process started (read before and after: its series stand), the dead pid's
    /proc files gone after it; not as if unknown over the whole window."""
    last = polls.rows[-1][0] if polls.rows else 0
    for source, times in polls.failed.items():
        if source not in unknown or not times or min(times) <= r.seen_ns:
            continue
        span = f"{(min(times) - t0) / 1e9:.2f} s and {(max(times) - t0) / 1e9:.2f} s"
        unknown[source] += (f" (only while the engine restarted: {len(times)} poll"
                            f"{'s' if len(times) > 1 else ''} between "
                            f"{span}; read before and after)" if max(times) < last else
                            f" (from {(min(times) - t0) / 1e9:.2f} s on: after the target "
                            "exited)")
