"""The latency histogram: HdrHistogram-compatible log-linear buckets, recorded with numpy.

A :class:`Histogram` has exactly HdrHistogram's bucket layout (Gil Tene's
HdrHistogram, also HdrHistogram_c and the ``hdrhistogram`` PyPI package): for
``digits`` significant decimal digits every value is kept to within
``10**-digits`` of itself, from ``lowest`` up to ``highest``. Because the layout
is the same, the counts array means the same thing everywhere, so

* histograms merge exactly by adding counts (other workers, other machines);
* :func:`encode` writes HdrHistogram's V2 compressed wire format (``HISTFAAA…``)
  and :func:`decode` reads it back, so Java/C/Python HdrHistogram tools read
  our files and we read theirs;
* quantiles follow HdrHistogram's definition (``getValueAtPercentile``), so our
  P999 equals the one those tools print for the same data.

Recording is vectorised: :meth:`Histogram.record` takes a numpy array and
computes every bucket index at once (a float ``frexp`` gives the bit length,
then shifts), then adds a ``bincount`` — no Python call per sample.

Values are non-negative integers in whatever unit the caller chose (tailgate's
bench records nanoseconds). Unlike HdrHistogram_py, a value outside
``[0, highest]`` is never dropped silently: it is clamped to the nearest end of
the range, still counted, and the number of clamped values is kept in
``clamped`` so a report can say so.
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO

import numpy as np

from .errors import InputError

# V2 wire format cookies (HdrHistogram's AbstractHistogram / HdrHistogram_c).
_ENCODING_COOKIE = 0x1C849303 | 0x10  # counts payload, LEB128/ZigZag words
_COMPRESSION_COOKIE = 0x1C849304 | 0x10  # zlib-compressed envelope
_PAYLOAD_HEADER = struct.Struct(">iiiiqqd")  # cookie, len, norm. offset, digits, lo, hi, ratio
_ENVELOPE_HEADER = struct.Struct(">ii")  # cookie, compressed length
_MAX_EXACT = 1 << 53  # float64 holds every integer below this: frexp stays exact


class HistogramError(InputError):
    """A histogram could not be built, merged or decoded (the message says why): a
    histogram log or an encoded histogram a user gave is bad input (exit status 2)."""


@dataclass(frozen=True)
class HistogramSpec:
    """The bucket layout: ``lowest`` discernible value, ``highest`` trackable, ``digits``.

    Derived fields follow HdrHistogram's constructor exactly (names as there).
    """

    lowest: int = 1
    highest: int = 3_600_000_000_000  # one hour in nanoseconds
    digits: int = 3

    def __post_init__(self) -> None:
        if self.lowest < 1:
            raise HistogramError(f"lowest must be >= 1, not {self.lowest}")
        if not 1 <= self.digits <= 5:
            raise HistogramError(f"digits must be 1..5, not {self.digits}")
        if self.highest < 2 * self.lowest:
            raise HistogramError(f"highest must be >= 2*lowest, not {self.highest}")
        if self.highest >= _MAX_EXACT:
            raise HistogramError(f"highest must be < 2**53, not {self.highest}")

    @property
    def unit_magnitude(self) -> int:
        return math.floor(math.log2(self.lowest))

    @property
    def sub_bucket_half_count_magnitude(self) -> int:
        mag = math.ceil(math.log2(2 * 10**self.digits))
        return mag - 1 if mag > 1 else 0

    @property
    def sub_bucket_count(self) -> int:
        return 1 << (self.sub_bucket_half_count_magnitude + 1)

    @property
    def sub_bucket_half_count(self) -> int:
        return self.sub_bucket_count // 2

    @property
    def sub_bucket_mask(self) -> int:
        return (self.sub_bucket_count - 1) << self.unit_magnitude

    @property
    def bucket_count(self) -> int:
        smallest_untrackable = self.sub_bucket_count << self.unit_magnitude
        buckets = 1
        while smallest_untrackable <= self.highest:
            if smallest_untrackable > (1 << 62):
                return buckets + 1
            smallest_untrackable <<= 1
            buckets += 1
        return buckets

    @property
    def counts_len(self) -> int:
        return (self.bucket_count + 1) * self.sub_bucket_half_count

    # -- index arithmetic, vectorised (works on numpy int64 arrays and on ints) --

    def index_of(self, values: np.ndarray) -> np.ndarray:
        """Counts-array index of each value (int64 array, already inside the range)."""
        v = np.asarray(values, dtype=np.int64)
        # bit_length(v | mask) == frexp exponent, exact because values < 2**53.
        _, pow2ceiling = np.frexp((v | self.sub_bucket_mask).astype(np.float64))
        # shift = bucket index + unit magnitude; in-place steps keep temporaries few.
        shift = pow2ceiling.astype(np.int64)
        shift -= self.sub_bucket_half_count_magnitude + 1
        sub_bucket = np.right_shift(v, shift)
        shift -= self.unit_magnitude - 1  # now bucket index + 1
        np.left_shift(shift, self.sub_bucket_half_count_magnitude, out=shift)
        shift += sub_bucket
        shift -= self.sub_bucket_half_count
        return shift

    def lowest_equivalent(self, index: np.ndarray | int) -> np.ndarray:
        """The smallest value that lands in counts index ``index``."""
        idx = np.asarray(index, dtype=np.int64)
        bucket = (idx >> self.sub_bucket_half_count_magnitude) - 1
        sub_bucket = (idx & (self.sub_bucket_half_count - 1)) + self.sub_bucket_half_count
        first = bucket < 0
        sub_bucket = np.where(first, sub_bucket - self.sub_bucket_half_count, sub_bucket)
        bucket = np.where(first, 0, bucket)
        return sub_bucket << (bucket + self.unit_magnitude)

    def highest_equivalent(self, index: np.ndarray | int) -> np.ndarray:
        """The largest value that lands in counts index ``index``."""
        idx = np.asarray(index, dtype=np.int64)
        bucket = np.maximum((idx >> self.sub_bucket_half_count_magnitude) - 1, 0)
        return self.lowest_equivalent(idx) + (np.int64(1) << (bucket + self.unit_magnitude)) - 1


DEFAULT_SPEC = HistogramSpec()


class Histogram:
    """An HdrHistogram-compatible histogram: record arrays, merge, quantiles.

    Mutable accumulator (not a value): ``counts`` is an int64 numpy array of
    ``spec.counts_len``. ``total`` always equals ``counts.sum()``. ``min``/``max``
    are the exact extreme values recorded (after clamping), ``clamped`` the
    number of values that fell outside ``[0, spec.highest]``.
    """

    __slots__ = ("clamped", "counts", "max", "min", "spec", "total")

    def __init__(self, spec: HistogramSpec = DEFAULT_SPEC) -> None:
        self.spec = spec
        self.counts = np.zeros(spec.counts_len, dtype=np.int64)
        self.total = 0
        self.min = 0
        self.max = 0
        self.clamped = 0

    # -- recording --------------------------------------------------------

    def record(self, values: np.ndarray | Sequence[float] | Sequence[int]) -> None:
        """Record every value of ``values`` (ints, or floats rounded to the nearest int)."""
        v = np.asarray(values)
        if v.size == 0:
            return
        lo, hi = v.min(), v.max()
        if v.dtype.kind == "f":
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise HistogramError("cannot record NaN or infinite values")
            # Clamp before the cast so huge floats cannot wrap around int64.
            if lo < 0 or hi > self.spec.highest:
                v = np.clip(v, -1.0, float(self.spec.highest) + 1.0)
            v = np.rint(v).astype(np.int64)
            lo, hi = v.min(), v.max()
        else:
            v = v.astype(np.int64, copy=False)
        if lo < 0 or hi > self.spec.highest:
            self.clamped += int(np.count_nonzero((v < 0) | (v > self.spec.highest)))
            v = np.clip(v, 0, self.spec.highest)
            lo, hi = v.min(), v.max()
        # Chunks that fit in cache: the index arithmetic is memory-bound otherwise. Only the
        # buckets hit are written: a histogram's counts are 264 KiB of zeros whose pages stay
        # unmapped until written, so one per --hdr interval costs the pages its values touch,
        # not the whole array (a 10-minute soak's RSS grew 6 MiB a minute when every record
        # wrote all of it).
        step = 1 << 16
        for i in range(0, v.size, step):
            idx = self.spec.index_of(v[i:i + step])
            base = int(idx.min())
            hits = np.bincount(idx - base)
            nz = np.flatnonzero(hits)
            self.counts[nz + base] += hits[nz]
        self.min = int(lo) if self.total == 0 else min(self.min, int(lo))
        self.max = max(self.max, int(hi))
        self.total += int(v.size)

    def add(self, other: Histogram) -> None:
        """Merge ``other`` into this one, exactly (same layout required)."""
        if other.spec != self.spec:
            raise HistogramError(f"cannot merge histograms of different layouts: "
                                 f"{other.spec} into {self.spec}")
        if other.total == 0:
            return
        self.counts += other.counts
        self.min = other.min if self.total == 0 else min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.total += other.total
        self.clamped += other.clamped

    def copy(self) -> Histogram:
        h = Histogram(self.spec)
        h.add(self)
        return h

    # -- reading ------------------------------------------------------------

    def value_at_percentile(self, percentile: float) -> int:
        """HdrHistogram's ``getValueAtPercentile`` (percentile in 0..100); 0 when empty."""
        return int(self.values_at_percentiles([percentile])[0])

    def values_at_percentiles(self, percentiles: Iterable[float]) -> list[int]:
        """Many percentiles at once: the highest value equivalent to the sample at
        rank ``max(1, round(p/100 * total))`` — exactly HdrHistogram's rule.
        Like HdrHistogram, the top percentiles may exceed the exact ``max`` by
        less than one bucket's width."""
        ps = [min(float(p), 100.0) for p in percentiles]
        if self.total == 0:
            return [0 for _ in ps]
        cum = np.cumsum(self.counts)
        ranks = np.array([max(int(p * self.total / 100.0 + 0.5), 1) for p in ps])
        idx = np.searchsorted(cum, ranks, side="left")
        vals = self.spec.highest_equivalent(idx)
        return [int(v) if p > 0 else int(self.spec.lowest_equivalent(i))
                for v, i, p in zip(vals, idx, ps, strict=True)]

    def samples_above_percentile(self, percentile: float) -> int:
        """How many recorded samples rank above ``percentile`` (what a tail figure rests on)."""
        rank = max(int(min(percentile, 100.0) * self.total / 100.0 + 0.5), 1)
        return max(self.total - rank, 0)

    def mean(self) -> float:
        if self.total == 0:
            return 0.0
        idx = np.nonzero(self.counts)[0]
        lo = self.spec.lowest_equivalent(idx).astype(np.float64)
        hi = self.spec.highest_equivalent(idx).astype(np.float64)
        mid = (lo + hi) / 2.0  # HdrHistogram's medianEquivalentValue, near enough
        return float(np.dot(mid, self.counts[idx]) / self.total)

    def stddev(self) -> float:
        if self.total == 0:
            return 0.0
        idx = np.nonzero(self.counts)[0]
        mid = (self.spec.lowest_equivalent(idx) + self.spec.highest_equivalent(idx)) / 2.0
        m = self.mean()
        return float(math.sqrt(np.dot((mid - m) ** 2, self.counts[idx]) / self.total))

    def nonzero(self) -> tuple[np.ndarray, np.ndarray]:
        """(indices, counts) of the non-empty buckets: a compact form for shipping."""
        idx = np.nonzero(self.counts)[0]
        return idx, self.counts[idx]

    def add_sparse(self, indices: np.ndarray, counts: np.ndarray, lo: int, hi: int) -> None:
        """Add buckets given as (indices, counts), e.g. from another process's :meth:`nonzero`."""
        n = int(np.sum(counts))
        if n == 0:
            return
        np.add.at(self.counts, np.asarray(indices, dtype=np.int64), counts)
        self.min = lo if self.total == 0 else min(self.min, lo)
        self.max = max(self.max, hi)
        self.total += n

    def __getstate__(self) -> tuple:
        # Sparse when pickled (between processes): a run's histogram has few non-empty
        # buckets out of tens of thousands.
        idx, cnt = self.nonzero()
        return (self.spec, idx, cnt, self.total, self.min, self.max, self.clamped)

    def __setstate__(self, state: tuple) -> None:
        spec, idx, cnt, self.total, self.min, self.max, self.clamped = state
        self.spec = spec
        self.counts = np.zeros(spec.counts_len, dtype=np.int64)
        self.counts[idx] = cnt

    def __repr__(self) -> str:
        return f"Histogram(total={self.total}, min={self.min}, max={self.max}, spec={self.spec})"


