"""eBPF probe facts for ``inspect --probe-window SECONDS``.

One collector runs every relevant probe at once over the same window (it
blocks for it): ``probe.runqlat``, ``probe.sockopt``, ``probe.mmsg`` and
``probe.softirq`` host-wide or for the target's processes, and
``probe.malloc`` for ``--pid`` only. Without a window, or where probes cannot
run (not root, no bpftrace, no tracefs, a host root), every fact is missing
with that reason, so the checks report ``unknown`` and say why.
"""

from __future__ import annotations

from typing import Any

from ..collect import Scope, collector
from ..host import Host
from ..model import Fact, SourceError
from .cgroup import cgroup_members

FACTS = ("runqlat", "sockopt", "mmsg", "malloc", "softirq")


def plan(scope: Scope, cgroup_pids: frozenset[int] | None = None) -> dict[str, Any]:
    """Which request (or the reason there is none) per probe: pure, for tests."""
    from ..probes import MAX_PIDS, Request

    window = float(scope.options["probe_window"])
    pids = tuple(scope.pids)
    keep: frozenset[int] | None = None
    if not pids and cgroup_pids is not None:
        if len(cgroup_pids) <= MAX_PIDS:
            pids = tuple(sorted(cgroup_pids))
        keep = cgroup_pids
    elif len(pids) > MAX_PIDS:
        keep, pids = frozenset(pids), ()
    out: dict[str, Any] = {}
    for name in FACTS:
        if name == "malloc":
            if not pids:
                out[name] = ("heap allocations are counted per process: give --pid "
                             f"(at most {MAX_PIDS})")
                continue
            out[name] = Request(name, window, pids)
        elif name == "softirq":
            out[name] = Request(name, window)
        else:
            out[name] = Request(name, window, pids, keep)
    return out


@collector("probe", multi=True, names=lambda t: [f"probe.{n}" for n in FACTS])
def probe_facts(host: Host, scope: Scope) -> dict[str, Fact]:
    window = scope.options.get("probe_window")
    names = [f"probe.{n}" for n in FACTS]
    if not window:
        return {n: Fact(missing="no probe window: run inspect --probe-window SECONDS "
                        "(root, bpftrace)") for n in names}
    from ..probes import driver, measure_many

    reason = driver.unavailable(host)
    if reason:
        return {n: Fact(missing=reason) for n in names}
    cgroup_pids = None
    if scope.cgroup and not scope.pids:
        try:
            cgroup_pids = cgroup_members(host, scope.cgroup)
        except SourceError as exc:
            return {n: Fact(missing=f"cgroup {scope.cgroup}: {exc}") for n in names}
    todo = plan(scope, cgroup_pids)
    requests = {k: v for k, v in todo.items() if not isinstance(v, str)}
    try:  # Ctrl-C (Host.cancel) stops the probes now, not at the end of the window
        results = measure_many(list(requests.values()), cancelled=lambda: host.cancelled)
    except SourceError as exc:
        return {f"probe.{k}": Fact(missing=str(exc)) for k in todo}
    facts = {f"probe.{k}": Fact(missing=v) for k, v in todo.items() if isinstance(v, str)}
    for name, res in zip(requests, results, strict=True):
        facts[f"probe.{name}"] = (Fact(missing=str(res)) if isinstance(res, SourceError)
                                  else Fact(value=res))
    return facts
