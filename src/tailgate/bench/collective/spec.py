"""Message sizes, element types, reduction ops and nccl-tests' bandwidth formulas (pure).

Sizes follow nccl-tests' conventions: ``K``/``M``/``G`` are powers of 1024
(``-b 8 -e 128M``), and a range doubles from its first size to its last
(``-f 2``). Bandwidths are nccl-tests' (``doc/PERFORMANCE.md``): ``algbw`` is
bytes / time in GB/s (10**9 bytes), ``busbw = algbw * factor`` with the
factor of each collective as in ``src/<collective>.cu`` ``GetBw``.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_BYTES = 16 << 30  # one buffer; beyond that a typo is likelier than a wish


@dataclass(frozen=True)
class DType:
    """An element type: its name, size in bytes, and whether numpy/MPI carry it."""

    name: str
    itemsize: int
    numpy: str | None  # numpy dtype name; None: numpy (and so MPI here) has no such type


DTYPES = {d.name: d for d in (
    DType("float32", 4, "float32"),
    DType("float64", 8, "float64"),
    DType("int32", 4, "int32"),
    DType("bfloat16", 2, None),
)}
OPS = ("sum", "prod", "min", "max")

# busbw / algbw per collective (nccl-tests src/*.cu GetBw), n = number of ranks.
BUS_FACTORS = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "alltoallv": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
    "hypercube": lambda n: 1.0,
}


def parse_size(text: str) -> int:
    """``"8"``, ``"8B"``, ``"64KiB"``, ``"1MiB"``, ``"1GB"`` -> bytes, by tailgate's one rule
    (tailgate.units: K/M/G are powers of 1000, KiB/MiB/GiB of 1024), within one buffer's range."""
    from ...units import parse_size as parse

    value = parse(text)
    if value < 1:
        raise ValueError(f"size must be at least 1 byte: {text!r}")
    if value > MAX_BYTES:
        raise ValueError(f"size {text!r} is over {MAX_BYTES >> 30} GiB per buffer")
    return value


def parse_sizes(text: str) -> list[int]:
    """``"8B..1GiB"`` (doubling), ``"1KiB..1MiB:4"`` (times 4), ``"1KiB,64KiB"`` or ``"4MiB"``.

    Returns the sizes in bytes, ascending, without duplicates.
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if ".." in part:
            lo_s, _, rest = part.partition("..")
            hi_s, _, factor_s = rest.partition(":")
            lo, hi = parse_size(lo_s), parse_size(hi_s)
            try:
                factor = int(factor_s) if factor_s else 2
            except ValueError:
                raise ValueError(f"bad factor in {part!r}: expected an integer >= 2") from None
            if factor < 2:
                raise ValueError(f"bad factor in {part!r}: expected an integer >= 2")
            if lo > hi:
                raise ValueError(f"empty size range {part!r}: {lo} B > {hi} B")
            size = lo
            while size <= hi:
                out.append(size)
                size *= factor
        else:
            out.append(parse_size(part))
    if not out:
        raise ValueError(f"no sizes in {text!r}")
    if len(set(out)) > 64:
        raise ValueError(f"{len(set(out))} sizes in {text!r}: at most 64")
    return sorted(set(out))


def element_count(nbytes: int, dtype: DType) -> int:
    """Elements of ``dtype`` in a buffer of ``nbytes`` (nccl-tests rounds down too)."""
    count = nbytes // dtype.itemsize
    if count < 1:
        raise ValueError(f"{nbytes} B holds no {dtype.name} element ({dtype.itemsize} B each)")
    return count


def algbw_gbps(nbytes: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: bytes / time, in GB/s (10**9 bytes per second)."""
    return nbytes / 1e9 / seconds if seconds > 0 else 0.0


def bus_factor(collective: str, ranks: int) -> float:
    """busbw / algbw for ``collective`` over ``ranks`` ranks (nccl-tests' GetBw)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, not {ranks}")
    try:
        return BUS_FACTORS[collective](ranks)
    except KeyError:
        raise ValueError(f"unknown collective {collective!r}") from None


def busbw_gbps(collective: str, nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth: algbw * factor (AllReduce: 2(n-1)/n)."""
    return algbw_gbps(nbytes, seconds) * bus_factor(collective, ranks)


def format_size(nbytes: int) -> str:
    """1024 -> ``1KiB``, 1536 -> ``1536B``: exact, and read back as the same size."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"
