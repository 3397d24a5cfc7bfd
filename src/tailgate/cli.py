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
import os
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


def one_line(text: str, limit: int = 400) -> str:
    """A message as one printable line: control characters (newlines included) escaped,
    long values cut, whatever a user's file or argument held."""
    from .report.safe import clean

    text = clean(text, keep_newlines=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def existing_pids(host, values: list[str]) -> tuple[int, ...]:
    """--pid values as integers of processes that exist on ``host`` (duplicates dropped)."""
    from .host import PID_MAX_LIMIT, valid_pid
    from .model import SourceError

    try:  # the host's own ceiling; the kernel's when it cannot be read
        pid_max = int(host.read("/proc/sys/kernel/pid_max").strip())
        pid_max = pid_max if 0 < pid_max <= PID_MAX_LIMIT else PID_MAX_LIMIT
    except (SourceError, ValueError):
        pid_max = PID_MAX_LIMIT
    try:
        pids = tuple(dict.fromkeys(valid_pid(v, pid_max) for v in values))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    for pid in pids:
        try:
            present = host.exists(f"/proc/{pid}")
        except SourceError as exc:
            raise UsageError(f"--pid {pid}: {exc}") from exc
        if not present:
            raise UsageError(f"no such process: --pid {pid}")
    return pids


def existing_cgroup(host, spec: str) -> str:
    """--cgroup as the absolute directory of an existing cgroup on ``host``."""
    from .model import SourceError
    from .sources.cgroup import resolve_cgroup

    try:
        path = resolve_cgroup(host, spec)
    except (SourceError, ValueError) as exc:
        raise UsageError(f"--cgroup: {exc}") from exc
    if path is None:
        raise UsageError(f"no such cgroup: --cgroup {spec}")
    return path


def check_writable(*paths: str | None) -> None:
    """Fail before a long run, not after it, when an output path cannot be written."""
    for path in paths:
        if not path or path == "-":
            continue
        parent = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise UsageError(f"cannot write {path}: is a directory")
        if not os.path.isdir(parent):
            raise UsageError(f"cannot write {path}: no directory {parent}")
        if not os.access(path if os.path.exists(path) else parent, os.W_OK):
            raise UsageError(f"cannot write {path}: permission denied")


def write_output(path: str, text: str) -> None:
    """Write a result to ``path``, or to standard output for ``-``."""
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from exc


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
        print(f"tailgate {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tailgate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tailgate ... | head`: the reader left, nothing more to say
        sys.stderr.close()
        return 0
