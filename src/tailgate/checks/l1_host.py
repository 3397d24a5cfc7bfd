"""Layer 1: the host's own hardware errors. Memory ECC from EDAC (``l1.memory.ecc``) and
firmware interrupts (``l1.firmware.smi``). Pure functions of (snapshot, params).

Both are counters judged on their growth over the window (the counter history, else this
run's --interval), as every L1 counter.
"""

from __future__ import annotations

import re
from typing import Any

from ..history import NoWindow, growth
from ..judge import check, need
from ..model import Result, Snapshot
from .ecc import ecc_status


def log_window(snap: Snapshot, name: str) -> tuple[float, str] | str:
    """(the window's start in seconds since boot, description) for a kernel-log fact read
    with its kernel clock (``uptime_s``, ``boot_id``), or why there is none."""
    fact = snap.fact(name)
    if not fact.ok or not isinstance(fact.value, dict):
        return f"kernel log: {fact.missing}"
    now = fact.value
    for then_fact, where in ((snap.earlier.get(name), "since the last stored run"),
                             (snap.before.get(name), "over this run's interval")):
        if then_fact is None or not then_fact.ok or not isinstance(then_fact.value, dict):
            continue
        then = then_fact.value
        if then.get("boot_id") and now.get("boot_id") and then["boot_id"] != now["boot_id"]:
            continue
        start = then.get("uptime_s")
        if isinstance(start, (int, float)) and now.get("uptime_s") is not None \
                and start <= now["uptime_s"]:
            return float(start), f"{now['uptime_s'] - start:.1f} s window {where}"
    return "no earlier reading of the kernel log's clock in this boot"


def log_events(snap: Snapshot, kinds: tuple[str, ...], bdf: str | None = None
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str] | str:
    """(events in the window, untimed events, window) of ``kinds`` (for ``bdf`` when given)
    in the kernel log, or why the log cannot say."""
    w = log_window(snap, "kernel.events")
    if isinstance(w, str):
        return w
    start, desc = w
    events = [e for e in snap.fact("kernel.events").value.get("events", [])
              if e["kind"] in kinds and (bdf is None or e.get("bdf") == bdf)]
    return ([e for e in events if e["t_s"] is not None and e["t_s"] > start],
            [e for e in events if e["t_s"] is None], desc)


_MEMORY_MCE = re.compile(r"memory|dram|dimm|ecc", re.I)


def _memory_from_log(snap: Snapshot, missing: str) -> list[Result]:
    """No EDAC counters: what the kernel log says of memory errors in the window."""
    got = log_events(snap, ("edac_ue", "edac_ce", "mce"))
    if isinstance(got, str):
        return [Result("unknown", subject="host memory", reason=f"{missing}; {got}")]
    inside, untimed, desc = got
    bad = [e for e in inside if e["kind"] == "edac_ue"
           or (e["kind"] == "mce" and _MEMORY_MCE.search(e["text"]))]
    evidence = {"kernel_log": [e["text"] for e in inside[-10:]], "window": desc}
    if bad:
        return [Result("fail", subject="host memory", observed=len(bad), evidence=evidence,
                       reason=f"no EDAC counters ({missing}), but the kernel log has "
                       f"{len(bad)} uncorrectable memory error or memory machine-check "
                       f"line(s) in the {desc}: {bad[-1]['text'][:120]}")]
    return [Result("unknown", subject="host memory", evidence=evidence,
                   reason=f"{missing}; the kernel log has no uncorrectable memory error in the "
                   f"{desc}, but corrected errors are not always logged: not a measurement")]


def _dimm_name(key: str, d: dict[str, Any]) -> str:
    return f"{key} ({d['label']})" if d.get("label") else key


