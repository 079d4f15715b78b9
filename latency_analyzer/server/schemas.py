"""Schema mappings: a server's own spans → the stage vocabulary, on the server's clock.

Each server gets a small table and one function. A mapping returns ``ServerStages``: stage
spans (``source="server"``, epoch ns of the *server's* clock) plus the instants the clock
alignment may rely on (``arrival_ns`` happened after the client began sending;
``first_token_ns`` and ``done_ns`` happened before the client received the first token and
the last byte). Stage names are those of ``SERVER_STAGES``; TGI without its batch spans gives
one ``inference`` stage, because nothing it reports splits prefill from decode.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import UsageError
from ..timeline import AttrValue, Span
from .spans import ServerSpan

__all__ = [
    "GENERIC_NAMES",
    "SCHEMAS",
    "SGLANG_SLICES",
    "VLLM_ATTRIBUTES",
    "ServerStages",
    "map_genai",
    "map_generic",
    "map_request",
    "map_sglang",
    "map_tgi",
    "map_vllm",
    "parse_duration",
    "request_spans",
]

Lookup = Callable[[str, str], ServerSpan | None]


@dataclass(frozen=True, slots=True)
class ServerStages:
    """What the server says about one request, on the server's clock (epoch ns).

    Attributes:
        schema: which mapping produced it (``vllm``, ``sglang``, ``tgi``, ``genai``,
            ``generic``, ``server-timing``, ``tgi-headers``).
        stages: the stage spans, in start order (``source="server"``).
        arrival_ns: a server instant after the client started sending (None: unknown).
        first_token_ns: a server instant before the client saw the first token.
        done_ns: a server instant before the client saw the last byte.
        last_token_ns: a server instant before the client saw the last token.
        span_id: the server's request span id, when spans were the source.
        attributes: server-reported facts worth keeping (request id, token counts).
        timed: False when only durations are known (Server-Timing): the merge places them.
        token_anchored: with ``timed`` False, the stages are ``prefill`` then ``decode``, the
            prefill ending at the first token and the decode by the last byte (llama.cpp's
            ``timings``): the merge places them by the client's token instants.
    """

    schema: str
    stages: tuple[Span, ...]
    arrival_ns: int | None = None
    first_token_ns: int | None = None
    done_ns: int | None = None
    span_id: str | None = None
    attributes: Mapping[str, AttrValue] = field(default_factory=dict, hash=False)
    timed: bool = True
    last_token_ns: int | None = None
    token_anchored: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.attributes, MappingProxyType):
            object.__setattr__(self, "attributes", MappingProxyType(dict(self.attributes)))


# --- helpers ---------------------------------------------------------------------------


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _float(attrs: Mapping[str, AttrValue], key: str) -> float | None:
    value = attrs.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value >= 0 else None


def _stage(name: str, start: int, end: int, raw: str, **attrs: AttrValue) -> Span:
    return Span(name, start, max(start, end), "server", {"server.span": raw, **attrs})


def _sequence(start: int, parts: Sequence[tuple[str, int]], raw: str) -> tuple[list[Span], int]:
    """Lay ``(stage, duration_ns)`` parts end to end from ``start``; zero-length parts skipped."""
    out, t = [], start
    for name, duration in parts:
        if duration > 0:
            out.append(_stage(name, t, t + duration, raw))
            t += duration
    return out, t


_UNITS_NS = {"ns": 1, "µs": 1_000, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|us|ms|s)\s*$")


def parse_duration(text: AttrValue) -> int | None:
    """Nanoseconds of a Rust ``Debug`` duration string (``"12.3ms"``, ``"450µs"``, ``"1.2s"``)."""
    if not isinstance(text, str):
        return None
    match = _DURATION.match(text)
    if match is None:
        return None
    return round(float(match.group(1)) * _UNITS_NS[match.group(2)])


def _union(stages: Sequence[Span]) -> list[Span]:
    """Merge overlapping spans of the same stage (nested slices: ``decode_forward`` in a loop)."""
    out: list[Span] = []
    for span in sorted(stages, key=lambda s: (s.name, s.start_ns, s.end_ns)):
        last = out[-1] if out else None
        if last is not None and last.name == span.name and span.start_ns <= last.end_ns:
            out[-1] = Span(
                last.name, last.start_ns, max(last.end_ns, span.end_ns), "server", last.attributes
            )
        else:
            out.append(span)
    return sorted(out, key=lambda s: (s.start_ns, s.end_ns))


# --- vLLM (and SGLang's root attributes) ---------------------------------------------------

#: vLLM v1 ``llm_request`` float-second attributes, by what they measure.
VLLM_ATTRIBUTES: Mapping[str, str] = MappingProxyType(
    {
        "queue": "gen_ai.latency.time_in_queue",
        "ttft": "gen_ai.latency.time_to_first_token",
        "prefill": "gen_ai.latency.time_in_model_prefill",
        "decode": "gen_ai.latency.time_in_model_decode",
        "inference": "gen_ai.latency.time_in_model_inference",
        "e2e": "gen_ai.latency.e2e",
    }
)
_KEPT = ("gen_ai.request.id", "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens")


def _latency(span: ServerSpan) -> dict[str, int]:
    out: dict[str, int] = {}
    for what, key in VLLM_ATTRIBUTES.items():
        value = _float(span.attributes, key)
        if value is not None:
            out[what] = _ns(value)
    return out


def _is_vllm(span: ServerSpan) -> bool:
    return span.name == "llm_request" and VLLM_ATTRIBUTES["e2e"] in span.attributes


def _from_latency(root: ServerSpan, schema: str) -> ServerStages | None:
    """Stages from ``gen_ai.latency.*``; the span starts at the request's arrival.

    ``preprocess`` = ttft − queue − prefill and ``postprocess`` = e2e − ttft − decode (each at
    least 0: vLLM measures ttft and e2e in the API process and the model times in the engine).
    """
    lat = _latency(root)
    if "ttft" not in lat or "e2e" not in lat:
        return None
    a, ttft, e2e = root.start_ns, lat["ttft"], lat["e2e"]
    queue, prefill, decode = lat.get("queue", 0), lat.get("prefill", 0), lat.get("decode", 0)
    # the engine's decode time, placed after the API process's first token, must still end by
    # the API process's e2e: when the API process lags (seen with real vLLM under load) the
    # sum overshoots and would reach past the client's last token
    clipped = max(0, decode - max(0, e2e - ttft))
    decode -= clipped
    parts = [("preprocess", ttft - queue - prefill), ("server_queue", queue), ("prefill", prefill)]
    stages, t = _sequence(a, parts, root.name)
    stages += _sequence(max(t, a + ttft), [("decode", decode)], root.name)[0]
    t = max(t, a + ttft) + max(decode, 0)
    stages += _sequence(t, [("postprocess", a + e2e - t)], root.name)[0]
    kept: dict[str, AttrValue] = {k: v for k in _KEPT if (v := root.attributes.get(k)) is not None}
    if clipped:
        kept["server.decode_clipped_ns"] = clipped
    # the last token as ttft + decode, trusted only when it precedes e2e (vLLM takes them
    # from two processes' clocks, and their sum can overshoot e2e by a fraction of a ms)
    last = a + ttft + decode if "decode" in lat and not clipped else None
    return ServerStages(
        schema, tuple(stages), a, a + ttft, a + e2e, root.span_id, kept, last_token_ns=last
    )


def map_vllm(root: ServerSpan, spans: Sequence[ServerSpan], lookup: Lookup) -> ServerStages | None:
    """vLLM v1: one ``llm_request`` SERVER span per request (start = arrival)."""
    return _from_latency(root, "vllm") if _is_vllm(root) else None


# --- SGLang ------------------------------------------------------------------------------

#: SGLang request-trace slice names → stages.
SGLANG_SLICES: Mapping[str, str] = MappingProxyType(
    {
        "tokenize": "preprocess",
        "request_process": "preprocess",
        "dispatch": "preprocess",
        "prefill_waiting": "server_queue",
        "waiting": "server_queue",
        "prefill_forward": "prefill",
        "chunked_prefill": "prefill",
        "prefill_process": "prefill",
        "decode_loop": "decode",
        "decode_forward": "decode",
        "decode_process": "decode",
        "detokenize": "postprocess",
        "response": "postprocess",
    }
)


def _children_stages(
    root: ServerSpan, spans: Sequence[ServerSpan], table: Mapping[str, str], schema: str
) -> ServerStages | None:
    mapped = [
        _stage(table[s.name], s.start_ns, s.end_ns, s.name)
        for s in spans
        if s.name in table and s.span_id != root.span_id
    ]
    if not mapped:
        return None
    stages = _union(mapped)
    firsts = [s.end_ns for s in stages if s.name == "prefill"]
    return ServerStages(
        schema,
        tuple(stages),
        arrival_ns=root.start_ns,
        first_token_ns=max(firsts) if firsts else None,
        done_ns=max(s.end_ns for s in stages),
        span_id=root.span_id,
    )


def map_sglang(
    root: ServerSpan, spans: Sequence[ServerSpan], lookup: Lookup
) -> ServerStages | None:
    """SGLang: a root span with stage-slice children; else its ``gen_ai.latency.*``."""
    by_slices = _children_stages(root, spans, SGLANG_SLICES, "sglang")
    if by_slices is not None:
        latency = _latency(root)
        if "ttft" in latency:  # the root's own ttft is a tighter first-token instant
            by_slices = _replace_first(by_slices, root.start_ns + latency["ttft"])
        return by_slices
    if str(root.resource.get("service.name", "")).startswith("sglang"):
        return _from_latency(root, "sglang")
    return None


def _replace_first(stages: ServerStages, first_token_ns: int) -> ServerStages:
    return ServerStages(
        stages.schema,
        stages.stages,
        stages.arrival_ns,
        first_token_ns,
        stages.done_ns,
        stages.span_id,
        stages.attributes,
    )


# --- TGI ---------------------------------------------------------------------------------

_TGI_ROOTS = ("generate_stream", "generate")
_TGI_FIELDS = ("validation_time", "queue_time", "inference_time", "time_per_token")


def _tgi_batch_spans(spans: Sequence[ServerSpan], lookup: Lookup) -> list[ServerSpan]:
    """The batch ``prefill``/``decode`` spans the request's spans follow from (links)."""
    out: dict[str, ServerSpan] = {}
    for span in spans:
        for trace_id, span_id in span.links:
            linked = lookup(trace_id, span_id)
            if linked is not None and linked.name in ("prefill", "decode"):
                out[linked.span_id] = linked
    return sorted(out.values(), key=lambda s: s.start_ns)


