"""Layer 1: GPU health (Xid events, ECC, retired pages and remapped rows, NVLink errors,
clock event reasons), per NVIDIA GPU. Pure functions of (snapshot, params).

Counters are judged on their growth over the window (the counter history, else this
run's --interval, as every L1 counter); Xid events on their kernel-log timestamps
against the window's start (seconds since boot, same boot only).
"""

from __future__ import annotations

from typing import Any

from ..history import NoWindow, growth
from ..judge import Unknown, check, need
from ..model import Result, Snapshot
from ..sources.amd_metrics import RESIDENCIES
from ..sources.gpu import GONE_KINDS, TAIL_CLASSES, UNSUPPORTED, XID
from ..sources.kernel_log import meaning
from .ecc import ecc_status

_NO_GPU = "no NVIDIA or AMD GPU in this host's PCI tree"


def _health(snap: Snapshot, p: dict | None = None) -> tuple[dict[str, Any], str]:
    h = need(snap, "gpu.health")
    if not isinstance(h, dict) or not isinstance(h.get("gpus"), dict):
        raise Unknown("gpu.health: not a mapping of GPUs")
    return h["gpus"], str(h.get("source") or "")


def _subjects(snap: Snapshot) -> tuple[list[str], list[Result]] | list[Result]:
    """The GPUs to judge (the PCI tree's and any a --dcgm exporter reports) and an unknown
    for every one of them its source does not report; or the one skip/unknown when there
    is none."""
    h = need(snap, "gpu.health")
    if not isinstance(h, dict) or not isinstance(h.get("gpus"), dict):
        raise Unknown("gpu.health: not a mapping of GPUs")
    gpus, bus, tried = h["gpus"], h.get("bus") or {}, h.get("tried") or {}
    if not gpus and not bus:
        if tried:
            return [Result("unknown", reason="no GPU health source answered: "
                           + "; ".join(f"{k}: {v}" for k, v in tried.items()))]
        return [Result("skip", reason=f"{_NO_GPU}, and no --dcgm URL")]
    missing = _unreadable(h)
    for bdf in sorted(set(bus) - set(gpus)):
        missing.append(Result("unknown", subject=f"{bdf} gpu", evidence={"tried": tried},
                              reason=not_reported(h, bdf)))
    return sorted(gpus), missing


def _unreadable(fact: dict[str, Any]) -> list[Result]:
    """A PCI device that could not be read may be a GPU: unknown, naming why."""
    return [Result("unknown", subject=f"{bdf} device",
                   reason=f"a PCI device that may be a GPU could not be read: {why}")
            for bdf, why in sorted((fact.get("pci_unreadable") or {}).items())]


def not_reported(h: dict[str, Any], bdf: str) -> str:
    """Why a GPU of the PCI tree has no reading."""
    entry = (h.get("bus") or {}).get(bdf, {})
    tried = h.get("tried") or {}
    if entry.get("vendor") == "amd":
        why = tried.get(f"amdgpu {bdf}")
        if why:
            return f"on the PCI bus; its amdgpu sysfs could not be read: {why}"
        return "on the PCI bus but its amdgpu sysfs was not read"
    if not h.get("source"):
        return "on the PCI bus; no NVIDIA source answered: " + "; ".join(
            f"{k}: {v}" for k, v in tried.items())
    if not entry.get("driver"):
        return "on the PCI bus with no driver bound: not answering its driver (see l1.gpu.xid)"
    reported = len([b for b in h.get("gpus") or {} if (h.get("bus") or {}).get(b, {}).get(
        "vendor") == "nvidia"])
    attached = h.get("attached")
    if attached is not None and reported < attached:
        return (f"on the PCI bus but not in {h['source']}, a capture that ends early "
                f"(Attached GPUs: {attached}, {reported} reported): not read")
    return (f"on the PCI bus but {h['source']} does not report it: a GPU not answering its "
            "driver, or a capture cut short (see l1.gpu.xid)")


def _window(snap: Snapshot, pick: Any) -> tuple[dict[str, float], dict[str, Any]] | str:
    """Growth of ``pick(gpu.health)``, or why there is no window."""
    try:
        g = growth(snap, "gpu.health", pick)
    except NoWindow as exc:
        return str(exc)
    return g.deltas, {"window_s": round(g.window_s, 3), "window": g.describe()}


