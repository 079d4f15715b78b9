"""One store of server spans, keyed by trace id, fed by every receiver (thread-safe).

Receivers run on their own threads or loops (an OTLP receiver, the SDK's span processor); a
merge waits on the store for a trace's spans with a grace period. The store is bounded: past
``max_traces`` the oldest traces are dropped, past ``max_spans_per_trace`` new spans of that
trace are counted in ``dropped`` and ignored, so a flood of spans cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from .spans import ServerSpan

__all__ = ["SpanStore"]

Ready = Callable[[list[ServerSpan]], bool]


def _any(spans: list[ServerSpan]) -> bool:
    return bool(spans)


class SpanStore:
    """Server spans by trace id.

    Args:
        max_traces: traces kept; the oldest (by first arrival) are dropped beyond it.
        max_spans_per_trace: spans kept per trace; later ones are dropped and counted.
    """

    def __init__(self, max_traces: int = 100_000, max_spans_per_trace: int = 10_000) -> None:
        self.max_traces = max_traces
        self.max_spans_per_trace = max_spans_per_trace
        self.dropped = 0
        self._traces: OrderedDict[str, dict[str, ServerSpan]] = OrderedDict()
        self._changed = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def __len__(self) -> int:
        with self._changed:
            return sum(len(spans) for spans in self._traces.values())

    def add(self, spans: Iterable[ServerSpan]) -> int:
        """Store ``spans`` (a re-sent span replaces the earlier copy); return how many."""
        added = 0
        with self._changed:
            for span in spans:
                added += self._add_one(span)
            while len(self._traces) > self.max_traces:
                self._traces.popitem(last=False)
                self.dropped += 1
            self._changed.notify_all()
            waiters = list(self._waiters)
        for loop, event in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)
        return added

    def _add_one(self, span: ServerSpan) -> int:
        trace = self._traces.setdefault(span.trace_id, {})
        if span.span_id not in trace and len(trace) >= self.max_spans_per_trace:
            self.dropped += 1
            return 0
        trace[span.span_id] = span
        return 1

    def trace(self, trace_id: str) -> list[ServerSpan]:
        """Every span of ``trace_id`` received so far, by start time."""
        with self._changed:
            spans = list(self._traces.get(trace_id.lower(), {}).values())
        return sorted(spans, key=lambda s: (s.start_ns, s.end_ns))

    def span(self, trace_id: str, span_id: str) -> ServerSpan | None:
        """One span by its ids (for links across traces), or None."""
        with self._changed:
            return self._traces.get(trace_id.lower(), {}).get(span_id.lower())

    def trace_ids(self) -> list[str]:
        """Trace ids held, oldest first."""
        with self._changed:
            return list(self._traces)

    def clear(self) -> None:
        with self._changed:
            self._traces.clear()

    def wait_for(self, trace_id: str, timeout: float, ready: Ready = _any) -> list[ServerSpan]:
        """Block until ``ready(spans of trace_id)`` or ``timeout`` seconds; return the spans."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not ready(spans := self.trace(trace_id)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        return spans

    async def await_trace(
        self, trace_id: str, timeout: float, ready: Ready = _any
    ) -> list[ServerSpan]:
        """Like ``wait_for`` without blocking the event loop."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        entry = (loop, event)
        with self._changed:
            self._waiters.append(entry)
        try:
            deadline = loop.time() + timeout
            while True:
                event.clear()  # before looking: a span added after the look sets it again
                spans = self.trace(trace_id)
                left = deadline - loop.time()
                if ready(spans) or left <= 0:
                    return spans
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), left)
        finally:
            with self._changed:
                self._waiters.remove(entry)
