"""Layer 2: kernel scheduling and I/O stack. Pure functions of (snapshot, params).

(`l2.sched.runqlat`, `l2.tcp.rcvbuf_lock` and `l2.net.syscall_batching` are judged
from eBPF evidence in checks/probed.py.)
"""

from __future__ import annotations

from ..judge import Unknown, check, need
from ..model import ParseError, Result, Snapshot
from ..sources.sysctl import knob_name, parse_ints

MIN_RATE_INTERVAL_S = 0.5


def _cpus(cpus: list[int]) -> str:
    """Compact cpulist: [0,1,2,5] -> '0-2,5'."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _rate_window(snap: Snapshot) -> float:
    if snap.interval_s < MIN_RATE_INTERVAL_S:
        raise Unknown(f"a rate needs two samples apart: interval was {snap.interval_s:.2f} s "
                      f"(use --interval >= {MIN_RATE_INTERVAL_S:g})")
    return snap.interval_s


def _delta(snap: Snapshot, name: str) -> tuple[object, object]:
    return need(snap, name, before=True), need(snap, name)


def _pids(snap: Snapshot) -> list[int]:
    return [int(p) for p in snap.target.get("pids") or []]


# -- cgroup ------------------------------------------------------------------------------------

_THROTTLE_COUNTERS = ("nr_throttled", "nr_periods", "throttled_time", "throttled_usec")


@check("l2.cgroup.throttling")
def cgroup_throttling(snap: Snapshot, p: dict) -> list[Result]:
    names = [n for n in snap.facts if n.startswith("cgroup.")]
    if not names:
        return [Result("skip", reason="no service cgroup given (use --cgroup or --pid)")]
    results = []
    for name in sorted(names):
        fact = snap.fact(name)
        subject = name.removeprefix("cgroup.").replace("target", "cgroup").replace("pid.", "pid ")
        if not fact.ok:
            results.append(Result("unknown", subject=subject, reason=fact.missing))
            continue
        now = fact.value
        subject = now["path"]
        then = snap.before_fact(name)
        stat, quota, period = now["stat"], now.get("quota_us"), now.get("period_us")
        evidence = {"path": now["path"], "cgroup_version": now["version"], "quota_us": quota,
                    "period_us": period, "cpu.stat": stat}
        if "nr_throttled" not in stat:
            if now.get("controller") is False or quota is None:
                results.append(Result("pass", subject=subject, observed=0, evidence=evidence,
                                      reason="no cpu bandwidth controller on this cgroup"))
            else:
                results.append(Result("unknown", subject=subject, evidence=evidence,
                                      reason="cpu.stat has no nr_throttled"))
            continue
        if not then.ok and name in snap.before:  # sampled, but refused or unreadable
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"the earlier sample: {then.missing}"))
            continue
        if not then.ok or snap.interval_s < MIN_RATE_INTERVAL_S:
            # An interval of ~0 s (--interval 0) is no window: whether a period was
            # throttled in it would be chance, not a measurement.
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"needs two samples at least {MIN_RATE_INTERVAL_S:g} s "
                                  "apart (--interval)"))
            continue
        old = then.value["stat"]
        # Two samples of one cgroup hold the same counters: another path, or a counter
        # the earlier sample lacks, is no delta (read as 0 it would be growth since boot).
        lacking = [k for k in _THROTTLE_COUNTERS if k in stat and k not in old]
        if then.value["path"] != now["path"] or lacking:
            why = (f"the earlier sample is of {then.value['path']!r}" if lacking == []
                   else f"the earlier sample's cpu.stat has no {lacking[0]}")
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"{why}: no delta across the interval"))
            continue
        back = [k for k in _THROTTLE_COUNTERS if k in stat and stat[k] < old[k]]
        if back:  # the cgroup was recreated (or the counters reset): no rate across that
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"counter reset: {back[0]} went backwards during the "
                                  f"interval ({old[back[0]]} -> {stat[back[0]]}) in "
                                  f"{now['path']}/cpu.stat"))
            continue
        throttled = stat["nr_throttled"] - old.get("nr_throttled", 0)
        periods = stat.get("nr_periods", 0) - old.get("nr_periods", 0)
        if "nr_periods" in stat and throttled > periods:  # a throttled period is a period
            results.append(Result("unknown", subject=subject, evidence=evidence,
                                  reason=f"implausible: nr_throttled grew by {throttled} but "
                                  f"nr_periods by {periods} in {now['path']}/cpu.stat"))
            continue
        if "throttled_time" in stat:  # v1, ns
            t_ms = (stat["throttled_time"] - old.get("throttled_time", 0)) / 1e6
        else:  # v2, us
            t_ms = (stat.get("throttled_usec", 0) - old.get("throttled_usec", 0)) / 1e3
        evidence.update(interval_s=snap.interval_s, periods_in_interval=periods,
                        throttled_ms_in_interval=round(t_ms, 3))
        quota_text = (f"hard CPU quota {quota / 1000:g} ms per {period / 1000:g} ms "
                      f"({quota / period:.2f} CPU)" if quota else "")
        if throttled > p["limit"]:
            results.append(Result(
                "fail", subject=subject, observed=throttled, evidence=evidence,
                reason=f"throttled in {throttled} of {periods} periods over {snap.interval_s:.1f} s "
                       f"({t_ms:.1f} ms stalled); {quota_text}".rstrip("; ")))
        elif quota:
            results.append(Result("warn", subject=subject, observed=throttled, evidence=evidence,
                                  reason=f"{quota_text}: not throttled in the interval, "
                                         f"but a burst will be"))
        else:
            results.append(Result("pass", subject=subject, observed=throttled, evidence=evidence,
                                  reason="no CPU quota, no throttling in the interval"))
    return results


# -- NUMA and IRQ placement -------------------------------------------------------------------

def _service_and_nics(snap: Snapshot) -> tuple[list[tuple[int, dict]], list[dict], list[Result]]:
    """(pid, status) pairs and NIC infos, plus unknowns for what could not be read."""
    problems: list[Result] = []
    procs = []
    for pid in _pids(snap):
        fact = snap.fact(f"proc.{pid}.status")
        if fact.ok:
            procs.append((pid, fact.value))
        else:
            problems.append(Result("unknown", subject=f"pid {pid}", reason=fact.missing))
    nics = []
    for iface in need(snap, "nic"):
        fact = snap.fact(f"nic.{iface}")
        if not fact.ok:
            problems.append(Result("unknown", subject=iface, reason=fact.missing))
        elif not fact.value.get("virtual"):
            nics.append(fact.value)
    return procs, nics, problems


def _memory_nodes(policies: dict[str, int], mems: set[int], local: int) -> dict[str, set[int]]:
    """Per memory policy in force, the nodes it may allocate from. default/local allocate on
    the node of the CPU the thread runs on: ``local`` when its CPUs are all local."""
    from ..sources.process import parse_policy

    out = {}
    for text in policies:
        pol = parse_policy(text)
        nodes = set(pol["nodes"] or ())
        if pol["mode"] in ("default", "local") or not nodes:
            out[text] = {local}
        elif pol["mode"] in ("bind", "interleave", "weighted interleave"):
            out[text] = (nodes & mems) or nodes  # the cpuset narrows a strict policy
        else:  # prefer, prefer (many): first choice, may spill elsewhere when full
            out[text] = nodes
    return out


def _memory_result(pid: int, subject: str, st: dict, nic_node: int, ev: dict,
                   maps) -> Result:
    """CPUs are on the NIC's node: judge where memory may come from."""
    mems = set(st["mems_allowed"])
    if mems and mems <= {nic_node}:
        return Result("pass", subject=subject, observed=nic_node, evidence=ev,
                      reason="CPUs on the NIC's node; the cpuset allows memory there only")
    if not maps.ok:
        return Result("unknown", subject=subject, evidence=ev,
                      reason=f"CPUs on the NIC's node, but the memory policy is unknown "
                             f"({maps.missing}); the cpuset allows nodes {_cpus(sorted(mems))}")
    ev["memory_policies"] = maps.value["policies"]
    ev["resident_bytes_per_node"] = maps.value["resident_bytes"]
    by_policy = _memory_nodes(maps.value["policies"], mems, nic_node)
    remote = {t: sorted(n - {nic_node}) for t, n in by_policy.items() if n - {nic_node}}
    names = ", ".join(sorted(by_policy))
    if not remote:
        return Result("pass", subject=subject, observed=nic_node, evidence=ev,
                      reason=f"CPUs on the NIC's node {nic_node}; memory policy {names} "
                             "allocates there")
    only_remote = [t for t, n in by_policy.items() if nic_node not in n]
    bad = "; ".join(f"{t} may allocate on node(s) {_cpus(n)}" for t, n in sorted(remote.items()))
    return Result("fail" if only_remote else "warn", subject=subject,
                  observed=_cpus(sorted({x for n in remote.values() for x in n})), evidence=ev,
                  reason=f"CPUs are on the NIC's node {nic_node}, but memory policy {bad}",
                  remedy=f"numactl --membind={nic_node} --cpunodebind={nic_node} for the service "
                         f"(or migratepages {pid} all {nic_node})")


