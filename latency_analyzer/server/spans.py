"""Server spans as plain data, and sans-IO decoding of OTLP trace payloads into them.

``decode_otlp(body, content_type)`` reads one OTLP/HTTP ``ExportTraceServiceRequest``:
protobuf through ``opentelemetry-proto``, or OTLP JSON. OTLP JSON spells trace and span ids in
hex (not protobuf-JSON's base64), so ids are rewritten to base64 before
``google.protobuf.json_format`` parses the rest; everything else is the protobuf library's.
Bad input raises ``PayloadError`` (a ``RequestError``), never anything else.

Decoding has a budget (:class:`Limits`, in ``_limits``): at most ``max_spans`` spans,
``max_resources`` resource entries and ``max_items`` encoded items (every protobuf field, every
JSON value) per payload, checked before the full decode.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from ..errors import UsageError
from ..timeline import AttrValue
from ._limits import (
    DEFAULT_LIMITS,
    NOT_PROTOBUF,
    YIELD_EVERY,
    Limits,
    PayloadError,
    PayloadTooLarge,
    check_decoded,
    check_json,
    check_protobuf,
)

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
    done = 0
    for resource_spans in request.resource_spans:
        resource = MappingProxyType(_attributes(resource_spans.resource.attributes))
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for pb in scope_spans.spans:
                done += 1 + len(pb.attributes)
                if done >= YIELD_EVERY:  # see _limits.YIELD_EVERY
                    done = 0
                    time.sleep(0)
                if span := _span(pb, resource, scope):
                    out.append(span)
    return out


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
        raise PayloadError(f"{NOT_PROTOBUF}: {exc}") from None
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
    check_decoded(request, limits)
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
