"""Layer 1: physical interconnect and hardware clocks. Pure functions of (snapshot, params).

Counters (FEC blocks, AER errors, replays) are judged on their growth over a
window: since the last stored run of this host (the history store), else over
this run's --interval. The window's length is in every finding's evidence.
"""

from __future__ import annotations

from typing import Any

from ..history import Growth, NoWindow, growth
from ..judge import Unknown, check, need
from ..model import Result, Snapshot
from ..sources.ethtool import DRIVER_FEC, LOS_DBM

ESCALATED_FEC_REMEDY = (
    "More than {limit:g} uncorrectable blocks per hour: a dirty fiber end face or an "
    "aging laser. Isolate the port (drain it), clean both end faces, and replace the "
    "optic or the fiber if the count keeps growing.")


def _ifaces(snap: Snapshot, index: str) -> list[str]:
    names = need(snap, index)
    if not isinstance(names, list):
        raise Unknown(f"{index}: not a list of interfaces")
    return names


def _no_ifaces() -> list[Result]:
    return [Result("skip", reason="no network interface backed by a device (use --iface)")]


def _driver(snap: Snapshot, iface: str) -> str | None:
    info = snap.fact(f"ethtool.info.{iface}")
    return info.value.get("driver") if info.ok and isinstance(info.value, dict) else None


def _window_evidence(g: Growth) -> dict[str, Any]:
    return {"window_s": round(g.window_s, 3), "window": g.describe(), "window_source": g.source}


# -- FEC -----------------------------------------------------------------------------------------

def _fec_source(snap: Snapshot, iface: str) -> tuple[str, str, Any, str] | Result:
    """(fact name, description, pick, fallback note) for this port's uncorrectable count, or a
    final Result. The note says why the standard statistics were not used ("" when they were)."""
    fec = snap.fact(f"ethtool.fec.{iface}")
    driver = _driver(snap, iface)
    if fec.ok and fec.value.get("supported") and "uncorrectable_blocks" in fec.value.get("stats", {}):
        return (f"ethtool.fec.{iface}", "ethtool -I --show-fec uncorrectable_blocks",
                lambda v: v["stats"]["uncorrectable_blocks"]["total"], "")
    names = DRIVER_FEC.get(driver or "")
    phy = snap.fact(f"ethtool.phy.{iface}")
    if names and phy.ok and names["uncorrectable"] in phy.value:
        counter = names["uncorrectable"]
        if not fec.ok:
            why = f"standard FEC statistics unreadable ({fec.missing})"
        elif not fec.value.get("supported"):
            why = f"`ethtool --show-fec` reports no FEC ({fec.value.get('reason')})"
        else:
            why = ("`ethtool -I --show-fec` printed no uncorrectable_blocks (a driver or "
                   "kernel without FEC statistics, or ethtool < 5.13)")
        return (f"ethtool.phy.{iface}", f"ethtool -S {counter} ({driver})", lambda v: v[counter],
                f"{why}; used the driver counter {counter} of `ethtool -S` instead")
    if not fec.ok:
        return Result("unknown", subject=iface, reason=fec.missing)
    if not fec.value.get("supported"):
        return Result("skip", subject=iface,
                      reason=f"no FEC on this port ({driver or 'driver unknown'}: "
                      f"{fec.value.get('reason')})")
    active = str(fec.value.get("active") or "")
    if active.lower() in ("off", "none"):
        return Result("skip", subject=iface, evidence={"active_fec": active},
                      reason=f"FEC is off on this link (Active FEC encoding: {active})")
    return Result("unknown", subject=iface, evidence={"active_fec": active or None},
                  reason=f"the driver ({driver or 'unknown'}) reports no uncorrectable-block "
                  f"counter (generic FEC statistics absent; driver counters known for "
                  f"{', '.join(sorted(DRIVER_FEC))})")


