"""Layer 1: PCIe links that trained below their capability (`l1.pcie.link_downtrained`).

A link's two ends report the same negotiated speed and width; the downstream end (the
device below) is read. What the link could do is the lower of the two ends' maximums:
a Gen5 card in a Gen4 slot is capped, not downtrained. Along a device's chain of ports
(root port, switch upstream port, switch downstream port, ..., device) the physical
links are every other pair counted from the device up: (device, port above it), then
(switch upstream port, the port above it), and so on; the pairs between a switch's
upstream and downstream ports are the switch's internal bus.
"""

from __future__ import annotations

from typing import Any

from ..judge import check, need
from ..model import Result, Snapshot


def _fmt(gts: float | None, width: int | None) -> str:
    speed = "unknown speed" if gts is None else f"{gts:g} GT/s"
    return f"{speed} x{width}" if width is not None else speed


def _links(chain: list[str]) -> list[tuple[str, str]]:
    """(upper, lower) port pairs of the physical links along ``chain`` (root first)."""
    return [(chain[i - 1], chain[i]) for i in range(len(chain) - 1, 0, -2)]


def _judge_link(upper: str, lower: str, kind: str, up: dict[str, Any] | None,
                low: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    cap_gts = low["max_gts"]
    if cap_gts is not None and up and up["max_gts"] is not None:
        cap_gts = min(cap_gts, up["max_gts"])
    cap_width = low["max_width"]
    if up and up["max_width"]:
        cap_width = min(cap_width, up["max_width"])
    now = _fmt(low["current_gts"], low["current_width"])
    capable = _fmt(cap_gts, cap_width)
    ev = {"link": f"{upper} -> {lower}", "current": now, "capable": capable,
          "lower_end": low["raw"], "upper_end": up["raw"] if up else None}
    if up and up["current_gts"] is not None and (up["current_gts"], up["current_width"]) != (
            low["current_gts"], low["current_width"]):
        ev["ends_disagree"] = f"{upper} reports {_fmt(up['current_gts'], up['current_width'])}"
    if low["current_gts"] is None or low["current_width"] == 0:
        return "unknown", f"the link {upper} -> {lower} reports no negotiated speed ({now}): " \
                          "down, or in a low-power state", ev
    if cap_gts is None:
        return "unknown", f"{lower} reports no maximum link speed", ev
    narrow = low["current_width"] < cap_width
    slow = low["current_gts"] < cap_gts
    if not narrow and not slow:
        return "pass", f"{now}, its full capability", ev
    if up is None:
        # Below its own maximum with no upper end to read: a slower or narrower slot
        # (capped) cannot be told from a downtrained link
        return "unknown", f"trained at {now}, below its own {capable}, and no link " \
                          f"attributes above it to tell a capping slot from a downtrained " \
                          "link", ev
    what = f"trained at {now}, capable of {capable}"
    if narrow:
        return "fail", f"{what}: {cap_width // max(low['current_width'], 1)}x fewer lanes " \
                       "(a lane failed training, a bad riser or slot, or bifurcation)", ev
    if kind == "gpu":
        # GPUs lower their link speed when idle (NVIDIA and AMD power management) and raise
        # it under load: a slow GPU link at rest is not proof of a bad link.
        return "warn", f"{what}: GPUs lower the link speed when idle; if it stays there " \
                       "under load (nvidia-smi -q: Link Gen Current vs Max), the link is " \
                       "downtrained", ev
    return "fail", f"{what} (signal integrity: the link fell back to a slower generation)", ev


@check("l1.pcie.link_downtrained")
def pcie_link_downtrained(snap: Snapshot, p: dict) -> list[Result]:
    devices = need(snap, "pci.devices")
    facts = need(snap, "pci.links")
    chains, links, errors = facts["chains"], facts["links"], facts.get("errors", {})
    if not chains:
        return [Result("skip", reason="no PCI NIC, GPU or accelerator on this host")]
    results: list[Result] = []
    seen: set[tuple[str, str]] = set()
    for bdf in sorted(chains):
        kind = devices.get(bdf, {}).get("kind", "device")
        for upper, lower in _links(chains[bdf]):
            if (upper, lower) in seen:
                continue  # a switch link shared by several devices is judged once
            seen.add((upper, lower))
            on = "" if lower == bdf else f" (upstream of {bdf})"
            subject = f"{lower} {kind if lower == bdf else 'port'}"
            if lower in errors or upper in errors:
                results.append(Result("unknown", subject=subject,
                                      reason="; ".join(errors[b] for b in (lower, upper)
                                                       if b in errors) + on))
                continue
            low = links.get(lower)
            if low is None:
                continue  # not a PCIe device: no link to train
            status, reason, ev = _judge_link(upper, lower, kind if lower == bdf else "port",
                                             links.get(upper), low)
            results.append(Result(status, subject=subject, evidence=ev, reason=reason + on,
                                  observed=_fmt(low["current_gts"], low["current_width"])))
        if len(chains[bdf]) == 1 and bdf in errors:  # its own files could not be read
            results.append(Result("unknown", subject=f"{bdf} {kind}", reason=errors[bdf]))
        elif len(chains[bdf]) == 1 and links.get(bdf) is not None:
            # No port above it in sysfs (a VM's passthrough, a root-complex integrated
            # device): judged on its own maximum, as a link whose upper end says nothing
            low = links[bdf]
            status, reason, ev = _judge_link("(no port above)", bdf, kind, None, low)
            results.append(Result(status, subject=f"{bdf} {kind}", evidence=ev,
                                  reason=reason + " (no port above it in sysfs)",
                                  observed=_fmt(low["current_gts"], low["current_width"])))
    if not results:
        return [Result("skip", evidence={"devices": sorted(chains)},
                       reason="no PCIe link on " + ", ".join(sorted(chains)) + " (no link "
                       "attributes: conventional PCI, as virtio devices in VMs)")]
    return results
