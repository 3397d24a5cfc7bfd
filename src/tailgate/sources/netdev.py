"""Network interfaces in sysfs: driver, NUMA locality and the IRQs that serve them.

A NIC's IRQs are found two ways and merged: the PCI function's ``msi_irqs``
directory (exact, any driver), and the action names in /proc/interrupts, which
each driver spells its own way:

=========  =============================================
virtio     ``virtio2-input.0``, ``virtio2-output.0`` (the virtio device name)
mlx5       ``mlx5_comp3@pci:0000:08:00.0`` (the PCI address)
ixgbe/i40e/ice/bnxt  ``eth0-TxRx-3`` (the interface name)
ena        ``eth0-Tx-Rx-3``; gve ``gve-ntfy-blk3@pci:0000:00:04.0``
=========  =============================================
"""

from __future__ import annotations

import posixpath

from ..collect import Scope, collector, crash_fact
from ..host import Host
from ..model import Fact, SourceError
from .procfs import parse_interrupts
from .records import is_uint, parse_cpulist, parse_cpumask

_PCI_ADDR_LEN = len("0000:00:00.0")


def _is_pci_addr(name: str) -> bool:
    return len(name) == _PCI_ADDR_LEN and name[4] == ":" and name[7] == ":" and name[10] == "."


# Interfaces judged in one run: each costs ~10 facts and 7 `ethtool` runs (~60 KiB of facts
# and ~0.1 s); a host with more device-backed interfaces than this (SR-IOV VFs by the
# thousand) is refused as a whole with the reason, not judged for minutes: give --iface.
MAX_IFACES = 1024


def interfaces(host: Host, scope: Scope) -> list[str]:
    """--iface, else every interface backed by a device (not lo, bridges, veths, ifb);
    at most MAX_IFACES of them."""
    names = list(scope.ifaces) if scope.ifaces else [
        n for n in host.listdir("/sys/class/net") if has_device(host, n)]
    if len(names) > MAX_IFACES:
        raise SourceError(f"{len(names)} network interfaces backed by a device, over the "
                          f"{MAX_IFACES} one run judges: refused (name the service's with "
                          "--iface)")
    return names


def has_device(host: Host, iface: str) -> bool:
    """Whether ``iface`` is backed by a device. One that cannot be told (its link leaves the
    root) is kept: its own facts then say why, and no other interface's are lost."""
    try:
        return host.exists(f"/sys/class/net/{iface}/device")
    except SourceError:
        return True


def irq_matches(name: str, iface: str, devname: str, pci: str | None) -> bool:
    if name.startswith(iface + "-"):
        return True
    if devname.startswith("virtio") and name.startswith(devname + "-"):
        return not name.endswith("-config")  # configuration changes, not packets
    return pci is not None and name.endswith("@pci:" + pci)


def nic_info(host: Host, iface: str, interrupts: dict | None) -> dict[str, object]:
    base = f"/sys/class/net/{iface}"
    if not host.exists(base):
        raise SourceError(f"interface {iface}: absent")
    if not host.exists(f"{base}/device"):
        return {"iface": iface, "virtual": True}
    target = posixpath.normpath(posixpath.join(base, host.readlink(f"{base}/device")))
    devname = posixpath.basename(target)
    # virtio-net sits on a virtio device whose parent is the PCI function.
    pci_dir = target if _is_pci_addr(devname) else posixpath.dirname(target)
    pci = posixpath.basename(pci_dir) if _is_pci_addr(posixpath.basename(pci_dir)) else None
    info: dict[str, object] = {"iface": iface, "virtual": False, "device": devname, "pci": pci}
    try:
        info["driver"] = posixpath.basename(host.readlink(f"{target}/driver"))
    except SourceError:
        info["driver"] = None
    numa = None
    for d in (target, pci_dir):
        try:
            numa = int(host.read(f"{d}/numa_node").strip())
            info["local_cpus"] = parse_cpulist(host.read(f"{d}/local_cpulist"))
            break
        except (SourceError, ValueError):
            continue
    info["numa_node"] = numa
    irqs: set[int] = set()
    try:
        irqs.update(int(i) for i in host.listdir(f"{pci_dir}/msi_irqs"))
    except (SourceError, ValueError):
        pass
    if interrupts is not None:
        for irq, row in interrupts["irqs"].items():
            if any(irq_matches(n, iface, devname, pci) for n in row["names"]):
                irqs.add(int(irq))
            elif int(irq) in irqs and all(n.endswith("-config") for n in row["names"]):
                irqs.discard(int(irq))
    affinity: dict[str, object] = {}
    for irq in sorted(irqs):
        for fname in ("effective_affinity_list", "smp_affinity_list"):
            try:
                affinity[str(irq)] = parse_cpulist(host.read(f"/proc/irq/{irq}/{fname}"))
                break
            except SourceError:
                continue
        else:
            affinity[str(irq)] = None
    info["irqs"] = sorted(irqs)
    info["irq_affinity"] = affinity
    if interrupts is not None:
        info["irq_names"] = {str(i): interrupts["irqs"].get(str(i), {}).get("names", [])
                             for i in sorted(irqs)}
    return info