@check("l1.fec.uncorrectable")
def fec_uncorrectable(snap: Snapshot, p: dict) -> list[Result]:
    ifaces = _ifaces(snap, "ethtool.fec")
    if not ifaces:
        return _no_ifaces()
    limit, escalate = float(p.get("limit", 0.0)), float(p.get("escalate_above", 10.0))
    results = []
    for iface in ifaces:
        src = _fec_source(snap, iface)
        if isinstance(src, Result):
            results.append(src)
            continue
        name, what, pick, note = src
        evidence: dict[str, Any] = {"source": what, "total": pick(snap.facts[name].value)}
        if note:
            evidence["fallback"] = note
        said = f" [{note}]" if note else ""
        fec = snap.fact(f"ethtool.fec.{iface}")
        if fec.ok and fec.value.get("stats"):
            evidence["fec_stats"] = fec.value["stats"]
            evidence["active_fec"] = fec.value.get("active")
        if fec.ok and fec.value.get("histogram"):
            # ethtool >= 6.19: symbol errors per FEC codeword, how close the link is to the edge
            evidence["fec_histogram"] = fec.value["histogram"]
        try:
            g = growth(snap, name, pick)
        except NoWindow as exc:
            results.append(Result("unknown", subject=iface, reason=str(exc) + said,
                                  evidence=evidence))
            continue
        grown = sum(g.deltas.values())
        rate = grown * 3600.0 / g.window_s
        evidence.update(_window_evidence(g), grown=grown)
        observed = round(rate, 3)
        if rate <= limit:
            results.append(Result("pass", subject=iface, observed=observed, evidence=evidence,
                                  reason=f"no uncorrectable FEC blocks in a {g.window_s:.1f} s "
                                         f"window{said}"))
        elif rate > escalate:
            results.append(Result(
                "fail", subject=iface, observed=observed, evidence=evidence,
                reason=f"{grown:g} uncorrectable blocks in {g.window_s:.1f} s = {rate:.1f}/h "
                f"(above {escalate:g}/h){said}", remedy=ESCALATED_FEC_REMEDY.format(limit=escalate)))
        else:
            results.append(Result("fail", subject=iface, observed=observed, evidence=evidence,
                                  reason=f"{grown:g} uncorrectable blocks in {g.window_s:.1f} s "
                                  f"= {rate:.2f}/h{said}"))
    return results


# -- optics --------------------------------------------------------------------------------------

def _module(snap: Snapshot, iface: str) -> dict[str, Any] | Result:
    mod = snap.fact(f"ethtool.module.{iface}")
    if not mod.ok:
        return Result("unknown", subject=iface, reason=mod.missing)
    if not mod.value.get("supported"):
        return Result("skip", subject=iface, reason=f"no pluggable module EEPROM on this port "
                      f"({_driver(snap, iface) or 'driver unknown'}: {mod.value.get('reason')})")
    return mod.value


def _module_id(m: dict[str, Any]) -> dict[str, Any]:
    return {k: m.get(k) for k in ("identifier", "vendor", "part", "transmitter_technology",
                                  "media", "cable_length_m")}


def _dbm(ln: dict[str, Any]) -> str:
    return "-inf" if ln["dbm"] is None else f"{ln['dbm']:g}"


def _lane(n: int, power: dict[int, dict[str, Any]], causes: dict[int, list[str]]) -> str:
    also = [_FLAG_NAMES[c] for c in causes[n] if c in _FLAG_NAMES]
    return f"lane {n} {_dbm(power[n])} dBm" + (f" ({', '.join(also)} flagged)" if also else "")


def _lanes(nums: list[int]) -> str:
    return f"lane{'s' if len(nums) > 1 else ''} {', '.join(str(n) for n in nums)}"


def lane_causes(m: dict[str, Any], limit: float) -> dict[int, list[str]]:
    """Every failing lane with every cause found: ``dark`` (no light) or ``low`` (below the
    limit), plus ``rx_los``/``rx_lol`` when the module also flagged that lane."""
    causes: dict[int, list[str]] = {}
    for ln in m["rx_power"]:
        if ln["dbm"] is None or ln["dbm"] <= LOS_DBM:
            causes[ln["lane"]] = ["dark"]
        elif ln["dbm"] < limit:
            causes[ln["lane"]] = ["low"]
    for flag in ("rx_los", "rx_lol"):
        for lane in m.get("lane_flags", {}).get(flag) or []:
            if lane in causes:
                causes[lane].append(flag)
    return dict(sorted(causes.items()))


_FLAG_NAMES = {"rx_los": "Rx LOS", "rx_lol": "Rx LOL"}


