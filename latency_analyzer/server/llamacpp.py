"""llama.cpp server's own ``timings`` → ``prefill`` / ``decode`` durations.

llama.cpp's server (``llama-server``) puts a ``timings`` object on the last chunk of a stream
(and in a whole response body): ``prompt_ms`` from the start of prompt processing to the first
sampled token, ``predicted_ms`` from that token to the end of generation, with the token counts
``prompt_n`` / ``predicted_n`` and ``cache_n`` (prompt tokens reused from the cache). The client
keeps them as ``wf.attributes["timings.<field>"]``. They are durations, not instants, so there
is no clock offset to estimate: ``latency_analyzer.merge.merge_timings`` places the prefill to
end at the server's first token, which lies between the client's send start plus the prefill
and the client's first token chunk, and the decode after it, ending by the last byte.

llama-cpp-python's own server (``python -m llama_cpp.server``, 0.3.x) sends no ``timings``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..timeline import AttrValue, Span
from .schemas import ServerStages

__all__ = ["SCHEMA", "timings_from_attributes", "timings_stages"]

SCHEMA = "llamacpp-timings"
_PREFIX = "timings."
_COUNTS = ("prompt_n", "predicted_n", "cache_n", "draft_n", "draft_n_accepted")


def timings_from_attributes(attributes: Mapping[str, AttrValue]) -> dict[str, float]:
    """The ``timings`` fields a waterfall recorded (``timings.<field>`` attributes)."""
    return {
        k[len(_PREFIX) :]: float(v)
        for k, v in attributes.items()
        if k.startswith(_PREFIX) and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def timings_stages(timings: Mapping[str, float]) -> ServerStages | None:
    """``prefill`` (``prompt_ms``) then ``decode`` (``predicted_ms``), as durations laid from
    0; None without either (or with a negative one)."""
    prompt, predicted = timings.get("prompt_ms"), timings.get("predicted_ms")
    if prompt is None or predicted is None or prompt < 0 or predicted < 0:
        return None
    p, d = round(prompt * 1e6), round(predicted * 1e6)
    attrs: dict[str, AttrValue] = {"server.span": "timings"}
    stages = (Span("prefill", 0, p, "server", attrs), Span("decode", p, p + d, "server", attrs))
    kept: dict[str, AttrValue] = {
        f"llamacpp.{k}": round(timings[k]) for k in _COUNTS if k in timings
    }
    return ServerStages(SCHEMA, stages, attributes=kept, timed=False, token_anchored=True)