@collector("nic", multi=True)
def nics(host: Host, scope: Scope) -> dict[str, object]:
    try:
        names = interfaces(host, scope)
    except SourceError as exc:
        return {"nic": Fact(missing=str(exc))}
    error = None
    try:
        interrupts = parse_interrupts(host.read("/proc/interrupts"))
    except SourceError as exc:
        interrupts, error = None, host.blame(exc)
    out: dict[str, object] = {"nic": names}
    for iface in names:
        try:
            out[f"nic.{iface}"] = nic_info(host, iface, interrupts)
            if error:  # IRQs are then only those of msi_irqs: say why the list may be short
                out[f"nic.{iface}"]["interrupts_error"] = error
        except SourceError as exc:
            out[f"nic.{iface}"] = Fact(missing=host.blame(exc))
    return out


def rps_map(host: Host, iface: str) -> dict[str, object]:
    """RPS: ``queues/rx-N/rps_cpus`` (hex CPU mask) sends NET_RX softirq work of queue N to
    those CPUs; RFS (``rps_flow_cnt`` > 0 with ``net.core.rps_sock_flow_entries`` > 0)
    steers each flow, within that mask, to the CPU its reader last ran on. Absent
    without CONFIG_RPS: None."""
    base = f"/sys/class/net/{iface}/queues"
    queues = sorted((q for q in host.listdir(base) if q.startswith("rx-")),
                    key=lambda n: int(n[3:]) if is_uint(n[3:]) else 0)
    masks: dict[str, list[int] | None] = {}
    flows: dict[str, int | None] = {}
    for q in queues:
        try:
            masks[q] = parse_cpumask(host.read(f"{base}/{q}/rps_cpus"))
        except SourceError as exc:
            if not str(exc).endswith(": absent"):
                raise
            masks[q] = None
        try:
            flows[q] = int(host.read(f"{base}/{q}/rps_flow_cnt").strip())
        except (SourceError, ValueError):
            flows[q] = None
    return {"rps_cpus": masks, "rps_flow_cnt": flows}


@collector("rps", multi=True)
def rps(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("rps", host, scope, lambda i: rps_map(host, i))


def per_iface(prefix: str, host: Host, scope: Scope, fn) -> dict[str, object]:
    """``fn(iface)`` for every interface of ``scope`` (ethtool, qdisc, pfc and rps facts):
    missing with the reason when it cannot be read, an error fact when ``fn`` raised."""
    try:
        names = interfaces(host, scope)
    except SourceError as exc:
        return {prefix: Fact(missing=str(exc))}
    out: dict[str, object] = {prefix: names}
    for iface in names:
        try:
            out[f"{prefix}.{iface}"] = fn(iface)
        except SourceError as exc:
            out[f"{prefix}.{iface}"] = Fact(missing=host.blame(exc))
        except Exception as exc:  # noqa: BLE001 - a parser bug: this port's fact is an error
            out[f"{prefix}.{iface}"] = crash_fact(f"{prefix} of {iface}", exc)
    return out