class IntervalHistograms:
    """One histogram per interval number (``--hdr`` intervals, the over-time series),
    only the latest few of them dense.

    A dense histogram costs the pages its values touch: 100 intervals of a 10-minute soak
    grew its RSS floor by about 10 MiB. Requests end nearly in the order they were meant
    to start, so an interval older than the OPEN newest ones is folded into its non-empty
    buckets (a few KiB); a late value for it unfolds it again, so nothing is ever lost and
    only memory depends on the order. :meth:`histograms` gives them all, dense, at the end.
    """

    OPEN = 4

    __slots__ = ("_folded", "_open", "spec")

    def __init__(self, spec: HistogramSpec = DEFAULT_SPEC) -> None:
        self.spec = spec
        self._open: dict[int, Histogram] = {}
        self._folded: dict[int, tuple] = {}

    def record(self, k: int, values: np.ndarray | Sequence[float] | Sequence[int]) -> None:
        self._get(k).record(values)

    def add(self, other: IntervalHistograms) -> None:
        """Merge ``other`` (another worker's) into these, exactly."""
        for k, h in other.histograms().items():
            self._get(k).add(h)

    def histograms(self) -> dict[int, Histogram]:
        """Every interval's histogram, dense, by interval number in order."""
        out = dict(self._open)
        out.update((k, _unfolded(state)) for k, state in self._folded.items())
        return dict(sorted(out.items()))

    @property
    def dense(self) -> int:
        """How many are held dense now (at most OPEN)."""
        return len(self._open)

    def __len__(self) -> int:
        return len(self._open) + len(self._folded)

    def _get(self, k: int) -> Histogram:
        h = self._open.get(k)
        if h is not None:
            return h
        state = self._folded.pop(k, None)
        h = self._open[k] = Histogram(self.spec) if state is None else _unfolded(state)
        if len(self._open) > self.OPEN:  # fold the oldest other one (a late k stays open)
            oldest = min(x for x in self._open if x != k)
            self._folded[oldest] = self._open.pop(oldest).__getstate__()
        return h

    def __getstate__(self) -> tuple:
        return (self.spec, {k: h.__getstate__() for k, h in self._open.items()}, self._folded)

    def __setstate__(self, state: tuple) -> None:
        self.spec, self._folded = state[0], dict(state[2])
        self._folded.update(state[1])  # shipped: every one folded until written again
        self._open = {}


