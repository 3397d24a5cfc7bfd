"""Layer 1: lossless Ethernet. Pause storms (the share of the window a port spent paused,
per priority) and the PFC configuration against where RDMA runs. Pure functions."""

from __future__ import annotations

from typing import Any

from ..history import NoWindow, growth
from ..judge import Unknown, check, need
from ..model import Result, Snapshot
from ..sources.pfc import NO_PAUSE_DRIVERS, pause_active


def _ifaces(snap: Snapshot) -> list[str]:
    names = need(snap, "net.pfc")
    if not isinstance(names, list):
        raise Unknown("net.pfc: not a list of interfaces")
    return names


def _skip() -> list[Result]:
    return [Result("skip", reason="no network interface backed by a device (use --iface)")]


def _no_counters(snap: Snapshot, iface: str, v: dict[str, Any]) -> Result:
    """No pause counter read: a skip only when it is known that none can move."""
    info = snap.fact(f"ethtool.info.{iface}")
    driver = info.value.get("driver") if info.ok and isinstance(info.value, dict) else None
    lp = v.get("link_pause") or {}
    pfc = v.get("pfc")
    evidence = {"driver": driver, "link_pause": v.get("link_pause"), "pfc": pfc,
                "unreadable": v.get("unreadable")}
    if driver in NO_PAUSE_DRIVERS:
        return Result("skip", subject=iface, evidence=evidence,
                      reason=f"{driver} has no pause counters (a virtual NIC: no MAC to pause)")
    if lp and not pause_active(lp) and pfc is not None and not pfc["enabled"]:
        return Result("skip", subject=iface, evidence=evidence,
                      reason="link pause off (ethtool -a) and PFC on no priority (dcb pfc "
                      "show): nothing can pause this port")
    if lp and not pause_active(lp) and pfc is None and not v.get("rdma"):
        return Result("skip", subject=iface, evidence=evidence,
                      reason="link pause off (ethtool -a) and no RDMA on this port (PFC "
                      "unread: " + str((v.get("unreadable") or {}).get(
                          "dcb pfc show", "dcb absent")) + ")")
    said = f"the {driver} driver" if driver else "the driver (unknown: ethtool -i unread)"
    return Result("unknown", subject=iface, evidence=evidence,
                  reason=f"{said} prints no pause counter tailgate knows in ethtool -S"
                  + (f" (link pause {'in use' if pause_active(lp) else 'off'} per ethtool -a)"
                     if lp else "; ethtool -a unread"))


@check("l1.pfc.pause_storm")
def pause_storm(snap: Snapshot, p: dict) -> list[Result]:
    ifaces = _ifaces(snap)
    if not ifaces:
        return _skip()
    limit = float(p.get("limit", 0.01))
    xoff_limit = float(p.get("xoff_per_s", 1000.0))
    results = []
    for iface in ifaces:
        f = snap.fact(f"net.pfc.{iface}")
        if not f.ok:
            results.append(Result("unknown", subject=iface, reason=f.missing))
            continue
        v = f.value
        if not v["prio"] and not v["global"] and not v["storm"]:
            results.append(_no_counters(snap, iface, v))
            continue
        try:
            g = growth(snap, f"net.pfc.{iface}",
                       lambda val: {"prio": val["prio"], "global": val["global"],
                                    "storm": val["storm"]})
        except NoWindow as exc:
            results.append(Result("unknown", subject=iface, reason=str(exc),
                                  evidence={"since_boot": {k: v[k] for k in
                                                           ("prio", "global", "storm")}}))
            continue
        w = g.window_s
        shares = {k: n / (w * 1e6) for k, n in g.deltas.items() if k.endswith("_us")}
        frames = {k: n for k, n in g.deltas.items() if k.endswith("_frames") and n}
        storm = {k: n for k, n in g.deltas.items() if k.startswith("storm/") and n}
        evidence: dict[str, Any] = {"window_s": round(w, 3), "window": g.describe(),
                                    "share_paused": {k: round(s, 4) for k, s in shares.items()
                                                     if s},
                                    "pause_frames": frames, "storm_events": storm}
        worst_k, worst = max(shares.items(), key=lambda kv: kv[1], default=("", 0.0))
        label = worst_k.replace("prio/", "priority ").replace("/", " ").replace("_us", "")
        rate = max(frames.values(), default=0) / w
        if storm:
            results.append(Result("fail", subject=iface, observed=round(worst, 4),
                                  evidence=evidence,
                                  reason=f"pause storm: the NIC's stall watermark fired "
                                  f"({', '.join(f'{k[6:]} +{n:g}' for k, n in storm.items())})"))
        elif worst > limit:
            results.append(Result("fail", subject=iface, observed=round(worst, 4),
                                  evidence=evidence,
                                  reason=f"{label} paused {worst:.1%} of the {g.describe()} "
                                  f"(red line {limit:.1%})"))
        elif not shares and rate > xoff_limit:
            results.append(Result("fail", subject=iface, observed=round(rate, 1),
                                  evidence=evidence,
                                  reason=f"{rate:.0f} pause (XOFF) frames/s in the "
                                  f"{g.describe()} (this driver counts no pause time)"))
        else:
            what = (f"worst {label} {worst:.2%} of the window" if shares and worst
                    else "no time paused" if shares else
                    f"{rate:.1f} pause frames/s (the driver counts frames, not time)")
            results.append(Result("pass", subject=iface, observed=round(worst, 4),
                                  evidence=evidence, reason=f"{what} in the {g.describe()}"))
    return results


