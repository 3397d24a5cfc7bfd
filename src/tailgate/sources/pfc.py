"""Lossless Ethernet: per-priority pause (PFC) counters, link pause settings and the PFC
configuration, per interface.

* ``ethtool -S``: the drivers' own statistic names (format strings of their
  ``get_strings``):
  mlx5 (en_stats.c ``pport_per_prio_pfc_stats_desc``): ``rx_prio{N}_pause``,
  ``rx_prio{N}_pause_duration`` (microseconds), ``tx_prio{N}_pause``,
  ``tx_prio{N}_pause_duration``, ``rx_prio{N}_pause_transition``; the same with
  ``global`` for link-level pause; ``tx_pause_storm_warning_events`` /
  ``tx_pause_storm_error_events`` (the device-stall watermarks); per-priority traffic
  ``rx_prio{N}_packets`` / ``tx_prio{N}_packets``. mlx5 prints the PFC counters only for
  priorities with PFC enabled (or ``global`` when link pause is on).
  ice (ice_ethtool.c): ``rx_priority_{N}_xon.nic``, ``rx_priority_{N}_xoff.nic``,
  ``tx_priority_{N}_xon.nic``, ``tx_priority_{N}_xoff.nic`` (frames only, no duration);
  i40e: ``port.rx_priority_{N}_xoff`` ... (same).
  bnxt_en (bnxt_ethtool.c): ``rx_pfc_ena_frames_pri{N}``, ``tx_pfc_ena_frames_pri{N}``,
  ``pfc_pri{N}_rx_duration_us``, ``pfc_pri{N}_tx_duration_us``.
* ``ethtool -a``: link-level (802.3x) pause, ``Autonegotiate/RX/TX: on|off``.
* ``dcb pfc show dev IFACE`` (iproute2): ``prio-pfc 0:off 1:off 2:off 3:on ...`` (one
  line with ``pfc-cap``/``delay`` in newer releases, two lines in older ones).
"""

from __future__ import annotations

import re
from typing import Any

from ..collect import Scope, collector
from ..host import Host
from ..model import ParseError, SourceError
from .ethtool import parse_stats

# (regex, direction, kind) per driver family; kind "frames" or "us".
_PAUSE_RES = (
    (re.compile(r"^(rx|tx)_prio(\d)_pause$"), "frames"),
    (re.compile(r"^(rx|tx)_prio(\d)_pause_duration$"), "us"),
    (re.compile(r"^(rx|tx)_priority_(\d)_xoff\.nic$"), "frames"),
    (re.compile(r"^port\.(rx|tx)_priority_(\d)_xoff$"), "frames"),
    (re.compile(r"^(rx|tx)_pfc_ena_frames_pri(\d)$"), "frames"),
)
_BNXT_US = re.compile(r"^pfc_pri(\d)_(rx|tx)_duration_us$")
_GLOBAL = {"rx_global_pause": ("rx", "frames"), "tx_global_pause": ("tx", "frames"),
           "rx_global_pause_duration": ("rx", "us"), "tx_global_pause_duration": ("tx", "us"),
           "rx_pause_ctrl_phy": ("rx", "frames"), "tx_pause_ctrl_phy": ("tx", "frames"),
           "link_xoff_rx.nic": ("rx", "frames"), "link_xoff_tx.nic": ("tx", "frames"),
           "rx_pause_frames": ("rx", "frames"), "tx_pause_frames": ("tx", "frames")}
_TRAFFIC = re.compile(r"^(rx|tx)_prio(\d)_packets$")
_STORM = ("tx_pause_storm_warning_events", "tx_pause_storm_error_events")


def pause_counters(stats: dict[str, int]) -> dict[str, Any]:
    """``ethtool -S`` statistics -> ``{"prio": {"3": {"rx_frames": n, "rx_us": n, ...}},
    "global": {...}, "traffic": {"3": {"rx": packets, "tx": packets}}, "storm": {...}}``;
    only what the driver printed."""
    prio: dict[str, dict[str, int]] = {}
    glob: dict[str, int] = {}
    traffic: dict[str, dict[str, int]] = {}
    for name, value in stats.items():
        for rx, kind in _PAUSE_RES:
            m = rx.match(name)
            if m:
                prio.setdefault(m.group(2), {})[f"{m.group(1)}_{kind}"] = value
                break
        else:
            b = _BNXT_US.match(name)
            if b:
                prio.setdefault(b.group(1), {})[f"{b.group(2)}_us"] = value
            elif name in _GLOBAL:
                d, kind = _GLOBAL[name]
                glob[f"{d}_{kind}"] = glob.get(f"{d}_{kind}", 0) + value
            elif (t := _TRAFFIC.match(name)):
                traffic.setdefault(t.group(2), {})[t.group(1)] = value
    storm = {k: stats[k] for k in _STORM if k in stats}
    return {"prio": prio, "global": glob, "traffic": traffic, "storm": storm}


def parse_pause_settings(text: str) -> dict[str, bool]:
    """``ethtool -a``: ``{"autoneg": bool, "rx": bool, "tx": bool}`` (and the negotiated
    values where ethtool prints them)."""
    out: dict[str, bool] = {}
    names = {"Autonegotiate": "autoneg", "RX": "rx", "TX": "tx", "RX negotiated": "rx_negotiated",
             "TX negotiated": "tx_negotiated"}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or key.strip() not in names:
            continue
        v = value.strip()
        if v not in ("on", "off"):
            raise ParseError(f"ethtool -a: {key.strip()}: not on/off: {v[:20]!r}")
        out[names[key.strip()]] = v == "on"
    if "rx" not in out or "tx" not in out:
        raise ParseError("ethtool -a: no RX/TX pause lines")
    return out


def parse_dcb_pfc(text: str) -> dict[str, Any]:
    """``dcb pfc show dev X`` -> ``{"enabled": [priorities with PFC on], "cap": n | None}``."""
    m = re.search(r"prio-pfc((?:\s+\d:(?:on|off))+)", text)
    if not m:
        raise ParseError("dcb pfc show: no prio-pfc line")
    pairs = re.findall(r"(\d):(on|off)", m.group(1))
    cap = re.search(r"pfc-cap\s+(\d+)", text)
    return {"enabled": sorted(int(p) for p, v in pairs if v == "on"),
            "cap": int(cap.group(1)) if cap else None}


def _one(host: Host, iface: str) -> dict[str, Any]:
    stats = parse_stats(host.run(["ethtool", "-S", iface]))
    out: dict[str, Any] = {**pause_counters(stats), "unreadable": {}}
    try:
        out["link_pause"] = parse_pause_settings(host.run(["ethtool", "-a", iface]))
    except SourceError as exc:
        out["link_pause"], out["unreadable"]["ethtool -a"] = None, host.blame(exc)
    try:
        out["pfc"] = parse_dcb_pfc(host.run(["dcb", "pfc", "show", "dev", iface]))
        out["pfc_source"] = "dcb pfc show"
    except SourceError as exc:
        out["pfc"], out["unreadable"]["dcb pfc show"] = None, host.blame(exc)
        out["pfc_source"] = None
    try:  # an RDMA device on this port's PCI function (RoCE)
        out["rdma"] = host.listdir(f"/sys/class/net/{iface}/device/infiniband")
    except SourceError:
        out["rdma"] = []
    return out


@collector("net.pfc", counter=True, multi=True)
def net_pfc(host: Host, scope: Scope) -> dict[str, object]:
    from .netdev import per_iface

    return per_iface("net.pfc", host, scope, lambda i: _one(host, i))