def _gpu(v: dict[str, Any], bdf: str) -> dict[str, Any]:
    return v["gpus"][bdf]


def _src(g: dict[str, Any], source: str) -> str:
    return str(g.get("source") or source)


# -- Xid and the kernel log's other GPU messages ------------------------------------------------

def xid_meaning(code: int) -> tuple[str, str]:
    return XID.get(code, (f"Xid {code} (not in tailgate's table: see NVIDIA's Xid catalog)",
                          "unlisted"))


def event_meaning(e: dict[str, Any]) -> tuple[str, str]:
    """(meaning, class) of a kernel-log GPU event: an Xid or another message class."""
    if e.get("kind", "xid") == "xid":
        return xid_meaning(e["code"])
    return meaning(e)


def _said(e: dict[str, Any]) -> str:
    return f"Xid {e['code']} {event_meaning(e)[0]}" if e.get("kind", "xid") == "xid" \
        else event_meaning(e)[0]


def _xid_window(snap: Snapshot, now: dict[str, Any]) -> tuple[float, str] | str:
    """(start of the window in seconds since boot, description), or why there is none."""
    for fact, where in ((snap.earlier.get("gpu.xid"), "since the last stored run"),
                        (snap.before.get("gpu.xid"), "over this run's interval")):
        if fact is None or not fact.ok or not isinstance(fact.value, dict):
            continue
        then = fact.value
        if then.get("boot_id") and now.get("boot_id") and then["boot_id"] != now["boot_id"]:
            continue  # rebooted since: the old uptime means nothing in this boot
        start = then.get("uptime_s")
        if isinstance(start, (int, float)) and now.get("uptime_s") is not None \
                and start <= now["uptime_s"]:
            return float(start), f"{now['uptime_s'] - start:.1f} s window {where}"
    return "no earlier reading of the kernel log's clock in this boot (no stored run, no " \
           "--interval)"


def _absent_from_driver(snap: Snapshot, bus: dict[str, Any]) -> dict[str, str]:
    """GPUs of the PCI tree the management interface does not report: bdf -> why."""
    h = snap.facts.get("gpu.health")
    if h is None or not h.ok or not isinstance(h.value, dict):
        return {b: "no driver bound" for b, e in bus.items() if not e.get("driver")}
    gpus = h.value.get("gpus") or {}
    out = {}
    for bdf, entry in bus.items():
        if bdf in gpus:
            continue
        if not entry.get("driver"):
            out[bdf] = "no driver bound to it"
        elif entry.get("vendor") == "nvidia" and h.value.get("source"):
            out[bdf] = f"{h.value['source']} does not report it"
    return out