def _unfolded(state: tuple) -> Histogram:
    """A histogram from its sparse :meth:`Histogram.__getstate__`."""
    h = Histogram.__new__(Histogram)
    h.__setstate__(state)
    return h


# -- the V2 wire format ----------------------------------------------------------


def _zigzag_leb128(values: Iterable[int]) -> bytes:
    """HdrHistogram's ZigZagEncoding.putLong: 7 bits a byte, the 9th byte takes 8 bits."""
    out = bytearray()
    for value in values:
        z = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
        for _ in range(8):
            if z < 0x80:
                out.append(z)
                break
            out.append((z & 0x7F) | 0x80)
            z >>= 7
        else:
            out.append(z & 0xFF)
    return bytes(out)


def _zigzag_words(data: bytes) -> list[int]:
    """Inverse of :func:`_zigzag_leb128` (malformed input raises HistogramError)."""
    words = []
    i, n = 0, len(data)
    while i < n:
        z = 0
        shift = 0
        for k in range(9):
            if i >= n:
                raise HistogramError("truncated counts payload")
            b = data[i]
            i += 1
            if k == 8:
                z |= b << 56
                break
            z |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        words.append((z >> 1) ^ -(z & 1))
    return words


def _payload_words(counts: np.ndarray) -> list[int]:
    """Counts up to the last non-zero one; a run of 2+ zeros becomes one negative word."""
    nz = np.nonzero(counts)[0]
    if nz.size == 0:
        return []
    words: list[int] = []
    prev = -1
    for i in nz.tolist():
        gap = i - prev - 1
        if gap == 1:
            words.append(0)
        elif gap > 1:
            words.append(-gap)
        words.append(int(counts[i]))
        prev = i
    return words


