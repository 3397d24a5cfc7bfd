"""Where results go: a path, or standard output for ``-``. Used by the commands and by the
renderers that save results (report.bench_outputs.save), so it sits below both.

Every error here is a :class:`~tailgate.errors.UsageError` (exit status 2)."""

from __future__ import annotations

import os
import sys

from .errors import UsageError


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