def map_tgi(root: ServerSpan, spans: Sequence[ServerSpan], lookup: Lookup) -> ServerStages | None:
    """TGI: ``generate``/``generate_stream`` with Debug-string durations, batch spans by link."""
    if root.name not in _TGI_ROOTS or "inference_time" not in root.attributes:
        return None
    times = {k: parse_duration(root.attributes.get(k)) or 0 for k in _TGI_FIELDS}
    validation, queue, inference = (
        times["validation_time"],
        times["queue_time"],
        times["inference_time"],
    )
    stages, t = _sequence(
        root.start_ns, [("preprocess", validation), ("server_queue", queue)], root.name
    )
    batches = _tgi_batch_spans(spans, lookup)
    prefill = next((b for b in batches if b.name == "prefill"), None)
    end = t + inference
    if prefill is not None and t <= prefill.end_ns <= end:
        stages.append(_stage("prefill", t, prefill.end_ns, "prefill"))
        stages.append(_stage("decode", prefill.end_ns, end, "decode"))
        first = prefill.end_ns
    else:
        stages += _sequence(t, [("inference", inference)], root.name)[0]
        first = None
    attrs = {k: root.attributes[k] for k in _TGI_FIELDS if k in root.attributes}
    return ServerStages("tgi", tuple(stages), root.start_ns, first, end, root.span_id, attrs)