def _gpu_results(snap: Snapshot, procs: list[tuple[int, dict]], devices: dict) -> list[Result]:
    """Each GPU a service process holds open against the CPUs it may run on."""
    results = []
    for pid, st in procs:
        held = snap.fact(f"proc.{pid}.gpus")
        if not held.ok:
            results.append(Result("unknown", subject=f"pid {pid} / GPUs",
                                  reason=f"which GPUs it uses is unknown: {held.missing}"))
            continue
        for dev in held.value.get("unresolved", []):
            results.append(Result("unknown", subject=f"pid {pid} / {dev}",
                                  reason=f"{dev} is open but its PCI address is unknown"))
        for bdf in held.value.get("gpus", []):
            gpu = devices.get(bdf, {})
            subject = f"pid {pid} / GPU {bdf}"
            node, local = gpu.get("numa_node"), gpu.get("local_cpus")
            ev = {"pid": pid, "gpu": bdf, "gpu_numa_node": node,
                  "gpu_local_cpus": _cpus(local) if local else None,
                  "cpus_allowed": _cpus(st["cpus_allowed"])}
            if node is None or node < 0 or not local:
                results.append(Result("unknown", subject=subject, evidence=ev,
                                      reason="the GPU reports no NUMA node or local CPUs"))
                continue
            remote = sorted(set(st["cpus_allowed"]) - set(local))
            if remote:
                results.append(Result(
                    "fail", subject=subject, observed=_cpus(remote), evidence=ev,
                    reason=f"may run on CPUs {_cpus(remote)} off the GPU's node {node}: "
                           "host-device copies cross the socket interconnect",
                    remedy=f"taskset -pc {_cpus(local)} {pid}; numactl --cpunodebind={node} "
                           f"--membind={node} for new processes"))
            else:
                results.append(Result("pass", subject=subject, observed=node, evidence=ev,
                                      reason=f"CPUs on the GPU's node {node}"))
    return results


