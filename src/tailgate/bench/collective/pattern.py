"""What each rank contributes, and what a correct result must hold (pure).

As nccl-tests does, every rank fills its send buffer with values that depend
on its rank and the element's index, and every result is compared with the
exact expected reduction. The values are small integers (or ±1, 2, 0.5 for
``prod``), so every reduction is exact in float32, float64, int32 and bfloat16:
any difference is a wrong element, not rounding. A row of ``PERIOD`` values
repeats along the buffer, so the expected result costs ``PERIOD`` elements of
memory whatever the message size.
"""

from __future__ import annotations

import numpy as np

PERIOD = 16
_PROD_VALUES = np.array([1.0, 2.0, -1.0, 0.5])


def contribution_row(rank: int, op: str) -> np.ndarray:
    """The ``PERIOD`` values rank ``rank`` sends, repeated along its buffer (float64)."""
    i = np.arange(PERIOD)
    if op == "prod":
        return _PROD_VALUES[(i + rank) % len(_PROD_VALUES)]
    return (((i * 5 + rank * 3 + 1) % 16) - 8).astype(np.float64)


def expected_row(ranks: int, op: str) -> np.ndarray:
    """The reduction of every rank's row: what each ``PERIOD`` elements of a result hold."""
    rows = np.stack([contribution_row(r, op) for r in range(ranks)])
    if op == "sum":
        return rows.sum(axis=0)
    if op == "prod":
        return rows.prod(axis=0)
    if op == "min":
        return rows.min(axis=0)
    if op == "max":
        return rows.max(axis=0)
    raise ValueError(f"unknown op {op!r}")


def count_wrong(result: np.ndarray, row: np.ndarray) -> int:
    """Elements of ``result`` that differ from ``row`` repeated along it (NaN is wrong)."""
    n = result.shape[0]
    full = n - n % PERIOD
    wrong = int(np.count_nonzero(result[:full].reshape(-1, PERIOD) != row))
    if full < n:
        wrong += int(np.count_nonzero(result[full:] != row[: n - full]))
    return wrong
