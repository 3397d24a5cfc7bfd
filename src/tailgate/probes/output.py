"""Parse what ``bpftrace -f json`` prints: pure text in, values out.

bpftrace 0.17 prints one JSON object per line, with blank lines in between::

    {"type": "attached_probes", "data": {"probes": 4}}
    {"type": "printf", "data": "so 7485 65536\\n"}
    {"type": "map", "data": {"@lat": {"0,1234": 7, "0,1240": 2}}}
    {"type": "map", "data": {"@max": 7283}}

A map with several keys joins them with commas into one string; a program here
puts at most one string key (a comm or a stack, which may hold commas) and puts
it last, so :func:`split_key` splits on the first ``n - 1`` commas. Two keys can
print alike (two return addresses in one function, under ``usym``): their
counts add up.
Lines that are not JSON (warnings bpftrace prints on stdout) are kept apart,
never guessed at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..model import ParseError


@dataclass(frozen=True)
class BpftraceOutput:
    maps: dict[str, Any] = field(default_factory=dict)
    printf: tuple[str, ...] = ()
    attached: int | None = None
    lost_events: int = 0
    other: tuple[str, ...] = ()  # non-JSON lines, e.g. warnings

    def map(self, name: str) -> dict[str, Any]:
        """A keyed map (``{}`` when the program never wrote it: bpftrace omits empty maps)."""
        value = self.maps.get(name, {})
        if not isinstance(value, dict):
            raise ParseError(f"bpftrace map {name} is a scalar, expected a keyed map")
        return value

    def scalar(self, name: str) -> int | None:
        value = self.maps.get(name)
        if value is None:
            return None
        if isinstance(value, dict):
            raise ParseError(f"bpftrace map {name} is keyed, expected a scalar")
        return int(value)


def _merge_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Keys that print alike (``usym`` of two addresses in one function) appear twice in
    one map: their counts add up instead of the last one winning."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out and isinstance(value, int) and isinstance(out[key], int):
            out[key] += value
        else:
            out[key] = value
    return out


def parse_output(text: str) -> BpftraceOutput:
    maps: dict[str, Any] = {}
    printf: list[str] = []
    other: list[str] = []
    attached: int | None = None
    lost = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("{"):
            other.append(line)
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_merge_pairs)
        except json.JSONDecodeError as exc:
            raise ParseError(f"bpftrace printed malformed JSON: {line[:80]!r}: {exc}") from exc
        if not isinstance(obj, dict) or "type" not in obj:
            raise ParseError(f"bpftrace printed an unexpected JSON value: {line[:80]!r}")
        kind, data = obj["type"], obj.get("data")
        if kind == "attached_probes":
            try:
                attached = int(data["probes"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ParseError(f"bpftrace attached_probes without a count: {line[:80]!r}") \
                    from exc
        elif kind == "printf":
            printf.append(str(data))
        elif kind in ("map", "hist", "lhist", "stats"):
            if not isinstance(data, dict):
                raise ParseError(f"bpftrace {kind} output without a map: {line[:80]!r}")
            maps.update(data)
        elif kind == "lost_events":
            try:
                lost += int(data["events"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ParseError(f"bpftrace lost_events without a count: {line[:80]!r}") \
                    from exc
        else:
            other.append(line)
    return BpftraceOutput(maps, tuple(printf), attached, lost, tuple(other))


def split_key(key: str, n: int) -> list[str]:
    """Split a joined map key into ``n`` parts; only the last may contain commas."""
    parts = key.split(",", n - 1)
    if len(parts) != n:
        raise ParseError(f"bpftrace map key {key!r} has fewer than {n} parts")
    return parts


def int_key(text: str) -> int:
    try:
        return int(text.strip(), 10)
    except ValueError as exc:
        raise ParseError(f"bpftrace map key part {text!r} is not an integer") from exc


def keyed(data: dict[str, Any], n: int) -> list[tuple[list[str], int]]:
    """``[(key parts, integer value)]`` of a map with ``n`` keys."""
    out = []
    for key, value in data.items():
        if not isinstance(value, (int, float)):
            raise ParseError(f"bpftrace map value for {key!r} is not a number: {value!r}")
        out.append((split_key(key, n) if n > 1 else [key], int(value)))
    return out