# --- OpenTelemetry GenAI semantic conventions ------------------------------------------------


def map_genai(root: ServerSpan, spans: Sequence[ServerSpan], lookup: Lookup) -> ServerStages | None:
    """A GenAI-semconv inference span (``gen_ai.operation.name``): prefill until the first
    token when the server reports it (``gen_ai.server.time_to_first_token``), then decode."""
    if "gen_ai.operation.name" not in root.attributes:
        return None
    ttft = _float(root.attributes, "gen_ai.server.time_to_first_token")
    if ttft is None:
        stages = [_stage("inference", root.start_ns, root.end_ns, root.name)]
        first = None
    else:
        first = min(root.start_ns + _ns(ttft), root.end_ns)
        stages = [
            _stage("prefill", root.start_ns, first, root.name),
            _stage("decode", first, root.end_ns, root.name),
        ]
    kept = {
        k: v
        for k in (
            "gen_ai.operation.name",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
        )
        if (v := root.attributes.get(k)) is not None
    }
    return ServerStages(
        "genai", tuple(stages), root.start_ns, first, root.end_ns, root.span_id, kept
    )


# --- generic spans by name ---------------------------------------------------------------

#: Default span name → stage table for ``map_generic`` (a user passes their own to extend it).
GENERIC_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "tokenize": "preprocess",
        "preprocess": "preprocess",
        "validation": "preprocess",
        "queue": "server_queue",
        "queued": "server_queue",
        "server_queue": "server_queue",
        "prefill": "prefill",
        "decode": "decode",
        "detokenize": "postprocess",
        "postprocess": "postprocess",
    }
)