@check("l1.gpu.xid")
def gpu_xid(snap: Snapshot, p: dict) -> list[Result]:
    v = need(snap, "gpu.xid")
    gpus = v.get("gpus") or []
    if not gpus:
        return [Result("skip", reason=_NO_GPU)]
    bus = v.get("bus") or {}
    window = _xid_window(snap, v)
    events = v.get("events") or []
    log = f"kernel log ({v.get('source') or 'dmesg'})"
    absent = _absent_from_driver(snap, bus)
    # A failure line that names no GPU (old drivers: "RmInitAdapter failed!") is that GPU's
    # when exactly one of its vendor's GPUs does not answer.
    unnamed = [e for e in events if e["bdf"] is None and e.get("kind") in GONE_KINDS]
    results = _unreadable(v)
    for bdf in sorted(set(gpus) | {e["bdf"] for e in events if e["bdf"]}):
        mine = [e for e in events if e["bdf"] == bdf]
        vendor = bus.get(bdf, {}).get("vendor")
        if bdf in absent and unnamed and len([b for b in absent if bus.get(b, {}).get(
                "vendor") == vendor]) == 1:
            mine = sorted(mine + [e for e in unnamed if e["kind"].startswith(
                "nvrm" if vendor == "nvidia" else "amdgpu")],
                key=lambda e: (e["t_s"] is None, e["t_s"] or 0))
        since_boot: dict[str, int] = {}
        for e in mine:
            key = str(e["code"]) if e.get("kind", "xid") == "xid" else e["kind"]
            since_boot[key] = since_boot.get(key, 0) + 1
        evidence: dict[str, Any] = {"since_boot": dict(sorted(since_boot.items())),
                                    "source": log}
        subject = f"{bdf} gpu"
        gone = [e for e in mine if e.get("kind") in GONE_KINDS
                or (e.get("kind", "xid") == "xid" and e["code"] == 79)]
        if v.get("unreadable") and not mine:
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"the kernel log could not be read: {v['unreadable']}"))
            continue
        if bdf in absent:
            evidence["not_answering"] = absent[bdf]
            if gone:
                evidence["kernel_log"] = [e["text"] for e in gone[-5:]]
                results.append(Result("fail", subject=subject, observed=len(gone),
                                      evidence=evidence,
                                      reason=f"on the bus but not answering its driver "
                                      f"({absent[bdf]}): the {log} says "
                                      + "; ".join(dict.fromkeys(_said(e) for e in gone))
                                      + f" ({gone[0]['text'][:120]})"))
            else:
                results.append(Result("unknown", subject=subject, evidence=evidence,
                                      reason=f"on the bus but not answering its driver "
                                      f"({absent[bdf]}), and the {log} says nothing of it: "
                                      "a capture cut short, or a GPU that stopped answering"))
            continue
        if isinstance(window, str):
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"{window}; {len(mine)} GPU event(s) in the {log} "
                                  "since boot"))
            continue
        start, desc = window
        evidence["window"] = desc
        untimed = [e for e in mine if e["t_s"] is None]
        inside = [e for e in mine if e["t_s"] is not None and e["t_s"] > start]
        evidence["in_window"] = [{"t_s": e["t_s"], "code": e["code"],
                                  "kind": e.get("kind", "xid"),
                                  "meaning": event_meaning(e)[0],
                                  "class": event_meaning(e)[1], "text": e["text"]}
                                 for e in inside[-20:]]
        said = ", ".join(dict.fromkeys(_said(e) for e in inside))
        tail = [e for e in inside if event_meaning(e)[1] in (*TAIL_CLASSES, "unlisted")]
        if untimed and not inside:
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"{len(untimed)} GPU event(s) without a usable "
                                  "timestamp (printk.time=0, or a journal line without a "
                                  "year): cannot tell whether they fall in the window"))
        elif tail:
            results.append(Result("fail", subject=subject, observed=len(inside), evidence=evidence,
                                  reason=f"{len(inside)} GPU event(s) in the {desc}: {said}"))
        elif inside:
            results.append(Result("warn", subject=subject, observed=len(inside), evidence=evidence,
                                  reason=f"application Xid event(s) in the {desc}: {said} (the "
                                  "program faulted, not the GPU)"))
        else:
            results.append(Result("pass", subject=subject, observed=0, evidence=evidence,
                                  reason=f"no GPU event in the {log} in the {desc}"
                                  + (f" ({len(mine)} earlier in this boot)" if mine else "")))
    return results


# -- ECC -----------------------------------------------------------------------------------------

def _ecc_volatile(v: dict[str, Any], bdf: str) -> dict[str, int]:
    return _gpu(v, bdf).get("ecc", {}).get("volatile", {})


