"""The histogram against the reference implementation (the ``hdrhistogram`` package)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader
from hypothesis import given, settings
from hypothesis import strategies as st

from tailgate.hist import (
    DEFAULT_SPEC,
    Histogram,
    HistogramError,
    HistogramSpec,
    Interval,
    IntervalHistograms,
    decode,
    encode,
    merged,
    parse_log,
    percentile_spectrum,
    write_log,
)

PERCENTILES = (0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0)


def reference(values, spec: HistogramSpec = DEFAULT_SPEC) -> HdrHistogram:
    ref = HdrHistogram(spec.lowest, spec.highest, spec.digits)
    for v in values:
        assert ref.record_value(int(v))
    return ref


def ref_counts(ref: HdrHistogram) -> np.ndarray:
    return np.array(ref.counts[: ref.counts_len], dtype=np.int64)


specs = st.builds(
    HistogramSpec,
    lowest=st.sampled_from([1, 2, 1000]),
    highest=st.sampled_from([10**6, 3_600_000_000_000, 2**52]),
    digits=st.integers(1, 4),
)


@settings(max_examples=60, deadline=None)
@given(spec=specs, data=st.data())
def test_bucket_layout_and_quantiles_match_hdrhistogram(spec, data):
    values = data.draw(st.lists(st.integers(0, spec.highest), min_size=1, max_size=300))
    ours = Histogram(spec)
    ours.record(np.array(values, dtype=np.int64))
    ref = reference(values, spec)
    assert ours.spec.counts_len == ref.counts_len
    assert np.array_equal(ours.counts, ref_counts(ref))
    assert ours.total == ref.total_count == len(values)
    assert (ours.min, ours.max) == (min(values), max(values))
    for p in PERCENTILES:
        assert ours.value_at_percentile(p) == ref.get_value_at_percentile(p), p


def test_vectorised_recording_equals_one_by_one_on_a_long_tail():
    rng = np.random.default_rng(7)
    values = rng.lognormal(11, 1.8, 30_000).astype(np.int64)
    ours = Histogram()
    ours.record(values[:10_000])
    ours.record(values[10_000:].astype(np.float64))  # the float path rounds to the same ints
    ref = reference(values)
    assert np.array_equal(ours.counts, ref_counts(ref))
    assert ours.values_at_percentiles(PERCENTILES) == [
        ref.get_value_at_percentile(p) for p in PERCENTILES]


def test_merge_is_exact_and_order_free():
    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 10**9, size=n) for n in (1, 500, 20_000)]
    whole = Histogram()
    whole.record(np.concatenate(parts))
    pieces = []
    for p in parts:
        h = Histogram()
        h.record(p)
        pieces.append(h)
    for order in (pieces, pieces[::-1]):
        m = merged(order)
        assert np.array_equal(m.counts, whole.counts)
        assert (m.total, m.min, m.max) == (whole.total, whole.min, whole.max)
    sparse = Histogram()
    for h in pieces:
        idx, counts = h.nonzero()
        sparse.add_sparse(idx, counts, h.min, h.max)
    assert np.array_equal(sparse.counts, whole.counts) and sparse.total == whole.total


def test_merge_refuses_a_different_layout():
    with pytest.raises(HistogramError):
        Histogram().add(Histogram(HistogramSpec(digits=2)))


def test_out_of_range_values_are_clamped_and_counted_never_dropped():
    spec = HistogramSpec(highest=10**6)
    h = Histogram(spec)
    h.record(np.array([-5, 0, 10, 5 * 10**6, 10**6]))
    assert h.total == 5 and h.clamped == 2
    assert h.min == 0 and h.max == 10**6
    h.record(np.array([1e30, -1e30]))  # floats beyond int64 still clamp, not wrap
    assert h.total == 7 and h.clamped == 4 and h.max == 10**6
    with pytest.raises(HistogramError):
        h.record(np.array([1.0, float("nan")]))


def test_samples_above_a_percentile():
    h = Histogram()
    h.record(np.arange(1, 501))
    assert h.samples_above_percentile(99.9) == 0  # a P999 from 500 samples rests on nothing
    assert h.samples_above_percentile(99.0) == 5
    assert h.samples_above_percentile(50.0) == 250


def test_our_encoding_decodes_in_hdrhistogram_and_theirs_in_ours():
    rng = np.random.default_rng(11)
    values = rng.lognormal(10, 2, 5_000).astype(np.int64)
    ours = Histogram()
    ours.record(values)
    text = encode(ours)
    assert text.startswith("HISTFAAA")
    theirs = HdrHistogram.decode(text)
    assert theirs.total_count == ours.total
    assert ref_counts(theirs).tolist() == ours.counts.tolist()
    for p in PERCENTILES[1:]:
        assert theirs.get_value_at_percentile(p) == ours.value_at_percentile(p)
    back = decode(reference(values).encode())
    assert np.array_equal(back.counts, ours.counts)
    again = decode(text)
    assert np.array_equal(again.counts, ours.counts) and again.total == ours.total


def test_empty_histogram_round_trips():
    text = encode(Histogram())
    assert HdrHistogram.decode(text).total_count == 0
    assert decode(text).total == 0
    assert Histogram().value_at_percentile(99.9) == 0


@pytest.mark.parametrize("bad", ["", "not base64!", "SElTVEZBQUE=", encode(Histogram())[:-8]])
def test_malformed_encodings_raise_a_histogram_error(bad):
    with pytest.raises(HistogramError):
        decode(bad)


def test_interval_log_is_read_by_hdrhistogram_log_reader(tmp_path):
    rng = np.random.default_rng(5)
    intervals = []
    total = Histogram()
    for i in range(3):
        h = Histogram()
        h.record(rng.integers(1000, 10**8, size=1000 * (i + 1)))
        total.add(h)
        intervals.append(Interval(float(i), 1.0, h))
    buf = io.StringIO()
    write_log(buf, intervals, start_epoch_s=1_700_000_000.0, comment="tailgate test")
    path = tmp_path / "lat.hlog"
    path.write_text(buf.getvalue())
    reader = HistogramLogReader(str(path), HdrHistogram(1, DEFAULT_SPEC.highest, 3))
    acc = HdrHistogram(1, DEFAULT_SPEC.highest, 3)
    n = 0
    while (h := reader.get_next_interval_histogram()) is not None:
        acc.add(h)
        n += 1
    assert n == 3 and acc.total_count == total.total
    for p in PERCENTILES[1:]:
        assert acc.get_value_at_percentile(p) == total.value_at_percentile(p)
    start, parsed = parse_log(buf.getvalue())
    assert start == 1_700_000_000.0
    assert [iv.start_s for iv in parsed] == [0.0, 1.0, 2.0]
    assert np.array_equal(merged(iv.histogram for iv in parsed).counts, total.counts)


def test_percentile_spectrum_has_wrk2_shape():
    h = Histogram()
    h.record(np.arange(1, 100_001) * 1000)
    text = percentile_spectrum(h)
    lines = text.splitlines()
    assert lines[0].split() == ["Value", "Percentile", "TotalCount", "1/(1-Percentile)"]
    assert lines[-3].startswith("#[Mean")
    assert "Total count    =       100000" in lines[-2]
    rows = [ln.split() for ln in lines[2:-3]]
    pcts = [float(r[1]) for r in rows]
    assert pcts == sorted(pcts) and pcts[-1] == 1.0
    assert any(0.999 <= p < 0.9991 for p in pcts)  # wrk2 prints 0.999023


def test_reads_a_log_written_by_java_hdrhistogram():
    """A real jHiccup log (Java HdrHistogram, lowest=20000 ns, 2 digits): our decoder
    agrees with the reference package bucket by bucket, and with the log's own
    Interval_Max column."""
    from pathlib import Path

    text = (Path(__file__).parent / "fixtures/hdr/jHiccup-2.0.7S.logV2.hlog").read_text()
    start, intervals = parse_log(text)
    assert start == 1441753532.570 and len(intervals) == 20
    assert intervals[0].histogram.spec == HistogramSpec(lowest=20000, highest=3600 * 10**9,
                                                        digits=2)
    lines = [ln for ln in text.splitlines() if ln[:1].isdigit()]
    for line, iv in zip(lines, intervals, strict=True):
        encoded = line.split(",")[3]
        ref = HdrHistogram.decode(encoded)
        assert iv.histogram.total == ref.total_count
        assert iv.histogram.counts.tolist() == ref_counts(ref).tolist()
        for p in PERCENTILES[1:]:
            assert iv.histogram.value_at_percentile(p) == ref.get_value_at_percentile(p)
        assert round(iv.histogram.max / 1e6, 3) == pytest.approx(float(line.split(",")[2]),
                                                                 abs=0.0011)
    # Merged, the stalls of this log (~1 s hiccups) are in the tail.
    total = merged((iv.histogram for iv in intervals), intervals[0].histogram.spec)
    assert total.value_at_percentile(99.9) > 800 * 10**6


def test_pickles_compactly_and_exactly():
    import pickle

    h = Histogram()
    h.record(np.random.default_rng(2).integers(0, 10**9, size=10_000))
    blob = pickle.dumps(h)
    back = pickle.loads(blob)
    assert np.array_equal(back.counts, h.counts)
    assert (back.total, back.min, back.max, back.clamped, back.spec) == (
        h.total, h.min, h.max, h.clamped, h.spec)
    assert len(blob) < h.counts.nbytes / 2


def test_interval_histograms_keep_few_dense_and_lose_nothing():
    """Values land in 60 intervals, mostly in order with some late ones (a request ends
    after later ones started): at most OPEN are dense at any time, and every interval
    reads back exactly what a dense histogram of its own would hold, after a pickle too."""
    import pickle

    rng = np.random.default_rng(5)
    ivs = IntervalHistograms()
    ref: dict[int, Histogram] = {}
    most_dense = 0
    for step in range(600):
        k = step // 10
        if step % 7 == 0 and k > 5:
            k -= int(rng.integers(1, 6))  # late: into an interval already folded
        v = rng.lognormal(12, 2, 50)
        ivs.record(k, v)
        ref.setdefault(k, Histogram()).record(v)
        most_dense = max(most_dense, ivs.dense)
    assert most_dense == IntervalHistograms.OPEN and len(ivs) == 60
    for got in (ivs.histograms(), pickle.loads(pickle.dumps(ivs)).histograms()):
        assert list(got) == sorted(ref)
        for k, h in ref.items():
            assert (got[k].total, got[k].min, got[k].max) == (h.total, h.min, h.max)
            assert np.array_equal(got[k].counts, h.counts)
    both = IntervalHistograms()
    both.add(ivs)
    both.add(pickle.loads(pickle.dumps(ivs)))
    assert both.histograms()[3].total == 2 * ref[3].total
