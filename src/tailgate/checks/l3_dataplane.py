"""Layer 3: the network data plane (RSS, XPS, queue discipline). Pure functions of
(snapshot, params). `l3.alloc.hot_path` is judged in checks/probed.py.
"""

from __future__ import annotations

from typing import Any

from ..judge import Unknown, check, need
from ..model import Result, Snapshot
from ..toeplitz import LAYOUTS, asymmetric_bits, counterexample, flow_hash

RANDOM_FLOWS = 100  # per layout, a cross-check of the exact (linear-algebra) verdict


def _ifaces(snap: Snapshot, index: str) -> list[str]:
    names = need(snap, index)
    if not isinstance(names, list):
        raise Unknown(f"{index}: not a list of interfaces")
    return names


def _no_ifaces() -> list[Result]:
    return [Result("skip", reason="no network interface backed by a device (use --iface)")]


# -- RSS -----------------------------------------------------------------------------------------

def judge_key(key: bytes) -> tuple[bool, dict[str, Any]]:
    """Is the Toeplitz key symmetric for every flow layout it is long enough for?"""
    layouts: dict[str, Any] = {}
    symmetric = True
    for layout in LAYOUTS:
        try:
            bad = asymmetric_bits(key, layout)
        except ValueError as exc:
            layouts[layout] = f"not checked: {exc}"
            continue
        if bad:
            symmetric = False
            flow = counterexample(key, layout, tries=RANDOM_FLOWS)
            entry: dict[str, Any] = {"symmetric": False, "asymmetric_input_bits": len(bad)}
            if flow is not None:
                entry["counterexample"] = {
                    "flow": f"{flow.src} {flow.sport} -> {flow.dst} {flow.dport}",
                    "hash": f"{flow_hash(key, flow):#010x}",
                    "reverse_hash": f"{flow_hash(key, flow.reversed()):#010x}"}
            layouts[layout] = entry
        else:
            # The exact criterion says symmetric; random flows must agree.
            if counterexample(key, layout, tries=RANDOM_FLOWS) is not None:  # pragma: no cover
                raise AssertionError("Toeplitz symmetry criterion disagrees with random flows")
            layouts[layout] = {"symmetric": True, "random_flows_checked": RANDOM_FLOWS}
    if all(isinstance(v, str) for v in layouts.values()):
        raise Unknown(f"RSS key of {len(key)} bytes is too short for any layout")
    return symmetric, layouts


@check("l3.rss.symmetric")
def rss_symmetric(snap: Snapshot, p: dict) -> list[Result]:
    ifaces = _ifaces(snap, "ethtool.rss")
    if not ifaces:
        return _no_ifaces()
    results = []
    for iface in ifaces:
        f = snap.fact(f"ethtool.rss.{iface}")
        if not f.ok:
            results.append(Result("unknown", subject=iface, reason=f.missing))
            continue
        rss = f.value
        funcs = {k for k, on in rss["functions"].items() if on}
        evidence: dict[str, Any] = {"rx_rings": rss["rings"], "table_size": len(rss["table"]),
                                    "hash_functions": sorted(funcs),
                                    "transforms": rss["transforms"], "key": rss["key"]}
        if rss["rings"] <= 1:
            results.append(Result("skip", subject=iface, evidence=evidence,
                                  reason="one RX ring: RSS has nothing to spread"))
            continue
        unknown = rss.get("unknown_bits") or {}
        if unknown:
            evidence["unknown_bits"] = {k: hex(v) for k, v in unknown.items()}
        # Both transformations feed Toeplitz an input that is the same for either direction
        # (XOR of the addresses; 6.15 adds OR plus XOR), so any key hashes symmetrically.
        sym = [t for t in ("symmetric-xor", "symmetric-or-xor") if rss["transforms"].get(t)]
        if sym and "toeplitz" in funcs:
            results.append(Result("pass", subject=iface, evidence=evidence, observed=sym[0],
                                  reason=f"Toeplitz over the {sym[0]} input transformation: "
                                  "both directions hash alike for any key"))
            continue
        if "functions" in unknown and not funcs:
            results.append(Result("unknown", subject=iface, evidence=evidence,
                                  reason=f"the active RSS hash function is one ethtool cannot "
                                  f"name ({unknown['functions']:#x}): symmetry not judged"))
            continue
        if funcs and "toeplitz" not in funcs:
            if funcs == {"xor"}:
                results.append(Result("warn", subject=iface, evidence=evidence, observed="xor",
                                      reason="plain XOR hash: symmetric, but it spreads flows "
                                      "poorly; use Toeplitz with a symmetric key"))
            else:
                results.append(Result("fail", subject=iface, evidence=evidence,
                                      observed=",".join(sorted(funcs)),
                                      reason=f"hash function {', '.join(sorted(funcs))} is not "
                                      "symmetric; use Toeplitz with a symmetric key"))
            continue
        if not rss["key"]:
            results.append(Result("unknown", subject=iface, evidence=evidence,
                                  reason="the driver does not expose the RSS key"))
            continue
        key = bytes.fromhex(rss["key"])
        note = ""
        if not funcs:  # older ethtool prints no "RSS hash function:" block
            note = " [hash function not reported by ethtool: judged as Toeplitz, the default]"
            evidence["note"] = note.strip(" []")
        symmetric, layouts = judge_key(key)
        evidence["layouts"] = layouts
        unchecked = [k for k, v in layouts.items() if isinstance(v, str)]
        if symmetric:
            checked = [k for k in layouts if k not in unchecked]
            scope = ("every flow (IPv4/IPv6, with and without ports)" if not unchecked else
                     f"{', '.join(checked)} flows; not checked: {', '.join(unchecked)} (the key "
                     "is too short for them)")
            results.append(Result("pass", subject=iface, evidence=evidence, observed="symmetric",
                                  reason=f"Toeplitz key is symmetric for {scope}{note}"))
        else:
            bad = [k for k, v in layouts.items() if isinstance(v, dict) and not v["symmetric"]]
            results.append(Result("fail", subject=iface, evidence=evidence, observed="asymmetric",
                                  reason="Toeplitz key is not symmetric: the two directions of a "
                                  f"flow land on different queues ({', '.join(bad)}){note}"))
    return results


