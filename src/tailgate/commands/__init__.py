"""The commands, one module each: ``register(subparsers)`` adds its parser, ``run(args)``
does the work. :func:`build_parser` is the whole tree (the CLI runs it; ``tailgate
completion`` generates the shell scripts from it)."""

from __future__ import annotations

import argparse
import importlib

from .. import __version__

COMMAND_MODULES = (
    "tailgate.commands.inspect",
    "tailgate.commands.catalog",
    "tailgate.commands.probe",
    "tailgate.commands.bench",
    "tailgate.commands.serve",
    "tailgate.commands.rules",
    "tailgate.commands.compare",
    "tailgate.commands.campaign",
    "tailgate.commands.diagnose",
    "tailgate.commands.plan",
    "tailgate.commands.report",
    "tailgate.commands.completion",
)


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