@check("l1.optics.rx_power")
def optics_rx_power(snap: Snapshot, p: dict) -> list[Result]:
    ifaces = _ifaces(snap, "ethtool.module")
    if not ifaces:
        return _no_ifaces()
    limit = float(p.get("limit", -10.0))
    results = []
    for iface in ifaces:
        m = _module(snap, iface)
        if isinstance(m, Result):
            results.append(m)
            continue
        flags = m.get("lane_flags", {})
        evidence: dict[str, Any] = {
            "module": _module_id(m), "lanes": m["rx_power"],
            "lane_flags": flags or "not reported (SFF-8472 modules, or ethtool before 6.4)",
            "module_rx_thresholds_dbm": m.get("rx_thresholds_dbm") or None}
        if m["media"] == "copper":
            results.append(Result("skip", subject=iface, evidence=evidence,
                                  reason="copper cable: no optical power to measure"))
            continue
        if not m["rx_power"]:
            results.append(Result("unknown", subject=iface, evidence=evidence,
                                  reason="no received power in ethtool -m: the module has no "
                                  "digital diagnostics, or this ethtool does not print them "
                                  "(before 5.16 none for CMIS modules, 5.16-5.18 none for SFP "
                                  "modules over netlink)"))
            continue
        causes = lane_causes(m, limit)
        evidence["failing_lanes"] = [{"lane": n, "causes": c} for n, c in causes.items()]
        power = {ln["lane"]: ln for ln in m["rx_power"]}
        worst = min((ln["dbm"] if ln["dbm"] is not None else float("-inf"))
                    for ln in m["rx_power"])
        observed = "-inf" if worst == float("-inf") else worst

        dark = [n for n, c in causes.items() if c[0] == "dark"]
        low = [n for n, c in causes.items() if c[0] == "low"]
        parts = []
        if dark:
            parts.append("loss of signal (no light) on " + ", ".join(_lane(n, power, causes) for n in dark))
        if low:
            parts.append(f"received power below {limit:g} dBm: " + ", ".join(_lane(n, power, causes)
                                                                      for n in low))
        # The flags are latched (set since the module was last read, link-up included), so
        # they are evidence beside the power readings, not a verdict of their own.
        other = {f: [n for n in flags.get(f) or [] if n not in causes] for f in _FLAG_NAMES}
        latched = "; ".join(f"{_FLAG_NAMES[f]} latched on {_lanes(ns)}"
                            for f, ns in other.items() if ns)
        if parts:
            results.append(Result("fail", subject=iface, observed=observed, evidence=evidence,
                                  reason="; ".join(parts)
                                  + (f" (other lanes: {latched})" if latched else "")))
        else:
            results.append(Result("pass", subject=iface, observed=observed, evidence=evidence,
                                  reason=f"{len(m['rx_power'])} lane(s), weakest {worst} dBm"
                                  + (f"; {latched} (set since the last read, e.g. at link-up; "
                                     "the power now is within the red line)" if latched else "")))
    return results


# -- cabling -------------------------------------------------------------------------------------

@check("l1.cable.copper_in_rack")
def copper_in_rack(snap: Snapshot, p: dict) -> list[Result]:
    ifaces = _ifaces(snap, "ethtool.module")
    if not ifaces:
        return _no_ifaces()
    in_rack = {str(i) for i in p.get("in_rack") or []}
    max_len = float(p.get("limit", 2.0))
    results = []
    for iface in ifaces:
        m = _module(snap, iface)
        if isinstance(m, Result):
            results.append(m)
            continue
        evidence = {"module": _module_id(m), "in_rack_list": sorted(in_rack),
                    "transceiver_types": m.get("transceiver_types")}
        length = m.get("cable_length_m")
        marked = iface in in_rack
        short = length is not None and length <= max_len
        if m["media"] == "copper":
            results.append(Result("pass", subject=iface, observed=length, evidence=evidence,
                                  reason=f"copper cable ({m.get('transmitter_technology') or 'DAC'}"
                                  f"{f', {length:g} m' if length is not None else ''})"))
        elif m["media"] == "optical" and (marked or short):
            why = "marked in-rack" if marked else f"an attached {length:g} m optical cable"
            results.append(Result("warn", subject=iface, observed=length, evidence=evidence,
                                  reason=f"optical module on an in-rack link ({why}): "
                                  "copper (DAC/ACC) saves the electro-optical conversion"))
        elif m["media"] == "optical":
            results.append(Result("skip", subject=iface, observed=length, evidence=evidence,
                                  reason="optical, but not an in-rack link (not in the baseline's "
                                  "in_rack list, and no cable length at or under "
                                  f"{max_len:g} m)"))
        else:
            results.append(Result("unknown", subject=iface, evidence=evidence,
                                  reason="media type not recognised from the module EEPROM"))
    return results


# -- PCIe ----------------------------------------------------------------------------------------

def _devices(snap: Snapshot) -> dict[str, dict[str, Any]]:
    devices = need(snap, "pci.devices")
    if not isinstance(devices, dict):
        raise Unknown("pci.devices: not a mapping")
    return devices