def encode(hist: Histogram) -> str:
    """The ``HISTFAAA…`` string (base64 of the compressed V2 encoding) of ``hist``."""
    spec = hist.spec
    body = _zigzag_leb128(_payload_words(hist.counts))
    header = _PAYLOAD_HEADER.pack(_ENCODING_COOKIE, len(body), 0, spec.digits,
                                  spec.lowest, spec.highest, 1.0)
    compressed = zlib.compress(header + body)
    blob = _ENVELOPE_HEADER.pack(_COMPRESSION_COOKIE, len(compressed)) + compressed
    return base64.b64encode(blob).decode("ascii")


def decode(text: str | bytes) -> Histogram:
    """Read a ``HISTFAAA…`` string (from us or any HdrHistogram) into a Histogram.

    ``min``/``max`` of the result are bucket bounds (the format does not carry
    the exact extremes). Raises HistogramError on anything malformed.
    """
    try:
        blob = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as exc:
        raise HistogramError(f"not base64: {exc}") from None
    if len(blob) < _ENVELOPE_HEADER.size:
        raise HistogramError("too short for an encoded histogram")
    cookie, length = _ENVELOPE_HEADER.unpack_from(blob)
    if cookie & ~0xF0 != 0x1C849304:
        raise HistogramError(f"not a compressed V2 histogram (cookie {cookie:#x})")
    if length != len(blob) - _ENVELOPE_HEADER.size:
        raise HistogramError(f"length {length} does not match {len(blob) - 8} bytes")
    try:
        raw = zlib.decompress(blob[_ENVELOPE_HEADER.size:])
    except zlib.error as exc:
        raise HistogramError(f"bad compressed payload: {exc}") from None
    if len(raw) < _PAYLOAD_HEADER.size:
        raise HistogramError("payload shorter than its header")
    cookie, plen, norm, digits, lowest, highest, _ratio = _PAYLOAD_HEADER.unpack_from(raw)
    if cookie & ~0xF0 != 0x1C849303:
        raise HistogramError(f"not a V2 counts payload (cookie {cookie:#x})")
    if norm != 0:
        raise HistogramError("normalizing index offsets are not supported")
    if plen != len(raw) - _PAYLOAD_HEADER.size:
        raise HistogramError("payload length does not match its header")
    try:
        spec = HistogramSpec(lowest=lowest, highest=highest, digits=digits)
    except HistogramError as exc:
        raise HistogramError(f"unsupported layout: {exc}") from None
    hist = Histogram(spec)
    pos = 0
    for word in _zigzag_words(raw[_PAYLOAD_HEADER.size:]):
        if word < 0:
            pos += -word
            continue
        if pos >= spec.counts_len:
            raise HistogramError("more counts than the layout holds")
        hist.counts[pos] = word
        pos += 1
    idx = np.nonzero(hist.counts)[0]
    if idx.size:
        hist.total = int(hist.counts.sum())
        hist.min = int(spec.lowest_equivalent(idx[0]))
        hist.max = int(spec.highest_equivalent(idx[-1]))
    return hist


