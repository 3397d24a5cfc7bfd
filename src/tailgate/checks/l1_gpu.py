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
from ..sources.gpu import TAIL_CLASSES, XID

_NO_GPU = "no NVIDIA GPU on this host (and no --dcgm URL)"


def _health(snap: Snapshot) -> tuple[dict[str, Any], str]:
    h = need(snap, "gpu.health")
    if not isinstance(h, dict) or not isinstance(h.get("gpus"), dict):
        raise Unknown("gpu.health: not a mapping of GPUs")
    return h["gpus"], str(h.get("source") or "")


def _window(snap: Snapshot, pick: Any) -> tuple[dict[str, float], dict[str, Any]] | str:
    """Growth of ``pick(gpu.health)``, or why there is no window."""
    try:
        g = growth(snap, "gpu.health", pick)
    except NoWindow as exc:
        return str(exc)
    return g.deltas, {"window_s": round(g.window_s, 3), "window": g.describe()}


def _gpu(v: dict[str, Any], bdf: str) -> dict[str, Any]:
    return v["gpus"][bdf]


# -- Xid -----------------------------------------------------------------------------------------

def xid_meaning(code: int) -> tuple[str, str]:
    return XID.get(code, (f"Xid {code} (not in tailgate's table: see NVIDIA's Xid catalog)",
                          "unlisted"))


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


@check("l1.gpu.xid")
def gpu_xid(snap: Snapshot, p: dict) -> list[Result]:
    v = need(snap, "gpu.xid")
    gpus = v.get("gpus") or []
    if not gpus:
        return [Result("skip", reason=_NO_GPU)]
    window = _xid_window(snap, v)
    events = v.get("events") or []
    results = []
    for bdf in sorted(set(gpus) | {e["bdf"] for e in events}):
        mine = [e for e in events if e["bdf"] == bdf]
        since_boot: dict[int, int] = {}
        for e in mine:
            since_boot[e["code"]] = since_boot.get(e["code"], 0) + 1
        evidence: dict[str, Any] = {"since_boot": {str(k): n for k, n in sorted(since_boot.items())},
                                    "source": "kernel log (dmesg)"}
        subject = f"{bdf} gpu"
        if isinstance(window, str):
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"{window}; {len(mine)} Xid event(s) in the kernel log "
                                  "since boot"))
            continue
        start, desc = window
        evidence["window"] = desc
        untimed = [e for e in mine if e["t_s"] is None]
        inside = [e for e in mine if e["t_s"] is not None and e["t_s"] > start]
        evidence["in_window"] = [{"t_s": e["t_s"], "code": e["code"],
                                  "meaning": xid_meaning(e["code"])[0],
                                  "class": xid_meaning(e["code"])[1], "text": e["text"]}
                                 for e in inside[-20:]]
        codes = sorted({e["code"] for e in inside})
        said = ", ".join(f"Xid {c} {xid_meaning(c)[0]}" for c in codes)
        tail = [c for c in codes if xid_meaning(c)[1] in (*TAIL_CLASSES, "unlisted")]
        if untimed and not inside:
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"{len(untimed)} Xid event(s) without a timestamp "
                                  "(printk.time=0): cannot tell whether they fall in the window"))
        elif tail:
            results.append(Result("fail", subject=subject, observed=len(inside), evidence=evidence,
                                  reason=f"{len(inside)} Xid event(s) in the {desc}: {said}"))
        elif inside:
            results.append(Result("warn", subject=subject, observed=len(inside), evidence=evidence,
                                  reason=f"application Xid event(s) in the {desc}: {said} (the "
                                  "program faulted, not the GPU)"))
        else:
            results.append(Result("pass", subject=subject, observed=0, evidence=evidence,
                                  reason=f"no Xid event in the {desc}"
                                  + (f" ({len(mine)} earlier in this boot)" if mine else "")))
    return results


# -- ECC -----------------------------------------------------------------------------------------

def _ecc_volatile(v: dict[str, Any], bdf: str) -> dict[str, int]:
    return _gpu(v, bdf).get("ecc", {}).get("volatile", {})


