"""The events :class:`~.openai.OpenAIStreamParser` yields, one per thing a stream says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "TIMINGS_FIELDS",
    "ChunkReceived",
    "ErrorReceived",
    "Event",
    "MalformedChunk",
    "StreamDone",
    "StreamTruncated",
    "TimingsReceived",
    "UsageReceived",
]


@dataclass(frozen=True, slots=True)
class ChunkReceived:
    """A JSON chunk with at least one choice.

    Attributes:
        content: the text of all choices (``delta.content``, ``message.content`` or ``text``).
        reasoning: the reasoning text of all choices (``reasoning_content`` or ``reasoning``).
        finish_reason: the first non-null ``finish_reason`` among the choices.
        completion_tokens: ``usage.completion_tokens`` when the chunk carries usage beside its
            choices (vLLM ``continuous_usage_stats``; a non-streaming body), else None.
        empty_token: no text, but a choice holds a ``content``/``text`` string outside a role
            announcement: a token whose text is empty (a byte-level model's partial UTF-8
            piece). vLLM's opening ``{"role": "assistant", "content": ""}`` is not one.
    """

    time_ns: int
    content: str
    reasoning: str
    finish_reason: str | None
    completion_tokens: int | None
    empty_token: bool = False

    @property
    def carries_token(self) -> bool:
        """False for a role-only chunk or an empty-delta finish chunk: no token arrived."""
        return bool(self.content or self.reasoning)


@dataclass(frozen=True, slots=True)
class UsageReceived:
    """A non-null ``usage`` object (vLLM's final ``choices: []`` chunk, or beside choices)."""

    time_ns: int
    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(frozen=True, slots=True)
class TimingsReceived:
    """llama.cpp server's ``timings`` object (on its last chunk, or a whole body): the
    server's own prompt and generation times in ms, and token counts. Only numeric fields of
    ``TIMINGS_FIELDS`` are kept."""

    time_ns: int
    values: dict[str, float]


#: The ``timings`` fields kept (llama.cpp server): counts and milliseconds.
TIMINGS_FIELDS = frozenset(
    {
        "cache_n",
        "prompt_n",
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
        "draft_n",
        "draft_n_accepted",
    }
)


@dataclass(frozen=True, slots=True)
class StreamDone:
    """The ``data: [DONE]`` sentinel."""

    time_ns: int


@dataclass(frozen=True, slots=True)
class ErrorReceived:
    """An error object: ``{"error": {...}}`` (OpenAI) or ``{"object": "error", ...}`` (vLLM)."""

    time_ns: int
    message: str
    code: str | int | None


@dataclass(frozen=True, slots=True)
class MalformedChunk:
    """Event data that is not JSON, or JSON that is not an object; ``raw`` is the data."""

    time_ns: int
    raw: str
    reason: str


@dataclass(frozen=True, slots=True)
class StreamTruncated:
    """The stream closed before ``[DONE]``."""

    time_ns: int
    reason: str


Event: TypeAlias = (
    ChunkReceived
    | UsageReceived
    | StreamDone
    | ErrorReceived
    | MalformedChunk
    | StreamTruncated
    | TimingsReceived
)