@check("l2.numa.affinity")
def numa_affinity(snap: Snapshot, p: dict) -> list[Result]:
    if not _pids(snap):
        return [Result("skip", reason="no service process given (use --pid)")]
    procs, nics, results = _service_and_nics(snap)
    devices_f = snap.fact("pci.devices")
    devices = devices_f.value if devices_f.ok and isinstance(devices_f.value, dict) else {}
    has_gpus = any(e.get("kind") in ("gpu", "accelerator") for e in devices.values())
    if not nics and not has_gpus and not results:
        return [Result("skip", reason="no physical network interface or GPU on this host")]
    nodes = need(snap, "numa.nodes")
    if len(nodes) <= 1:
        return results + [Result("pass", subject=f"pid {pid}", observed=nodes[0] if nodes else 0,
                                 reason="single NUMA node: everything is local")
                          for pid, _ in procs]
    for pid, st in procs:
        maps = snap.fact(f"proc.{pid}.numa_maps")
        for nic in nics:
            subject = f"pid {pid} / {nic['iface']}"
            ev = {"pid": pid, "process": st["name"], "cpus_allowed": _cpus(st["cpus_allowed"]),
                  "mems_allowed": _cpus(st["mems_allowed"]), "nic_numa_node": nic["numa_node"],
                  "nic_local_cpus": _cpus(nic.get("local_cpus") or []), "numa_nodes": _cpus(nodes)}
            if nic["numa_node"] is None or nic["numa_node"] < 0:
                results.append(Result("unknown", subject=subject, evidence=ev,
                                      reason="the NIC reports no NUMA node (numa_node -1)"))
                continue
            remote_cpus = sorted(set(st["cpus_allowed"]) - set(nic.get("local_cpus") or []))
            if remote_cpus:
                results.append(Result(
                    "fail", subject=subject, observed=_cpus(remote_cpus), evidence=ev,
                    reason=f"may run on CPUs {_cpus(remote_cpus)} off the NIC's node "
                           f"{nic['numa_node']}",
                    remedy=f"taskset -pc {_cpus(nic.get('local_cpus') or [])} {pid}; "
                           f"numactl --membind={nic['numa_node']} for new processes"))
            else:
                results.append(_memory_result(pid, subject, st, nic["numa_node"], ev, maps))
    if has_gpus:
        results += _gpu_results(snap, procs, devices)
    if not results:
        return [Result("skip", reason="no physical network interface, and no GPU held open "
                                      "by the service")]
    return results


