"""What every OTLP receiver shares: the store it feeds, its decode pool and counters, and
``async with`` / ``run_in_thread()`` over its ``start()`` and ``stop()``.

The thread runner itself is ``latency_analyzer._threads``' (one implementation).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from .._threads import AsyncService, ThreadRunner
from ._limits import Limits
from ._pool import DecodePool
from .store import SpanStore

__all__ = ["AsyncService", "Receiver", "ThreadRunner"]

R = TypeVar("R", bound="Receiver")


class Receiver:
    """The part of a receiver that is not its transport.

    Attributes:
        accepted: export requests stored.
        rejected: export requests refused as malformed or over budget.
        busy: export requests refused because their decode lane was full (the pool's count).
    """

    def __init__(self, store: SpanStore, host: str, port: int, limits: Limits) -> None:
        self.store = store
        self.host = host
        self.port = port
        self.limits = limits
        self.accepted = 0
        self.rejected = 0
        self._pool: DecodePool | None = None

    @property
    def busy(self) -> int:
        """Export requests refused with "try later" (0 while it is not serving)."""
        return 0 if self._pool is None else self._pool.busy

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def _close_pool(self) -> None:
        """Let the pool's running decodes finish, off the loop."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.to_thread(pool.close)

    async def __aenter__(self: R) -> R:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def run_in_thread(self: R) -> ThreadRunner[R]:
        """A sync context manager serving on a private loop in a daemon thread."""
        return ThreadRunner(self)
