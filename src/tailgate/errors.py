"""The error tree of tailgate: every error a command may end with carries its exit status.

``cli.main`` is the one place that turns them into a message and an exit status.
An exception that is not a :class:`TailgateError` is a defect of tailgate, never
a fact about the host: it exits :data:`EXIT_BUG`, as does a report with a finding
whose status is ``error`` (a check or parser that raised).

Exit statuses (documented in the README):

* ``0`` the gate passed: nothing at or above ``--fail-on``, every required id measured;
* ``1`` the gate failed: a red line crossed (or a finding at ``--fail-on``), or a
  required id that was not measured;
* ``2`` usage or configuration error: bad arguments, bad baseline, unreadable input;
* ``3`` tailgate failed: a check or parser raised (the report says which), or the
  command itself crashed. Whatever else the report says, it is not a pass;
* ``130`` interrupted.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_GATE = 1
EXIT_USAGE = 2
EXIT_BUG = 3
EXIT_INTERRUPTED = 130


class TailgateError(Exception):
    """Base of every error a command may end with; ``exit_status`` is what the CLI returns."""

    exit_status = EXIT_USAGE


class UsageError(TailgateError):
    """Bad input from the user (an argument, a path): printed as one line, exit status 2."""


class InputError(UsageError, ValueError):
    """Bad input a parser or loader refused (a file, an expression, an option's value): a
    :class:`UsageError` (exit status 2) and, for the callers that catch it as one, a
    ValueError. Every such class of tailgate derives from it."""


class ConfigError(TailgateError):
    """A configuration file (baseline, counter history) that cannot be used, exit status 2."""


class SourceError(TailgateError):
    """A fact could not be read. The message is the reason shown to the user.

    Inside ``collect`` it becomes a missing fact (an ``unknown`` finding); only a
    command that cannot go on without the source lets it reach the CLI (exit 2).
    """


class ParseError(SourceError):
    """A source was read but its content did not have the expected shape."""


class ProtocolError(TailgateError):
    """A server under test broke its protocol (an event stream that is not one, a chunk of
    another shape). A fact about the server, not an error of the command: the load engine
    catches it where it judges the response and it becomes that request's outcome. One
    that reached the CLI would be a defect of tailgate (exit status 3)."""

    exit_status = EXIT_BUG
