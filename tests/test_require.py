"""tests/support/require.py: a test whose precondition is missing fails with the reason,
never skips (a skip would let CI go green without running it)."""

from __future__ import annotations

import os

import pytest

from support.require import require_diagnose_host


def test_the_diagnose_scenarios_fail_without_root_or_a_second_cpu(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception, match=r"diagnose needs root \(bpftrace\)"):
        require_diagnose_host()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(pytest.fail.Exception, match="pinned to different CPUs: need 2"):
        require_diagnose_host()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    require_diagnose_host()  # root on 2 CPUs: nothing raised
