"""`tailgate compare BEFORE AFTER`: the before/after table, and a performance gate."""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError
from ..outputs import check_writable, write_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="before/after table of two results, with significance; a CI gate",
        description="Compare two results (inspect, bench, LLM bench or probe JSON; several "
        "runs per side, comma-separated, merge exactly from their histograms): metric, before, "
        "after, change (x and %), whether the change is beyond the noise, bottom-up.")
    p.add_argument("before", metavar="BEFORE", help="result JSON file(s), comma-separated")
    p.add_argument("after", metavar="AFTER", help="result JSON file(s), comma-separated")
    p.add_argument("--max-regression", action="append", default=[], metavar="METRIC=PCT%",
                   help="exit 1 when METRIC (e.g. p999, latency.p99, ttft.p999, "
                   "rate.achieved) got worse by more than PCT%% and the change is not within "
                   "the noise (repeatable)")
    p.add_argument("--json", metavar="FILE|-", help="write the comparison as JSON")
    p.add_argument("--markdown", metavar="FILE|-", help="write the table as Markdown")
    p.add_argument("--html", metavar="FILE",
                   help="write a self-contained HTML page (table and percentile spectra)")
    p.add_argument("--quiet", action="store_true", help="no terminal table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..campaign.table import is_campaign_dir

    if is_campaign_dir(args.before) or is_campaign_dir(args.after):  # two `campaign run` dirs
        if not (is_campaign_dir(args.before) and is_campaign_dir(args.after)):
            raise UsageError("compare a campaign directory with another campaign directory")
        from .campaign import compare_campaigns

        return compare_campaigns(args)
    from ..compare import (
        CompareError,
        compare,
        document,
        load,
        measured_differently,
        parse_gate,
        regressions,
        side,
        spectra,
        status_changes,
    )

    try:
        gates = [parse_gate(g) for g in args.max_regression]
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    check_writable(args.json, args.markdown, args.html)
    before = [p for p in args.before.split(",") if p]
    after = [p for p in args.after.split(",") if p]
    try:  # (each file read once)
        docs_b, docs_a = [load(p) for p in before], [load(p) for p in after]
        kind_b, mb = side(before, docs_b)
        kind_a, ma = side(after, docs_a)
        if kind_a != kind_b:
            raise CompareError(f"cannot compare a {kind_b} result with a {kind_a} result")
        rows = compare(mb, ma)
        changes = (status_changes(docs_b[-1], docs_a[-1]) if kind_a == "inspect" else [])
        differently = measured_differently(docs_b, docs_a)
    except CompareError as exc:
        raise UsageError(str(exc)) from exc
    failed = regressions(rows, gates)
    doc = document(kind_a, rows, changes, failed, {"before": before, "after": after},
                   differently)
    if args.json:
        write_output(args.json, json.dumps(doc, indent=1) + "\n")
    from ..report import compare_render

    if args.markdown:
        write_output(args.markdown, compare_render.markdown(doc, rows))
    if args.html:
        write_output(args.html, compare_render.html_page(doc, rows, spectra(docs_b, docs_a)))
    if not args.quiet and "-" not in (args.json, args.markdown):
        from rich.console import Console

        compare_render.terminal(doc, rows, Console())
    elif failed:  # no table shows it: the exit status alone would not say why
        import sys

        for g, r in failed:
            change = "n/a" if r.change_pct is None else f"{r.change_pct:+.1f} %"
            print(f"tailgate compare: regression: {r.name} {change} (gate {g.metric}="
                  f"{g.max_pct:g}%, significant: {r.significant})", file=sys.stderr)
    return 1 if failed else 0
