"""What the server says about a request: OpenTelemetry spans and Server-Timing headers.

* ``inject(headers)``: a W3C ``traceparent`` for each request (``propagation``).
* receivers, all feeding one bounded ``SpanStore`` keyed by trace id, each decoding within
  ``Limits`` off its event loop: ``OTLPHttpReceiver``
  (``/v1/traces``, protobuf or JSON, gzip), ``read_otlp_jsonl`` (the file exporter's
  JSON lines), ``StoreSpanProcessor`` (in-process SDK; import from ``server.inprocess``) and
  ``OTLPGrpcReceiver`` (``server.otlp_grpc``, needs grpcio).
* ``map_request(spans, client_span_id)``: vLLM / SGLang / TGI / GenAI / generic span schemas
  → server stages (``schemas``); ``parse_server_timing`` and ``tgi_header_stages`` for headers.
* ``bracket`` / ``combine``: the server clock's offset, bounded by causality (``align``).

``latency_analyzer.merge`` places the result inside the client's waterfall.
"""

from .align import Bracket, ClockOffset, bracket, combine
from .files import OTLPJsonLinesParser, read_otlp_jsonl
from .otlp_http import OTLPHttpReceiver, inflate
from .schemas import (
    GENERIC_NAMES,
    SCHEMAS,
    ServerStages,
    map_request,
    parse_duration,
    request_spans,
)
from .server_timing import (
    ServerTimingMetric,
    parse_server_timing,
    server_timing_stages,
    tgi_header_stages,
)
from .spans import (
    DEFAULT_LIMITS,
    Limits,
    PayloadError,
    PayloadTooLarge,
    ServerSpan,
    decode_otlp,
    decode_otlp_json,
    decode_otlp_protobuf,
)
from .store import SpanStore

__all__ = [
    "DEFAULT_LIMITS",
    "GENERIC_NAMES",
    "SCHEMAS",
    "Bracket",
    "ClockOffset",
    "Limits",
    "OTLPHttpReceiver",
    "OTLPJsonLinesParser",
    "PayloadError",
    "PayloadTooLarge",
    "ServerSpan",
    "ServerStages",
    "ServerTimingMetric",
    "SpanStore",
    "bracket",
    "combine",
    "decode_otlp",
    "decode_otlp_json",
    "decode_otlp_protobuf",
    "inflate",
    "map_request",
    "parse_duration",
    "parse_server_timing",
    "read_otlp_jsonl",
    "request_spans",
    "server_timing_stages",
    "tgi_header_stages",
]
