"""Requests prepared ahead of their instant, their bytes handed to the kernel at it.

A load schedule knows when each request is due. A request asked for before its instant
(``Client.request(intended_start_ns=...)`` in the future) does its client work at once: the
pooled connection is taken, headers and body are encoded and written, but the writes are held
here. At the instant, one callback hands every held request of that instant to the kernel in a
tight loop, so a hundred requests due together leave within a fraction of a millisecond of
it instead of one after another's Python work.

The instant is kept by a ``timerfd`` on Linux (the loop wakes when the kernel's timer fires;
asyncio's own timers round the epoll timeout up to the next whole millisecond) and by
``loop.call_at`` elsewhere.

What is not held: a request that must dial a new connection waits for its instant before it
dials (its ``dns``, ``connect`` and ``tls`` are measured as they happen), and an HTTP/2 stream
on a pooled connection waits for its instant before it is encoded (the connection's writes are
shared by every stream on it).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from typing import Protocol

from .._timerfd import kernel_timer

__all__ = ["Hold", "SendSchedule"]


#: How long before an instant the timer wakes the loop, which then spins to the instant: a
#: sleeping CPU (a virtual machine's most of all) takes 0.1-0.3 ms to wake.
_EARLY_NS = 300_000


class Writer(Protocol):
    """What a held request writes through (the protocol's transport)."""

    def send_held(self, data: bytes) -> int | None:
        """Hand ``data`` to the kernel; the instant before, or None if nothing was sent."""

    def settle_held(self, before_ns: int) -> None:
        """The bookkeeping of a write that ``send_held`` made."""


class Hold:
    """One request's writes, held until ``at_ns`` (a ``perf_counter_ns`` instant)."""

    __slots__ = ("_pending", "_sent", "_waiters", "at_ns", "released")

    def __init__(self, at_ns: int) -> None:
        self.at_ns = at_ns
        self.released = False
        # (writer, bytes) in the order they were written
        self._pending: list[tuple[Writer, bytes]] = []
        self._sent: list[tuple[Writer, int]] = []
        self._waiters: list[asyncio.Future[None]] = []

    def add(self, writer: Writer, data: bytes) -> None:
        """Keep ``data`` for ``writer`` to write at the instant, after what came before."""
        self._pending.append((writer, bytes(data)))

    async def wait(self) -> None:
        """Until the instant (at once if it has passed)."""
        if self.released:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    def send(self) -> None:
        """Hand what is held to the kernel, one send per connection (the request's bytes
        leave together); the bookkeeping waits for :meth:`settle`."""
        if self.released:
            return
        self.released = True
        pending, self._pending = self._pending, []
        while pending:
            writer = pending[0][0]
            same = [data for w, data in pending if w is writer]
            if len(same) < len(pending):  # more than one connection: not the usual case
                pending = [(w, data) for w, data in pending if w is not writer]
            else:
                pending = []
            before = writer.send_held(same[0] if len(same) == 1 else b"".join(same))
            if before is not None:
                self._sent.append((writer, before))

    def settle(self) -> None:
        """After :meth:`send`: note the writes on the request and wake who waits."""
        sent, self._sent = self._sent, []
        for writer, before in sent:
            writer.settle_held(before)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def release(self) -> None:
        """:meth:`send`, then :meth:`settle`."""
        self.send()
        self.settle()

    def drop(self) -> None:
        """The request ended before its instant (cancelled, failed): nothing is sent."""
        self._pending = []
        self.released = True
        for waiter in self._waiters:
            waiter.cancel()
        self._waiters = []


class SendSchedule:
    """The holds of one Client's loop, released at their instants in a single callback each."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._instants: list[int] = []  # a heap of the instants in ``_due``
        self._due: dict[int, list[Hold]] = {}
        self._timer = kernel_timer()
        self._armed_ns: int | None = None
        self._handle: asyncio.TimerHandle | None = None
        if self._timer is not None:
            loop.add_reader(self._timer.fd, self._fire)

    @property
    def kernel_timer(self) -> bool:
        """True when a timerfd keeps the instants (else asyncio's millisecond-rounded timers)."""
        return self._timer is not None

    def hold(self, at_ns: int) -> Hold:
        hold = Hold(at_ns)
        holds = self._due.get(at_ns)
        if holds is None:
            self._due[at_ns] = holds = []
            heapq.heappush(self._instants, at_ns)
            if self._armed_ns is None or at_ns < self._armed_ns:
                self._arm(at_ns)
        holds.append(hold)
        return hold

    def _arm(self, at_ns: int) -> None:
        self._armed_ns = at_ns
        if self._timer is not None:
            self._timer.set(at_ns - _EARLY_NS)
            return
        if self._handle is not None:
            self._handle.cancel()
        delay = (at_ns - time.perf_counter_ns()) / 1e9
        self._handle = self._loop.call_at(self._loop.time() + delay, self._fire)

    def _fire(self) -> None:
        if self._timer is not None:
            self._timer.drain()
        self._armed_ns, self._handle = None, None
        clock, instants = time.perf_counter_ns, self._instants
        now = clock()
        while instants and instants[0] <= now + _EARLY_NS:
            at = heapq.heappop(instants)
            while now < at:  # woken early on purpose: the last few µs, spun
                now = clock()
            ready = self._due.pop(at)
            for hold in ready:  # every send of the instant first, nothing in between
                hold.send()
            for hold in ready:
                hold.settle()
            now = clock()
        if instants:
            self._arm(instants[0])

    def close(self) -> None:
        """Drop what is still held and give the timer back."""
        for holds in self._due.values():
            for hold in holds:
                hold.drop()
        self._due, self._instants = {}, []
        if self._handle is not None:
            self._handle.cancel()
        if self._timer is not None:
            self._loop.remove_reader(self._timer.fd)
            self._timer.close()
            self._timer = None
