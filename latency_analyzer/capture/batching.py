"""An event loop that, while many streams are busy, reads their arrivals in batches.

asyncio's loop blocks in ``epoll_wait`` whenever it has nothing to run, and a segment that
arrives while it blocks wakes it: a context switch for us, and a wake-up that the sending side
pays for inside its ``send`` (on one host, that is the server under test, on its CPU). Our
protocol hands each read to its stream's consumer inside the read's callback (see
``_protocol``), so the loop is done with one read before the next segment comes and goes back
to blocking: with many streams open, it is woken once per segment. On the test bed, 64
streams flat out, 65,536 tokens on 2 cores: asyncio's loop blocked about 14,600 times, this
one about 2,900; the client used 15 % less CPU, the server 13 % less, and the tokens came
14 % faster (``benchmarks/bench_batching.py``).

:class:`BatchingSelector` keeps the loop eager and changes one thing. When the loop is about to
block, and its last select found three or more descriptors ready less than the *wait* ago, it
first sleeps out the rest of the wait, then takes everything that arrived meanwhile in one
call. Nobody waits on the stream sockets while it sleeps, so the senders' writes wake no one.

* The wait is at most ``window`` (0.25 ms by default), and at most half the shortest gap seen
  lately between two arrivals on one descriptor.
* A wait that gathered fewer than three descriptors is not repeated until a select finds
  several again: a wait costs about one wake, so it must save two. Paced streams that arrive
  one or two at a time are read as asyncio reads them.
* Only the reads of sockets whose arrivals the kernel stamps wait (``_wire``). Anything else
  ends the sleep the moment it is ready: a socket being connected or written to, a timer
  (the held requests' ``timerfd``, ``_hold``), the loop's self-pipe, a pipe. The loop's own
  timers are never passed either: the sleep ends at the next one.

What it changes in the readings: the arrival times a waterfall holds are the kernel's receive
stamps, taken when each segment came, not when it was read, so a read that waited is still
timed right. One thing a wait can do is read two segments of one stream together, when the
second came during it: the first then carries the second's stamp, at most the wait late, and
the waterfall flags it (``shared_read_chunks``). Measured (``bench_batching.py``, ``jitter``:
64 connections, exponential gaps of 10 ms mean), stamp − send P99 / P99.9: 3.6 / 31 µs on
asyncio's loop, 6.1 / 33 µs on this one at 0.25 ms, 7.3 / 398 µs at 2 ms. What else moves is
when bytes are handled: up to the wait later (the read lag shows it), and a closed-loop
user's next request with them.

Linux only (``epoll`` and a ``timerfd`` for a sleep finer than a millisecond); elsewhere
:func:`new_event_loop` gives asyncio's own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import selectors
import sys
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from .._timerfd import TimerFd, kernel_timer
from ._wire import kernel_stamped_fd

__all__ = ["DEFAULT_WINDOW", "BatchingSelector", "new_event_loop", "run"]

T = TypeVar("T")

#: The longest a read waits by default, in seconds.
DEFAULT_WINDOW = 0.00025

#: Descriptors a select must find ready for the next blocking one to wait first (and a wait
#: must gather to be repeated): a wait costs about one wake-up, so it pays when it saves two.
_BUSY = 3

_clock = time.monotonic  # asyncio's clock: its timeouts are on it
_now_ns = time.perf_counter_ns  # the timerfd's clock (CLOCK_MONOTONIC too)


def _epoll_events(events: int) -> int:
    flags = 0
    if events & selectors.EVENT_READ:
        flags |= select.EPOLLIN
    if events & selectors.EVENT_WRITE:
        flags |= select.EPOLLOUT
    return flags


# None where there is no epoll, or where ``selectors`` is not the standard library's (gevent's
# monkey-patched one has no EpollSelector): new_event_loop then gives asyncio's loop
_EPOLL: Any = getattr(selectors, "EpollSelector", None)


class BatchingSelector(_EPOLL or selectors.DefaultSelector):  # type: ignore[misc]
    """``epoll``, with the wait described in the module's text.

    Args:
        window: the longest wait, in seconds (> 0).
        timer: the timer the sleep is kept by.

    Attributes:
        window: the longest wait.
        waits: blocking selects that slept first.
    """

    def __init__(self, window: float, timer: TimerFd) -> None:
        super().__init__()
        self.window = window
        self.waits = 0
        self._timer = timer
        # what ends a sleep: the timer, and every descriptor that must not wait
        self._prompt = select.epoll()
        self._prompt.register(timer.fd, select.EPOLLIN)
        self._prompt_fds: set[int] = set()
        self._busy_at = -1e18  # when a select last found _BUSY or more descriptors ready
        self._gap = window * 2  # the shortest recent gap between two readies of one descriptor
        self._ready_at: dict[int, float] = {}  # descriptor -> when a select last found it

    @property
    def wait(self) -> float:
        """The wait in force now (seconds)."""
        return min(self.window, self._gap / 2)

    # -- which descriptors may wait --
    def _sort(self, fd: int, events: int) -> None:
        prompt = bool(events & selectors.EVENT_WRITE) or not kernel_stamped_fd(fd)
        if prompt and fd not in self._prompt_fds:
            self._prompt.register(fd, _epoll_events(events))
            self._prompt_fds.add(fd)
        elif prompt:
            self._prompt.modify(fd, _epoll_events(events))
        elif fd in self._prompt_fds:
            self._drop(fd)

    def _drop(self, fd: int) -> None:
        self._prompt_fds.discard(fd)
        with contextlib.suppress(OSError):  # closed already: the epoll set lost it then
            self._prompt.unregister(fd)

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key: selectors.SelectorKey = super().register(fileobj, events, data)
        self._sort(key.fd, events)
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = self._fileobj_lookup(fileobj)
        try:
            key: selectors.SelectorKey = super().modify(fileobj, events, data)
        except BaseException:  # the epoll refused it: asyncio's selector dropped the key
            if fd in self._prompt_fds:
                self._drop(fd)
            self._ready_at.pop(fd, None)
            raise
        self._sort(key.fd, events)
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key: selectors.SelectorKey = super().unregister(fileobj)
        if key.fd in self._prompt_fds:
            self._drop(key.fd)
        self._ready_at.pop(key.fd, None)
        return key

    # -- the select --
    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        slept = False
        if timeout is None or timeout > 0:
            rest = self._busy_at + min(self.window, self._gap / 2) - _clock()
            if rest > 0:
                if timeout is not None:
                    rest = min(rest, timeout)
                    timeout -= rest
                self._sleep(rest)
                slept = True
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(timeout)
        if len(ready) < _BUSY:
            if slept:  # the wait gathered too little to pay for itself: none until it would
                self._busy_at = -1e18
        else:
            now = _clock()
            self._busy_at = now
            seen, shortest = self._ready_at, self.window * 2
            for key, _ in ready:
                before = seen.get(key.fd)
                if before is not None and now - before < shortest:
                    shortest = now - before
                seen[key.fd] = now
            self._gap += (shortest - self._gap) / 4
        return ready

    def _sleep(self, seconds: float) -> None:
        """Until ``seconds`` from now, or until a prompt descriptor is ready."""
        self.waits += 1
        timer = self._timer
        timer.set(_now_ns() + int(seconds * 1e9))
        woke = self._prompt.poll(-1)
        if len(woke) != 1 or woke[0][0] != timer.fd:
            timer.disarm()  # ended early: the expiry to come is not wanted
        timer.drain()

    def close(self) -> None:
        super().close()
        self._prompt.close()  # closing an epoll object twice is a no-op
        self._timer.close()


def new_event_loop(window: float = DEFAULT_WINDOW) -> asyncio.AbstractEventLoop:
    """A loop on a :class:`BatchingSelector` of ``window`` seconds; asyncio's own loop when
    ``window`` is 0 or this system has no ``epoll`` or ``timerfd``."""
    timer = (
        kernel_timer() if window > 0 and _EPOLL is not None and hasattr(select, "epoll") else None
    )
    if timer is None:
        return asyncio.new_event_loop()
    return asyncio.SelectorEventLoop(BatchingSelector(window, timer))


def run(main: Coroutine[Any, Any, T], window: float = DEFAULT_WINDOW) -> T:
    """``asyncio.run(main)``, on :func:`new_event_loop` of ``window`` seconds."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=lambda: new_event_loop(window)) as runner:
            return runner.run(main)
    policy = asyncio.get_event_loop_policy()  # 3.10: asyncio.run asks the policy for its loop

    class _Policy(asyncio.DefaultEventLoopPolicy):
        def new_event_loop(self) -> asyncio.AbstractEventLoop:
            return new_event_loop(window)

    asyncio.set_event_loop_policy(_Policy())
    try:
        return asyncio.run(main)
    finally:
        asyncio.set_event_loop_policy(policy)
