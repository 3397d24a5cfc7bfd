"""Host: the only place that touches the machine being inspected.

A Host has a root: ``/`` for this machine, or a directory holding another
host's tree (a mounted root, or a test fixture), like node_exporter's
``--path.rootfs``. Files are read below the root. Commands run for real only
on ``/``; under any other root their captured output is read from
``<root>/commands/<name>`` (see :func:`command_file_name`), so fixture roots can
carry ``ethtool -S eth0`` output from real hardware.

Every failure becomes a :class:`SourceError` whose message is the reason a
finding shows as ``unknown``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

from .model import SourceError

DEFAULT_TIMEOUT_S = 5.0
TIMEOUT_ENV = "TAILGATE_COMMAND_TIMEOUT"  # seconds; for slow hosts and for tests of hung commands
_IFACE_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


def valid_iface(name: str) -> str:
    """Return ``name`` if it is a legal Linux interface name (IFNAMSIZ, no '/' or space)."""
    if not _IFACE_RE.match(name) or name in (".", ".."):
        raise ValueError(f"invalid interface name: {name!r}")
    return name


def valid_pid(value: object) -> int:
    text = str(value)
    if not text.isdigit():
        raise ValueError(f"invalid pid: {value!r}")
    pid = int(text, 10)
    if pid <= 0:
        raise ValueError(f"invalid pid: {value!r}")
    return pid


def command_file_name(argv: list[str] | tuple[str, ...]) -> str:
    """File name under ``<root>/commands/`` holding the captured output of ``argv``.

    ``["ethtool", "-S", "eth0"]`` -> ``ethtool_-S_eth0``; characters other than
    letters, digits and ``.-_`` become ``_``.
    """
    return re.sub(r"[^A-Za-z0-9._-]", "_", "_".join(argv))


def _reason(exc: OSError, what: str) -> str:
    if exc.errno == errno.ENOENT:
        return f"{what}: absent"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{what}: permission denied (run as root)"
    return f"{what}: {exc.strerror or exc}"


class Host:
    def __init__(self, root: str | os.PathLike[str] = "/", timeout_s: float | None = None):
        self.root = Path(root)
        self.live = self.root.resolve() == Path("/")
        if timeout_s is None:
            timeout_s = float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)
        self.timeout_s = timeout_s

    def path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str) -> str:
        try:
            with open(self.path(path), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError as exc:
            raise SourceError(_reason(exc, path)) from exc

    def exists(self, path: str) -> bool:
        return self.path(path).exists()

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(path)))
        except OSError as exc:
            raise SourceError(_reason(exc, path)) from exc

    def readlink(self, path: str) -> str:
        try:
            return os.readlink(self.path(path))
        except OSError as exc:
            raise SourceError(_reason(exc, path)) from exc

    def run(self, argv: list[str], timeout_s: float | None = None) -> str:
        """Run a command (no shell) and return its stdout, or its captured output off-host."""
        shown = " ".join(argv)
        if not self.live:
            captured = self.root / "commands" / command_file_name(argv)
            try:
                return captured.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                raise SourceError(f"`{shown}`: no captured output under {self.root}/commands") from exc
        if shutil.which(argv[0]) is None:
            raise SourceError(f"`{argv[0]}` is not installed")
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            proc = subprocess.run(
                argv,
                check=False,
                capture_output=True,
                text=True,
                timeout=limit,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "LC_ALL": "C"},
            )
        except subprocess.TimeoutExpired as exc:
            raise SourceError(f"`{shown}` timed out after {limit:g} s and was killed") from exc
        except OSError as exc:
            raise SourceError(_reason(exc, shown)) from exc
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip().splitlines()
            tail = err[-1] if err else ""
            raise SourceError(f"`{shown}` exited {proc.returncode}: {tail}".rstrip(": "))
        return proc.stdout
