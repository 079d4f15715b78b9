"""A kernel timer on ``perf_counter``'s clock that an event loop can wait on.

A ``timerfd`` (Linux) set to an absolute ``CLOCK_MONOTONIC`` instant becomes readable when
the instant comes, to the nanosecond the kernel manages; asyncio's own timers are rounded up
to the next whole millisecond of the ``epoll`` timeout. A leaf: it imports nothing of the
package.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
from typing import Any

__all__ = ["TimerFd", "kernel_timer"]

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TimerFd:
    """A CLOCK_MONOTONIC timerfd (``perf_counter_ns`` reads the same clock), set absolute."""

    def __init__(self) -> None:
        libc: Any = ctypes.CDLL(None, use_errno=True)
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._libc, self.fd = libc, fd
        self._spec = _Itimerspec()

    def set(self, at_ns: int) -> None:
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = divmod(max(1, at_ns), 10**9)
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None):
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def disarm(self) -> None:
        """Stop the timer (an expiry already read or drained stays so)."""
        self._spec.it_value.tv_sec = self._spec.it_value.tv_nsec = 0
        self._libc.timerfd_settime(self.fd, 0, ctypes.byref(self._spec), None)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):  # set again before the loop read it
            os.read(self.fd, 8)

    def close(self) -> None:
        """Close the descriptor (again: nothing; its number may belong to another file by
        then)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def kernel_timer() -> TimerFd | None:
    """A timerfd when this system has one on ``perf_counter``'s clock, else None."""
    if not sys.platform.startswith("linux"):
        return None
    info = time.get_clock_info("perf_counter")
    if "CLOCK_MONOTONIC" not in info.implementation or "RAW" in info.implementation:
        return None
    try:
        return TimerFd()
    except (OSError, AttributeError):
        return None
