"""Run an async service on a private event loop in a daemon thread (for synchronous callers).

Shared by the span receivers (server/) and the loopback test bed (testing/): a leaf module
that imports nothing else of the package.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["AsyncService", "ThreadRunner"]

_TIMEOUT_S = 10.0
T = TypeVar("T")


class AsyncService(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=AsyncService)


class ThreadRunner(Generic[S]):
    """``with ThreadRunner(service) as s:`` starts ``service`` on its own loop and thread."""

    def __init__(self, service: S) -> None:
        self.service = service
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> S:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name=f"la-{type(self.service).__name__}", daemon=True
        )
        self._thread.start()
        try:
            self.call(self.service.start())
        except BaseException:
            self._shutdown()
            raise
        return self.service

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.call(self.service.stop())
        finally:
            self._shutdown()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the service's loop and wait for its result."""
        if self._loop is None:
            coro.close()
            raise RuntimeError("the thread runner is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_TIMEOUT_S)

    def _run(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def _shutdown(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_TIMEOUT_S)
        self._loop = None
        self._thread = None