def _siblings(snap: Snapshot, cpus: list[int]) -> tuple[dict[int, list[int]] | None, str]:
    """Each CPU's hyperthread siblings (itself excluded), or None with the reason."""
    fact = snap.fact("cpu.siblings")
    if not fact.ok:
        return None, f"hyperthread siblings unknown ({fact.missing})"
    table = {int(k): v for k, v in fact.value.items()}
    return {c: [s for s in table.get(c, [c]) if s != c] for c in cpus}, ""


def _rps(snap: Snapshot, iface: str) -> tuple[list[int] | None, dict, str]:
    """The CPUs RPS/RFS may run this NIC's NET_RX softirqs on, evidence, and a problem."""
    fact = snap.fact(f"rps.{iface}")
    if not fact.ok:
        return None, {}, f"RPS masks of {iface} unreadable ({fact.missing})"
    masks = fact.value["rps_cpus"]
    cpus = sorted({c for m in masks.values() if m for c in m})
    ev = {"rps_cpus": _cpus(cpus) if cpus else "none",
          "rps_flow_cnt": fact.value.get("rps_flow_cnt")}
    entries = snap.fact(knob_name("net/core/rps_sock_flow_entries"))
    if entries.ok:
        ev["rps_sock_flow_entries"] = entries.value
    return cpus, ev, ""