# -- the histogram log format (HistogramLogWriter / HistogramLogReader) -------------


@dataclass(frozen=True)
class Interval:
    """One line of a histogram log: ``start_s`` after the log's start, ``length_s`` long."""

    start_s: float
    length_s: float
    histogram: Histogram
    tag: str | None = None  # HdrHistogram's "Tag=NAME," prefix: several series in one log


def write_log(out: IO[str], intervals: Sequence[Interval], start_epoch_s: float,
              max_value_unit_ratio: float = 1e6, comment: str | None = None) -> None:
    """Write an HdrHistogram interval log (format 1.3), as Java's HistogramLogWriter does.

    ``max_value_unit_ratio`` scales the ``Interval_Max`` column (1e6: ns -> ms).
    """
    import datetime as _dt

    when = _dt.datetime.fromtimestamp(start_epoch_s, _dt.UTC).isoformat(" ")
    if comment:
        out.write(f"#{comment}\n")
    out.write("#[Histogram log format version 1.3]\n")
    out.write(f"#[StartTime: {start_epoch_s:.3f} (seconds since epoch), {when}]\n")
    out.write('"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"\n')
    for iv in intervals:
        if iv.tag:
            out.write(f"Tag={iv.tag},")
        out.write(f"{iv.start_s:.3f},{iv.length_s:.3f},"
                  f"{iv.histogram.max / max_value_unit_ratio:.3f},{encode(iv.histogram)}\n")


