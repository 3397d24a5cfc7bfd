"""Ending: every command tailgate started dies with it, whatever ends it.

Commands run in their own process group (``start_new_session``) so that a time-out kills
the whole tree; that also means a signal sent to tailgate alone (``kill PID``, CI's or
systemd's SIGTERM, a closed terminal's SIGHUP) does not reach them. Three layers:

* every child is registered here while it runs (:func:`track` / :func:`untrack`);
* :func:`install` makes SIGTERM and SIGHUP kill every registered group at once and then
  unwind tailgate as :class:`Terminated` (exit 128 + the signal); SIGINT keeps Python's
  KeyboardInterrupt (the commands stop gracefully) and :func:`kill_all` runs on the way out;
* :func:`die_with_parent`, a ``preexec_fn``, asks the kernel to SIGKILL the child when
  tailgate's thread that started it ends (``PR_SET_PDEATHSIG``): a SIGKILL to tailgate
  cannot be caught, and this still ends its children.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_lock = threading.Lock()
_tracked: dict[int, bool] = {}  # pid -> is the leader of its own process group

try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the signal handlers still hold
    _prctl = None


class Terminated(BaseException):
    """Tailgate was told to end (SIGTERM, SIGHUP); its children are already dead."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def track(pid: int, group: bool = True) -> None:
    with _lock:
        _tracked[pid] = group


def untrack(pid: int) -> None:
    with _lock:
        _tracked.pop(pid, None)


def kill_all() -> None:
    """SIGKILL every registered child (its whole process group when it leads one)."""
    with _lock:
        tracked = list(_tracked.items())
    for pid, group in tracked:
        try:
            if group:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except OSError:  # gone already
            pass


_owner = 0  # the process that installed the handlers (a forked bench worker inherits them)


def _on_signal(signum: int, _frame) -> None:
    if os.getpid() != _owner:  # a fork: end as if no handler were set, touching nothing
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    kill_all()
    raise Terminated(signum)


def install() -> None:
    """Handle the ending signals (main thread only; a no-op elsewhere)."""
    global _owner
    if threading.current_thread() is not threading.main_thread():
        return
    _owner = os.getpid()
    for sig in ENDING_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:  # nohup: the user asked to survive SIGHUP
            continue
        signal.signal(sig, _on_signal)


def die_with_parent_fn() -> Callable[[], None] | None:
    """A ``preexec_fn`` for Popen: the child gets SIGKILL when its parent thread ends (and
    exits at once if tailgate is already gone). None where prctl is not available."""
    if _prctl is None:
        return None
    prctl, parent = _prctl, os.getpid()

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(127)

    return die_with_parent