@check("l1.pfc.config")
def pfc_config(snap: Snapshot, p: dict) -> list[Result]:
    ifaces = _ifaces(snap)
    if not ifaces:
        return _skip()
    results = []
    for iface in ifaces:
        f = snap.fact(f"net.pfc.{iface}")
        if not f.ok:
            results.append(Result("unknown", subject=iface, reason=f.missing))
            continue
        v = f.value
        info = snap.fact(f"ethtool.info.{iface}")
        driver = info.value.get("driver") if info.ok and isinstance(info.value, dict) else None
        if v.get("pfc") is None and not info.ok:
            # which driver decides whether its counters tell the PFC configuration (mlx5)
            results.append(Result("unknown", subject=iface, reason="no PFC configuration "
                                  f"readable and the driver unknown: {info.missing}"))
            continue
        enabled, how = None, None
        if v.get("pfc") is not None:
            enabled, how = v["pfc"]["enabled"], "dcb pfc show"
        elif driver == "mlx5_core":
            # en_stats.c prints per-priority PFC counters only for PFC-enabled priorities
            enabled, how = sorted(int(k) for k in v["prio"]), "mlx5 ethtool -S per-priority counters"
        lp = v.get("link_pause") or {}
        rdma = v.get("rdma") or []
        evidence = {"pfc_enabled": enabled, "pfc_source": how, "link_pause": v.get("link_pause"),
                    "rdma_devices": rdma, "traffic": v.get("traffic"),
                    "unreadable": v.get("unreadable")}
        if enabled is None:
            if rdma:
                results.append(Result("unknown", subject=iface, evidence=evidence,
                                      reason="RDMA runs here but the PFC configuration is "
                                      "unreadable: " + "; ".join(
                                          f"{k}: {r}" for k, r in (v.get("unreadable") or {}).items())))
            else:
                results.append(Result("skip", subject=iface, evidence=evidence,
                                      reason="no RDMA device on this port and no PFC "
                                      "configuration readable (dcb pfc show)"))
            continue
        traffic = v.get("traffic") or {}
        busy = {k for k, t in traffic.items() if sum(t.values())}
        idle = [q for q in enabled if traffic and str(q) not in busy]
        if rdma and not enabled:
            if lp.get("rx") or lp.get("tx"):
                results.append(Result("warn", subject=iface, evidence=evidence,
                                      reason=f"RDMA ({', '.join(rdma)}) on link-level pause, "
                                      "not PFC: each pause stops every priority of the port"))
            else:
                results.append(Result("fail", subject=iface, evidence=evidence,
                                      reason=f"RDMA ({', '.join(rdma)}) without PFC or pause: "
                                      "RoCE runs lossy, a drop costs a go-back-N retransmit"))
        elif enabled and not rdma:
            results.append(Result("warn", subject=iface, evidence=evidence,
                                  reason=f"PFC on priority {', '.join(map(str, enabled))} but no "
                                  "RDMA device on this port: no lossless traffic to protect, "
                                  "only pauses to spread"))
        elif idle:
            results.append(Result("warn", subject=iface, evidence=evidence,
                                  reason=f"PFC on priority {', '.join(map(str, idle))}, which "
                                  f"carries no traffic (traffic on {', '.join(sorted(busy))}): "
                                  "the lossless class is on another priority"))
        else:
            results.append(Result("pass", subject=iface, evidence=evidence,
                                  reason=(f"PFC on priority {', '.join(map(str, enabled))} for "
                                          f"RDMA ({', '.join(rdma)})") if enabled else
                                  "no PFC and no RDMA on this port"))
    return results