def _subject(bdf: str, entry: dict[str, Any]) -> str:
    """``0000:81:00.0 nic mlx5_core``, ``0000:80:01.0 upstream`` (short: it heads a report line)."""
    driver = f" {entry['driver']}" if entry.get("driver") and entry.get("kind") != "upstream" else ""
    return f"{bdf} {entry.get('kind', 'device')}{driver}"


def _role(entry: dict[str, Any]) -> str:
    serves = entry.get("serves") or []
    return f" (upstream port of {', '.join(serves)})" if serves else ""


def _aer_growth(snap: Snapshot, bdf: str, names: tuple[str, ...]) -> tuple[Growth, dict]:
    aer = snap.facts["pci.aer"].value["counters"][bdf]
    g = growth(snap, "pci.aer", lambda v: {n: v["counters"][bdf][n] for n in names if n in aer})
    return g, {n: aer.get(n) for n in names}


@check("l1.pcie.bad_tlp")
def pcie_bad_tlp(snap: Snapshot, p: dict) -> list[Result]:
    devices = _devices(snap)
    if not devices:
        return [Result("skip", reason="no PCI NIC, GPU or accelerator on this host")]
    aer = need(snap, "pci.aer")
    counters, errors = aer.get("counters", {}), aer.get("errors", {})
    limit = float(p.get("limit", 0))
    results = [Result("unknown", subject=_subject(b, devices.get(b, {})), reason=r)
               for b, r in sorted(errors.items())]
    for bdf in sorted(counters):
        subject = _subject(bdf, devices.get(bdf, {}))
        if "BadTLP" not in counters[bdf]:
            results.append(Result("unknown", subject=subject, reason="no BadTLP counter"))
            continue
        try:
            g, totals = _aer_growth(snap, bdf, ("BadTLP",))
        except NoWindow as exc:
            results.append(Result("unknown", subject=subject, reason=str(exc),
                                  evidence={"since_boot": counters[bdf]}))
            continue
        grown = sum(g.deltas.values())
        evidence = {"since_boot": counters[bdf], **_window_evidence(g)}
        status = "fail" if grown > limit else "pass"
        results.append(Result(status, subject=subject, observed=grown, evidence=evidence,
                              reason=f"BadTLP grew by {grown:g} in {g.window_s:.1f} s"
                              + _role(devices.get(bdf, {}))))
    if not results:
        judged = ", ".join(sorted(devices))
        return [Result("unknown", evidence={"devices": devices},
                       reason=f"no AER counters for {judged} (aer_dev_correctable absent: AER "
                       "not supported here, as in VMs, or disabled by firmware or pci=noaer)")]
    return results


_AER_TOTALS = {"fatal": "TOTAL_ERR_FATAL", "nonfatal": "TOTAL_ERR_NONFATAL"}


def _kind_total(counts: dict[str, float], kind: str) -> float:
    """One file's count: its TOTAL_ERR_* line, else (a kernel or capture without it) the sum
    of its own named counters, never the other file's."""
    total = _AER_TOTALS[kind]
    if total in counts:
        return counts[total]
    return sum(n for k, n in counts.items() if not k.startswith("TOTAL_"))


