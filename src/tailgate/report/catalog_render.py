"""The catalog on a terminal: `tailgate checks` (one line per red line) and `tailgate explain
ID` (one entry in full)."""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Iterable

from ..baseline import Entry


def checks_text(entries: Iterable[Entry], implemented: Collection[str]) -> str:
    """One line per entry: layer, id, red line, limit; those no check implements marked."""
    lines = []
    for e in entries:
        limit = e.params.get("limit")
        shown = "" if limit is None else f"{limit} {e.unit}".strip()
        mark = "" if e.id in implemented else "  (not implemented yet)"
        lines.append(f"{e.layer}  {e.id:<28} {e.title}" + (f"  [limit {shown}]" if shown else "")
                     + mark)
    return "".join(line + "\n" for line in lines)


def _wrap(text: str) -> str:
    return textwrap.fill(text, 88, initial_indent="  ", subsequent_indent="  ")


def entry_text(entry: Entry) -> str:
    """One entry in full: red line, default baseline, why, how measured, needs, remedy."""
    out = f"{entry.id}  ({entry.layer})\n  red line: {entry.title}\n\n"
    if entry.params:
        out += ("default baseline: " + ", ".join(f"{k}={v!r}" for k, v in entry.params.items())
                + (f"  [{entry.unit}]" if entry.unit else "") + "\n\n")
    for head, body in (("why", entry.rationale), ("how it is measured", entry.measure),
                       ("what it takes to measure it", entry.needs), ("remedy", entry.remedy)):
        if body:
            out += f"{head}:\n{_wrap(body)}\n\n"
    return out