@check("l2.irq.isolation")
def irq_isolation(snap: Snapshot, p: dict) -> list[Result]:
    """Physically isolated: no NIC IRQ and no RPS/RFS softirq CPU on a service CPU or on a
    hyperthread sibling of one (siblings share the core's pipeline and L1/L2 caches)."""
    if not _pids(snap):
        return [Result("skip", reason="no service process given (use --pid)")]
    procs, nics, results = _service_and_nics(snap)
    if not nics and not results:
        return [Result("skip", reason="no physical network interface on this host")]
    softirqs = snap.fact("proc.softirqs")
    before = snap.before_fact("proc.softirqs")
    net_rx = None
    if softirqs.ok and before.ok and "NET_RX" in softirqs.value:
        net_rx = [a - b for a, b in zip(softirqs.value["NET_RX"], before.value.get("NET_RX", []),
                                        strict=False)]
        if any(d < 0 for d in net_rx):  # reset during the interval: no evidence from it
            net_rx = None
    for nic in nics:
        if not nic["irqs"]:
            # An unreadable /proc/interrupts is said as such: its IRQs may be there.
            why = nic.get("interrupts_error")
            results.append(Result("unknown", subject=nic["iface"],
                                  reason=f"{why}: the IRQs of this interface cannot be found"
                                  if why else "no IRQs found for this interface"))
            continue
        unreadable = [i for i, cpus in nic["irq_affinity"].items() if cpus is None]
        irq_cpus = sorted({c for cpus in nic["irq_affinity"].values() if cpus for c in cpus})
        rps_cpus, rps_ev, rps_problem = _rps(snap, nic["iface"])
        for pid, st in procs:
            subject = f"pid {pid} / {nic['iface']}"
            service = sorted(st["cpus_allowed"])
            siblings, sib_problem = _siblings(snap, service)
            ev = {"pid": pid, "process": st["name"], "service_cpus": _cpus(service),
                  "nic_irqs": nic["irq_names"] if "irq_names" in nic else nic["irqs"],
                  "irq_cpus": _cpus(irq_cpus),
                  "irq_affinity": {k: _cpus(v) if v else None for k, v in nic["irq_affinity"].items()},
                  **rps_ev}
            if siblings is not None:
                ev["service_core_siblings"] = _cpus(sorted({s for v in siblings.values() for s in v}))
            if net_rx is not None:
                ev["net_rx_softirqs_in_interval_per_cpu"] = net_rx
            probed = snap.fact("probe.softirq")
            if probed.ok:  # eBPF-measured NET_RX time per CPU, with --probe-window
                ev["net_rx_softirq_time_per_cpu"] = probed.value.get("cpus")
            sibling_cpus = set() if siblings is None else {s for v in siblings.values() for s in v}
            sibling_cpus -= set(service)
            problems = []
            for what, cpus in (("NIC IRQs", irq_cpus), ("RPS/RFS softirqs", rps_cpus or [])):
                same = sorted(set(cpus) & set(service))
                near = sorted(set(cpus) & sibling_cpus)
                if same:
                    problems.append(f"{what} may run on the service's CPUs {_cpus(same)}")
                if near:
                    problems.append(f"{what} may run on CPUs {_cpus(near)}, hyperthread siblings "
                                    "of the service's CPUs (the same physical core)")
            if problems:
                shared = sorted((set(irq_cpus) | set(rps_cpus or [])) & (set(service) | sibling_cpus))
                results.append(Result(
                    "fail", subject=subject, observed=_cpus(shared), evidence=ev,
                    reason="; ".join(problems),
                    remedy="echo CPUS > /proc/irq/N/smp_affinity_list for each NIC IRQ (and ban "
                           "them in irqbalance), clear or move rps_cpus of the NIC's rx queues, "
                           "on physical cores the service does not use (neither CPU of a "
                           "hyperthread pair); pin the service to the other cores"))
                continue
            missing = [m for m in (rps_problem, sib_problem) if m]
            if unreadable:
                missing.insert(0, f"affinity of IRQs {','.join(unreadable)} unreadable")
            if nic.get("interrupts_error"):  # IRQs named only in /proc/interrupts may be missing
                missing.append(f"the NIC's IRQs may be incomplete: {nic['interrupts_error']}")
            if missing:
                results.append(Result("unknown", subject=subject, evidence=ev,
                                      reason="; ".join(missing) + ": physical isolation cannot "
                                             "be confirmed"))
            else:
                results.append(Result(
                    "pass", subject=subject, observed="", evidence=ev,
                    reason=f"NIC IRQs on CPUs {_cpus(irq_cpus)}"
                           + (f", RPS on {_cpus(rps_cpus)}" if rps_cpus else ", no RPS")
                           + ": no service CPU and no sibling of one"))
    return results


# -- TCP/IP ------------------------------------------------------------------------------------

