"""`tailgate checks` lists the catalog; `tailgate explain ID` prints one entry in full."""

from __future__ import annotations

import argparse
import textwrap

from ..errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("checks", help="list every red line: id, layer, limit")
    p.set_defaults(func=run_checks)
    p = sub.add_parser("explain", help="rationale, measurement and remedy of one check")
    p.add_argument("id", metavar="ID")
    p.set_defaults(func=run_explain)


def run_checks(args: argparse.Namespace) -> int:
    from ..baseline import catalog
    from ..judge import checks

    implemented = checks()
    for e in catalog().values():
        limit = e.params.get("limit")
        shown = "" if limit is None else f"{limit} {e.unit}".strip()
        mark = "" if e.id in implemented else "  (not implemented yet)"
        print(f"{e.layer}  {e.id:<28} {e.title}" + (f"  [limit {shown}]" if shown else "") + mark)
    return 0


def _wrap(text: str) -> str:
    return textwrap.fill(text, 88, initial_indent="  ", subsequent_indent="  ")


def run_explain(args: argparse.Namespace) -> int:
    from ..baseline import catalog

    entry = catalog().get(args.id)
    if entry is None:
        close = [i for i in catalog() if args.id in i]
        hint = f" (did you mean {', '.join(close)}?)" if close else " (see `tailgate checks`)"
        raise UsageError(f"unknown check id {args.id!r}{hint}")
    print(f"{entry.id}  ({entry.layer})\n  red line: {entry.title}\n")
    if entry.params:
        print("default baseline: " + ", ".join(f"{k}={v!r}" for k, v in entry.params.items())
              + (f"  [{entry.unit}]" if entry.unit else "") + "\n")
    for head, body in (("why", entry.rationale), ("how it is measured", entry.measure),
                       ("what it takes to measure it", entry.needs), ("remedy", entry.remedy)):
        if body:
            print(f"{head}:\n{_wrap(body)}\n")
    return 0
