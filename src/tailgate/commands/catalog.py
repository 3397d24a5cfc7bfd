"""`tailgate checks` lists the catalog; `tailgate explain ID` prints one entry in full (the
text is report/catalog_render's)."""

from __future__ import annotations

import argparse

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
    from ..report.catalog_render import checks_text

    print(checks_text(catalog().values(), checks()), end="")
    return 0


def run_explain(args: argparse.Namespace) -> int:
    from ..baseline import catalog
    from ..report.catalog_render import entry_text

    entry = catalog().get(args.id)
    if entry is None:
        close = [i for i in catalog() if args.id in i]
        hint = f" (did you mean {', '.join(close)}?)" if close else " (see `tailgate checks`)"
        raise UsageError(f"unknown check id {args.id!r}{hint}")
    print(entry_text(entry), end="")
    return 0
