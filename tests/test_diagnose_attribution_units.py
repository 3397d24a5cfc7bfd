"""diagnose's attribution (pure): a late generator told from the service."""

from __future__ import annotations

import numpy as np
import pytest

from tailgate.diagnose.attribution import attribute


def test_only_the_generators_sending_counts_as_its_lateness():
    """2,000 requests of 1 ms, one in 50 of 10 ms, 1 ms of which late sending. A reply's
    wait in the generator's socket is in no latency (a request ends at the kernel's receive
    stamp): the generator's part is its sending alone, too small to claim."""
    n = 2000
    starts = np.arange(n, dtype=np.int64) * 5_000_000
    lat = np.full(n, 1_000_000, np.int64)
    slow = np.arange(n) % 50 == 7
    lat[slow] = 10_000_000
    sends = starts + np.where(slow, 1_000_000, 10_000)
    (gen,), _ = attribute(starts, starts + lat, {}, sends=sends)
    assert not gen.claimed
    assert gen.time_share == pytest.approx(0.1)
    assert gen.sentence.endswith("waiting for the load generator to send them; its lateness "
                                 "lasted 10 % of their latency")


def test_a_generator_late_by_less_than_a_claim_needs_is_not_claimed():
    """A clean run against a fast server on a VM: each reply waits ~40 us for the generator's
    woken thread, half of a 0.08 ms tail. The share is there, the time is not: no claim, and
    the sentence says why. Ten times slower, the same shares are claimed."""
    def gen_for(scale: int):
        n = 4000
        starts = np.arange(n, dtype=np.int64) * 1_000_000
        lat = np.full(n, 60_000 * scale, np.int64)
        lat[np.arange(n) % 50 == 3] = 100_000 * scale
        sends = starts + np.where(lat > 60_000 * scale, 55_000, 30_000) * scale
        (gen,), _ = attribute(starts, starts + lat, {}, sends=sends)
        return gen

    fast = gen_for(1)
    assert fast.time_share == pytest.approx(0.55) and not fast.claimed, fast.sentence
    assert fast.sentence.endswith("0.055 ms each: under the 1 ms a claim needs"), fast.sentence
    slow = gen_for(20)
    assert slow.time_share == pytest.approx(0.55) and slow.claimed, slow.sentence
    assert "claim needs" not in slow.sentence
