"""Rules every parser of a source shares: one record once, digits are ASCII.

* **A record that appears twice** (a counter line, an AER key, an interface in
  /proc/net/dev, one PTP port answering twice) with different values is a broken
  source: which one is true cannot be told, so the source is a :class:`ParseError`
  naming the record, never "the last one wins". A line repeated with the same value
  says nothing new and is kept once.
* **CPU sets have one parser per kernel format**: a cpulist (``0-3,8``: :func:`parse_cpulist`)
  and a hex bitmap (``00000000,0000000f``: :func:`parse_cpumask`), bounded by the kernel's
  largest NR_CPUS.
* **Digits are ASCII**: ``str.isdigit()`` also takes ``'²'`` (which ``int()`` refuses)
  and ``\\d`` takes other scripts' digits (which ``int()`` reads); a kernel or a tool
  writes ``0-9`` only, so nothing else is a number.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, MutableMapping
from typing import Any, TypeVar

from ..model import ParseError

K = TypeVar("K")
V = TypeVar("V")

_ASCII_UINT = re.compile(r"[0-9]+", re.ASCII)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def put(out: MutableMapping[K, V], key: K, value: V, what: str) -> None:
    """``out[key] = value``, unless ``key`` is there already with another value: then the
    source holds the record twice and is refused (``what`` names the source's format)."""
    if key in out and out[key] != value:
        raise ParseError(f"{what}: {_show(key)} appears twice with different values "
                         f"({_show(out[key])}, then {_show(value)}): a broken source")
    out[key] = value


def unique_pairs(what: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A ``json.loads`` ``object_pairs_hook`` applying :func:`put` to every object (JSON's
    own rule is that the last duplicate key wins, silently)."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            put(out, key, value, what)
        return out

    return hook


def loads_unique(text: str, what: str, **kwargs: Any) -> Any:
    """``json.loads`` with duplicate keys refused (:func:`unique_pairs`)."""
    return json.loads(text, object_pairs_hook=unique_pairs(what), **kwargs)


def is_uint(text: str) -> bool:
    """Whether ``text`` is ASCII digits only (not ``'²'``, not ``'٣'``)."""
    return _ASCII_UINT.fullmatch(text) is not None


# -- CPU sets ---------------------------------------------------------------------------

MAX_CPUS = 8192  # the kernel's largest NR_CPUS (and far above MAX_NUMNODES)
_CPU_RANGE_RE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")
# a bitmap: 32-bit words, most significant first; 256 words = 8192 CPUs
_CPU_MASK_RE = re.compile(r"[0-9a-fA-F]{1,8}(,[0-9a-fA-F]{1,8}){0,255}")


def parse_cpulist(text: str, empty_ok: bool = True) -> list[int]:
    """Kernel cpulist format: ``0-3,8,10-11`` (also used for node lists). Empty -> [],
    or a ParseError where content is required (``empty_ok=False``: every host has a CPU
    online and a NUMA node). Ids at or above MAX_CPUS are not a real machine's."""
    out: list[int] = []
    text = text.strip()
    if not text:
        if not empty_ok:
            raise ParseError("empty cpu list where at least one is required")
        return out
    for part in text.split(","):
        m = _CPU_RANGE_RE.fullmatch(part)
        if not m:
            raise ParseError(f"malformed cpu list {text[:60]!r}")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) else a
        if b < a:
            raise ParseError(f"malformed cpu range {part!r}")
        if b >= MAX_CPUS or len(out) + b - a >= MAX_CPUS:
            raise ParseError(f"cpu list {text[:60]!r}: beyond {MAX_CPUS} CPUs, not a real host")
        out.extend(range(a, b + 1))
    return out


def parse_cpumask(text: str) -> list[int]:
    """Kernel hex bitmap (rps_cpus, xps_cpus, smp_affinity): ``00000000,0000000f`` ->
    ``[0, 1, 2, 3]``. Words of 1 to 8 hex digits; empty or anything else is a ParseError."""
    s = text.strip()
    if not _CPU_MASK_RE.fullmatch(s):
        raise ParseError(f"not a CPU mask: {s[:40]!r}")
    value = 0
    for word in s.split(","):
        value = (value << 32) | int(word, 16)
    return [i for i in range(value.bit_length()) if value >> i & 1]
