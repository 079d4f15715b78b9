"""W3C trace context on outgoing requests, through OpenTelemetry's TraceContext propagator.

Every request gets a ``traceparent`` naming a fresh *client span* id. The server's spans carry
that trace id and (for vLLM, SGLang, TGI) the client span id as their parent, which is how a
waterfall finds its server spans later. A caller's own ``traceparent`` is kept as the parent::

    ctx = inject(headers)          # headers gains "traceparent" (and keeps "tracestate")
    ctx.trace_id, ctx.span_id      # 32 / 16 lowercase hex digits
"""

from __future__ import annotations

import random
from collections.abc import MutableMapping
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..timeline._unfrozen import unfrozen

__all__ = ["TraceContext", "inject"]

_PROPAGATOR = TraceContextTextMapPropagator()
_FIELDS = frozenset(f.lower() for f in _PROPAGATOR.fields)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """The ids one request was sent with.

    Attributes:
        trace_id: 32 lowercase hex digits.
        span_id: the client span's id, 16 lowercase hex digits: the server's parent.
        parent_span_id: the caller's span id when the caller sent its own ``traceparent``.
        sampled: the ``sampled`` flag sent (servers with a parent-based sampler, vLLM's
            default, record nothing when it is off).
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    sampled: bool = True

    @property
    def traceparent(self) -> str:
        """The header value that was sent."""
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


_OpenTraceContext = unfrozen(TraceContext)
_new = object.__new__
_getrandbits = random.getrandbits  # the module's shared generator: random.seed() reaches it


def _new_span_id() -> int:
    # Span ids need uniqueness, not secrecy (the OpenTelemetry SDK draws them the same way).
    while not (span_id := _getrandbits(64)):
        pass
    return span_id


def _caller_context(headers: MutableMapping[str, str]) -> trace.SpanContext | None:
    """The caller's own trace context, removed from ``headers`` (any header-name case)."""
    names = [n for n in headers if n.lower() in _FIELDS]
    if not names:  # nearly every request: nothing to extract
        return None
    carrier: dict[str, str] = {}
    for name in names:
        carrier[name.lower()] = headers.pop(name)
    if "traceparent" not in carrier:
        return None
    parent = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return parent if parent.is_valid else None


def inject(headers: MutableMapping[str, str]) -> TraceContext:
    """Add a W3C ``traceparent`` for a new client span to ``headers`` (in place).

    A valid ``traceparent`` already in ``headers`` becomes the parent: the trace id, flags and
    ``tracestate`` are kept and a new span id is sent. An invalid one is replaced by a new
    trace, as the W3C recommendation says.

    Args:
        headers: request headers; modified in place.

    Returns:
        The ids sent, to record on the waterfall.
    """
    # built in its slots: the frozen field-by-field __init__ costs more than the rest
    ctx = _new(_OpenTraceContext)
    ctx.trace_id, ctx.span_id, ctx.parent_span_id, ctx.sampled = _inject_ids(headers)
    ctx.__class__ = TraceContext
    built: TraceContext = ctx
    return built


def _inject_ids(headers: MutableMapping[str, str]) -> tuple[str, str, str | None, bool]:
    """:func:`inject`, the ids as a tuple: ``(trace_id, span_id, parent_span_id, sampled)``
    (what the Client records on every request, without a TraceContext to hold them)."""
    parent = _caller_context(headers) if headers else None
    if parent is None:
        # a new sampled trace: the header is written here, as the propagator would write it
        # (``00-<trace>-<span>-01``, no ``tracestate``), without building a context for it
        # lowercase hex, zero-padded: what ``:032x``/``:016x`` give, without parsing a spec
        trace_hex = (_getrandbits(128) or 1).to_bytes(16, "big").hex()
        span_hex = _new_span_id().to_bytes(8, "big").hex()
        headers["traceparent"] = f"00-{trace_hex}-{span_hex}-01"
        return trace_hex, span_hex, None, True
    trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
    span_id = _new_span_id()
    context = trace.SpanContext(
        trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=state
    )
    _PROPAGATOR.inject(headers, context=trace.set_span_in_context(trace.NonRecordingSpan(context)))
    return f"{trace_id:032x}", f"{span_id:016x}", f"{parent.span_id:016x}", flags.sampled
