"""One store of server spans, keyed by trace id, fed by every receiver (thread-safe).

Receivers run on their own threads or loops (an OTLP receiver, the SDK's span processor); a
merge waits on the store for a trace's spans with a grace period. The store is bounded in
traces, spans and bytes: past ``max_traces``, ``max_spans`` or ``max_bytes`` the oldest traces
(by first arrival) are evicted, past ``max_spans_per_trace`` new spans of that trace are
refused; both are counted, in spans, in ``dropped``, so a flood of spans cannot exhaust memory
and a report can say what was lost.

Bytes are an estimate of what a span holds (its name, ids, attribute keys and values, plus a
fixed per-object overhead), not ``sys.getsizeof`` of every object: cheap to keep, and within a
small factor of the process's real growth (see ``benchmarks/bench_receivers.py``).
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


#: Estimated bytes of a span beyond its strings: the dataclass, two mapping proxies and dicts.
_SPAN_OVERHEAD = 600
_ATTR_OVERHEAD = 100  # a dict slot, the key and value objects' headers


def span_bytes(span: ServerSpan) -> int:
    """The store's estimate of what ``span`` costs in memory (resource attributes are shared
    by the spans of one export, so they are not counted per span)."""
    size = _SPAN_OVERHEAD + len(span.name) + len(span.scope) + 64 * len(span.links)
    for key, value in span.attributes.items():
        size += _ATTR_OVERHEAD + len(key) + (len(value) if isinstance(value, str) else 8)
    return size


class SpanStore:
    """Server spans by trace id.

    Args:
        max_traces: traces kept; the oldest (by first arrival) are evicted beyond it.
        max_spans_per_trace: spans kept per trace; later ones are refused.
        max_spans: spans kept in all; the oldest traces are evicted beyond it.
        max_bytes: estimated bytes kept in all (:func:`span_bytes`); likewise.

    Attributes:
        dropped: spans evicted or refused since the store was made.
        bytes: the estimate of what the store holds now.
    """

    def __init__(
        self,
        max_traces: int = 100_000,
        max_spans_per_trace: int = 10_000,
        *,
        max_spans: int = 200_000,
        max_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.max_traces = max_traces
        self.max_spans_per_trace = max_spans_per_trace
        self.max_spans = max_spans
        self.max_bytes = max_bytes
        self.dropped = 0
        self.bytes = 0
        self._spans = 0
        self._trace_bytes: dict[str, int] = {}
        self._traces: OrderedDict[str, dict[str, ServerSpan]] = OrderedDict()
        self._changed = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def __len__(self) -> int:
        with self._changed:
            return self._spans

    def add(self, spans: Iterable[ServerSpan]) -> int:
        """Store ``spans`` (a re-sent span replaces the earlier copy); return how many were
        kept. The oldest traces are evicted while the store is over a cap (the trace being
        added last, and only if it alone is over)."""
        added = 0
        with self._changed:
            for span in spans:
                added += self._add_one(span)
            while self._traces and (
                len(self._traces) > self.max_traces
                or self._spans > self.max_spans
                or self.bytes > self.max_bytes
            ):
                self._evict_oldest()
            self._changed.notify_all()
            waiters = list(self._waiters)
        for loop, event in waiters:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)
        return added

    def _add_one(self, span: ServerSpan) -> int:
        trace = self._traces.setdefault(span.trace_id, {})
        old = trace.get(span.span_id)
        if old is None and len(trace) >= self.max_spans_per_trace:
            self.dropped += 1
            return 0
        size = span_bytes(span) - (span_bytes(old) if old is not None else 0)
        trace[span.span_id] = span
        self._spans += old is None
        self.bytes += size
        self._trace_bytes[span.trace_id] = self._trace_bytes.get(span.trace_id, 0) + size
        return 1

    def _evict_oldest(self) -> None:
        trace_id, trace = self._traces.popitem(last=False)
        self.dropped += len(trace)
        self._spans -= len(trace)
        self.bytes -= self._trace_bytes.pop(trace_id, 0)

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
        """Forget every span (``dropped`` keeps counting what was lost before)."""
        with self._changed:
            self._traces.clear()
            self._trace_bytes.clear()
            self._spans = self.bytes = 0

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