@check("l1.gpu.ecc")
def gpu_ecc(snap: Snapshot, p: dict) -> list[Result]:
    gpus, source = _health(snap)
    subj = _subjects(snap)
    if not isinstance(subj, tuple):
        return subj
    results = subj[1]
    limit = float(p.get("limit", 0))
    corr_limit = float(p.get("correctable_per_hour", 0))
    for bdf in sorted(gpus):
        g = gpus[bdf]
        subject = f"{bdf} gpu"
        ecc = g.get("ecc") or {}
        src = _src(g, source)
        evidence: dict[str, Any] = {"source": src, "ecc_mode": g.get("ecc_mode"), "ecc": ecc}
        if g.get("ecc_mode") == "Disabled":
            results.append(Result("skip", subject=subject, evidence=evidence,
                                  reason="ECC is disabled on this GPU (nvidia-smi -e 1 and a "
                                  "reset enable it)"))
            continue
        if g.get("ecc_mode") == UNSUPPORTED:
            results.append(Result("skip", subject=subject, evidence=evidence,
                                  reason=f"{src} says this GPU does not support ECC (no ECC "
                                  "memory, or amdgpu RAS off)"))
            continue
        if not ecc.get("volatile"):
            mode = g.get("ecc_mode")
            why = (g.get("unreadable") or {}).get("ecc")
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=why or f"no volatile ECC counters in {src}"
                                  + (f" although ECC is {mode}" if mode else
                                     ", and no ECC mode either (the section is not in it)")))
            continue
        w = _window(snap, lambda val, b=bdf: _ecc_volatile(val, b))
        if isinstance(w, str):
            unc = {k: n for k, n in ecc["volatile"].items() if "uncorrectable" in k and n}
            status = "fail" if unc else "unknown"
            results.append(Result(status, subject=subject, evidence=evidence,
                                  reason=(f"uncorrectable ECC errors since the driver loaded: {unc}; "
                                          if unc else "") + w))
            continue
        deltas, win = w
        evidence.update(win, grown=deltas)
        unc = sum(n for k, n in deltas.items() if "uncorrectable" in k)
        corr = sum(n for k, n in deltas.items() if k.endswith("correctable")
                   and "uncorrectable" not in k)
        status, rate = ecc_status(unc, corr, win["window_s"], limit, corr_limit)
        if status == "fail":
            results.append(Result("fail", subject=subject, observed=unc, evidence=evidence,
                                  reason=f"{unc:g} uncorrectable ECC error(s) in the "
                                  f"{win['window']}"))
        elif status == "warn":
            results.append(Result("warn", subject=subject, observed=unc, evidence=evidence,
                                  reason=f"{corr:g} correctable ECC error(s) in the "
                                  f"{win['window']} ({rate:.1f}/h): corrected, but memory that "
                                  "is wearing out"))
        else:
            results.append(Result("pass", subject=subject, observed=unc, evidence=evidence,
                                  reason=f"no ECC error in the {win['window']}"))
    return results


# -- retired pages and remapped rows -------------------------------------------------------------

@check("l1.gpu.memory_repair")
def gpu_memory_repair(snap: Snapshot, p: dict) -> list[Result]:
    gpus, source = _health(snap)
    subj = _subjects(snap)
    if not isinstance(subj, tuple):
        return subj
    results = subj[1]
    for bdf in sorted(gpus):
        g = gpus[bdf]
        subject = f"{bdf} gpu"
        rr, rp = g.get("remapped_rows"), g.get("retired_pages")
        src = _src(g, source)
        evidence = {"source": src, "remapped_rows": rr, "retired_pages": rp,
                    "ecc_mode": g.get("ecc_mode")}
        if not rr and not rp:
            if g.get("ecc_mode") in (UNSUPPORTED, "Disabled"):
                results.append(Result("skip", subject=subject, evidence=evidence,
                                      reason=f"ECC {g['ecc_mode'].lower()} on this GPU: no "
                                      "row remapping or page retirement"))
            else:
                results.append(Result("unknown", subject=subject, evidence=evidence,
                                      reason=f"neither remapped rows nor retired pages in {src}"
                                      + (f" although ECC is {g['ecc_mode']}"
                                         if g.get("ecc_mode") else "")))
            continue
        fails, warns = [], []
        if rr:
            if rr.get("failure"):
                fails.append("row remapping failed (Remapping Failure Occurred: a bank has no "
                             "spare row left)")
            if rr.get("pending"):
                warns.append("a row remap is pending (applied at the next GPU reset)")
        if rp and rp.get("pending"):
            warns.append("a page retirement is pending (applied at the next GPU reset or "
                         "driver reload)")
        w = _window(snap, lambda val, b=bdf: {
            **{f"rows_{k}": n for k, n in (_gpu(val, b).get("remapped_rows") or {}).items()
               if k in ("uncorrectable", "correctable")},
            **{f"pages_{k}": n for k, n in (_gpu(val, b).get("retired_pages") or {}).items()
               if k in ("single_bit", "double_bit", "retired")}})
        if isinstance(w, str):
            evidence["window"] = w
        else:
            deltas, win = w
            evidence.update(win, grown=deltas)
            grown = {k: n for k, n in deltas.items() if n}
            if grown.get("rows_uncorrectable") or grown.get("pages_double_bit") \
                    or grown.get("pages_retired"):
                fails.append(f"rows remapped or pages retired after uncorrectable errors in the "
                             f"{win['window']}: {grown}")
            elif grown:
                warns.append(f"rows remapped or pages retired after correctable errors in the "
                             f"{win['window']}: {grown}")
        if fails:
            results.append(Result("fail", subject=subject, evidence=evidence,
                                  reason="; ".join(fails + warns)))
        elif warns:
            results.append(Result("warn", subject=subject, evidence=evidence,
                                  reason="; ".join(warns)))
        else:
            results.append(Result("pass", subject=subject, evidence=evidence,
                                  reason="no failed or pending row remap or page retirement"
                                  + ("" if isinstance(w, tuple) else f" (growth not judged: {w})")))
    return results


