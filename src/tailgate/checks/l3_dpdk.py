"""Layer 3 where a DPDK application owns the port: ring overflow, mbuf exhaustion, queue
spread, Tx queues per lcore and packet rate, from two telemetry samples (sources/dpdk.py).

Pure functions of (snapshot, params). Every finding's subject names the process (file
prefix, pid) and the port, so two data planes on one host are told apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..judge import Unknown, check, need
from ..model import Result, Snapshot
from ..sources.dpdk import parse_eal_lcores, testpmd_forwarding_cores

_QUEUE = re.compile(r"^(rx|tx)_q([0-9]+)_packets$")
# Virtual devices whose driver never sets imissed (DPDK 22.11 and 24.11 source): their 0 is
# not a measurement. A PCI port's name is its address, so NIC drivers are not told apart here.
NO_IMISSED = re.compile(r"^net_(tap|null|ring|af_packet|memif|vhost|virtio_user)[0-9]*$")
# Per-queue drop counters some drivers add to xstats (names differ by driver).
_QUEUE_DROP = re.compile(r"^rx_q([0-9]+)_.*(miss|drop|no_?buf|out_of_buffer|discard)", re.I)


@dataclass(frozen=True)
class Port:
    subject: str
    prefix: str
    proc: dict[str, Any]  # the t1 sample of the whole process
    now: dict[str, Any]
    then: dict[str, Any]
    seconds: float

    def delta(self, name: str) -> int | None:
        a, b = self.then["stats"].get(name), self.now["stats"].get(name)
        if not isinstance(a, int) or not isinstance(b, int):
            return None
        if b < a:
            raise Unknown(f"{name} went backwards ({a} -> {b}): counters were reset during "
                          "the interval")
        return b - a

    def xdelta(self, name: str) -> int | None:
        a, b = (self.then.get("xstats") or {}).get(name), (self.now.get("xstats") or {}).get(name)
        if a is None or b is None or b < a:
            return None
        return b - a

    def queues(self, direction: str) -> int | None:
        info = self.now.get("info") or {}
        n = info.get(f"nb_{direction}_queues")
        if isinstance(n, int):
            return n
        found = {int(m.group(2)) for k in (self.now.get("xstats") or {})
                 if (m := _QUEUE.match(k)) and m.group(1) == direction}
        return len(found) if found else None

    def per_queue_rx(self) -> list[int]:
        """Rx packets of each queue over the interval: xstats (every queue) else q_ipackets."""
        n = self.queues("rx")
        if n is None:
            raise Unknown("the number of Rx queues is not reported (no /ethdev/info, no "
                          "rx_qN_packets in xstats)")
        xs = [self.xdelta(f"rx_q{q}_packets") for q in range(n)]
        if all(x is not None for x in xs):
            return [x for x in xs if x is not None]
        q0, q1 = self.then["stats"].get("q_ipackets"), self.now["stats"].get("q_ipackets")
        if isinstance(q0, list) and isinstance(q1, list) and n <= min(len(q0), len(q1)):
            return [q1[q] - q0[q] for q in range(n)]
        raise Unknown(f"per-queue Rx counters are not reported for {n} queues")


def _subject(prefix: str, proc: dict[str, Any], port: str, entry: dict[str, Any]) -> str:
    name = (entry.get("info") or {}).get("name")
    return (f"dpdk {prefix} pid {proc.get('pid')} port {port}"
            + (f" {name}" if name else ""))


def _ports(snap: Snapshot) -> Iterator[Port | Result]:
    """Each port of each DPDK process with both samples, or a Result saying why not."""
    prefixes = need(snap, "dpdk")
    if not prefixes:
        yield Result("skip", reason="no DPDK process with a telemetry socket on this host "
                     "(looked in /var/run/dpdk and $XDG_RUNTIME_DIR/dpdk; --dpdk PREFIX)")
        return
    for prefix in prefixes:
        now, then = snap.fact(f"dpdk.{prefix}"), snap.before_fact(f"dpdk.{prefix}")
        subject = f"dpdk {prefix}"
        if not now.ok:
            yield Result("unknown", subject=subject, reason=now.missing or "")
            continue
        proc = now.value
        subject = f"dpdk {prefix} pid {proc.get('pid')}"
        if not then.ok:
            yield Result("unknown", subject=subject, reason=f"no first sample: {then.missing}")
            continue
        if then.value.get("pid") != proc.get("pid"):
            yield Result("unknown", subject=subject, reason=f"the process changed (pid "
                         f"{then.value.get('pid')} -> {proc.get('pid')}) during the interval")
            continue
        if not proc["ports"]:
            yield Result("skip", subject=subject, reason="the process has no ethdev port")
            continue
        for port, entry in sorted(proc["ports"].items(), key=lambda kv: int(kv[0])):
            psub = _subject(prefix, proc, port, entry)
            before = then.value["ports"].get(port)
            if before is None:
                yield Result("unknown", subject=psub, reason="the port appeared during the interval")
                continue
            t0, t1 = before.get("t"), entry.get("t")
            seconds = (t1 - t0) if isinstance(t0, (int, float)) and isinstance(t1, (int, float)) \
                else snap.interval_s
            if seconds <= 0:
                yield Result("unknown", subject=psub, reason="the two samples are not apart in time "
                             "(inspect with --interval > 0)")
                continue
            yield Port(psub, prefix, proc, entry, before, seconds)


def _each(snap: Snapshot, judge_port: Callable[[Port], Result]) -> list[Result]:
    results: list[Result] = []
    for item in _ports(snap):
        if isinstance(item, Result):
            results.append(item)
            continue
        try:
            results.append(judge_port(item))
        except Unknown as exc:
            results.append(Result("unknown", subject=item.subject, reason=str(exc)))
    return results


def _rx_breakdown(port: Port) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        out["rx_packets_per_queue"] = port.per_queue_rx()
    except Unknown:
        pass
    drops = {k: d for k in (port.now.get("xstats") or {})
             if _QUEUE_DROP.match(k) and (d := port.xdelta(k))}
    if drops:
        out["queue_drops"] = drops
    return out


@check("l3.dpdk.rx_overflow")
def rx_overflow(snap: Snapshot, p: dict) -> list[Result]:
    def judge_port(port: Port) -> Result:
        name = (port.now.get("info") or {}).get("name", "")
        if NO_IMISSED.match(name):
            raise Unknown(f"the {name.rstrip('0123456789')} driver does not count packets dropped "
                          "on a full Rx ring (imissed stays 0 whatever happens)")
        missed = port.delta("imissed")
        if missed is None:
            missed = port.xdelta("rx_missed_errors")
        if missed is None:
            raise Unknown("neither imissed nor rx_missed_errors is reported")
        ev = {"imissed": missed, "seconds": round(port.seconds, 6),
              "rx_packets": port.delta("ipackets"), **_rx_breakdown(port)}
        rings = _ring_fill(port.proc)
        if rings:
            ev["software_rings_in_use"] = rings
        if missed > p["limit"]:
            return Result("fail", subject=port.subject, observed=missed, evidence=ev,
                          reason=f"{missed} packets dropped on full Rx rings in "
                          f"{port.seconds:.2f} s ({missed / port.seconds:,.0f}/s)")
        return Result("pass", subject=port.subject, observed=missed, evidence=ev,
                      reason=f"no Rx ring overflow in {port.seconds:.2f} s")
    return _each(snap, judge_port)


def _ring_fill(proc: dict[str, Any]) -> dict[str, float]:
    """How full the application's own rings are (/ring/info, 24.x), mempools' rings left out
    (their entries are free mbufs, not queued work)."""
    out = {}
    for name, info in (proc.get("rings") or {}).items():
        if name.startswith("MP_") or not info.get("capacity") or "used_count" not in info:
            continue
        out[name] = round(info["used_count"] / info["capacity"], 4)
    return out


def _pool_fill(proc: dict[str, Any]) -> dict[str, Any]:
    pools = proc.get("mempools")
    if pools is None:
        return {}
    fill = {}
    for name, info in pools.items():
        if "free" in info and info["size"]:
            fill[name] = round(1 - info["free"] / info["size"], 4)
    return fill


@check("l3.dpdk.mbuf_exhaustion")
def mbuf_exhaustion(snap: Snapshot, p: dict) -> list[Result]:
    def judge_port(port: Port) -> Result:
        nombuf = port.delta("rx_nombuf")
        if nombuf is None:
            nombuf = port.xdelta("rx_mbuf_allocation_errors")
        if nombuf is None:
            raise Unknown("neither rx_nombuf nor rx_mbuf_allocation_errors is reported")
        pools = port.proc.get("mempools") or {}
        fill = _pool_fill(port.proc)
        ev: dict[str, Any] = {"rx_nombuf": nombuf, "seconds": round(port.seconds, 6),
                              "mempools": {k: {"size": v["size"], **({"in_use": fill[k]}
                                                                       if k in fill else {})}
                                           for k, v in pools.items()}}
        if pools and not fill:
            ev["fill_level"] = "not reported by this DPDK release (23.03 and later report it)"
        if nombuf > p["limit"]:
            return Result("fail", subject=port.subject, observed=nombuf, evidence=ev,
                          reason=f"{nombuf} Rx mbuf allocation failures in {port.seconds:.2f} s: "
                          "the pool is too small for the rings and packets in flight")
        full = {k: v for k, v in fill.items() if v >= p["fill_warn"]}
        if full:
            worst = max(full, key=lambda k: full[k])
            return Result("warn", subject=port.subject, observed=nombuf, evidence=ev,
                          reason=f"mempool {worst} is {full[worst]:.0%} in use (warn at "
                          f"{p['fill_warn']:.0%}): little headroom before allocations fail")
        return Result("pass", subject=port.subject, observed=nombuf, evidence=ev,
                      reason=f"no mbuf allocation failure in {port.seconds:.2f} s")
    return _each(snap, judge_port)


@check("l3.dpdk.queue_spread")
def queue_spread(snap: Snapshot, p: dict) -> list[Result]:
    def judge_port(port: Port) -> Result:
        n = port.queues("rx")
        if n is not None and n <= 1:
            return Result("skip", subject=port.subject, evidence={"rx_queues": n},
                          reason="one Rx queue: nothing to spread")
        per_q = port.per_queue_rx()
        total = sum(per_q)
        ev: dict[str, Any] = {"rx_packets_per_queue": per_q, "seconds": round(port.seconds, 6)}
        if total < p["min_packets"]:
            return Result("skip", subject=port.subject, evidence=ev,
                          reason=f"idle: {total} packets in {port.seconds:.2f} s (fewer than "
                          f"{p['min_packets']} to judge the spread)")
        fair = total / len(per_q)
        ratio = round(max(per_q) / fair, 3)
        busiest = per_q.index(max(per_q))
        ev.update({"share_per_queue": [round(x / total, 4) for x in per_q], "busiest_queue": busiest})
        if ratio > p["limit"]:
            return Result("fail", subject=port.subject, observed=ratio, evidence=ev,
                          reason=f"Rx queue {busiest} carries {max(per_q) / total:.0%} of the "
                          f"packets, {ratio:.2f} x its fair share of {len(per_q)} queues: "
                          "the hash does not spread these flows")
        return Result("pass", subject=port.subject, observed=ratio, evidence=ev,
                      reason=f"busiest of {len(per_q)} Rx queues at {ratio:.2f} x its fair share")
    return _each(snap, judge_port)


def forwarding_lcores(proc: dict[str, Any]) -> tuple[int, str]:
    """How many lcores forward, and from what it was read."""
    params = proc.get("eal_params") or []
    try:
        eal = parse_eal_lcores(params) if params else {}
        nb = testpmd_forwarding_cores(proc.get("app_params") or [])
    except ValueError as exc:
        raise Unknown(f"cannot read the lcores from /eal/params {params}: {exc}") from exc
    lcores = proc.get("lcores")
    if lcores:
        rte = sorted(int(k) for k, v in lcores.items() if v.get("role") == "RTE")
        main = eal.get("main", rte[0] if rte else None)
        workers = [lc for lc in rte if lc != main]
        source = f"/eal/lcore: RTE lcores {rte}, main {main}"
    elif "lcores" in eal:
        workers = [lc for lc in eal["lcores"] if lc != eal["main"]]
        source = f"/eal/params: lcores {eal['lcores']}, main {eal['main']}"
    else:
        raise Unknown("the lcores are not reported (no /eal/lcore/list, and /eal/params has "
                      "no -l, -c or --lcores: EAL then uses every CPU)")
    count = max(1, len(workers))  # a main-only application forwards on the main lcore
    if nb is not None and nb < count:
        count = nb
        source += f"; testpmd --nb-cores={nb}"
    return count, source


@check("l3.dpdk.tx_queue_per_lcore")
def tx_queue_per_lcore(snap: Snapshot, p: dict) -> list[Result]:
    def judge_port(port: Port) -> Result:
        txq = port.queues("tx")
        if txq is None:
            raise Unknown("the number of Tx queues is not reported")
        lcores, source = forwarding_lcores(port.proc)
        ev = {"tx_queues": txq, "forwarding_lcores": lcores, "lcores_from": source}
        if txq < lcores:
            return Result("fail", subject=port.subject, observed=txq, evidence=ev,
                          reason=f"{lcores} forwarding lcores share {txq} Tx queue(s): every "
                          "burst takes a lock or MT-safe path")
        return Result("pass", subject=port.subject, observed=txq, evidence=ev,
                      reason=f"{txq} Tx queue(s) for {lcores} forwarding lcore(s)")
    return _each(snap, judge_port)


@check("l3.dpdk.packet_rate")
def packet_rate(snap: Snapshot, p: dict) -> list[Result]:
    def judge_port(port: Port) -> Result:
        rx, tx = port.delta("ipackets"), port.delta("opackets")
        if rx is None or tx is None:
            raise Unknown("ipackets/opackets are not reported")
        rxb, txb = port.delta("ibytes"), port.delta("obytes")
        s = port.seconds
        ev: dict[str, Any] = {"rx_mpps": round(rx / s / 1e6, 6), "tx_mpps": round(tx / s / 1e6, 6),
                              "rx_packets": rx, "tx_packets": tx, "seconds": round(s, 6)}
        if rxb is not None and txb is not None:
            ev.update({"rx_gbps": round(rxb * 8 / s / 1e9, 6), "tx_gbps": round(txb * 8 / s / 1e9, 6)})
        return Result("pass", subject=port.subject, observed=round(rx / s / 1e6, 3), evidence=ev,
                      reason=f"{rx / s / 1e6:.3f} Mpps in, {tx / s / 1e6:.3f} Mpps out over "
                      f"{s:.2f} s")
    return _each(snap, judge_port)
