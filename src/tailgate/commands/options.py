"""What several commands share: the status line of a long command. (--pid and --cgroup are
checked in :mod:`tailgate.service`.)"""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def status(args, command: str):
    """A one-line spinner on stderr saying what a long command is doing (rich), yielding a
    function that updates it; a no-op when stderr is not a terminal, with --quiet, or when a
    document goes to stdout (--json -)."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty() or getattr(args, "json", None) == "-":
        yield lambda text: None
        return
    from rich.console import Console

    with Console(stderr=True).status(f"tailgate {command}: starting") as shown:
        yield lambda text: shown.update(f"tailgate {command}: {text}")