def _uncorrectable_named(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    """``fatal/CmpltTO``-style names of the non-zero per-error counters (totals left out)."""
    return {f"{kind}/{name}": n for kind, c in counts.items() for name, n in c.items()
            if n and not name.startswith("TOTAL_")}


@check("l1.pcie.aer_uncorrectable")
def pcie_aer_uncorrectable(snap: Snapshot, p: dict) -> list[Result]:
    devices = _devices(snap)
    if not devices:
        return [Result("skip", reason="no PCI NIC, GPU or accelerator on this host")]
    aer = need(snap, "pci.aer_uncorrectable")
    counters, errors = aer.get("counters", {}), aer.get("errors", {})
    limit = float(p.get("limit", 0))
    results = [_aer_from_log(snap, b, devices.get(b, {}), r) for b, r in sorted(errors.items())]
    for bdf in sorted(counters):
        subject = _subject(bdf, devices.get(bdf, {}))
        counts = counters[bdf]
        since_boot = {kind: _kind_total(counts[kind], kind) for kind in counts}
        evidence: dict[str, Any] = {"since_boot": since_boot,
                                    "named_since_boot": _uncorrectable_named(counts)}
        try:
            g = growth(snap, "pci.aer_uncorrectable",
                       lambda v, b=bdf: {f"{k}/{n}": c for k, d in v["counters"][b].items()
                                         for n, c in d.items()})
        except NoWindow as exc:
            status = "warn" if any(since_boot.values()) else "unknown"
            results.append(Result(status, subject=subject, evidence=evidence,
                                  reason=f"{exc}" + (f"; since boot: {since_boot}"
                                                     if any(since_boot.values()) else "")
                                  + _role(devices.get(bdf, {}))))
            continue
        grown = {k: n for k, n in g.deltas.items() if n}
        named = {k: n for k, n in grown.items() if "/TOTAL_" not in k}
        # per file: its own TOTAL line where printed, else the sum of its named counters
        total = sum(_kind_total({k.split("/", 1)[1]: n for k, n in g.deltas.items()
                                 if k.startswith(f"{kind}/")}, kind) for kind in counts)
        evidence.update(_window_evidence(g), grown=grown)
        before = {k: n for k, n in since_boot.items() if n}
        if total > limit:
            which = ", ".join(f"{k} +{n:g}" for k, n in named.items()) or \
                ", ".join(f"{k} +{n:g}" for k, n in grown.items())
            fatal = any(k.startswith("fatal/") for k in grown)
            results.append(Result("fail", subject=subject, observed=total, evidence=evidence,
                                  reason=f"{total:g} uncorrectable "
                                  f"{'(fatal) ' if fatal else ''}AER error(s) in "
                                  f"{g.window_s:.1f} s: {which}" + _role(devices.get(bdf, {}))))
        elif before:
            # None in the window, but the device lost transactions (or, fatal, its link)
            # earlier in this boot: it may again. Warned, as without a window.
            named_before = ", ".join(f"{k} {n}" for k, n in evidence["named_since_boot"].items())
            results.append(Result("warn", subject=subject, observed=total, evidence=evidence,
                                  reason=f"no uncorrectable AER error in {g.window_s:.1f} s, "
                                  f"but since boot: {before}"
                                  + (f" ({named_before})" if named_before else "")
                                  + _role(devices.get(bdf, {}))))
        else:
            results.append(Result("pass", subject=subject, observed=total, evidence=evidence,
                                  reason=f"no fatal or non-fatal AER error in {g.window_s:.1f} s "
                                  "nor since boot" + _role(devices.get(bdf, {}))))
    if not results:
        judged = [b for b, e in sorted(devices.items()) if e.get("kind") != "upstream"]
        logged = [r for r in (_aer_from_log(snap, b, devices[b], "no aer_dev_* files")
                              for b in judged) if r.status == "fail"]
        if logged:  # a kernel before 4.19 has no AER counters in sysfs, but logs the errors
            return logged
        return [Result("unknown", evidence={"devices": sorted(devices)},
                       reason=f"no AER counters for {', '.join(sorted(devices))} (AER not "
                       "supported here, as in VMs, or disabled by firmware or pci=noaer)")]
    return results


def _aer_from_log(snap: Snapshot, bdf: str, entry: dict[str, Any], why: str) -> Result:
    """No AER counters for ``bdf``: the kernel log's uncorrected AER lines naming it in the
    window fail; otherwise unknown with both reasons."""
    from .l1_host import log_events

    subject = _subject(bdf, entry)
    got = log_events(snap, ("aer_uncorrected",), bdf)
    if isinstance(got, str):
        return Result("unknown", subject=subject, reason=why)
    inside, _, desc = got
    if inside:
        return Result("fail", subject=subject, observed=len(inside),
                      evidence={"kernel_log": [e["text"] for e in inside[-10:]], "window": desc},
                      reason=f"{len(inside)} uncorrected AER error(s) in the kernel log in the "
                      f"{desc} ({why}): {inside[-1]['text'][:120]}" + _role(entry))
    return Result("unknown", subject=subject, reason=f"{why}; the kernel log has no "
                  f"uncorrected AER line for it in the {desc}")


def _mlx5_ifaces(snap: Snapshot) -> tuple[dict[str, str], dict[str, str]]:
    """PCI address -> interface, for NICs whose ethtool -S has PCIe signal-integrity
    counters; and PCI address -> reason, for NICs whose ethtool output could not be read
    (they may have such counters: their device cannot pass on the others alone)."""
    out, unreadable = {}, {}
    names = snap.fact("ethtool.phy")
    for iface in names.value if names.ok and isinstance(names.value, list) else []:
        info, phy = snap.fact(f"ethtool.info.{iface}"), snap.fact(f"ethtool.phy.{iface}")
        nic = snap.fact(f"nic.{iface}")
        # sysfs's PCI address first: ethtool's bus-info is free text of the driver
        bus = (nic.value.get("pci") if nic.ok and isinstance(nic.value, dict) else None) \
            or (info.value.get("bus-info") if info.ok and isinstance(info.value, dict) else None)
        if not bus:
            continue
        if not info.ok:
            unreadable[bus.lower()] = f"{iface}: {info.missing}"
        elif not phy.ok and info.value.get("driver") == "mlx5_core":
            unreadable[bus.lower()] = f"{iface}: {phy.missing}"
        elif phy.ok and "rx_pci_signal_integrity" in phy.value:
            out[bus.lower()] = iface
    return out, unreadable


def _lost_stand_ins(bdf: str, entry: dict[str, Any], aer_f: Any, aer: dict[str, Any],
                    replay_f: Any, replay: dict[str, Any]) -> list[str]:
    """Why the counters ``bdf`` has (pci.devices: AER, amdgpu's replay count) were not read."""
    lost = []
    if entry.get("aer"):
        if not aer_f.ok:
            lost.append(f"AER unreadable ({aer_f.missing})")
        elif bdf not in aer:
            lost.append("pci.devices found aer_dev_correctable but pci.aer has no counters "
                        "for it")
        elif not {"Rollover", "Timeout"} & set(aer[bdf]):
            # every kernel that has the file writes both (drivers/pci/pcie/aer.c)
            lost.append("its AER counters have neither Rollover nor Timeout")
    if entry.get("amdgpu_replay") and bdf not in replay.get("counters", {}):
        lost.append(f"vendor replay counters unreadable ({replay_f.missing})" if not replay_f.ok
                    else "pci.devices found pcie_replay_count but pci.replay has no count "
                    "for it")
    return lost


@check("l1.pcie.link_recovery")
def pcie_link_recovery(snap: Snapshot, p: dict) -> list[Result]:
    devices = _devices(snap)
    if not devices:
        return [Result("skip", reason="no PCI NIC, GPU or accelerator on this host")]
    limit = float(p.get("limit", 0))
    aer_f, replay_f = snap.fact("pci.aer"), snap.fact("pci.replay")
    aer = aer_f.value.get("counters", {}) if aer_f.ok else {}
    replay = replay_f.value if replay_f.ok else {"counters": {}, "sources": {}, "errors": {}}
    aer_errors = aer_f.value.get("errors", {}) if aer_f.ok else {}
    mlx5, mlx5_unreadable = _mlx5_ifaces(snap)
    # Sources that failed: named in the reason of every device judged without them.
    failed = [f"AER unreadable ({aer_f.missing})"] if not aer_f.ok else []
    if not replay_f.ok:
        failed.append(f"vendor replay counters unreadable ({replay_f.missing})")
    replay_errors = replay.get("errors", {})
    results = []
    for bdf in sorted(devices):
        subject = _subject(bdf, devices[bdf])
        notes = list(failed)
        # A counter this device has but that could not be read: the others cannot vouch
        # for it alone, so the device is unknown unless what was read already fails.
        mine = [f"{what} unreadable ({why})" for what, why in (
            ("replay counter", replay_errors.get(bdf)), ("AER counters", aer_errors.get(bdf)),
            ("ethtool counters", mlx5_unreadable.get(bdf))) if why]
        notes += mine
        if devices[bdf].get("kind") == "gpu" and devices[bdf].get("vendor") == "0x10de":
            for tool in ("nvml", "nvidia-smi"):
                if tool in replay_errors:
                    notes.append(f"{tool}: {replay_errors[tool]}"
                                 + ("; read nvidia-smi -q instead" if tool == "nvml"
                                    and bdf in replay.get("counters", {}) else ""))
        # (description of the stand-in, fact, pick) for every counter this device exposes.
        stand_ins: list[tuple[str, str, Any]] = []
        if bdf in aer and {"Rollover", "Timeout"} & set(aer[bdf]):
            stand_ins.append(("AER Rollover (REPLAY_NUM rollover) + Timeout (replay timer)",
                              "pci.aer", lambda v, b=bdf: {n: v["counters"][b][n]
                                                           for n in ("Rollover", "Timeout")
                                                           if n in v["counters"][b]}))
        if bdf in replay.get("counters", {}):
            stand_ins.append((replay.get("sources", {}).get(bdf, "vendor replay counter"),
                              "pci.replay", lambda v, b=bdf: v["counters"][b]))
        if bdf in mlx5:
            i = mlx5[bdf]
            stand_ins.append((f"mlx5 {i} rx/tx_pci_signal_integrity (transitions to recovery)",
                              f"ethtool.phy.{i}",
                              lambda v: {n: v[n] for n in ("rx_pci_signal_integrity",
                                                           "tx_pci_signal_integrity") if n in v}))
        if not stand_ins and not mine:
            # A counter it has, in a source that could not be read (or that lacks it):
            # the device is unknown with the reason, not left out as having no stand-in.
            lost = _lost_stand_ins(bdf, devices[bdf], aer_f, aer, replay_f, replay)
            if lost:
                results.append(Result("unknown", subject=subject,
                                      evidence={"unavailable_sources": lost},
                                      reason="; ".join(lost) + _role(devices[bdf])))
            continue
        evidence: dict[str, Any] = {"stand_ins": [s[0] for s in stand_ins], "grown": {}}
        total, unknown, window = 0.0, [], None
        for what, name, pick in stand_ins:
            try:
                g = growth(snap, name, pick)
            except NoWindow as exc:
                unknown.append(f"{what}: {exc}")
                continue
            evidence["grown"][what] = g.deltas
            window = g if window is None or g.window_s < window.window_s else window
            total += sum(g.deltas.values())
        if window is not None:
            evidence.update(_window_evidence(window))
        role = _role(devices[bdf])
        if notes:
            evidence["unavailable_sources"] = notes
            role += f" [{'; '.join(notes)}]"
        if total > limit:
            results.append(Result("fail", subject=subject, observed=total, evidence=evidence,
                                  reason=f"{total:g} link replay/recovery events in the window"
                                  + role))
        elif unknown:
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason="; ".join(unknown) + role))
        elif mine or failed:  # what was read is quiet, but not everything could be read
            results.append(Result("unknown", subject=subject, observed=total, evidence=evidence,
                                  reason="no replay or recovery events in the counters read, "
                                  "but not all could be read" + role))
        else:
            results.append(Result("pass", subject=subject, observed=total, evidence=evidence,
                                  reason="no replay or recovery events in the window" + role))
    if not results:
        reasons = [f"pci.aer: {aer_f.missing}"] if not aer_f.ok else []
        reasons += [f"{k}: {v}" for k, v in replay.get("errors", {}).items()]
        return [Result("unknown", evidence={"devices": sorted(devices)},
                       reason="no stand-in for LTSSM recovery on " + ", ".join(sorted(devices))
                       + ": no AER Rollover/Timeout counters, no vendor replay counter "
                       "(NVIDIA, amdgpu) and no mlx5 PCIe signal-integrity counter"
                       + (f" ({'; '.join(reasons)})" if reasons else ""))]
    return results


