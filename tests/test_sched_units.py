"""tailgate.sched: how tailgate's helper threads stay out of the latency-critical one's way."""

from __future__ import annotations

import os
import time

from tailgate import sched


def test_a_breather_yields_only_once_its_stretch_of_work_is_over(monkeypatch):
    yields = []
    real = os.sched_yield
    monkeypatch.setattr(sched.os, "sched_yield", lambda: (yields.append(1), real())[1])
    patient = sched.Breather(every_ns=10**12)  # 1,000 s: never within this test
    for _ in range(1000):
        patient()
    assert yields == []
    eager = sched.Breather(every_ns=1)
    for _ in range(5):
        t = time.monotonic_ns()
        while time.monotonic_ns() - t < 1000:  # (past every_ns on any clock resolution)
            pass
        eager()
    assert len(yields) == 5
    # the default is the fast engine's JSON side's (one figure for both)
    assert sched.Breather().every_ns == sched.YIELD_NS == 50_000
