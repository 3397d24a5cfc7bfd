"""Signal dispositions the Ctrl-C tests set up for the children they interrupt."""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """``preexec_fn`` for a child a test will interrupt with SIGINT: a shell's background job
    (``make test &``, ``nohup make test &`` in a CI script) starts with SIGINT ignored, an
    ignored signal stays ignored across exec, and Python installs its KeyboardInterrupt
    handler only where SIGINT is at its default, so the child would never see the test's
    Ctrl-C. A terminal's Ctrl-C reaches a foreground program at its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def hangup_and_interrupt_default() -> None:
    """``preexec_fn`` for a child a test ends with SIGHUP or SIGINT: ``nohup`` starts the
    suite with SIGHUP ignored as a background job starts it with SIGINT ignored, both stay
    ignored across exec, and tailgate (rightly) leaves an ignored signal ignored. A terminal
    that closes, or a Ctrl-C, reaches a program at its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
