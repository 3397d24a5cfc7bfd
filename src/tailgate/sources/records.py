"""Rules every parser of a source shares: one record once, digits are ASCII.

* **A record that appears twice** (a counter line, an AER key, an interface in
  /proc/net/dev, one PTP port answering twice) with different values is a broken
  source: which one is true cannot be told, so the source is a :class:`ParseError`
  naming the record, never "the last one wins". A line repeated with the same value
  says nothing new and is kept once.
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