@check("l1.memory.ecc")
def memory_ecc(snap: Snapshot, p: dict) -> list[Result]:
    fact = snap.fact("host.edac")
    if not fact.ok:
        return _memory_from_log(snap, str(fact.missing))
    v = fact.value
    ue_limit = float(p.get("limit", 0))
    ce_limit = float(p.get("correctable_per_hour", 60.0))
    results = []
    for mc in sorted(v["mcs"], key=lambda n: int(n[2:])):
        m = v["mcs"][mc]
        dimms = m.get("dimms") or {}
        since = {"ce": m["ce"], "ue": m["ue"]}
        evidence: dict[str, Any] = {
            "since_driver_load": since,
            "dimms_with_errors": {_dimm_name(k, d): {"ce": d["ce"], "ue": d["ue"]}
                                  for k, d in dimms.items() if d["ce"] or d["ue"]}}
        subject = f"{mc} memory"
        try:
            g = growth(snap, "host.edac", lambda val, mc=mc: {
                "ce": val["mcs"][mc]["ce"], "ue": val["mcs"][mc]["ue"],
                **{f"{k}/ce": d["ce"] for k, d in val["mcs"][mc].get("dimms", {}).items()},
                **{f"{k}/ue": d["ue"] for k, d in val["mcs"][mc].get("dimms", {}).items()}})
        except NoWindow as exc:
            status = "warn" if m["ue"] else "unknown"
            results.append(Result(status, subject=subject, evidence=evidence,
                                  reason=(f"{m['ue']} uncorrectable error(s) since the EDAC "
                                          "driver loaded; " if m["ue"] else "") + str(exc)))
            continue
        ue, ce = g.deltas.get("ue", 0), g.deltas.get("ce", 0)
        status, rate = ecc_status(ue, ce, g.window_s, ue_limit, ce_limit)
        grown = {k.rsplit("/", 1)[0]: n for k, n in g.deltas.items() if "/" in k and n}
        where = ", ".join(_dimm_name(k, dimms.get(k, {})) for k in dict.fromkeys(grown)) \
            or "no DIMM named by the driver"
        evidence.update(window_s=round(g.window_s, 3), window=g.describe(),
                        grown={k: n for k, n in g.deltas.items() if n}, ce_per_hour=round(rate, 1))
        if status == "fail":
            results.append(Result("fail", subject=subject, observed=ue, evidence=evidence,
                                  reason=f"{ue:g} uncorrectable memory error(s) in the "
                                  f"{g.describe()} on {where}"))
        elif status == "warn":
            results.append(Result("warn", subject=subject, observed=ue, evidence=evidence,
                                  reason=f"{ce:g} corrected memory error(s) in the "
                                  f"{g.describe()} ({rate:.0f}/h, over {ce_limit:g}/h) on "
                                  f"{where}: each is a machine-check interrupt that steals "
                                  "a CPU, and a DIMM this noisy is failing"))
        elif m["ue"]:
            results.append(Result("warn", subject=subject, observed=ue, evidence=evidence,
                                  reason=f"no uncorrectable error in the {g.describe()}, but "
                                  f"{m['ue']} since the EDAC driver loaded"))
        else:
            results.append(Result("pass", subject=subject, observed=ue, evidence=evidence,
                                  reason=f"no uncorrectable and {ce:g} corrected memory "
                                  f"error(s) in the {g.describe()} ({rate:.1f}/h)"))
    return results


@check("l1.firmware.smi")
def firmware_smi(snap: Snapshot, p: dict) -> Result:
    v = need(snap, "cpu.smi")
    limit = float(p.get("limit", 0.1))
    if v.get("count") is None:
        return Result("skip", subject="host", evidence=v, reason=v.get("no_msr")
                      or "no SMI counter on this CPU")
    try:
        g = growth(snap, "cpu.smi", lambda val: {"smi": val["count"]})
    except NoWindow as exc:
        return Result("unknown", subject="host", evidence={"since_reset": v["count"]},
                      reason=f"{v['count']} SMIs since reset; {exc}")
    n = g.deltas.get("smi", 0)
    rate = n / g.window_s if g.window_s else 0.0
    evidence = {"since_reset": v["count"], "grown": n, "window_s": round(g.window_s, 3),
                "window": g.describe(), "cpu": v.get("cpu", 0)}
    status = "fail" if rate > limit else "pass"
    return Result(status, subject="host", observed=round(rate, 3), evidence=evidence,
                  reason=f"{n:g} SMI(s) in the {g.describe()} ({rate:.2f}/s"
                  + (f", over {limit:g}/s: every one freezes all CPUs for tens to hundreds "
                     "of microseconds)" if status == "fail" else ")"))
