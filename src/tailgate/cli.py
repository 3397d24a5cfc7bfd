"""The `tailgate` command: parse arguments, hand off to a command module, exit.

Each command lives in ``tailgate/commands/<name>.py`` and exposes
``register(subparsers)`` (adds its parser and sets ``func``) and a function
``run(args) -> int``. Heavy imports stay inside ``run`` so `tailgate --help`
and `tailgate inspect` start fast.

Exit status: 0 fine, 1 a red line or SLO crossed, 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

COMMAND_MODULES = (
    "tailgate.commands.inspect",
    "tailgate.commands.catalog",
    "tailgate.commands.probe",
    "tailgate.commands.bench",
)


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailgate",
        description="Govern tail latency (P99/P999/P9999) bottom-up: L1 physical, L2 kernel, "
        "L3 data plane, L4 inference engine.",
    )
    parser.add_argument("--version", action="version", version=f"tailgate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a command not built yet
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"tailgate {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tailgate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tailgate ... | head`: the reader left, nothing more to say
        sys.stderr.close()
        return 0