@check("l2.net.congestion_control")
def congestion_control(snap: Snapshot, p: dict) -> Result:
    algo = need(snap, knob_name("net/ipv4/tcp_congestion_control")).strip()
    if not algo:
        raise Unknown("net.ipv4.tcp_congestion_control is empty")
    avail_fact = snap.fact(knob_name("net/ipv4/tcp_available_congestion_control"))
    evidence = {"tcp_congestion_control": algo,
                "available": avail_fact.value if avail_fact.ok else avail_fact.missing}
    if algo in p["preferred"]:
        if algo != "bbr":
            return Result("pass", subject="default", observed=algo, evidence=evidence)
        # The red line is BBRv3: only a declared version 3 passes, v1 is at most a warn.
        bbr = snap.fact("kernel.tcp_bbr")
        evidence["bbr"] = bbr.value if bbr.ok else bbr.missing
        if not bbr.ok:
            return Result("unknown", subject="default", observed="bbr", evidence=evidence,
                          reason=f"BBR is the default, but which BBR is unknown ({bbr.missing}); "
                                 "only BBRv3 passes, v1 is a warn")
        version = bbr.value.get("version")
        major = str(version).split(".")[0] if version else None
        if major == "3":
            return Result("pass", subject="default", observed="bbr v3", evidence=evidence,
                          reason=f"BBRv3 ({bbr.value.get('source')})")
        declared = f"version {version}" if version else "no module version: mainline BBR v1"
        return Result("warn", subject="default", observed=f"bbr v{major or 1}", evidence=evidence,
                      reason=f"BBR v{major or 1} ({bbr.value.get('source')}: {declared}); the red "
                             "line is BBRv3, which keeps queues short under loss and shares "
                             "fairly with other flows",
                      remedy="Run a kernel carrying BBRv3 (google/bbr v3 branch, or a distribution "
                             "kernel that ships it) and keep net.ipv4.tcp_congestion_control=bbr.")
    hint = "bbr is available" if "bbr" in str(evidence["available"]).split() else \
        "bbr is not available (modprobe tcp_bbr)"
    return Result("fail", subject="default", observed=algo, evidence=evidence,
                  reason=f"loss-based {algo} is the default; {hint}")


def _grown(before: int, after: int, what: str, source: str) -> int:
    """Growth of one counter over the interval. A counter that went backwards was reset
    (a driver reload, a namespace recreated, a wrapped 32-bit counter): there is no rate
    across a reset, so the finding is unknown and says which counter and where."""
    if after < before:
        raise Unknown(f"counter reset: {what} went backwards during the interval "
                      f"({before} -> {after}) in {source}; no rate across a reset")
    return after - before


def _dev_grown(d0: dict, d1: dict, iface: str, field: str) -> int:
    return _grown(d0[iface][field], d1[iface][field], f"{iface} {field}", "/proc/net/dev")


def _snmp_grown(s0: dict, s1: dict, proto: str, key: str, source: str = "/proc/net/snmp") -> int:
    for which, sample in (("the earlier", s0), ("the later", s1)):
        if key not in sample.get(proto, {}):
            raise Unknown(f"{source}: no {proto} {key} in {which} sample")
    return _grown(s0[proto][key], s1[proto][key], f"{proto} {key}", source)


