"""Memory ECC counts judged one way, for the host's DIMMs (EDAC, ``l1.memory.ecc``) and a
GPU's memory (``l1.gpu.ecc``): an uncorrectable error over the limit in the window fails;
corrected errors coming faster than the hourly limit warn (each one is an interrupt, and
memory this noisy is wearing out); otherwise it passes. The reasons are each check's."""

from __future__ import annotations


def ecc_status(uncorrectable: float, corrected: float, window_s: float,
               limit: float, corrected_per_hour: float) -> tuple[str, float]:
    """``fail``, ``warn`` or ``pass`` for the errors grown over ``window_s``, and the
    corrected errors per hour it judged."""
    rate = corrected * 3600.0 / window_s if window_s else 0.0
    if uncorrectable > limit:
        return "fail", rate
    if rate > corrected_per_hour:
        return "warn", rate
    return "pass", rate
