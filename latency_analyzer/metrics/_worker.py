"""Parsing off the event loop: in a child process (no GIL shared with the load) or a thread.

The child is ``python -m latency_analyzer.metrics._child``, fed over its stdin/stdout with
length-prefixed pickles: ``(text, content_type)`` in, ``("ok", samples)`` or ``("err", reason)``
out, strictly in order. A plain child process, not ``multiprocessing``: spawn would re-import
the user's ``__main__`` script, fork is unsafe in a process that runs threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import sys
from concurrent.futures import ThreadPoolExecutor

from ._parse import MetricsParseError, ParsedSample, parse

__all__ = ["ProcessParser", "ThreadParser"]

_HEAD = 8  # as _child.HEAD (not imported: that module is the child's __main__)


class ThreadParser:
    """Parse in one worker thread (holds the GIL while it parses)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-parse")

    async def start(self) -> None:
        return None

    async def parse(self, text: str, ctype: str | None) -> list[ParsedSample]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, parse, text, ctype)

    async def close(self) -> None:
        self._pool.shutdown(wait=True)


class ProcessParser:
    """Parse in a child process; requests are answered in the order they were made."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()  # FIFO: one request on the pipe at a time, in order

    async def start(self) -> None:
        """Start the child and wait until it answers (its imports are done)."""
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "latency_analyzer.metrics._child",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        await self.parse("", None)

    async def parse(self, text: str, ctype: str | None) -> list[ParsedSample]:
        """Samples of ``text``.

        Raises:
            MetricsParseError: malformed text, or the child is gone.
        """
        async with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None or proc.stdout is None:
                raise MetricsParseError("parser process not running")
            blob = pickle.dumps((text, ctype), protocol=pickle.HIGHEST_PROTOCOL)
            try:
                proc.stdin.write(len(blob).to_bytes(_HEAD, "big") + blob)
                await proc.stdin.drain()
                size = int.from_bytes(await proc.stdout.readexactly(_HEAD), "big")
                status, value = pickle.loads(await proc.stdout.readexactly(size))
            except (OSError, asyncio.IncompleteReadError):
                raise MetricsParseError("parser process died") from None
        if status == "err":
            raise MetricsParseError(value)
        return [ParsedSample(*row) for row in value]

    async def close(self) -> None:
        """End the child (EOF on its stdin) and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
            with contextlib.suppress(OSError):
                await proc.stdin.wait_closed()
        try:
            await asyncio.wait_for(proc.wait(), timeout=5.0)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
