"""Server spans as plain data, and sans-IO decoding of OTLP trace payloads into them.

``decode_otlp(body, content_type)`` reads one OTLP/HTTP ``ExportTraceServiceRequest``:
protobuf through ``opentelemetry-proto``, or OTLP JSON. OTLP JSON spells trace and span ids in
hex (not protobuf-JSON's base64), so ids are rewritten to base64 before
``google.protobuf.json_format`` parses the rest; everything else is the protobuf library's.
Bad input raises ``PayloadError`` (a ``RequestError``), never anything else.

Decoding has a budget (:class:`Limits`): at most ``max_spans`` spans, ``max_resources``
resource entries and ``max_items`` encoded items (every protobuf field, every JSON value) per
payload. The budget is checked *before* the full decode, by a walk that stops as soon as it is
spent: the protobuf wire format's tags and lengths (a bounded number of steps, never the
allocation of the decoded tree), or for JSON a count of its separators (one C-speed pass). A
payload over budget raises :class:`PayloadTooLarge` (a ``PayloadError``), which receivers answer
with 413 / ``RESOURCE_EXHAUSTED``.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from ..errors import RequestError, UsageError
from ..timeline import AttrValue

__all__ = [
    "DEFAULT_LIMITS",
    "JSON",
    "PROTOBUF",
    "Limits",
    "PayloadError",
    "PayloadTooLarge",
    "ServerSpan",
    "decode_otlp",
    "decode_otlp_json",
    "decode_otlp_protobuf",
    "spans_from_request",
]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


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


@dataclass(frozen=True, slots=True)
class ServerSpan:
    """One span as a server reported it, on the server's clock.

    Attributes:
        trace_id: 32 lowercase hex digits.
        span_id: 16 lowercase hex digits.
        parent_span_id: the parent's id, None for a root span.
        name: the server's span name (``llm_request``, ``generate_stream``, ...).
        start_ns: start, Unix epoch ns on the *server's* clock.
        end_ns: end, same clock.
        kind: ``server``, ``internal``, ``client``, ...
        attributes: scalar attributes (arrays and maps as JSON text).
        resource: the resource's attributes (``service.name``, ...).
        scope: the instrumentation scope name (``vllm.tracing.otel``, ...).
        links: (trace_id, span_id) of linked spans (TGI's follows-from batch spans).
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    kind: str = "internal"
    attributes: Mapping[str, AttrValue] = field(default_factory=dict, hash=False)
    resource: Mapping[str, AttrValue] = field(default_factory=dict, hash=False)
    scope: str = ""
    links: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name in ("attributes", "resource"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def _any_value(value: AnyValue) -> AttrValue:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        scalar: AttrValue = getattr(value, kind)
        return scalar
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return json.dumps(_plain(value), separators=(",", ":"))


def _plain(value: AnyValue) -> Any:
    """An array / kvlist value as plain JSON data."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    return _any_value(value)


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, AttrValue]:
    return {kv.key: _any_value(kv.value) for kv in pairs}


def _hex_id(raw: bytes, size: int) -> str | None:
    if len(raw) != size or not any(raw):
        return None
    return raw.hex()


def _span(pb: PbSpan, resource: Mapping[str, AttrValue], scope: str) -> ServerSpan | None:
    trace_id, span_id = _hex_id(pb.trace_id, 16), _hex_id(pb.span_id, 8)
    if trace_id is None or span_id is None:
        return None  # a span without valid ids can never be matched to a request
    links = tuple(
        (lt, ls)
        for link in pb.links
        if (lt := _hex_id(link.trace_id, 16)) and (ls := _hex_id(link.span_id, 8))
    )
    return ServerSpan(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=_hex_id(pb.parent_span_id, 8),
        name=pb.name,
        start_ns=pb.start_time_unix_nano,
        end_ns=max(pb.start_time_unix_nano, pb.end_time_unix_nano),
        kind=_KINDS.get(pb.kind, "unspecified"),
        attributes=_attributes(pb.attributes),
        resource=resource,
        scope=scope,
        links=links,
    )


def spans_from_request(request: ExportTraceServiceRequest) -> list[ServerSpan]:
    """Flatten an ``ExportTraceServiceRequest`` (or ``TracesData``) into spans."""
    out: list[ServerSpan] = []
    for resource_spans in request.resource_spans:
        resource = MappingProxyType(_attributes(resource_spans.resource.attributes))
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            out += [s for pb in scope_spans.spans if (s := _span(pb, resource, scope))]
    return out


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
_NOT_PB = "not an OTLP protobuf ExportTraceServiceRequest"


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise PayloadError(f"{_NOT_PB}: truncated or overlong varint")
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
                raise PayloadError(f"{_NOT_PB}: a field runs past its message")
            stack.pop()
            continue
        items += 1
        if items > limits.max_items:
            raise PayloadTooLarge(f"more than {limits.max_items} protobuf fields")
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
                raise PayloadError(f"{_NOT_PB}: a field runs past its message")
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
                raise PayloadError(f"{_NOT_PB}: nested too deeply")
            stack.append((pos + size, child))
        else:
            raise PayloadError(f"{_NOT_PB}: wire type {wire}")


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


def _check_decoded(request: ExportTraceServiceRequest, limits: Limits) -> None:
    """Counts only the decoded tree knows exactly (JSON): resources, then spans."""
    if len(request.resource_spans) > limits.max_resources:
        raise PayloadTooLarge(f"more than {limits.max_resources} resource entries")
    spans = 0
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            spans += len(ss.spans)
    if spans > limits.max_spans:
        raise PayloadTooLarge(f"more than {limits.max_spans} spans")


def decode_otlp_protobuf(body: bytes, limits: Limits = DEFAULT_LIMITS) -> list[ServerSpan]:
    """Decode a binary ``ExportTraceServiceRequest`` within ``limits``.

    Raises:
        PayloadTooLarge: over ``limits`` (found before the message is decoded).
        PayloadError: not a valid message.
    """
    check_protobuf(body, limits)
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise PayloadError(f"{_NOT_PB}: {exc}") from None
    return spans_from_request(request)


def _hex_to_b64(value: Any) -> Any:
    if not isinstance(value, str):
        raise PayloadError(f"span/trace id is not a string: {value!r}")
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except ValueError:
        raise PayloadError(f"span/trace id is not hex: {value[:40]!r}") from None


def _fix_ids(node: Any) -> None:
    """Rewrite OTLP JSON's hex ids to base64, in place, wherever an id field appears."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS:
                node[key] = _hex_to_b64(value)
            else:
                _fix_ids(value)
    elif isinstance(node, list):
        for item in node:
            _fix_ids(item)


def decode_otlp_json(
    data: bytes | str | Mapping[str, Any], limits: Limits = DEFAULT_LIMITS
) -> list[ServerSpan]:
    """Decode one OTLP JSON ``ExportTraceServiceRequest`` / ``TracesData`` object.

    Raises:
        PayloadTooLarge: over ``limits`` (values counted before parsing; spans and resources
            counted before they are converted).
        PayloadError: not JSON, not an object, or not the OTLP shape.
    """
    if isinstance(data, (bytes, str)):
        check_json(data, limits)
    try:
        obj = json.loads(data) if isinstance(data, (bytes, str)) else copy.deepcopy(dict(data))
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise PayloadError("OTLP JSON must be an object with resourceSpans")
    try:
        _fix_ids(obj)
    except RecursionError:
        raise PayloadError("OTLP JSON nested too deeply") from None
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(obj, request, ignore_unknown_fields=True)
    except (json_format.ParseError, binascii.Error, ValueError, TypeError, RecursionError) as exc:
        raise PayloadError(f"not an OTLP JSON ExportTraceServiceRequest: {exc}") from None
    _check_decoded(request, limits)
    return spans_from_request(request)


def decode_otlp(
    body: bytes, content_type: str, limits: Limits = DEFAULT_LIMITS
) -> list[ServerSpan]:
    """Decode an OTLP/HTTP traces body by its (already decompressed) content type.

    Raises:
        PayloadTooLarge: over ``limits``.
        PayloadError: malformed body.
        UsageError: a content type other than protobuf or JSON.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if media == PROTOBUF:
        return decode_otlp_protobuf(body, limits)
    if media == JSON:
        return decode_otlp_json(body, limits)
    raise UsageError(f"OTLP/HTTP carries {PROTOBUF} or {JSON}, not {content_type!r}")