# -- NVLink --------------------------------------------------------------------------------------

@check("l1.gpu.nvlink")
def gpu_nvlink(snap: Snapshot, p: dict) -> list[Result]:
    gpus, source = _health(snap)
    subj = _subjects(snap)
    if not isinstance(subj, tuple):
        return subj
    results = subj[1]
    limit = float(p.get("limit", 0))
    for bdf in sorted(gpus):
        g = gpus[bdf]
        subject = f"{bdf} gpu"
        links, states = g.get("nvlink") or {}, g.get("nvlink_state") or {}
        totals = g.get("nvlink_total") or g.get("xgmi") or {}
        src = _src(g, source)
        evidence: dict[str, Any] = {"source": src, "links": links, "state": states}
        unreadable = (g.get("unreadable") or {}).get("nvlink")
        if not links and not totals and not states:
            if unreadable:
                results.append(Result("unknown", subject=subject, reason=unreadable))
            elif g.get("nvlink_read"):
                results.append(Result("skip", subject=subject, evidence=evidence,
                                      reason=f"no NVLink or xGMI link on this GPU ({src} "
                                      "reports none)"))
            else:
                results.append(Result("unknown", subject=subject, evidence=evidence,
                                      reason=f"{src} carries no NVLink counters (not "
                                      "collected there): cannot tell whether links exist"))
            continue
        w = _window(snap, lambda val, b=bdf: _gpu(val, b).get("nvlink")
                    or _gpu(val, b).get("nvlink_total") or _gpu(val, b).get("xgmi") or {})
        active = sorted((k for k, s in states.items() if s == "active"), key=int)
        down = sorted((k for k, s in states.items() if s != "active"), key=int)
        if isinstance(w, str):
            results.append(Result("unknown", subject=subject, evidence=evidence, reason=w))
            continue
        deltas, win = w
        evidence.update(win, grown={k: n for k, n in deltas.items() if n})
        grown = sum(deltas.values())
        if grown > limit:
            by_link: dict[str, float] = {}
            for k, n in deltas.items():
                if n:
                    by_link[k.split("/")[0]] = by_link.get(k.split("/")[0], 0) + n
            results.append(Result("fail", subject=subject, observed=grown, evidence=evidence,
                                  reason=f"{grown:g} NVLink error(s) (CRC, replay, recovery) in the "
                                  f"{win['window']}: " + ", ".join(f"link {k}: {n:g}"
                                                                    for k, n in by_link.items())))
        elif active and down:
            results.append(Result("warn", subject=subject, observed=grown, evidence=evidence,
                                  reason=f"link(s) {', '.join(down)} inactive beside "
                                  f"{len(active)} active: the GPU runs with fewer NVLinks"))
        else:
            results.append(Result("pass", subject=subject, observed=grown, evidence=evidence,
                                  reason=f"no NVLink error in the {win['window']}"
                                  + (f"; {len(active)} link(s) active" if active else "")))
    return results


# -- clock event reasons -------------------------------------------------------------------------

