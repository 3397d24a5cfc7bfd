"""diagnose's attribution (pure): a late generator told from the service, sending and
reading."""

from __future__ import annotations

import numpy as np
import pytest

from tailgate.diagnose.attribution import attribute


def _tail_of_late_reads(arrives_known: bool):
    """2,000 requests of 1 ms, one in 50 of 10 ms; of those 10 ms, 1 ms late sending and
    7 ms with the reply waiting unread in the generator's socket."""
    n = 2000
    starts = np.arange(n, dtype=np.int64) * 5_000_000
    lat = np.full(n, 1_000_000, np.int64)
    slow = np.arange(n) % 50 == 7
    lat[slow] = 10_000_000
    ends = starts + lat
    sends = starts + np.where(slow, 1_000_000, 10_000)
    arrives = np.where(slow, ends - 7_000_000, ends - 10_000) if arrives_known else None
    out, _ = attribute(starts, ends, {}, sends=sends, arrives=arrives)
    (gen,) = out
    return gen


def test_a_generator_late_reading_its_replies_is_named_and_says_how_much():
    gen = _tail_of_late_reads(True)
    assert gen.claimed, gen.sentence
    assert gen.time_share == pytest.approx(0.8)
    assert gen.extra["read_share"] == pytest.approx(0.7)
    assert gen.sentence.endswith("its lateness lasted 80 % of their latency (70 % reading "
                                 "their replies)")


def test_without_arrival_times_only_the_send_side_counts():
    gen = _tail_of_late_reads(False)
    assert not gen.claimed
    assert gen.time_share == pytest.approx(0.1)
    assert gen.extra["read_share"] is None


def test_a_generator_late_by_less_than_a_claim_needs_is_not_claimed():
    """A clean run against a fast server on a VM: each reply waits ~40 us for the generator's
    woken thread, half of a 0.08 ms tail. The share is there, the time is not: no claim, and
    the sentence says why. Ten times slower, the same shares are claimed."""
    def gen_for(scale: int):
        n = 4000
        starts = np.arange(n, dtype=np.int64) * 1_000_000
        lat = np.full(n, 60_000 * scale, np.int64)
        lat[np.arange(n) % 50 == 3] = 100_000 * scale
        ends = starts + lat
        sends = starts + 5_000 * scale
        arrives = ends - np.where(lat > 60_000 * scale, 50_000, 25_000) * scale
        (gen,), _ = attribute(starts, ends, {}, sends=sends, arrives=arrives)
        return gen

    fast = gen_for(1)
    assert fast.time_share == pytest.approx(0.55) and not fast.claimed, fast.sentence
    assert fast.sentence.endswith("0.055 ms each: under the 1 ms a claim needs"), fast.sentence
    slow = gen_for(20)
    assert slow.time_share == pytest.approx(0.55) and slow.claimed, slow.sentence
    assert "claim needs" not in slow.sentence