# -- clock ---------------------------------------------------------------------------------------

def _ts_evidence(snap: Snapshot) -> tuple[list[str], dict[str, Any]]:
    hw, ev = [], {}
    names = snap.fact("ethtool.ts")
    for iface in names.value if names.ok and isinstance(names.value, list) else []:
        f = snap.fact(f"ethtool.ts.{iface}")
        if f.ok:
            ev[iface] = {"hardware": f.value["hardware"], "phc_index": f.value["phc_index"]}
            if f.value["hardware"]:
                hw.append(iface)
        else:
            ev[iface] = {"missing": f.missing}
    return hw, ev


def _judge_offsets(offsets: dict[str, int | float], limit: float, evidence: dict,
                   how: str) -> Result:
    worst_src, worst = max(offsets.items(), key=lambda kv: abs(kv[1]))
    evidence["offsets_ns"] = offsets
    if abs(worst) <= limit:
        return Result("pass", observed=worst, evidence=evidence,
                      reason=f"{how}: worst offset {worst:g} ns ({worst_src})")
    return Result("fail", observed=worst, evidence=evidence,
                  reason=f"{how}: offset {worst:g} ns ({worst_src}) exceeds +-{limit:g} ns")


@check("l1.clock.ptp")
def clock_ptp(snap: Snapshot, p: dict) -> Result:
    limit = float(p.get("limit", 5.0))
    hw, ts = _ts_evidence(snap)
    evidence: dict[str, Any] = {"hardware_timestamping": hw, "interfaces": ts}
    pmc, log, chrony = snap.fact("ptp.pmc"), snap.fact("ptp.log"), snap.fact("chrony.tracking")
    recent: dict[str, int] = {}
    unlocked = []
    if log.ok:
        for prog in ("ptp4l", "phc2sys"):
            samples = [s for s in log.value["samples"] if s["prog"] == prog][-10:]
            if samples and samples[-1]["state"] in ("s0", "s1"):
                unlocked.append(f"{prog} {samples[-1]['state']} (not locked)")
            for i, s in enumerate(samples):
                if s["state"] not in ("s0", "s1"):
                    recent[f"{prog} sample {i - len(samples)}"] = s["offset_ns"]
    if pmc.ok and pmc.value["time_status"]:
        evidence["ptp4l"] = pmc.value
        soft = [pp for pp in pmc.value["ports"] if pp.get("timestamping") == "SOFTWARE"]
        if soft:
            return Result("fail", evidence=evidence,
                          reason="ptp4l uses software timestamping on "
                          + ", ".join(str(pp.get("interface") or pp["port"]) for pp in soft)
                          + ": not hardware PTP")
        synced = [s for s in pmc.value["time_status"] if s["gm_present"]]
        if not synced:
            return Result("fail", evidence=evidence,
                          reason="ptp4l answers but has no grandmaster (this clock is its own "
                          "master): not synchronised")
        if unlocked:
            return Result("fail", evidence=evidence, reason="; ".join(unlocked))
        offsets = {f"ptp4l {s['port']} master_offset": s["master_offset_ns"] for s in synced}
        judged = _judge_offsets({**offsets, **recent}, limit, evidence, "PTP")
        if judged.status == "pass" and not log.ok:
            # The journal would have shown an unlocked servo or worse offsets: without it
            # pmc's one offset cannot vouch for the clock.
            return Result("unknown", observed=judged.observed, evidence=evidence,
                          reason=f"{judged.reason}, but the ptp4l/phc2sys journal is "
                          f"unreadable: {log.missing}")
        return judged
    # pmc gave nothing: what stands in for it (the journal, chrony) says so.
    instead = "" if pmc.ok else f"pmc: {pmc.missing}; "
    if log.ok and log.value["samples"]:
        evidence["log_tail"] = log.value["samples"][-10:]
        if unlocked:
            return Result("fail", evidence=evidence, reason="; ".join(unlocked))
        if recent:
            return _judge_offsets(recent, limit, evidence,
                                  f"{instead}PTP from the ptp4l/phc2sys journal instead")
    if chrony.ok:
        c = chrony.value
        evidence["chrony"] = c
        if c["kind"] == "ntp":
            return Result("fail", observed=c["offset_ns"], evidence=evidence,
                          reason=f"software NTP: chrony follows {c['ref_name'] or c['ref_id']} over "
                          "the network; asymmetric network jitter produces false latency spikes")
        if not c["synchronised"] or c["kind"] in ("none", "local"):
            return Result("fail", evidence=evidence,
                          reason=f"chrony is not synchronised to a reference ({c['leap'] or c['kind']})")
        return _judge_offsets({f"chrony {c['ref_name']}": c["offset_ns"]}, limit, evidence,
                              f"{instead}chrony on hardware reference clock {c['ref_name']}")
    evidence["missing"] = {n: f.missing for n, f in
                           (("ptp.pmc", pmc), ("ptp.log", log), ("chrony.tracking", chrony))
                           if not f.ok}
    if log.ok and log.value.get("unavailable"):
        evidence["missing"]["ptp.log"] = log.value["unavailable"]
    pmc_empty = pmc.ok and not pmc.value["time_status"]
    if ts and not hw and any("missing" not in v for v in ts.values()):
        return Result("fail", evidence=evidence,
                      reason="no interface timestamps in hardware ("
                      + ", ".join(f"{i}: software only" for i, v in ts.items() if "missing" not in v)
                      + "), so hardware PTP is impossible; "
                      + ("ptp4l is not running (pmc: no answer)" if pmc_empty
                         else f"pmc: {pmc.missing}")
                      + f"; chrony: {chrony.missing}")
    if pmc_empty:
        return Result("fail", evidence=evidence,
                      reason=f"no PTP daemon answers (pmc: no answer from ptp4l) although "
                      f"{', '.join(hw) or 'no interface'} can timestamp in hardware; "
                      f"chrony: {chrony.missing}")
    raise Unknown("cannot tell how the clock is synchronised: "
                  + "; ".join(f"{k}: {v}" for k, v in evidence["missing"].items()))
