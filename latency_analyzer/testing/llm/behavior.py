"""What the test-bed LLM server does with a request: the knobs, their checks and the body.

Timeline of one request, all deadlines absolute from ``t0`` = request body fully read::

    t0 ── header_delay ──▶ headers (+ role chunk) ── queue + prefill ──▶ token 0
       ── decode ──▶ token 1 ── decode ──▶ ... token N-1 ──▶ usage chunk, [DONE]

A chunk carrying ``tokens_per_chunk`` tokens leaves when its last token is due
(``t_first + index_of_last_token * decode``). A non-streamed response is sent whole when the
last token is due, i.e. ``t0 + header_delay + queue + prefill + (tokens - 1) * decode``.

Every knob may be overridden per request with ``"testbed": {...}`` in the JSON body;
``max_tokens`` in the body sets ``tokens``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FAULTS", "Behavior", "chunk_bounds", "parse_body", "prompt_tokens"]

#: Accepted values of the ``fault`` knob.
FAULTS = frozenset(
    {
        "reset",
        "truncate",
        "malformed",
        "http_error",
        "hang",
        "close_before_headers",
        "stream_error",
    }
)


@dataclass(frozen=True)
class Behavior:
    """What the server does with one request. Durations are in seconds.

    Attributes:
        header_delay: from request fully read to response headers sent.
        queue: simulated scheduler queue, after the headers, before prefill.
        prefill: from the end of the queue to the first token chunk.
        decode: between consecutive output tokens.
        tokens: output tokens per response.
        tokens_per_chunk: tokens carried by each streamed chunk.
        usage: send usage (the final ``choices: []`` chunk when the request asks for it with
            ``stream_options.include_usage``; always in non-streamed bodies).
        role_chunk: send a vLLM-style ``{"role": "assistant", "content": ""}`` chunk right
            after the headers.
        reasoning_tokens: the first N tokens go to ``delta.reasoning_content`` (chat only).
        empty_tokens, empty_last_tokens: the first / last N tokens are sent with empty text
            (``content: ""`` or ``text: ""``), as a byte-level model streams partial UTF-8
            pieces; each is still its own chunk, stamped in ``RequestRecord.chunk_ns``.
        timings: end a stream with llama.cpp server's closing chunk (empty delta,
            ``finish_reason``) carrying its ``timings``: ``prompt_ms`` from the end of the
            queue to the first token's write, ``predicted_ms`` from the first token's write to
            the last's (both from ``RequestRecord`` stamps), ``prompt_n``, ``predicted_n``.
        keepalive: if False, every response carries ``Connection: close``.
        fault: one of :data:`FAULTS` or None; see :class:`LLMServer`.
        fault_after: token chunks sent before the fault strikes (stream faults).
        fault_status: HTTP status of ``fault="http_error"``.
        model: model name reported when the request names none.
    """

    header_delay: float = 0.0
    queue: float = 0.0
    prefill: float = 0.0
    decode: float = 0.0
    tokens: int = 16
    tokens_per_chunk: int = 1
    usage: bool = True
    role_chunk: bool = True
    reasoning_tokens: int = 0
    empty_tokens: int = 0
    empty_last_tokens: int = 0
    timings: bool = False
    keepalive: bool = True
    fault: str | None = None
    fault_after: int = 0
    fault_status: int = 400
    model: str = "testbed-model"

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {sorted(FAULTS)}")
        if self.tokens < 0 or self.tokens_per_chunk < 1 or self.fault_after < 0:
            raise ValueError("tokens and fault_after must be >= 0, tokens_per_chunk >= 1")
        if self.empty_tokens < 0 or self.empty_last_tokens < 0:
            raise ValueError("empty_tokens and empty_last_tokens must be >= 0")
        for name in ("header_delay", "queue", "prefill", "decode"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def override(self, changes: Mapping[str, Any]) -> Behavior:
        """Return a copy with ``changes`` applied, checking names and types.

        Raises:
            ValueError: an unknown knob or a value of the wrong type.
        """
        checked = {name: _check_knob(name, value) for name, value in changes.items()}
        return dataclasses.replace(self, **checked)


_TYPES_BY_ANNOTATION: dict[str, tuple[type, ...]] = {
    "float": (int, float),
    "int": (int,),
    "bool": (bool,),
    "str": (str,),
    "str | None": (str, type(None)),
}
_KNOB_TYPES = {f.name: _TYPES_BY_ANNOTATION[str(f.type)] for f in dataclasses.fields(Behavior)}


def _check_knob(name: str, value: Any) -> Any:
    """Return ``value`` if it suits knob ``name``; raise ValueError otherwise."""
    if name not in _KNOB_TYPES:
        raise ValueError(f"unknown testbed knob {name!r}; expected one of {sorted(_KNOB_TYPES)}")
    expected = _KNOB_TYPES[name]
    is_bool = isinstance(value, bool)
    if not isinstance(value, expected) or (is_bool and bool not in expected):
        raise ValueError(f"testbed knob {name!r} got {value!r}")
    return value


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """Count whitespace-separated words of the prompt or message contents (at least 1)."""
    parts: list[str] = []
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        parts.append(prompt)
    messages = body.get("messages")
    if isinstance(messages, list):
        parts += [
            m["content"]
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("content"), str)
        ]
    return max(1, sum(len(p.split()) for p in parts))


def chunk_bounds(behavior: Behavior) -> list[tuple[int, int]]:
    """[start, stop) token ranges of the streamed chunks."""
    step = behavior.tokens_per_chunk
    return [(i, min(i + step, behavior.tokens)) for i in range(0, behavior.tokens, step)]


def parse_body(raw: bytes, defaults: Behavior) -> tuple[Mapping[str, Any], Behavior]:
    """Decode the JSON body and the effective behavior. Raises ValueError if invalid."""
    body = json.loads(raw or b"{}")
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    overrides = body.get("testbed") or {}
    if not isinstance(overrides, dict):
        raise ValueError("'testbed' must be an object")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if isinstance(max_tokens, int) and "tokens" not in overrides:
        overrides = {**overrides, "tokens": max_tokens}
    return body, defaults.override(overrides)
