"""``amd-smi`` JSON, read where amdgpu's own sysfs files are not there (a container without
the device's sysfs, a capture made with the tool only).

* ``amd-smi static --json``: per GPU ``bus.bdf`` (its PCI address; absent in some
  builds) and ``ras.ecc_block_state`` (``{"UMC": "ENABLED", "XGMI_WAFL": "DISABLED", ...}``,
  or ``"N/A"`` on a GPU without RAS: a Radeon has no ECC memory).
* ``amd-smi metric --json``: per GPU ``ecc`` (totals) and ``ecc_blocks`` (per RAS block:
  ``correctable_count``, ``uncorrectable_count``, ``deferred_count``; ``"N/A"`` where
  there are none), ``power.throttle_status`` (``THROTTLED`` / ``UNTHROTTLED``: the
  ASIC's throttle bits, non-zero or not) and, on MI300, ``throttle`` (the firmware's
  accumulated throttler residencies and ``accumulation_counter``, as gpu_metrics 1.6+).
* ``amd-smi list --json``: ``[{"gpu": N, "bdf": ...}]``, for a ``static`` without ``bdf``.

Older amd-smi (ROCm 6.0-6.3) prints a bare list of GPUs; newer wraps it in
``{"gpu_data": [...]}``. Both are read. ``"N/A"`` is absent, never zero.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..model import ParseError

_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
# metric's "throttle" keys -> the residency names of sources.amd_metrics
_THROTTLE_KEYS = {"accumulation_counter": "accumulation", "prochot_accumulated": "prochot",
                  "ppt_accumulated": "ppt", "socket_thermal_accumulated": "socket_thermal",
                  "vr_thermal_accumulated": "vr_thermal", "hbm_thermal_accumulated": "hbm_thermal"}


def _gpus(text: str, what: str) -> dict[str, dict[str, Any]]:
    """The per-GPU objects of an amd-smi JSON document, keyed by their ``gpu`` index."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"{what}: not JSON ({exc})") from exc
    if isinstance(data, dict) and isinstance(data.get("gpu_data"), list):
        data = data["gpu_data"]
    if not isinstance(data, list) or not data:
        raise ParseError(f"{what}: no list of GPUs (neither [...] nor {{\"gpu_data\": [...]}})")
    out: dict[str, dict[str, Any]] = {}
    for i, g in enumerate(data):
        if not isinstance(g, dict) or isinstance(g.get("gpu"), bool) \
                or not isinstance(g.get("gpu"), int):
            raise ParseError(f"{what}: entry {i} has no integer \"gpu\" index")
        out[str(g["gpu"])] = g
    return out


def _count(v: Any) -> int | None:
    """A counter as amd-smi prints it: an int, ``{"value": int}``, or "N/A" (absent)."""
    if isinstance(v, dict):
        v = v.get("value")
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def parse_amd_smi_list(text: str) -> dict[str, str]:
    """``amd-smi list --json`` -> ``{gpu index: bdf}``."""
    return {idx: g["bdf"].lower() for idx, g in _gpus(text, "amd-smi list --json").items()
            if isinstance(g.get("bdf"), str) and _BDF.match(g["bdf"])}


def parse_amd_smi_static(text: str) -> dict[str, dict[str, Any]]:
    """``amd-smi static --json`` -> ``{gpu index: {"bdf": str | None, "ras_blocks":
    {block: enabled} | None}}`` (block names lower case, as amdgpu's ras/ files; None
    where amd-smi says N/A: no RAS on this GPU)."""
    out: dict[str, dict[str, Any]] = {}
    for idx, g in _gpus(text, "amd-smi static --json").items():
        bus = g.get("bus") if isinstance(g.get("bus"), dict) else {}
        bdf = bus.get("bdf")
        ras = g.get("ras") if isinstance(g.get("ras"), dict) else {}
        state = ras.get("ecc_block_state")
        blocks = {str(b).lower(): s == "ENABLED" for b, s in state.items()} \
            if isinstance(state, dict) else None
        out[idx] = {"bdf": bdf.lower() if isinstance(bdf, str) and _BDF.match(bdf) else None,
                    "ras_blocks": blocks}
    return out


def parse_amd_smi_metric(text: str) -> dict[str, dict[str, Any]]:
    """``amd-smi metric --json`` -> ``{gpu index: {"ecc_blocks": {block: {"ce", "ue"}},
    "ecc_total": {"ce", "ue"}, "throttled": bool, "residency": {...}}}``, each key only
    where amd-smi printed numbers."""
    out: dict[str, dict[str, Any]] = {}
    for idx, g in _gpus(text, "amd-smi metric --json").items():
        got: dict[str, Any] = {}
        blocks = g.get("ecc_blocks")
        if isinstance(blocks, dict):
            per = {}
            for b, c in blocks.items():
                ce = _count(c.get("correctable_count")) if isinstance(c, dict) else None
                ue = _count(c.get("uncorrectable_count")) if isinstance(c, dict) else None
                if ce is not None and ue is not None:
                    per[str(b).lower()] = {"ce": ce, "ue": ue}
            if per:
                got["ecc_blocks"] = per
        ecc = g.get("ecc") if isinstance(g.get("ecc"), dict) else {}
        ce, ue = _count(ecc.get("total_correctable_count")), _count(
            ecc.get("total_uncorrectable_count"))
        if ce is not None and ue is not None:
            got["ecc_total"] = {"ce": ce, "ue": ue}
        power = g.get("power") if isinstance(g.get("power"), dict) else {}
        status = power.get("throttle_status")
        if status in ("THROTTLED", "UNTHROTTLED"):
            got["throttled"] = status == "THROTTLED"
        throttle = g.get("throttle") if isinstance(g.get("throttle"), dict) else {}
        res = {name: _count(throttle.get(key)) for key, name in _THROTTLE_KEYS.items()}
        if all(v is not None for v in res.values()):
            got["residency"] = res
        out[idx] = got
    return out
