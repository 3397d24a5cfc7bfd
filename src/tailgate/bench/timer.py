"""Wake-ups at absolute CLOCK_MONOTONIC times with microsecond precision.

asyncio/uvloop timers have millisecond resolution (libuv rounds to ms), which
would add up to a millisecond of generator lateness to every request of a
low-rate run against a 50 µs server. A Linux ``timerfd`` armed at an absolute
time and watched by the loop wakes within microseconds. Where timerfd is not
available the loop's own ``call_at`` is used (and lateness shows it).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import math
import os
from collections.abc import Callable

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        lib.timerfd_create  # noqa: B018 - probe for the symbol
        return lib
    except (OSError, AttributeError):
        return None


class Waker:
    """Calls ``callback()`` once at (or just after) the time given to :meth:`at`.

    Times are ``time.monotonic()`` seconds. Arming again replaces the previous
    wake-up. Close it when done.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self._fd = -1
        self._spec = _Itimerspec()
        self.origin = 0.0
        self.period = 0.0
        lib = _libc()
        if lib is not None:
            fd = lib.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                self._settime = lib.timerfd_settime
                self._spec_ref = ctypes.byref(self._spec)
                loop.add_reader(fd, self._fire)

    @property
    def precise(self) -> bool:
        return self._fd >= 0

    def at(self, when: float, period: float = 0.0) -> None:
        """Wake at ``when``, then every ``period`` seconds after it (0: once).

        Re-arming costs a system call that is slow under virtualisation (~10 µs
        here), so a caller with requests coming every ``period`` arms once and
        lets the timer tick instead of re-arming for every request.
        """
        if self._fd >= 0:
            # Whole nanoseconds rounded up: the timer never fires before ``when``.
            when_ns = max(math.ceil(when * 1e9), 1)  # zero would disarm the timer
            period_ns = math.ceil(period * 1e9) if period > 0 else 0
            self.origin, self.period = when_ns / 1e9, period_ns / 1e9
            self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = divmod(when_ns, 10**9)
            self._spec.it_interval.tv_sec, self._spec.it_interval.tv_nsec = divmod(
                period_ns, 10**9)
            self._settime(self._fd, _TFD_TIMER_ABSTIME, self._spec_ref, None)
        else:
            if self._handle is not None:
                self._handle.cancel()
            # loop.time() and time.monotonic() share CLOCK_MONOTONIC's origin on Linux;
            # elsewhere convert through the difference now.
            import time

            self._handle = self._loop.call_at(self._loop.time() + (when - time.monotonic()),
                                              self._callback)

    def next_fire(self, now: float) -> float:
        """When the timer fires next after ``now`` (inf if it will not)."""
        if now < self.origin:
            return self.origin
        if self.period <= 0:
            return math.inf
        return self.origin + (math.floor((now - self.origin) / self.period) + 1) * self.period

    def disarm(self) -> None:
        if self._fd >= 0:
            self._spec.it_value.tv_sec = self._spec.it_value.tv_nsec = 0
            self._spec.it_interval.tv_sec = self._spec.it_interval.tv_nsec = 0
            self._settime(self._fd, 0, self._spec_ref, None)
        elif self._handle is not None:
            self._handle.cancel()

    def _fire(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return  # re-armed before we read: a later wake-up is pending
        self._callback()

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        if self._handle is not None:
            self._handle.cancel()