_HW = ("hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal")
_NAMES = {"hw_slowdown": "HW slowdown", "hw_thermal": "HW thermal slowdown",
          "hw_power_brake": "HW power brake", "sw_thermal": "SW thermal slowdown",
          "sw_power_cap": "SW power cap", "power": "power", "thermal": "thermal",
          "board_limit": "board limit", "reliability": "reliability", "sync_boost": "sync boost"}
# Counters whose time is a slowdown the operator must act on (thermal, power brake); the
# SW power cap is the configured limit doing its job.
_HW_TIME = ("hw_thermal", "hw_power_brake", "sw_thermal", "thermal", "reliability",
            "board_limit")


def _amd_residency(snap: Snapshot, bdf: str) -> tuple[dict[str, float], dict[str, Any]] | str:
    """Shares of the window an AMD GPU spent in each throttler: residency growth over the
    growth of the firmware's accumulation counter (both count the same firmware samples)."""
    w = _window(snap, lambda val, b=bdf: _gpu(val, b).get("throttle_residency") or {})
    if isinstance(w, str):
        return w
    deltas, win = w
    ticks = deltas.get("accumulation", 0)
    if ticks <= 0:
        return (f"the firmware's accumulation counter did not move in the {win['window']} "
                "(no sample to divide by)")
    return {k: n / ticks for k, n in deltas.items() if k != "accumulation"}, win


def _amd_clock_events(snap: Snapshot, bdf: str, g: dict[str, Any], subject: str,
                      src: str, p: dict) -> Result:
    """An AMD GPU: the throttler bits of gpu_metrics now, or the residency counters' window
    (MI300), judged as the NVIDIA reasons: thermal fails; power and current limits warn."""
    limit = float(p.get("limit", 0.0))
    cap_limit = float(p.get("power_cap_share", 0.05))
    kinds: dict[str, str] = g.get("clock_event_kinds") or {}
    metrics = g.get("gpu_metrics") or {}
    said_by = f"gpu_metrics {metrics['revision']}" if metrics.get("revision") \
        else str(g.get("clock_source") or src)
    evidence: dict[str, Any] = {"source": said_by, "active": sorted(kinds),
                                "gpu_metrics": metrics}
    res = g.get("throttle_residency")
    if res:
        evidence["residency"] = res
        got = _amd_residency(snap, bdf)
        if isinstance(got, str):
            return Result("unknown", subject=subject, evidence=evidence,
                          reason=f"{said_by} has throttle residency counters but no current "
                          f"state; the time in throttling is not judged: {got}")
        shares, win = got
        evidence.update(win, share_of_window={k: round(v, 4) for k, v in shares.items()})
        said = ", ".join(f"{k} {v:.1%}" for k, v in shares.items() if v)
        hot = max((v for k, v in shares.items() if RESIDENCIES.get(k) == "thermal"),
                  default=0.0)
        if hot > limit:
            return Result("fail", subject=subject, observed=round(hot, 4), evidence=evidence,
                          reason=f"throttled by PROCHOT or a thermal limit in the "
                          f"{win['window']}: {said}")
        if shares.get("ppt", 0.0) > cap_limit:
            return Result("warn", subject=subject, observed=round(hot, 4), evidence=evidence,
                          reason=f"the power limit (PPT) held the clocks down for "
                          f"{shares['ppt']:.1%} of the {win['window']}: the power limit, not "
                          "the workload, sets the speed")
        return Result("pass", subject=subject, observed=round(hot, 4), evidence=evidence,
                      reason=f"no thermal or PROCHOT throttling in the {win['window']}"
                      + (f" ({said})" if said else ""))
    temps = metrics.get("temperatures_c") or {}
    thermal = sorted(k for k, v in kinds.items() if v == "thermal")
    limits = sorted(k for k, v in kinds.items() if v in ("power", "current", "reliability"))
    other = sorted(k for k, v in kinds.items() if v in ("unnamed", "unknown"))
    if thermal and thermal != ["TEMP_HOTSPOT"]:
        return Result("fail", subject=subject, evidence=evidence,
                      reason="clocks held down now by " + ", ".join(thermal)
                      + (" (" + ", ".join(f"{k} {v:g} C" for k, v in temps.items()) + ")"
                         if temps else ""))
    notes = []
    if thermal:  # TEMP_HOTSPOT alone: RDNA 3/4 firmware sets it even idle (drm/amd#3251)
        notes.append("TEMP_HOTSPOT is set" + (f" at a hotspot of {temps['hotspot']:g} C"
                                              if "hotspot" in temps else "")
                     + ", a bit RDNA 3/4 firmware sets even at idle (drm/amd#3251): not "
                     "judged a thermal slowdown alone")
    if limits:
        notes.append("held at a limit now: " + ", ".join(limits)
                     + " (a power, current or reliability limit, not the workload, sets the "
                     "speed)")
    if other:
        status = metrics.get("throttle_status")
        notes.append(f"a throttler is active (ASIC-dependent throttle_status {status:#x}; "
                     f"{said_by} does not name its kind)" if isinstance(status, int)
                     else f"a throttler is active ({said_by} says THROTTLED without naming "
                     "its kind)")
    if notes:
        return Result("warn", subject=subject, evidence=evidence, reason="; ".join(notes))
    return Result("pass", subject=subject, evidence=evidence,
                  reason=f"no throttler active now ({said_by}; no slowdown time counters "
                  "there)")


