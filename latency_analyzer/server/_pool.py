"""Where receivers decode: off the event loop, in two bounded lanes.

A receiver's loop only reads bytes and answers; inflating, checking and decoding a payload run
in a worker thread. Small payloads (what an exporter sends every few seconds) and large ones
have a lane each, one thread per lane, so a valid export never queues behind a flood of big
ones. A lane holds at most ``max_pending`` payloads (running or queued); one more is refused at
once with :class:`Busy`, which receivers answer as OTLP's retryable "try later" (HTTP 503 with
``Retry-After``, gRPC ``UNAVAILABLE``), as the Collector's memory limiter refuses data.

The worker holds the GIL while it decodes, but CPython hands the GIL over every
``sys.getswitchinterval()`` (5 ms), and the decode's own cost is bounded by
:class:`~latency_analyzer.server.spans.Limits`: the loop keeps answering.
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
    """Two single-thread lanes split at ``small_body`` bytes.

    Args:
        small_body: payloads up to this size (as received) take the small lane.
        max_pending: payloads each lane may hold (running and queued).
    """

    def __init__(self, small_body: int = 256 * 1024, max_pending: tuple[int, int] = (16, 2)):
        self.small_body = small_body
        self.max_pending = max_pending
        self.busy = 0
        self._lanes = (
            ThreadPoolExecutor(1, thread_name_prefix="otlp-decode-small"),
            ThreadPoolExecutor(1, thread_name_prefix="otlp-decode-large"),
        )
        self._pending = [0, 0]
        self._lock = threading.Lock()

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
