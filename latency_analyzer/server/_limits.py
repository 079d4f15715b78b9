"""What one OTLP payload may hold (:class:`Limits`), checked before it is decoded.

The budget is checked *before* the full decode, by a walk that stops as soon as it is spent:
the protobuf wire format's tags and lengths (a bounded number of steps, never the allocation
of the decoded tree), or for JSON a count of its separators (one C-speed pass). A payload over
budget raises :class:`PayloadTooLarge` (a ``PayloadError``), which receivers answer with 413 /
``RESOURCE_EXHAUSTED``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..errors import RequestError

__all__ = [
    "DEFAULT_LIMITS",
    "NOT_PROTOBUF",
    "YIELD_EVERY",
    "Limits",
    "PayloadError",
    "PayloadTooLarge",
    "check_decoded",
    "check_json",
    "check_protobuf",
]


class PayloadError(RequestError):
    """An OTLP payload (or Server-Timing value) that cannot be read."""

    def __init__(self, message: str) -> None:
        super().__init__("bad_payload", message)


class PayloadTooLarge(PayloadError):
    """A payload over a size or count budget (:class:`Limits`, or a receiver's byte caps)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one OTLP payload may hold; checked before it is decoded.

    Attributes:
        max_spans: spans per payload (the SDK's batch exporter sends at most 512).
        max_resources: ``ResourceSpans`` entries per payload (an exporter sends one per
            process it speaks for).
        max_items: encoded items per payload: protobuf fields at any depth (a span with 20
            attributes is about 70), JSON values. Bounds the decode's time and memory whatever
            the items are (empty ``ResourceSpans``, attributes without keys, nested arrays).
    """

    max_spans: int = 10_000
    max_resources: int = 1_000
    max_items: int = 100_000


DEFAULT_LIMITS = Limits()


# The OTLP trace messages' sub-message fields, by field number: the walk descends into these
# (every other field is one item, skipped by its wire type). Names follow trace.proto.
_REQUEST, _RESOURCE_SPANS, _RESOURCE, _SCOPE_SPANS, _SCOPE = 0, 1, 2, 3, 4
_SPAN, _EVENT, _LINK, _KEY_VALUE, _ANY_VALUE, _ARRAY, _KV_LIST, _STATUS = 5, 6, 7, 8, 9, 10, 11, 12
_CHILDREN: tuple[dict[int, int], ...] = (
    {1: _RESOURCE_SPANS},  # ExportTraceServiceRequest / TracesData
    {1: _RESOURCE, 2: _SCOPE_SPANS},  # ResourceSpans
    {1: _KEY_VALUE},  # Resource
    {1: _SCOPE, 2: _SPAN},  # ScopeSpans
    {3: _KEY_VALUE},  # InstrumentationScope
    {9: _KEY_VALUE, 11: _EVENT, 13: _LINK, 15: _STATUS},  # Span
    {3: _KEY_VALUE},  # Span.Event
    {5: _KEY_VALUE},  # Span.Link
    {2: _ANY_VALUE},  # KeyValue
    {5: _ARRAY, 6: _KV_LIST},  # AnyValue
    {1: _ANY_VALUE},  # ArrayValue
    {1: _KEY_VALUE},  # KeyValueList
    {},  # Status
)
_MAX_DEPTH = 100  # the protobuf runtime's own recursion limit
#: Fields walked, or attributes converted, between two yields of the GIL (``time.sleep(0)``):
#: about a millisecond of work, so an event loop or a cheap export in another thread waits
#: for that rather than for CPython's 5 ms switch interval.
YIELD_EVERY = 2048
NOT_PROTOBUF = "not an OTLP protobuf ExportTraceServiceRequest"


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise PayloadError(f"{NOT_PROTOBUF}: truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def check_protobuf(body: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    """Walk the wire format's tags and lengths, counting spans, resources and items.

    Stops at the first budget exceeded, so its cost is bounded by ``limits``, not by the
    payload. Framing errors (a length past the end, a bad wire type) are ``PayloadError``.

    Raises:
        PayloadTooLarge: over ``limits``.
        PayloadError: not protobuf framing.
    """
    items = spans = resources = 0
    stack = [(len(body), _REQUEST)]  # (end of the message, its kind)
    pos = 0
    while stack:
        end, kind = stack[-1]
        if pos >= end:
            if pos > end:
                raise PayloadError(f"{NOT_PROTOBUF}: a field runs past its message")
            stack.pop()
            continue
        items += 1
        if items > limits.max_items:
            raise PayloadTooLarge(f"more than {limits.max_items} protobuf fields")
        if not items % YIELD_EVERY:
            time.sleep(0)
        tag = body[pos]  # pos < end <= len(body); one-byte varints inline (most tags, sizes)
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(body, pos, end)
        wire = tag & 7
        if wire == 0:
            _, pos = _varint(body, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size = body[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = _varint(body, pos, end)
            if pos + size > end:
                raise PayloadError(f"{NOT_PROTOBUF}: a field runs past its message")
            child = _CHILDREN[kind].get(tag >> 3)
            if child is None:
                pos += size
                continue
            if child == _SPAN:
                spans += 1
                if spans > limits.max_spans:
                    raise PayloadTooLarge(f"more than {limits.max_spans} spans")
            elif child == _RESOURCE_SPANS:
                resources += 1
                if resources > limits.max_resources:
                    raise PayloadTooLarge(f"more than {limits.max_resources} resource entries")
            if len(stack) >= _MAX_DEPTH:
                raise PayloadError(f"{NOT_PROTOBUF}: nested too deeply")
            stack.append((pos + size, child))
        else:
            raise PayloadError(f"{NOT_PROTOBUF}: wire type {wire}")


def check_json(body: bytes | str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Bound a JSON payload's values before parsing: a value other than the first in an
    array or object follows a comma, and every container opens with a bracket, so commas plus
    brackets plus one is never fewer than the values (commas inside strings only make the
    bound looser).

    Raises:
        PayloadTooLarge: over ``limits``.
    """
    data = body.encode() if isinstance(body, str) else body
    values = data.count(b",") + data.count(b"[") + data.count(b"{") + 1
    if values > limits.max_items:
        raise PayloadTooLarge(f"more than {limits.max_items} JSON values")


def check_decoded(request: ExportTraceServiceRequest, limits: Limits) -> None:
    """Counts only the decoded tree knows exactly (JSON): resources, then spans."""
    if len(request.resource_spans) > limits.max_resources:
        raise PayloadTooLarge(f"more than {limits.max_resources} resource entries")
    spans = 0
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            spans += len(ss.spans)
    if spans > limits.max_spans:
        raise PayloadTooLarge(f"more than {limits.max_spans} spans")
