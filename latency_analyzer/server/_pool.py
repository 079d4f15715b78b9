"""Where receivers decode: off the event loop, in two bounded lanes.

A receiver's loop only reads bytes and answers; inflating, checking and decoding a payload run
in worker threads. Small payloads (what an exporter sends every few seconds: a few KB) and
large ones have a lane each, so a valid export never queues behind a flood of big ones. A lane
holds at most ``max_pending`` payloads; one more is refused at once with :class:`Busy`, which
receivers answer as OTLP's retryable "try later" (HTTP 503 with ``Retry-After``, gRPC
``UNAVAILABLE``), as the Collector's memory limiter refuses data.

In the small lane each payload has a thread of its own: the decodes hold the GIL, and CPython
hands it over every ``sys.getswitchinterval()`` (5 ms), so a cheap export beside costly small
ones finishes in a few switch intervals instead of waiting for them to end. The large lane has
one thread (its payloads queue): fewer threads asking for the GIL at once. The walk and the
span conversion also yield the GIL every millisecond or so of work (``_limits.YIELD_EVERY``).
Each decode's own cost is bounded by :class:`~latency_analyzer.server.spans.Limits`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["Busy", "DecodePool"]

T = TypeVar("T")


class Busy(Exception):
    """The lane for a payload of this size is full."""


class DecodePool:
    """Two lanes split at ``small_body`` bytes: a thread per small payload, one for large ones.

    Args:
        small_body: payloads up to this size (as received) take the small lane.
        max_pending: payloads each lane may hold (running and queued), small and large.
    """

    def __init__(self, small_body: int = 64 * 1024, max_pending: tuple[int, int] = (8, 2)):
        self.small_body = small_body
        self.max_pending = max_pending
        self.busy = 0
        self._lanes = (
            ThreadPoolExecutor(max_pending[0], thread_name_prefix="otlp-decode-small"),
            ThreadPoolExecutor(1, thread_name_prefix="otlp-decode-large"),
        )
        self._pending = [0, 0]
        self._lock = threading.Lock()

    def full(self, size: int) -> bool:
        """Whether a payload of ``size`` bytes would be refused now (a hint: nothing is
        reserved, so a receiver can refuse before reading a body it would have to refuse)."""
        lane = 0 if size <= self.small_body else 1
        with self._lock:
            return self._pending[lane] >= self.max_pending[lane]

    def refused(self) -> None:
        """Count a payload its receiver refused after :meth:`full` said so."""
        with self._lock:
            self.busy += 1

    async def run(self, size: int, func: Callable[[], T]) -> T:
        """``func()`` in the lane for ``size`` bytes.

        Raises:
            Busy: that lane is full (counted in ``busy``).
        """
        lane = 0 if size <= self.small_body else 1
        with self._lock:
            if self._pending[lane] >= self.max_pending[lane]:
                self.busy += 1
                raise Busy(f"{self._pending[lane]} payloads are being decoded; try later")
            self._pending[lane] += 1

        def release(_: object) -> None:  # when the work ends, even if its waiter went away
            with self._lock:
                self._pending[lane] -= 1

        try:
            work = self._lanes[lane].submit(func)
        except RuntimeError:  # shut down
            release(None)
            raise Busy("the receiver is stopping") from None
        work.add_done_callback(release)
        return await asyncio.wrap_future(work)

    def close(self) -> None:
        """Stop the threads (a decode still running finishes first)."""
        for lane in self._lanes:
            lane.shutdown(wait=True, cancel_futures=True)