@check("l2.net.drop_rate")
def drop_rate(snap: Snapshot, p: dict) -> Result:
    window = _rate_window(snap)
    dev0, dev1 = _delta(snap, "net.dev")
    snmp0, snmp1 = _delta(snap, "net.snmp")
    soft0, soft1 = _delta(snap, "net.softnet")
    common = sorted(set(dev0) & set(dev1))
    per_iface = {k: {f: _dev_grown(dev0, dev1, k, f) for f in
                     ("rx_packets", "tx_packets", "rx_drop", "tx_drop", "rx_fifo", "tx_fifo")}
                 for k in common}
    for k in common:  # every packet has bytes: more packets than bytes is no count
        for d in ("rx", "tx"):
            if f"{d}_bytes" not in dev0[k] or f"{d}_bytes" not in dev1[k]:
                continue
            grown = _dev_grown(dev0, dev1, k, f"{d}_bytes")
            if per_iface[k][f"{d}_packets"] > grown:
                raise Unknown(f"implausible: {k} {d}_packets grew by "
                              f"{per_iface[k][f'{d}_packets']} but {d}_bytes by {grown} in "
                              "/proc/net/dev")
    packets = sum(r["rx_packets"] + r["tx_packets"] for r in per_iface.values())
    parts = {
        "interface_drops": sum(r["rx_drop"] + r["tx_drop"] for r in per_iface.values()),
        "interface_fifo": sum(r["rx_fifo"] + r["tx_fifo"] for r in per_iface.values()),
        "softnet_backlog_drops": _grown(sum(r["dropped"] for r in soft0),
                                        sum(r["dropped"] for r in soft1),
                                        "dropped", "/proc/net/softnet_stat"),
        "ip_in_discards": _snmp_grown(snmp0, snmp1, "Ip", "InDiscards"),
        "ip_out_discards": _snmp_grown(snmp0, snmp1, "Ip", "OutDiscards"),
    }
    if "Udp" in snmp1 and "RcvbufErrors" in snmp1["Udp"]:
        parts["udp_rcvbuf_errors"] = _snmp_grown(snmp0, snmp1, "Udp", "RcvbufErrors")
    drops = sum(parts.values())
    evidence = {"interval_s": window, "packets": packets, **parts,
                "softnet_time_squeeze": _grown(sum(r["time_squeeze"] for r in soft0),
                                               sum(r["time_squeeze"] for r in soft1),
                                               "time_squeeze", "/proc/net/softnet_stat"),
                "per_interface": {k: {f: r[f] for f in
                                      ("rx_packets", "tx_packets", "rx_drop", "tx_drop")}
                                  for k, r in per_iface.items()}}
    if packets <= 0:
        raise Unknown(f"no packets in the {window:.1f} s interval: the drop rate is undefined")
    rate = 100.0 * drops / packets
    status = "fail" if rate >= p["limit"] else "pass"
    worst = max(parts, key=parts.get)
    reason = (f"{drops} drops in {packets} packets over {window:.1f} s (mostly {worst})"
              if drops else f"no drops in {packets} packets over {window:.1f} s")
    return Result(status, subject="host", observed=round(rate, 6), evidence=evidence, reason=reason)


@check("l2.net.retransmit_rate")
def retransmit_rate(snap: Snapshot, p: dict) -> Result:
    window = _rate_window(snap)
    s0, s1 = _delta(snap, "net.snmp")
    out_segs = _snmp_grown(s0, s1, "Tcp", "OutSegs")
    retrans = _snmp_grown(s0, s1, "Tcp", "RetransSegs")
    evidence: dict = {"interval_s": window, "OutSegs": out_segs, "RetransSegs": retrans}
    nst = snap.fact("net.netstat")
    nst0 = snap.before_fact("net.netstat")
    if nst.ok and nst0.ok and "TcpExt" in nst.value:
        for key in ("TCPTimeouts", "TCPLostRetransmit", "TCPFastRetrans", "TCPSynRetrans"):
            if key in nst.value["TcpExt"]:
                then, now = nst0.value.get("TcpExt", {}).get(key, 0), nst.value["TcpExt"][key]
                # evidence only: a reset one is shown as such, not as a negative count
                evidence[key] = now - then if now >= then else "reset during the interval"
    if out_segs <= 0:
        raise Unknown(f"no TCP segments sent in the {window:.1f} s interval")
    rate = 100.0 * retrans / out_segs
    return Result("fail" if rate > p["limit"] else "pass", subject="host",
                  observed=round(rate, 6), evidence=evidence,
                  reason=f"{retrans} of {out_segs} segments retransmitted over {window:.1f} s")


@check("l2.tcp.moderate_rcvbuf")
def moderate_rcvbuf(snap: Snapshot, p: dict) -> Result:
    raw = need(snap, knob_name("net/ipv4/tcp_moderate_rcvbuf"))
    try:
        value = int(raw)
    except ValueError as exc:
        raise Unknown(f"tcp_moderate_rcvbuf is not an integer: {raw!r}") from exc
    ok = value == p["limit"]
    return Result("pass" if ok else "fail", subject="net.ipv4.tcp_moderate_rcvbuf", observed=value,
                  reason="" if ok else "receive-buffer autotuning is off")


