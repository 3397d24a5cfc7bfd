"""Sizes users type, one rule for every command (bench, plan, bench allreduce).

* A plain number is bytes: ``4096``, ``1.5e9``.
* ``K``, ``M``, ``G``, ``T``, ``P`` (with or without ``B``) are powers of 1000 (SI): ``64K``
  and ``64KB`` are 64,000 bytes, ``141GB`` is 141e9.
* ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB`` (also ``Ki``) are powers of 1024 (IEC):
  ``64KiB`` is 65,536 bytes, ``80GiB`` is 85,899,345,920.

Case does not matter; only ASCII digits are digits. The value must be a whole number of
bytes, finite, and at most :data:`MAX_SIZE` (``1e400`` is refused, not infinity).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MAX_SIZE = 2**63 - 1  # what any byte count here fits in
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+]?[0-9]{1,4}))?\s*"
                   r"(?:([kmgtp])(i?))?(b?)\s*", re.ASCII | re.IGNORECASE)
EXAMPLES = "e.g. 4096, 64KiB, 16MiB, 141GB, 1.5e9"


def parse_size(text: str) -> int:
    """Bytes in ``text`` by the rule above; ValueError naming the text otherwise."""
    m = _SIZE.fullmatch(str(text))
    if m is None:
        raise ValueError(f"not a size: {text!r} ({EXAMPLES})")
    digits, exponent, prefix, binary, _ = m.groups()
    try:
        value = Decimal(digits) * (Decimal(10) ** int(exponent or 0))
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"not a size: {text!r} ({EXAMPLES})") from None
    if prefix:
        power = "kmgtp".index(prefix.lower()) + 1
        value *= (1024 if binary else 1000) ** power
    if value > MAX_SIZE:
        raise ValueError(f"size {text!r} is implausibly large (over {MAX_SIZE:,} bytes)")
    if value != value.to_integral_value():
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(value)
