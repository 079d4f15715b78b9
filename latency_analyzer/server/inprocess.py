"""In-process spans: an OpenTelemetry SDK ``SpanProcessor`` that feeds a ``SpanStore``.

For a server running in the same process as the measuring client (a FastAPI app under test,
an embedded engine)::

    provider.add_span_processor(StoreSpanProcessor(store))

Needs ``opentelemetry-sdk``. Like the SDK's own processors it never raises into the
application: a span it cannot convert is counted in ``failed``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from ..timeline import AttrValue
from .spans import ServerSpan
from .store import SpanStore

__all__ = ["StoreSpanProcessor", "from_readable_span"]


def _value(value: Any) -> AttrValue:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return json.dumps(list(value), default=str)  # sequences: JSON text, as the decoder does


def _attrs(attrs: Mapping[str, Any] | None) -> dict[str, AttrValue]:
    return {k: _value(v) for k, v in (attrs or {}).items()}


def from_readable_span(span: ReadableSpan) -> ServerSpan | None:
    """A finished SDK span as a ``ServerSpan``; None without valid ids or times."""
    ctx = span.context
    if ctx is None or not ctx.is_valid or span.start_time is None or span.end_time is None:
        return None
    parent = span.parent
    return ServerSpan(
        trace_id=f"{ctx.trace_id:032x}",
        span_id=f"{ctx.span_id:016x}",
        parent_span_id=f"{parent.span_id:016x}" if parent is not None else None,
        name=span.name,
        start_ns=span.start_time,
        end_ns=max(span.start_time, span.end_time),
        kind=span.kind.name.lower(),
        attributes=_attrs(span.attributes),
        resource=_attrs(span.resource.attributes),
        scope=span.instrumentation_scope.name if span.instrumentation_scope else "",
        links=tuple(
            (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in span.links
        ),
    )


class StoreSpanProcessor(SpanProcessor):
    """Puts every ended span into ``store``."""

    def __init__(self, store: SpanStore) -> None:
        self.store = store
        self.failed = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        try:
            converted = from_readable_span(span)
        except Exception:  # an exporter-like component must never break the application
            self.failed += 1
            return
        if converted is not None:
            self.store.add([converted])

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
