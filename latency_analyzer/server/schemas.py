"""Schema mappings: a server's own spans → the stage vocabulary, on the server's clock.

Each mapping returns :class:`ServerStages` (``_stages``). The inference servers' own schemas
(vLLM, SGLang, TGI) live in ``_engines``; here are the conventions any server may follow
(OpenTelemetry GenAI, spans named by stage) and ``map_request``, which picks the mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from ..errors import UsageError
from ._engines import SGLANG_SLICES, VLLM_ATTRIBUTES, map_sglang, map_tgi, map_vllm
from ._stages import (
    Lookup,
    ServerStages,
    children_stages,
    float_attr,
    make_stage,
    parse_duration,
    to_ns,
)
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


# --- OpenTelemetry GenAI semantic conventions ------------------------------------------------


def map_genai(root: ServerSpan, spans: Sequence[ServerSpan], lookup: Lookup) -> ServerStages | None:
    """A GenAI-semconv inference span (``gen_ai.operation.name``): prefill until the first
    token when the server reports it (``gen_ai.server.time_to_first_token``), then decode."""
    if "gen_ai.operation.name" not in root.attributes:
        return None
    ttft = float_attr(root.attributes, "gen_ai.server.time_to_first_token")
    if ttft is None:
        stages = [make_stage("inference", root.start_ns, root.end_ns, root.name)]
        first = None
    else:
        first = min(root.start_ns + to_ns(ttft), root.end_ns)
        stages = [
            make_stage("prefill", root.start_ns, first, root.name),
            make_stage("decode", first, root.end_ns, root.name),
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
    found = children_stages(root, spans, names, "generic")
    if found is None and root.name in names:
        stage = make_stage(names[root.name], root.start_ns, root.end_ns, root.name)
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
