"""The platform: bare metal, a virtual machine, or a container, read through the Host.

What a host *is* decides which checks can apply: a virtual machine's physical layer (its
NIC's PHY, optics, FEC, PCIe links, a hardware PTP clock) belongs to the hypervisor, so a
guest cannot have, nor fix, what L1 asks for. Signs read, each named in the evidence:

* virtual machine: the ``hypervisor`` flag in ``/proc/cpuinfo`` (CPUID leaf 1, ECX bit 31:
  set by every x86 hypervisor for its guests); ``/sys/hypervisor/type`` (Xen); DMI
  ``sys_vendor``/``product_name`` of a known hypervisor or cloud VM (AWS ``*.metal``
  instances are bare metal); which hypervisor, from DMI, ``/sys/hypervisor/type`` or the
  paravirtual clock in ``available_clocksource`` (kvm-clock, xen, hyperv_clocksource_*);
* container: ``/.dockerenv`` (Docker), ``/run/.containerenv`` (Podman),
  ``/run/systemd/container`` (systemd-nspawn and others write their name there), and
  container managers' names in ``/proc/1/cgroup``.

A container shares its host's kernel and sees its hardware, so it is judged like its host:
a container on bare metal as bare metal, one in a VM as a VM. Nothing read at all (a
fixture root without these files) is a missing fact: the hardware checks then run.
"""

from __future__ import annotations

import re
from typing import Any

from ..collect import Scope, collector
from ..host import Host
from ..model import SourceError

KINDS = ("baremetal", "vm", "container")
# DMI strings of hypervisors and cloud VMs (systemd's src/basic/virt.c keeps the long list).
_DMI_VENDORS = {
    "qemu": "qemu", "kvm": "kvm", "vmware": "vmware", "innotek gmbh": "oracle",
    "oracle corporation": "oracle", "xen": "xen", "bochs": "bochs", "parallels": "parallels",
    "bhyve": "bhyve", "openstack": "kvm", "nutanix": "kvm", "google": "kvm",
}
_DMI_PRODUCTS = {
    "kvm": "kvm", "virtualbox": "oracle", "vmware": "vmware", "virtual machine": "microsoft",
    "hvm domu": "xen", "google compute engine": "kvm", "openstack nova": "kvm",
    "standard pc": "qemu", "bhyve": "bhyve", "cloud hypervisor": "kvm",
}
_CLOCKSOURCES = {"kvm-clock": "kvm", "xen": "xen", "hyperv_clocksource_tsc_page": "microsoft",
                 "hyperv_clocksource_msr": "microsoft"}
_CGROUP_HINTS = (("docker", "docker"), ("kubepods", "kubernetes"), ("containerd", "containerd"),
                 ("libpod", "podman"), ("lxc", "lxc"), ("machine.slice/", "systemd-nspawn"))


def _read(host: Host, path: str, read: list[str]) -> str | None:
    try:
        text = host.read(path)
    except SourceError:
        return None
    read.append(path)
    return text


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (x86 ``flags``, arm64 ``Features``)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def _dmi(vendor: str, product: str) -> str | None:
    v, p = vendor.strip().lower(), product.strip().lower()
    if v.startswith("amazon ec2"):
        return None if p.endswith(".metal") else "amazon"
    if v.startswith("microsoft") and "virtual machine" not in p:
        return None  # Microsoft also builds hardware (Surface)
    for name, hv in _DMI_VENDORS.items():
        if v.startswith(name):
            return hv
    for name, hv in _DMI_PRODUCTS.items():
        if p.startswith(name):
            return hv
    return None


def detect(host: Host) -> dict[str, Any]:
    """``{"kind", "hypervisor", "container", "signs", "read"}``; SourceError when none of the
    files that tell could be read."""
    read: list[str] = []
    signs: list[str] = []
    hypervisor: str | None = None
    vm = False
    cpuinfo = _read(host, "/proc/cpuinfo", read)
    if cpuinfo is not None and "hypervisor" in cpu_flags(cpuinfo):
        vm = True
        signs.append("/proc/cpuinfo: the CPU has the 'hypervisor' flag")
    xen = _read(host, "/sys/hypervisor/type", read)
    if xen is not None and xen.strip():
        vm, hypervisor = True, xen.strip().lower()
        signs.append(f"/sys/hypervisor/type: {xen.strip()}")
    vendor = _read(host, "/sys/class/dmi/id/sys_vendor", read) or ""
    product = _read(host, "/sys/class/dmi/id/product_name", read) or ""
    by_dmi = _dmi(vendor, product)
    if by_dmi:
        vm, hypervisor = True, hypervisor or by_dmi
        signs.append(f"DMI: {vendor.strip()} / {product.strip()}")
    clocks = _read(host, "/sys/devices/system/clocksource/clocksource0/available_clocksource",
                   read)
    for name in (clocks or "").split():
        if name in _CLOCKSOURCES and vm:
            hypervisor = hypervisor or _CLOCKSOURCES[name]
            signs.append(f"available_clocksource: {name} (paravirtual clock)")
            break
    container: str | None = None
    for path, name in (("/.dockerenv", "docker"), ("/run/.containerenv", "podman")):
        if host.exists(path):
            container = container or name
            read.append(path)
            signs.append(f"{path} exists")
    named = _read(host, "/run/systemd/container", read)
    if named is not None and named.strip():
        container = container or re.sub(r"[^\w.-]", "_", named.strip())[:32]
        signs.append(f"/run/systemd/container: {named.strip()[:32]}")
    cgroup = _read(host, "/proc/1/cgroup", read)
    for hint, name in _CGROUP_HINTS:
        if cgroup is not None and hint in cgroup:
            container = container or name
            signs.append(f"/proc/1/cgroup names {hint}")
            break
    if not read:
        raise SourceError("cannot tell the platform: none of /proc/cpuinfo, /sys/hypervisor/type, "
                          "/sys/class/dmi/id, /.dockerenv, /run/.containerenv, /proc/1/cgroup "
                          "is readable")
    kind = "vm" if vm else "container" if container else "baremetal"
    if kind == "baremetal":
        signs.append("no sign of a hypervisor or a container manager in "
                     + ", ".join(dict.fromkeys(read)))
    return {"kind": kind, "hypervisor": hypervisor if vm else None, "container": container,
            "signs": signs, "read": list(dict.fromkeys(read))}


def describe(p: dict[str, Any]) -> str:
    """``virtual machine (kvm), in a container (docker)``."""
    kind = p.get("kind")
    text = {"vm": "virtual machine", "baremetal": "bare metal",
            "container": "container"}.get(str(kind), str(kind))
    if kind == "vm" and p.get("hypervisor"):
        text += f" ({p['hypervisor']})"
    if p.get("container") and kind != "container":
        text += f", in a container ({p['container']})"
    elif kind == "container" and p.get("container"):
        text += f" ({p['container']})"
    return text


@collector("host.platform")
def platform_fact(host: Host, scope: Scope) -> dict[str, Any]:
    return detect(host)