@check("l1.gpu.clock_events")
def gpu_clock_events(snap: Snapshot, p: dict) -> list[Result]:
    gpus, source = _health(snap)
    subj = _subjects(snap)
    if not isinstance(subj, tuple):
        return subj
    results = subj[1]
    limit = float(p.get("limit", 0.0))  # share of the window in hardware/thermal slowdown
    cap_limit = float(p.get("power_cap_share", 0.05))
    for bdf in sorted(gpus):
        g = gpus[bdf]
        subject = f"{bdf} gpu"
        src = _src(g, source)
        if g.get("clock_event_kinds") is not None or g.get("throttle_residency"):
            results.append(_amd_clock_events(snap, bdf, g, subject, src, p))
            continue
        active = [k for k, on in (g.get("clock_events") or {}).items() if on]
        counters = g.get("clock_event_us") or g.get("violation_us") or {}
        evidence: dict[str, Any] = {"source": src, "active": active, "counters_us": counters}
        if not g.get("clock_events") and not counters:
            why = (g.get("unreadable") or {}).get("clock_events")
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=why or f"no clock event reasons in {src} for this GPU"))
            continue
        shares: dict[str, float] = {}
        w = _window(snap, lambda val, b=bdf: _gpu(val, b).get("clock_event_us")
                    or _gpu(val, b).get("violation_us") or {})
        if isinstance(w, tuple) and counters:
            deltas, win = w
            shares = {k: n / (win["window_s"] * 1e6) for k, n in deltas.items()}
            evidence.update(win, share_of_window={k: round(s, 4) for k, s in shares.items()})
        hw_now = [k for k in active if k in _HW]
        hw_share = max((s for k, s in shares.items() if k in _HW_TIME), default=0.0)
        cap_share = max((s for k, s in shares.items() if k in ("sw_power_cap", "power")),
                        default=0.0)
        said = ", ".join(f"{_NAMES.get(k, k)} {s:.1%}" for k, s in shares.items() if s)
        if hw_now or hw_share > limit:
            results.append(Result(
                "fail", subject=subject, observed=round(hw_share, 4), evidence=evidence,
                reason=("clocks held down now by " + ", ".join(_NAMES[k] for k in hw_now)
                        if hw_now else "") + ("; " if hw_now and said else "")
                + (f"time in slowdown over the window: {said}" if said else "")))
        elif cap_share > cap_limit or "sw_power_cap" in active:
            results.append(Result(
                "warn", subject=subject, observed=round(hw_share, 4), evidence=evidence,
                reason="the SW power cap holds the clocks down"
                + (f" ({said} of the window)" if said else " now")
                + ": the power limit, not the workload, sets the speed"))
        elif isinstance(w, str) and counters:
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"no slowdown active now, but the time spent in one is "
                                  f"not judged: {w}"))
        else:
            results.append(Result(
                "pass", subject=subject, observed=round(hw_share, 4), evidence=evidence,
                reason="no hardware, thermal or power-brake slowdown"
                + (f" in the {w[1]['window']}" if isinstance(w, tuple) and counters
                   else " active now (no slowdown time counters in this source)")))
    return results
