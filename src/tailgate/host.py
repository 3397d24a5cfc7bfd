"""Host: the only place that touches the machine being inspected.

A Host has a root: ``/`` for this machine, or a directory holding another
host's tree (a mounted root, or a test fixture), like node_exporter's
``--path.rootfs``. Files are read below the root. Commands run for real only
on ``/``; under any other root their captured output is read from
``<root>/commands/<name>`` (see :func:`command_file_name`), so fixture roots can
carry ``ethtool -S eth0`` output from real hardware, and a ``--root`` run never
executes anything.

The reader trusts nothing it is pointed at (tailgate runs as root on hosts and
roots that others fill):

* every path is resolved inside the root: a symlink that leads out of it
  (absolute, or ``../..``) is refused with a reason, and the opened file's real
  path is checked again after ``open`` (a link swapped in between is caught);
* only regular files are read: FIFOs, sockets and devices are refused by
  ``stat``/``fstat`` before a byte is read, and files are opened ``O_NONBLOCK``
  so nothing can block the open;
* every read and every command's output has a size cap (:class:`TooLarge`), and
  text holding NUL bytes is binary, not a value;
* commands run without a shell, in their own process group, with a time-out and
  the output cap; :meth:`Host.cancel` (Ctrl-C) kills every one still running.

Every failure becomes a :class:`SourceError` whose message is the reason a
finding shows as ``unknown``; it names the file or the command.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import selectors
import shutil
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

from . import ending
from .model import ParseError, SourceError

DEFAULT_TIMEOUT_S = 5.0
TIMEOUT_ENV = "TAILGATE_COMMAND_TIMEOUT"  # seconds; for slow hosts and for tests of hung commands
# The largest file tailgate reads: /proc/interrupts of a 512-CPU host with a few thousand
# IRQs is ~10 MiB; anything bigger is not a kernel file we know.
MAX_READ_BYTES = 16 * 2**20
# The largest command output kept: `ss -tmpin` of 100k sockets is ~40 MiB.
MAX_OUTPUT_BYTES = 64 * 2**20
_STDERR_KEEP = 64 * 1024
PID_MAX_LIMIT = 4194304  # the kernel's ceiling for /proc/sys/kernel/pid_max (2^22)
PID_MAX_MIN = 301  # its floor: RESERVED_PIDS + 1 (kernel/pid.c pid_max_min)
IFNAMSIZ = 16
_KERNEL_SPACE = frozenset(b" \t\n\v\f\r\xa0")  # lib/ctype.c: isspace() is true for these bytes


class TooLarge(SourceError):
    """A file or a command's output over its size cap: refused, nothing of it kept."""


class Refused(SourceError):
    """A path that leaves the root, or something that is not a regular file."""


def valid_iface(name: str) -> str:
    """Return ``name`` if the kernel would accept it as an interface name.

    The rule of ``dev_valid_name()`` (net/core/dev.c): not empty, at most 15 bytes
    (IFNAMSIZ - 1), not ``.`` or ``..``, and no ``/``, ``:`` or byte for which the
    kernel's ``isspace()`` is true. Any other byte is legal (control characters too,
    which is why every renderer escapes them).
    """
    raw = os.fsencode(name) if isinstance(name, str) else b""
    if (not raw or len(raw) >= IFNAMSIZ or raw in (b".", b"..") or b"\0" in raw
            or any(c in _KERNEL_SPACE or c in b"/:" for c in raw)):
        raise ValueError(f"invalid interface name {shorten(repr(name))}: the kernel allows 1 to "
                         f"{IFNAMSIZ - 1} bytes, not '.' or '..', without '/', ':' or white space")
    return name


def valid_pid(value: object, pid_max: int = PID_MAX_LIMIT) -> int:
    """A PID as the kernel writes it: ASCII digits, 1 .. pid_max - 1."""
    text = str(value)
    if not (text and text.isascii() and text.isdigit()):
        raise ValueError(f"invalid pid {shorten(repr(text))}: expected ASCII digits")
    # Digits past the ceiling's length are refused before int() turns 300 of them into a number.
    pid = int(text, 10) if len(text.lstrip("0")) <= len(str(PID_MAX_LIMIT)) else PID_MAX_LIMIT
    if not 0 < pid < pid_max:
        raise ValueError(f"invalid pid {shorten(text, 20)}: PIDs are 1 to {pid_max - 1} here "
                         "(kernel.pid_max)")
    return pid


def shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    if exc.errno == errno.ELOOP:
        return f"{what}: symlink loop (too many levels of symbolic links)"
    return f"{what}: {exc.strerror or exc}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def read_regular(path: str, limit: int, what: str | None = None,
                 inside: str | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (already resolved), at most ``limit``.

    FIFOs, sockets and devices are refused before they are opened (``stat``) and again
    on the open descriptor (``fstat``, against a swap in between); ``O_NONBLOCK`` keeps
    even that open from blocking. Over ``limit`` bytes is :class:`TooLarge`. With
    ``inside``, the open descriptor's real path (``/proc/self/fd``) must lie under that
    directory: a path component swapped for a symlink between the check and the open is
    caught here.
    """
    what = what or path
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SourceError(_reason(exc, what)) from exc
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"{what}: {_kind(st.st_mode)}, not a regular file: refused")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise SourceError(_reason(exc, what)) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{what}: {_kind(st.st_mode)}, not a regular file: refused")
        if inside is not None and inside != "/":
            try:
                opened = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # no /proc here: the path as resolved is the best we have
                opened = os.path.realpath(path)
            if not _inside(opened, inside):
                raise Refused(f"{what}: opened outside the root (to {shorten(opened)}): refused")
        if st.st_size > limit:
            raise TooLarge(f"{what}: {st.st_size} bytes, over the {_mib(limit)} cap: refused")
        chunks, size = [], 0
        while True:  # procfs and sysfs files report size 0 or 4096: read up to the cap
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            except OSError as exc:
                raise SourceError(_reason(exc, what)) from exc
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"{what}: more than the {_mib(limit)} cap: refused")
        return b"".join(chunks)
    finally:
        os.close(fd)


def as_text(data: bytes, what: str) -> str:
    """Kernel and tool text never holds NUL: a NUL byte means binary, not a value."""
    if b"\0" in data:
        raise ParseError(f"{what}: binary content (NUL bytes), not text")
    return data.decode("utf-8", errors="replace")


def _inside(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


class Host:
    def __init__(self, root: str | os.PathLike[str] = "/", timeout_s: float | None = None,
                 max_read: int = MAX_READ_BYTES, max_output: int = MAX_OUTPUT_BYTES):
        self.root = Path(root)
        # Live only when the root *is* "/" as written: a root that merely resolves to "/"
        # (a symlink to it, /proc/1/root) is still a root, and a root never runs commands.
        self.live = posixpath.normpath(os.path.abspath(os.fspath(root))) in ("/", "//")
        self._real = os.path.realpath(root)
        if timeout_s is None:
            timeout_s = float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)
        self.timeout_s = timeout_s
        self.max_read = max_read
        self.max_output = max_output
        self._local = threading.local()
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._cancelled = False

    # -- paths ---------------------------------------------------------------------------

    def path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def _resolve(self, path: str, follow: bool = True) -> str:
        """The real path of ``path`` under the root; refused when a symlink leaves it."""
        if "\0" in path:
            raise Refused(f"{shorten(repr(path))}: NUL in a path: refused")
        rel = posixpath.normpath("/" + path).lstrip("/")  # '..' cannot climb above the root
        full = posixpath.join(self._real, rel) if rel else self._real
        if follow:
            real = os.path.realpath(full)
        else:
            real = posixpath.join(os.path.realpath(posixpath.dirname(full)), posixpath.basename(full))
        if not _inside(real, self._real):
            raise Refused(f"{path}: a symlink leads outside the root {self.root} "
                          f"(to {shorten(real)}): refused")
        return real

    def source(self) -> str | None:
        """The file or command this thread read last (names the source of a parse error)."""
        return getattr(self._local, "source", None)

    def forget_source(self) -> None:
        self._local.source = None

    def blame(self, exc: Exception) -> str:
        """``exc`` as a reason that names its source: a parser's message names a field, not
        the file it came from, so the file or command read last is put in front."""
        msg = str(exc)
        src = self.source()
        if src and src not in msg and (isinstance(exc, ParseError)
                                       or not isinstance(exc, SourceError)):
            return f"{src}: {msg}"
        return msg

    # -- files ---------------------------------------------------------------------------

    def read(self, path: str, limit: int | None = None, nul_ok: bool = False) -> str:
        """The text of ``path`` under the root. NUL bytes mean binary, refused, unless the
        format separates its records with them (``nul_ok``: modules.builtin.modinfo)."""
        self._local.source = path
        real = self._resolve(path)
        data = read_regular(real, self.max_read if limit is None else limit, what=path,
                            inside=self._real)
        return data.decode("utf-8", errors="replace") if nul_ok else as_text(data, path)

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        """The raw bytes of ``path`` under the root (a binary sysfs table: gpu_metrics)."""
        self._local.source = path
        return read_regular(self._resolve(path), self.max_read if limit is None else limit,
                            what=path, inside=self._real)

    def read_at(self, path: str, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of ``path`` (a device that reads by offset, such as
        /dev/cpu/N/msr whose offset is the MSR number; a plain file under a fixture root)."""
        self._local.source = path
        real = self._resolve(path)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise SourceError(_reason(exc, path)) from exc
        try:
            data = os.pread(fd, size, offset)
        except OSError as exc:
            raise SourceError(_reason(exc, path)) from exc
        finally:
            os.close(fd)
        if len(data) != size:
            raise SourceError(f"{path}: {len(data)} bytes at offset {offset:#x}, expected {size}")
        return data

    def exists(self, path: str) -> bool:
        """Whether ``path`` names anything under the root (a dangling or looping symlink
        counts: reading it then says why it cannot be read)."""
        return os.path.lexists(self._resolve(path))

    def listdir(self, path: str) -> list[str]:
        self._local.source = path
        try:
            return sorted(os.listdir(self._resolve(path)))
        except OSError as exc:
            raise SourceError(_reason(exc, path)) from exc

    def readlink(self, path: str) -> str:
        self._local.source = path
        try:
            return os.readlink(self._resolve(path, follow=False))
        except OSError as exc:
            raise SourceError(_reason(exc, path)) from exc

    # -- commands ------------------------------------------------------------------------

    def run(self, argv: list[str], timeout_s: float | None = None) -> str:
        """Run a command (no shell) and return its stdout, or its captured output off-host."""
        shown = " ".join(argv)
        self._local.source = f"`{shown}`"
        if not self.live:
            rel = f"/commands/{command_file_name(argv)}"
            try:
                real = self._resolve(rel)
                data = read_regular(real, self.max_output, what=f"`{shown}` (captured in {rel})",
                                    inside=self._real)
            except SourceError as exc:
                if str(exc).endswith(": absent"):
                    raise SourceError(f"`{shown}`: no captured output under "
                                      f"{self.root}/commands") from exc
                raise
            return as_text(data, f"`{shown}`")
        if shutil.which(argv[0]) is None:
            raise SourceError(f"`{argv[0]}` is not installed")
        limit = self.timeout_s if timeout_s is None else timeout_s
        code, out, err = self._spawn(argv, shown, limit)
        if code != 0:  # the reason is the last line the tool printed, whatever its bytes
            lines = (err or out).replace(b"\0", b"").decode("utf-8", "replace").strip().splitlines()
            tail = lines[-1] if lines else ""
            raise SourceError(f"`{shown}` exited {code}: {shorten(tail, 300)}".rstrip(": "))
        return as_text(out, f"`{shown}`")

    def _spawn(self, argv: list[str], shown: str, limit: float) -> tuple[int, bytes, bytes]:
        """Run ``argv`` in its own process group; kill the group on time-out, on an
        output over the cap, on cancel() and on any exception (Ctrl-C)."""
        if self._cancelled:
            raise SourceError(f"`{shown}`: not run (interrupted)")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    env={**os.environ, "LC_ALL": "C"},
                                    preexec_fn=ending.die_with_parent_fn())
        except OSError as exc:
            raise SourceError(_reason(exc, f"`{shown}`")) from exc
        ending.track(proc.pid)
        with self._lock:
            self._procs.add(proc)
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + limit
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ, out)
                sel.register(proc.stderr, selectors.EVENT_READ, err)
                while sel.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SourceError(f"`{shown}` timed out after {limit:g} s and was killed")
                    for key, _ in sel.select(min(left, 0.5)):
                        chunk = os.read(key.fd, 1 << 16)
                        if not chunk:
                            sel.unregister(key.fileobj)
                            continue
                        buf = key.data
                        buf += chunk
                        if buf is out and len(out) > self.max_output:
                            raise TooLarge(f"`{shown}`: output over the {_mib(self.max_output)} "
                                           "cap: killed")
                        if buf is err and len(err) > _STDERR_KEEP:
                            del err[: len(err) - _STDERR_KEEP]
                    if self._cancelled:
                        raise SourceError(f"`{shown}`: interrupted and killed")
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            self._kill(proc)
            raise SourceError(f"`{shown}` timed out after {limit:g} s and was killed") from exc
        except BaseException:
            self._kill(proc)
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
            with self._lock:
                self._procs.discard(proc)
            ending.untrack(proc.pid)
        return code, bytes(out), bytes(err)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Kill every command still running and run no new one (Ctrl-C)."""
        self._cancelled = True
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