@check("l1.gpu.ecc")
def gpu_ecc(snap: Snapshot, p: dict) -> list[Result]:
    gpus, source = _health(snap)
    if not gpus:
        return [Result("skip", reason=_NO_GPU)]
    limit = float(p.get("limit", 0))
    corr_limit = float(p.get("correctable_per_hour", 0))
    results = []
    for bdf in sorted(gpus):
        g = gpus[bdf]
        subject = f"{bdf} gpu"
        ecc = g.get("ecc") or {}
        evidence: dict[str, Any] = {"source": source, "ecc_mode": g.get("ecc_mode"), "ecc": ecc}
        if g.get("ecc_mode") == "Disabled":
            results.append(Result("skip", subject=subject, evidence=evidence,
                                  reason="ECC is disabled on this GPU (nvidia-smi -e 1 and a "
                                  "reset enable it)"))
            continue
        if not ecc.get("volatile"):
            results.append(Result("skip", subject=subject, evidence=evidence,
                                  reason="no ECC error counters (a GPU without ECC memory, "
                                  "or every counter N/A)"))
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
        rate = corr * 3600.0 / win["window_s"] if win["window_s"] else 0.0
        if unc > limit:
            results.append(Result("fail", subject=subject, observed=unc, evidence=evidence,
                                  reason=f"{unc:g} uncorrectable ECC error(s) in the "
                                  f"{win['window']}"))
        elif rate > corr_limit:
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
    if not gpus:
        return [Result("skip", reason=_NO_GPU)]
    results = []
    for bdf in sorted(gpus):
        g = gpus[bdf]
        subject = f"{bdf} gpu"
        rr, rp = g.get("remapped_rows"), g.get("retired_pages")
        evidence = {"source": source, "remapped_rows": rr, "retired_pages": rp}
        if not rr and not rp:
            results.append(Result("skip", subject=subject, evidence=evidence,
                                  reason="neither row remapping nor page retirement reported "
                                  "(a GPU without ECC memory)"))
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
               if k in ("single_bit", "double_bit")}})
        if isinstance(w, str):
            evidence["window"] = w
        else:
            deltas, win = w
            evidence.update(win, grown=deltas)
            grown = {k: n for k, n in deltas.items() if n}
            if grown.get("rows_uncorrectable") or grown.get("pages_double_bit"):
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
    if not gpus:
        return [Result("skip", reason=_NO_GPU)]
    limit = float(p.get("limit", 0))
    results = []
    for bdf in sorted(gpus):
        g = gpus[bdf]
        subject = f"{bdf} gpu"
        links, states = g.get("nvlink") or {}, g.get("nvlink_state") or {}
        totals = g.get("nvlink_total") or {}
        evidence: dict[str, Any] = {"source": source, "links": links, "state": states}
        unreadable = (g.get("unreadable") or {}).get("nvlink")
        if not links and not totals and not states:
            if unreadable:
                results.append(Result("unknown", subject=subject, reason=unreadable))
            else:
                results.append(Result("skip", subject=subject, evidence=evidence,
                                      reason="no NVLink on this GPU"))
            continue
        w = _window(snap, lambda val, b=bdf: _gpu(val, b).get("nvlink")
                    or _gpu(val, b).get("nvlink_total") or {})
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


@check("l1.gpu.clock_events")
def gpu_clock_events(snap: Snapshot, p: dict) -> list[Result]:
    gpus, source = _health(snap)
    if not gpus:
        return [Result("skip", reason=_NO_GPU)]
    limit = float(p.get("limit", 0.0))  # share of the window in hardware/thermal slowdown
    cap_limit = float(p.get("power_cap_share", 0.05))
    results = []
    for bdf in sorted(gpus):
        g = gpus[bdf]
        subject = f"{bdf} gpu"
        active = [k for k, on in (g.get("clock_events") or {}).items() if on]
        counters = g.get("clock_event_us") or g.get("violation_us") or {}
        evidence: dict[str, Any] = {"source": source, "active": active, "counters_us": counters}
        if not g.get("clock_events") and not counters:
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason="no clock event reasons reported for this GPU"))
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
