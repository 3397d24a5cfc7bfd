"""Tests that need a real server or tool fail when it is missing: they never skip.

`make test` installs everything the suite needs (apt-get and .venv), so a missing piece is a
broken install step, and a skip would let CI go green without running the test.
"""

from __future__ import annotations

import os

import pytest


def require(reason: str | None) -> None:
    """Fail the calling test with ``reason`` when it is not None."""
    if reason is not None:
        pytest.fail(f"{reason} (make test installs it; a missing install step is a defect)",
                    pytrace=False)


def require_diagnose_host(cpus: int = 2) -> None:
    """Fail the calling test unless it runs as root (diagnose's probes are bpftrace) with
    ``cpus`` CPUs to pin the server and the load apart: the live diagnose scenarios'
    precondition (CI runs as root on 2 CPUs or more)."""
    if os.geteuid() != 0:
        pytest.fail("diagnose needs root (bpftrace); CI runs as root")
    if len(os.sched_getaffinity(0)) < cpus:
        pytest.fail(f"the server and the load are pinned to different CPUs: need {cpus}")
