"""`tailgate campaign run FILE --out DIR` and `tailgate campaign report DIR`."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import EXIT_BUG, EXIT_GATE, EXIT_OK, UsageError
from ..outputs import check_writable, write_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "campaign", help="measure one system at every layer (inspect, loads, collective) "
        "into one directory; compare two with `tailgate compare DIR DIR`",
        description="A campaign file names one system under test; `campaign run` measures it "
        "with every command (inspect with probes first, then each load, then the collective) "
        "and keeps every document with an index; `tailgate compare BEFORE_DIR AFTER_DIR` "
        "prints the method's before/after table.")
    csub = p.add_subparsers(dest="campaign_command", metavar="SUBCOMMAND", required=True)
    r = csub.add_parser("run", help="run a campaign file into a directory",
                        description="Run every step of the campaign FILE as the tailgate "
                        "command itself, each with a time-out; a failing step is recorded with "
                        "its reason and the campaign goes on. Exit 0 when every step passed, 1 "
                        "when one crossed a red line or an SLO or failed, 3 when a step hit a "
                        "tailgate bug.")
    r.add_argument("file", metavar="FILE", help="the campaign YAML file")
    r.add_argument("--out", required=True, metavar="DIR",
                   help="directory for the documents and the index (new, or empty)")
    r.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=None,
                   help="diagnose each load that misses its SLO (default: the file's "
                   "`diagnose:`, else no)")
    r.set_defaults(func=run_cmd)
    rep = csub.add_parser("report", help="render one campaign directory",
                          description="The steps of one campaign and every figure its "
                          "documents hold, bottom-up (nothing is re-run).")
    rep.add_argument("dir", metavar="DIR", help="a directory written by `campaign run`")
    rep.add_argument("--json", metavar="FILE|-", help="write the figures as JSON")
    rep.add_argument("--markdown", metavar="FILE|-", help="write them as Markdown")
    rep.add_argument("--html", metavar="FILE", help="write a self-contained HTML page")
    rep.add_argument("--quiet", action="store_true", help="no terminal table")
    rep.set_defaults(func=report_cmd)


def _check_service(c) -> None:
    """The service must exist before anything runs (a missing pid is the file's error)."""
    from ..host import Host
    from ..service import existing_cgroup, existing_pids

    host = Host("/")
    try:
        if c.pids:
            existing_pids(host, [str(p) for p in c.pids])
        if c.cgroup:
            existing_cgroup(host, c.cgroup)
    except UsageError as exc:
        key = "pids" if c.pids and "pid" in str(exc) else "cgroup"
        raise UsageError(f"{c.where(key)}: {exc}") from None


def run_cmd(args: argparse.Namespace) -> int:
    from ..campaign.run import INDEX, run_campaign
    from ..campaign.spec import load_campaign

    c = load_campaign(args.file)
    _check_service(c)
    out = args.out
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out}: not a directory")
    if os.path.isdir(out) and os.listdir(out):
        what = "holds a campaign" if os.path.exists(os.path.join(out, INDEX)) else "is not empty"
        raise UsageError(f"--out {out}: {what} (a campaign goes into a new directory)")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise UsageError(f"--out {out}: no directory {parent}")
    diagnose = c.diagnose if args.diagnose is None else args.diagnose
    if diagnose and not (c.pids or c.cgroup):
        raise UsageError(f"{c.path}: --diagnose needs the service (service.pids or "
                         "service.cgroup) in the campaign file")
    index = run_campaign(c, out, diagnose, sys.stderr)
    codes = [s["exit_status"] for s in index["steps"]]
    if EXIT_BUG in codes:
        return EXIT_BUG
    return EXIT_OK if all(s["status"] == "ok" for s in index["steps"]) else EXIT_GATE


def report_cmd(args: argparse.Namespace) -> int:
    from ..campaign.table import CampaignFileError, load_dir, one_side
    from ..report import campaign_render

    check_writable(args.json, args.markdown, args.html)
    try:
        camp = load_dir(args.dir)
    except CampaignFileError as exc:
        raise UsageError(str(exc)) from None
    rows = one_side(camp)
    doc = campaign_render.report_document(camp, rows)
    if args.json:
        write_output(args.json, json.dumps(doc, indent=1) + "\n")
    if args.markdown:
        write_output(args.markdown, campaign_render.report_markdown(doc))
    if args.html:
        write_output(args.html, campaign_render.report_html(doc, rows))
    if not args.quiet and "-" not in (args.json, args.markdown):
        from rich.console import Console

        campaign_render.report_terminal(doc, Console())
    return EXIT_OK


def compare_campaigns(args: argparse.Namespace) -> int:
    """`tailgate compare BEFORE_DIR AFTER_DIR`: the method's table of two campaigns."""
    from ..campaign.table import CampaignFileError, changes, load_dir, one_side, table
    from ..compare import parse_gate, regressions
    from ..report import campaign_render

    try:
        gates = [parse_gate(g) for g in args.max_regression]
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    check_writable(args.json, args.markdown, args.html)
    try:
        cb, ca = load_dir(args.before), load_dir(args.after)
        before, after = one_side(cb), one_side(ca)
    except CampaignFileError as exc:
        raise UsageError(str(exc)) from None
    rows, only_b, only_a = table(before, after)
    failed = regressions(rows, gates)
    doc = campaign_render.compare_document(cb, ca, rows, changes(before, after), failed,
                                           only_b, only_a)
    if args.json:
        write_output(args.json, json.dumps(doc, indent=1) + "\n")
    if args.markdown:
        write_output(args.markdown, campaign_render.markdown(doc, rows))
    if args.html:
        write_output(args.html, campaign_render.html_page(doc, rows, before, after))
    if not args.quiet and "-" not in (args.json, args.markdown):
        from rich.console import Console

        campaign_render.terminal(doc, rows, Console(width=160))
    return EXIT_GATE if failed else EXIT_OK
