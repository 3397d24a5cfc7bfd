"""Cross-node clock skew of a fleet (the +-5 ns red line is between nodes, not per host).

Two readings, each with what bounds it:

* **PTP offsets** (from every node's ``l1.clock.ptp`` finding): each node reports its
  own offset to its master (ptp4l ``master_offset``, phc2sys, or chrony on a PHC). Two
  nodes that follow the same grandmaster differ by at most ``|a| + |b|``; the spread
  ``max - min`` of the signed offsets is what they report, not a measurement between
  them (path asymmetry to the master is invisible to both). Nodes following different
  grandmasters are not comparable.
* **Round trip** (:func:`probe_clocks`, measured by the driver): a task pinned to each
  node reads ``CLOCK_REALTIME``; with the driver's own reads before and after it, the
  node's offset to the driver is ``node - (t0 + t1) / 2 +- rtt / 2``. Its bound is half a
  Ray round trip (hundreds of microseconds): it catches a node whose clock is grossly off,
  it can never vouch for nanoseconds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

CHECK = "l1.clock.ptp"


def now_ns() -> int:
    """Runs on a node: its CLOCK_REALTIME (what phc2sys disciplines) in ns."""
    return time.time_ns()


def probe_clocks(ray: Any, nodes: Sequence[Any], samples: int = 5,
                 timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
    """Per node id: the round-trip sample with the smallest RTT, ``{"offset_ns", "rtt_ns",
    "samples"}``, or ``{"error": why}``."""
    from ray.exceptions import GetTimeoutError, RayError

    from .cluster import pinned

    task = ray.remote(now_ns)
    out: dict[str, dict[str, Any]] = {}
    for node in nodes:
        best: tuple[int, int] | None = None
        try:
            for _ in range(samples):
                t0 = time.time_ns()
                there = ray.get(task.options(max_retries=0, **pinned(ray, node)).remote(),
                                timeout=timeout_s)
                t1 = time.time_ns()
                rtt = t1 - t0
                if best is None or rtt < best[1]:
                    best = (int(there) - (t0 + t1) // 2, rtt)
        except (GetTimeoutError, RayError) as exc:
            out[node.id] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
            continue
        assert best is not None
        out[node.id] = {"offset_ns": best[0], "rtt_ns": best[1], "samples": samples}
    return out


def _ptp_row(report: Any) -> dict[str, Any]:
    f = next((f for f in report.findings if f.id == CHECK), None)
    if f is None:
        return {"ptp_status": "unknown", "offset_to_master_ns": None, "grandmaster": None,
                "reason": f"no {CHECK} finding"}
    ev = f.evidence or {}
    gms = sorted({s.get("gm") for s in (ev.get("ptp4l") or {}).get("time_status", [])
                  if s.get("gm")})
    if not gms and ev.get("chrony"):
        gms = [f"chrony:{ev['chrony'].get('ref_name') or ev['chrony'].get('ref_id')}"]
    offset = f.observed if isinstance(f.observed, (int, float)) and f.status in (
        "pass", "fail") and ev.get("offsets_ns") else None
    return {"ptp_status": f.status, "offset_to_master_ns": offset,
            "grandmaster": gms[0] if len(gms) == 1 else (gms or None), "reason": f.reason}


def clock_skew(hosts: Sequence[Any], probes: dict[str, dict[str, Any]] | None = None,
               limit_ns: float = 5.0) -> dict[str, Any]:
    """The fleet's clock-skew section (pure): one row per host, the spread and bound of
    the PTP offsets, the round-trip check, and a status."""
    probes = probes or {}
    rows = []
    for h in hosts:
        row: dict[str, Any] = {"address": h.node.address}
        if h.report is None:
            row.update(ptp_status="unknown", offset_to_master_ns=None, grandmaster=None,
                       reason=h.reason)
        else:
            row.update(_ptp_row(h.report))
        p = probes.get(h.node.id)
        if p is not None:
            row["round_trip"] = p
        rows.append(row)
    measured = [r for r in rows if r["offset_to_master_ns"] is not None]
    gms = {str(r["grandmaster"]) for r in measured}
    ptp: dict[str, Any] = {"nodes_with_offset": len(measured)}
    if len(measured) >= 2 and len(gms) == 1 and None not in {r["grandmaster"] for r in measured}:
        offs = [float(r["offset_to_master_ns"]) for r in measured]
        two = sorted((abs(o) for o in offs), reverse=True)[:2]
        ptp.update(spread_ns=max(offs) - min(offs), bound_ns=sum(two),
                   grandmaster=measured[0]["grandmaster"])
        ptp["status"] = "pass" if ptp["bound_ns"] <= limit_ns else "fail"
        ptp["reason"] = (f"offsets to grandmaster {ptp['grandmaster']} spread "
                         f"{ptp['spread_ns']:g} ns; any two nodes differ by at most "
                         f"{ptp['bound_ns']:g} ns (|a| + |b|: each offset is to the master, "
                         f"not between nodes) against +-{limit_ns:g} ns")
    elif len(measured) >= 2:
        ptp.update(status="unknown", reason="the nodes follow different grandmasters ("
                   + ", ".join(sorted(gms)) + "): their offsets are not comparable")
    else:
        why = "; ".join(f"{r['address']}: {r['reason']}" for r in rows
                        if r["offset_to_master_ns"] is None)
        ptp.update(status="unknown", reason=f"{len(measured)} of {len(rows)} node(s) report an "
                   f"offset to a PTP master, 2 are needed ({why})")
    rt = [(r["address"], r["round_trip"]) for r in rows
          if "offset_ns" in r.get("round_trip", {})]
    round_trip: dict[str, Any] = {"nodes": len(rt)}
    if rt:
        worst = max(rt, key=lambda a: abs(a[1]["offset_ns"]) - a[1]["rtt_ns"] / 2)
        proven = abs(worst[1]["offset_ns"]) - worst[1]["rtt_ns"] / 2
        bound = max(p["rtt_ns"] / 2 for _, p in rt)
        round_trip.update(bound_ns=bound, status="fail" if proven > limit_ns else "pass",
                          reason=(f"{worst[0]}'s clock differs from the driver's by at least "
                                  f"{proven:,.0f} ns" if proven > limit_ns else
                                  f"every node's clock is within half a round trip "
                                  f"(<= {bound:,.0f} ns) of the driver's: consistent, but this "
                                  f"cannot resolve +-{limit_ns:g} ns"))
    statuses = {ptp["status"], round_trip.get("status", "unknown")}
    status = "fail" if "fail" in statuses else ptp["status"]
    return {"limit_ns": limit_ns, "status": status, "ptp": ptp, "round_trip": round_trip,
            "hosts": rows}