@check("l2.tcp.mem_sizing")
def mem_sizing(snap: Snapshot, p: dict) -> Result:
    try:
        tcp_mem = parse_ints(need(snap, knob_name("net/ipv4/tcp_mem")), 3)
        tcp_rmem = parse_ints(need(snap, knob_name("net/ipv4/tcp_rmem")), 3)
    except ParseError as exc:
        raise Unknown(str(exc)) from exc
    page = need(snap, "hw.page_size")
    total = need(snap, "proc.meminfo")["MemTotal"]
    cap = tcp_mem[2] * page
    frac = cap / total
    windows = cap / tcp_rmem[2] if tcp_rmem[2] else float("inf")
    evidence = {"tcp_mem_pages": tcp_mem, "page_size": page, "tcp_mem_max_bytes": cap,
                "mem_total_bytes": total, "tcp_rmem": tcp_rmem,
                "full_receive_windows_within_tcp_mem": round(windows, 1)}
    observed = round(100 * frac, 2)
    if frac > p["max_fraction"]:
        return Result("fail", subject="tcp_mem", observed=observed, evidence=evidence,
                      reason=f"TCP may take {100 * frac:.1f} % of RAM before pressure: a "
                             f"connection burst can reach the OOM killer first "
                             f"(limit {100 * p['max_fraction']:g} %)")
    if frac < p["min_fraction"]:
        return Result("warn", subject="tcp_mem", observed=observed, evidence=evidence,
                      reason=f"tcp_mem max is only {100 * frac:.2f} % of RAM: TCP enters "
                             "memory pressure early and shrinks every window")
    if windows < p["min_full_windows"]:
        return Result("warn", subject="tcp_rmem", observed=observed, evidence=evidence,
                      reason=f"only {windows:.0f} sockets can reach tcp_rmem max "
                             f"({tcp_rmem[2]} B) within tcp_mem (want {p['min_full_windows']})")
    return Result("pass", subject="tcp_mem", observed=observed, evidence=evidence,
                  reason=f"tcp_mem max {cap / 2**20:.0f} MiB = {100 * frac:.1f} % of RAM; "
                         f"{windows:.0f} full receive windows fit")


# -- io_uring ----------------------------------------------------------------------------------

@check("l2.io.io_uring")
def io_uring(snap: Snapshot, p: dict) -> list[Result]:
    pids = _pids(snap)
    if not pids:
        return [Result("skip", reason="no service process given (use --pid)")]
    disabled = snap.fact(knob_name("kernel/io_uring_disabled"))
    if disabled.ok and disabled.value.strip() == "2":
        return [Result("skip", reason="io_uring is disabled on this kernel (io_uring_disabled=2)")]
    results = []
    for pid in pids:
        fact = snap.fact(f"proc.{pid}.io_uring")
        subject = f"pid {pid}"
        if not fact.ok:
            results.append(Result("unknown", subject=subject, reason=fact.missing))
            continue
        rings = fact.value
        ev = {"rings": rings}
        if not rings:
            # epoll (nginx, Envoy, most servers) is a healthy, conventional design: this red
            # line judges how rings are set up, and gates on their absence only when asked.
            if p.get("require_ring"):
                results.append(Result("warn", subject=subject, observed=0, evidence=ev,
                                      reason="no io_uring ring: every I/O is a syscall "
                                      "(the baseline sets require_ring)"))
            else:
                results.append(Result("skip", subject=subject, observed=0, evidence=ev,
                                      reason="no io_uring ring (epoll or plain syscalls): "
                                      "nothing to judge; `require_ring: true` in the baseline "
                                      "warns on it"))
            continue
        lacking = []
        if not all(r["sqpoll"] for r in rings):
            lacking.append("SQPOLL")
        if not all(r["user_bufs"] for r in rings):
            lacking.append("registered buffers")
        if lacking:
            results.append(Result("warn", subject=subject, observed=len(rings), evidence=ev,
                                  reason=f"{len(rings)} ring(s) without {' and '.join(lacking)}"))
        else:
            results.append(Result("pass", subject=subject, observed=len(rings), evidence=ev,
                                  reason=f"{len(rings)} ring(s) with SQPOLL and registered buffers"))
    return results