def map_generic(
    root: ServerSpan,
    spans: Sequence[ServerSpan],
    lookup: Lookup,
    names: Mapping[str, str] = GENERIC_NAMES,
) -> ServerStages | None:
    """Stages from span names (``names``: span name → stage); the request span is ``root``."""
    found = _children_stages(root, spans, names, "generic")
    if found is None and root.name in names:
        stage = _stage(names[root.name], root.start_ns, root.end_ns, root.name)
        found = ServerStages("generic", (stage,), root.start_ns, None, root.end_ns, root.span_id)
    return found


# --- selection and dispatch --------------------------------------------------------------

Mapper = Callable[[ServerSpan, Sequence[ServerSpan], Lookup], ServerStages | None]

#: Mappings tried in order by ``map_request(schema="auto")``.
SCHEMAS: Mapping[str, Mapper] = MappingProxyType(
    {
        "vllm": map_vllm,
        "sglang": map_sglang,
        "tgi": map_tgi,
        "genai": map_genai,
        "generic": map_generic,
    }
)


def request_spans(spans: Sequence[ServerSpan], client_span_id: str | None) -> list[ServerSpan]:
    """The spans of one request: the children of the client span and their descendants.

    Without a client span id, every span of the trace. Spans of other requests in the same
    trace (a caller's own trace holding several requests) have another parent and are left out.
    """
    if client_span_id is None:
        return list(spans)
    children: dict[str | None, list[ServerSpan]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span)
    out: list[ServerSpan] = []
    todo = list(children.get(client_span_id.lower(), []))
    while todo:
        span = todo.pop()
        out.append(span)
        todo += children.get(span.span_id, [])
    return sorted(out, key=lambda s: (s.start_ns, s.end_ns))


def _no_lookup(trace_id: str, span_id: str) -> ServerSpan | None:
    return None


def map_request(
    spans: Sequence[ServerSpan],
    client_span_id: str | None = None,
    *,
    schema: str = "auto",
    names: Mapping[str, str] | None = None,
    lookup: Lookup = _no_lookup,
) -> ServerStages | None:
    """Map the server spans of one request to stages; None when no mapping applies.

    Args:
        spans: spans of the request's trace (``SpanStore.trace(trace_id)``).
        client_span_id: the ``traceparent`` span id the request carried.
        schema: ``auto`` (try ``SCHEMAS`` in order) or one of its keys.
        names: a span name → stage table for the generic mapping (implies ``generic`` when
            ``schema`` is ``auto`` and no server-specific mapping applies).
        lookup: finds a linked span by (trace id, span id), e.g. ``SpanStore.span``.

    Raises:
        UsageError: an unknown schema name.
    """
    if schema != "auto" and schema not in SCHEMAS:
        raise UsageError(f"unknown schema {schema!r}; expected auto or one of {sorted(SCHEMAS)}")
    mine = request_spans(spans, client_span_id)
    roots = [s for s in mine if s.parent_span_id == client_span_id] or mine
    order = list(SCHEMAS) if schema == "auto" else [schema]
    for name in order:
        for root in [*roots, *(s for s in mine if s not in roots)]:
            if name == "generic":
                found = map_generic(root, mine, lookup, names or GENERIC_NAMES)
            else:
                found = SCHEMAS[name](root, mine, lookup)
            if found is not None:
                return found
    return None
