"""`tailgate bench allreduce`: a launcher-run program with its own options, parsed and run by
:mod:`tailgate.bench.collective.command`; rank 0's files and report come from report/."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from ..bench.collective.command import run as run_collective
    from ..report.collective_render import save

    return run_collective(args, save)