def parse_log(text: str) -> tuple[float | None, list[Interval]]:
    """Parse an interval log (pure): (StartTime in epoch seconds or None, intervals).

    Comment and legend lines are skipped; a ``Tag=…,`` prefix is accepted and
    ignored; a malformed interval line raises HistogramError naming its line.
    """
    start = None
    intervals = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("#[StartTime:"):
                try:
                    start = float(line[len("#[StartTime:"):].split()[0])
                except (ValueError, IndexError):
                    raise HistogramError(f"line {n}: bad StartTime") from None
            continue
        if line.startswith('"StartTimestamp"'):
            continue
        tag = None
        if line.startswith("Tag="):
            tag, _, line = line[len("Tag="):].partition(",")
        parts = line.split(",")
        if len(parts) != 4:
            raise HistogramError(f"line {n}: expected 4 comma-separated fields")
        try:
            t0, length = float(parts[0]), float(parts[1])
        except ValueError:
            raise HistogramError(f"line {n}: bad timestamp") from None
        try:
            hist = decode(parts[3])
        except HistogramError as exc:
            raise HistogramError(f"line {n}: {exc}") from None
        intervals.append(Interval(t0, length, hist, tag or None))
    return start, intervals


def merged(hists: Iterable[Histogram], spec: HistogramSpec = DEFAULT_SPEC) -> Histogram:
    """A new histogram holding the sum of ``hists`` (all of layout ``spec``)."""
    out = Histogram(spec)
    for h in hists:
        out.add(h)
    return out


def percentile_spectrum(hist: Histogram, scale: float = 1e6, ticks_per_half: int = 5) -> str:
    """HdrHistogram's ``outputPercentileDistribution`` text (what wrk2 prints as the
    "Detailed Percentile spectrum"); values are divided by ``scale`` (1e6: ns -> ms)."""
    lines = [f"{'Value':>12} {'Percentile':>14} {'TotalCount':>10} {'1/(1-Percentile)':>14}", ""]
    if hist.total:
        cum = np.cumsum(hist.counts)
        level = 0.0
        while True:
            v = hist.value_at_percentile(level)
            idx = int(hist.spec.index_of(np.array([v]))[0])
            count = int(cum[idx])
            if count >= hist.total:
                break
            pct = level / 100.0
            lines.append(f"{v / scale:12.3f} {pct:14.12f} {count:10d} {1 / (1 - pct):14.2f}")
            ticks = ticks_per_half * 2 ** (int(math.log2(100.0 / (100.0 - level))) + 1)
            level += 100.0 / ticks
            if level >= 100.0:
                break
        lines.append(f"{hist.max / scale:12.3f} {1.0:14.12f} {hist.total:10d}")
    lines.append(f"#[Mean    = {hist.mean() / scale:12.3f}, "
                 f"StdDeviation   = {hist.stddev() / scale:12.3f}]")
    lines.append(f"#[Max     = {hist.max / scale:12.3f}, Total count    = {hist.total:12d}]")
    lines.append(f"#[Buckets = {hist.spec.bucket_count:12d}, "
                 f"SubBuckets     = {hist.spec.sub_bucket_count:12d}]")
    return "\n".join(lines)
