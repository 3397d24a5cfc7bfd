"""`tailgate rules`: Prometheus recording and alerting rules from the catalog and a baseline."""

from __future__ import annotations

import argparse
import re

from ..errors import UsageError
from ..outputs import check_writable, write_output

DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rules", help="Prometheus alerting and recording rules from the red lines",
        description="Write Prometheus rules (promtool check rules clean) that fire where "
        "`tailgate serve`'s findings cross a red line, plus P99/P999 rules over the resident "
        "run-queue histogram and an engine's TTFT histogram.")
    p.add_argument("--baseline", metavar="FILE", help="YAML file overriding red lines per id")
    p.add_argument("--for", dest="for_fail", default="5m", metavar="DURATION",
                   help="how long a fail must last before its alert fires (default 5m)")
    p.add_argument("--for-warn", default="30m", metavar="DURATION",
                   help="the same for warn alerts (default 30m)")
    p.add_argument("--for-unknown", default="1h", metavar="DURATION",
                   help="the same for unmeasured red lines (default 1h)")
    p.add_argument("--window", default="5m", metavar="DURATION",
                   help="rate window of the histogram quantiles (default 5m)")
    p.add_argument("--ttft-p99", type=float, default=2.0, metavar="SECONDS",
                   help="engine SLO on vLLM's TTFT P99 (default 2)")
    p.add_argument("--job", default="", metavar="NAME",
                   help="restrict every rule to this scrape job")
    p.add_argument("--out", metavar="FILE", default="-",
                   help="write the rules here (default: standard output)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..baseline import BaselineError, default_baseline, load_baseline
    from ..rules import RuleOptions, generate, to_yaml

    for flag, value in (("--for", args.for_fail), ("--for-warn", args.for_warn),
                        ("--for-unknown", args.for_unknown), ("--window", args.window)):
        if not DURATION.match(value):
            raise UsageError(f"{flag} {value!r}: expected a Prometheus duration such as 5m")
    if not re.fullmatch(r"[a-zA-Z0-9_.:-]*", args.job):
        raise UsageError(f"--job {args.job!r}: letters, digits and _.:- only")
    if not args.ttft_p99 > 0:
        raise UsageError("--ttft-p99 must be > 0")
    check_writable(args.out)
    try:
        baseline = load_baseline(args.baseline) if args.baseline else default_baseline()
    except BaselineError as exc:
        raise UsageError(str(exc)) from exc
    opts = RuleOptions(for_fail=args.for_fail, for_warn=args.for_warn,
                       for_unknown=args.for_unknown, window=args.window,
                       ttft_p99_s=args.ttft_p99, job=args.job)
    write_output(args.out, to_yaml(generate(baseline, opts)))
    return 0