# -- XPS -----------------------------------------------------------------------------------------

def _cpus(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


@check("l3.xps.per_core_tx")
def xps_per_core_tx(snap: Snapshot, p: dict) -> list[Result]:
    ifaces = _ifaces(snap, "xps")
    if not ifaces:
        return _no_ifaces()
    results = []
    for iface in ifaces:
        f = snap.fact(f"xps.{iface}")
        if not f.ok:
            results.append(Result("unknown", subject=iface, reason=f.missing))
            continue
        queues, online = f.value["queues"], f.value["online"]
        evidence = {"online_cpus": online, "xps_cpus": queues}
        if all(m is None for m in queues.values()):
            if len(queues) == 1 and len(online) > 1:
                results.append(Result("warn", subject=iface, observed=1, evidence=evidence,
                                      reason=f"one transmit queue shared by all {len(online)} CPUs: "
                                      "the device offers no per-core queues"))
            elif len(queues) == 1:
                results.append(Result("pass", subject=iface, observed=1, evidence=evidence,
                                      reason="one CPU, one transmit queue"))
            else:
                results.append(Result("unknown", subject=iface, evidence=evidence,
                                      reason="xps_cpus absent (kernel without CONFIG_XPS?)"))
            continue
        owners: dict[int, list[str]] = {c: [] for c in online}
        shared = {q: m for q, m in queues.items() if m and len(m) > 1}
        for q, m in queues.items():
            for c in m or []:
                owners.setdefault(c, []).append(q)
        unmapped = [c for c, qs in owners.items() if not qs and c in online]
        multi = {c: qs for c, qs in owners.items() if len(qs) > 1}
        problems = []
        if all(not m for m in queues.values()):
            problems.append("XPS is not configured (every xps_cpus mask is empty): the kernel "
                            "picks queues by flow hash, so CPUs contend for them")
        else:
            if unmapped:
                problems.append(f"CPU(s) {_cpus(unmapped)} map to no transmit queue")
            if multi:
                problems.append("CPU(s) mapped to several queues: "
                                + "; ".join(f"{c}: {', '.join(qs)}" for c, qs in multi.items()))
            if shared:
                problems.append("queue(s) shared by several CPUs: "
                                + "; ".join(f"{q}: {_cpus(m)}" for q, m in shared.items()))
        if len(queues) < len(online):
            evidence["note"] = f"{len(online)} CPUs but {len(queues)} transmit queues"
        if problems:
            results.append(Result("fail", subject=iface, observed=len(shared) + len(unmapped),
                                  evidence=evidence, reason="; ".join(problems)))
        else:
            results.append(Result("pass", subject=iface, observed=0, evidence=evidence,
                                  reason=f"each of {len(online)} CPUs owns its own transmit queue"))
    return results


# -- queue discipline ----------------------------------------------------------------------------

@check("l3.queue.aqm")
def queue_aqm(snap: Snapshot, p: dict) -> list[Result]:
    ifaces = _ifaces(snap, "tc.qdisc")
    if not ifaces:
        return _no_ifaces()
    results = []
    for iface in ifaces:
        f = snap.fact(f"tc.qdisc.{iface}")
        if not f.ok:
            results.append(Result("unknown", subject=iface, reason=f.missing))
            continue
        q = f.value
        evidence: dict[str, Any] = {"root": q["root"], "leaves": q["leaves"]}
        rings = snap.fact(f"ethtool.rings.{iface}")
        evidence["rings"] = rings.value if rings.ok else {"missing": rings.missing}
        kinds = sorted({leaf["kind"] for leaf in q["leaves"]})
        bad = sorted({leaf["kind"] for leaf in q["leaves"] if leaf["class"] != "aqm"})
        observed = ",".join(kinds)
        if not bad:
            results.append(Result("pass", subject=iface, observed=observed, evidence=evidence,
                                  reason=f"active queue management: {observed}"))
            continue
        tail = sorted({leaf["kind"] for leaf in q["leaves"] if leaf["class"] == "tail-drop"})
        if tail:
            reason = f"tail-drop FIFO ({', '.join(tail)}): a full queue drops every arrival"
        elif "noqueue" in bad:
            reason = "no qdisc (noqueue): overflow drops in the driver ring, at the tail"
        else:
            reason = f"{', '.join(bad)}: not an active queue management discipline"
        results.append(Result("warn", subject=iface, observed=observed, evidence=evidence,
                              reason=reason))
    return results
