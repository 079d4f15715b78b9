"""The inference servers' own span schemas: vLLM, SGLang and TGI → the stage vocabulary.

Each server gets a small table and one function. Stage names are those of ``SERVER_STAGES``;
TGI without its batch spans gives one ``inference`` stage, because nothing it reports splits
prefill from decode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from ..timeline import AttrValue
from ._stages import (
    Lookup,
    ServerStages,
    children_stages,
    float_attr,
    lay_end_to_end,
    make_stage,
    parse_duration,
    to_ns,
)
from .spans import ServerSpan

__all__ = [
    "SGLANG_SLICES",
    "VLLM_ATTRIBUTES",
    "map_sglang",
    "map_tgi",
    "map_vllm",
]


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
        value = float_attr(span.attributes, key)
        if value is not None:
            out[what] = to_ns(value)
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
    stages, t = lay_end_to_end(a, parts, root.name)
    stages += lay_end_to_end(max(t, a + ttft), [("decode", decode)], root.name)[0]
    t = max(t, a + ttft) + max(decode, 0)
    stages += lay_end_to_end(t, [("postprocess", a + e2e - t)], root.name)[0]
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


def map_sglang(
    root: ServerSpan, spans: Sequence[ServerSpan], lookup: Lookup
) -> ServerStages | None:
    """SGLang: a root span with stage-slice children; else its ``gen_ai.latency.*``."""
    by_slices = children_stages(root, spans, SGLANG_SLICES, "sglang")
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
    stages, t = lay_end_to_end(
        root.start_ns, [("preprocess", validation), ("server_queue", queue)], root.name
    )
    batches = _tgi_batch_spans(spans, lookup)
    prefill = next((b for b in batches if b.name == "prefill"), None)
    end = t + inference
    if prefill is not None and t <= prefill.end_ns <= end:
        stages.append(make_stage("prefill", t, prefill.end_ns, "prefill"))
        stages.append(make_stage("decode", prefill.end_ns, end, "decode"))
        first = prefill.end_ns
    else:
        stages += lay_end_to_end(t, [("inference", inference)], root.name)[0]
        first = None
    attrs = {k: root.attributes[k] for k in _TGI_FIELDS if k in root.attributes}
    return ServerStages("tgi", tuple(stages), root.start_ns, first, end, root.span_id, attrs)
