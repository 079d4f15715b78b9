"""Sans-IO OpenAI-compatible response parsing: streamed chunks (SSE) and whole JSON bodies.

Covers ``/v1/chat/completions`` and ``/v1/completions`` as served by OpenAI, vLLM, llama.cpp,
TGI and the like::

    parser = OpenAIStreamParser()
    for chunk, t in chunks:
        for event in parser.feed(chunk, t):
            if isinstance(event, ChunkReceived) and event.carries_token:
                ...  # a token (or several) arrived at event.time_ns
    events = parser.close(t_end)  # [StreamTruncated(...)] when no [DONE] came

Nothing here raises on bad input from the server: it becomes a ``MalformedChunk`` or
``ErrorReceived`` event and parsing goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from latency_analyzer._redact import redact_text
from latency_analyzer.capture.sse import SSEParser

__all__ = [
    "ChunkReceived",
    "ErrorReceived",
    "Event",
    "MalformedChunk",
    "OpenAIStreamParser",
    "StreamDone",
    "StreamTruncated",
    "TimingsReceived",
    "UsageReceived",
    "error_message_from_body",
    "parse_openai_body",
]

_DONE = "[DONE]"


def _stdlib_loads(raw: str | bytes) -> Any:
    return json.loads(raw)


def _fastest_loads() -> Callable[[str | bytes], Any]:
    """orjson when installed (``pip install latency-analyzer[fast]``): one chunk is parsed per
    streamed token, and it decodes a chunk ~4x faster than the standard library."""
    try:
        import orjson
    except ImportError:
        return _stdlib_loads
    return orjson.loads


_loads = _fastest_loads()
_MAX_TEXT_MESSAGE = 200  # characters of a non-JSON error body worth showing to a person


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


class OpenAIStreamParser:
    """OpenAI streaming semantics on top of ``SSEParser``: ``feed(bytes, t)`` then ``close(t)``."""

    def __init__(self) -> None:
        self._sse = SSEParser()
        self.chunks = 0
        """JSON object chunks parsed (including ``choices: []`` usage chunks; not errors)."""
        self.done = False
        """True once ``[DONE]`` was received."""

    @property
    def comments(self) -> int:
        """SSE comment lines seen (keep-alive pings)."""
        return self._sse.comments

    @property
    def truncated(self) -> bool:
        """True when ``close()`` found a partial SSE event or line pending."""
        return self._sse.truncated

    def feed(self, data: bytes, time_ns: int) -> list[Event]:
        """Parse one received network chunk.

        Args:
            data: the bytes as received (any split).
            time_ns: their arrival time; stamped on every event they complete.

        Returns:
            The events completed by this chunk, in stream order.
        """
        events: list[Event] = []
        for text in self._sse.feed_data(data):
            self._on_data(text, time_ns, events)
        return events

    def close(self, time_ns: int) -> list[Event]:
        """End of stream.

        Returns:
            ``[StreamTruncated]`` when no ``[DONE]`` was seen, else nothing.
        """
        self._sse.close(time_ns)
        if self.done:
            return []
        reason = "stream ended without [DONE]"
        if self._sse.truncated:
            reason += "; a partial event was pending"
        return [StreamTruncated(time_ns, reason)]

    def _on_data(self, data: str, time_ns: int, events: list[Event]) -> None:
        """One SSE event's data: a JSON chunk (nearly always), ``[DONE]`` or garbage."""
        if data[:1] != "{" and data.strip() == _DONE:
            self.done = True
            events.append(StreamDone(time_ns))
            return
        try:  # _load_object, inlined for the usual chunk: a JSON object
            obj: Any = _loads(data)
        except (ValueError, RecursionError):
            obj = None
        if type(obj) is not dict:
            obj = _load_object(data, time_ns, events)  # again, to say what is wrong with it
            if obj is None:
                return
        if (obj.get("error") is None and obj.get("object") != "error") or not _append_error(
            obj, time_ns, events
        ):
            self.chunks += 1
            _append_chunk(obj, time_ns, events)


def parse_openai_body(body: bytes, time_ns: int) -> list[Event]:
    """Events of a non-streaming JSON response (chat or completions) or of an error body.

    Args:
        body: the whole response body.
        time_ns: when it was fully received.

    Returns:
        ``[ChunkReceived]`` (when there are choices) then ``[UsageReceived]`` (when there is
        usage); or ``[ErrorReceived]``; or ``[MalformedChunk]`` when the body is not a JSON object.
    """
    events: list[Event] = []
    obj = _load_object(body, time_ns, events)
    if obj is not None and not _append_error(obj, time_ns, events):
        _append_chunk(obj, time_ns, events)
    return events


def error_message_from_body(body: bytes) -> str | None:
    """A readable message from an HTTP error body.

    Understands ``{"error": {"message": ...}}`` (OpenAI), ``{"error": "..."}`` (TGI),
    ``{"object": "error", "message": ...}`` (vLLM) and ``{"detail": ...}`` (FastAPI); anything
    else gives the first characters of the body as text, whitespace collapsed.

    Credentials in the body (a server echoing the key it refused) are masked before the text is
    cut, so no part of one survives.

    Returns:
        The message, or None for an empty (or all-whitespace) body.
    """
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        obj: Any = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the stack
        obj = None
    message = _json_error_message(obj) if isinstance(obj, dict) else None
    if message is not None:
        return redact_text(message)
    return redact_text(" ".join(text[: _MAX_TEXT_MESSAGE * 8].split()))[:_MAX_TEXT_MESSAGE]


def _load_object(raw: str | bytes, time_ns: int, events: list[Event]) -> dict[str, Any] | None:
    """JSON decoding that reports failure as a ``MalformedChunk`` instead of raising."""
    try:
        obj: Any = _loads(raw)
    except ValueError as exc:  # JSONDecodeError (both libraries), UnicodeDecodeError for bytes
        reason = f"invalid JSON: {exc}"
    except RecursionError:  # the standard library's limit; orjson's (1024) is a ValueError
        reason = "invalid JSON: nested too deeply"
    else:
        if isinstance(obj, dict):
            return obj
        reason = f"not a JSON object: {type(obj).__name__}"
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    events.append(MalformedChunk(time_ns, text, reason))
    return None


def _append_error(obj: dict[str, Any], time_ns: int, events: list[Event]) -> bool:
    """Append an ``ErrorReceived`` when ``obj`` is an error object; tell whether it was."""
    error = obj.get("error")
    if error is not None:
        source = error if isinstance(error, dict) else {"message": error}
    elif obj.get("object") == "error":
        source = obj
    else:
        return False
    message = source.get("message")
    code = source.get("code")
    events.append(
        ErrorReceived(
            time_ns,
            message=message if isinstance(message, str) else json.dumps(error or obj),
            code=code if isinstance(code, (str, int)) and not isinstance(code, bool) else None,
        )
    )
    return True


_set_time, _set_content, _set_reasoning, _set_finish, _set_completion, _set_empty = (
    ChunkReceived.__dict__[name].__set__
    for name in (
        "time_ns",
        "content",
        "reasoning",
        "finish_reason",
        "completion_tokens",
        "empty_token",
    )
)


def _chunk_received(
    time_ns: int,
    content: str,
    reasoning: str,
    finish: str | None,
    completion: int | None,
    empty: bool,
) -> ChunkReceived:
    """``ChunkReceived(...)`` with its slots set directly: one is built per streamed token, and
    the frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``."""
    chunk: ChunkReceived = object.__new__(ChunkReceived)
    _set_time(chunk, time_ns)
    _set_content(chunk, content)
    _set_reasoning(chunk, reasoning)
    _set_finish(chunk, finish)
    _set_completion(chunk, completion)
    _set_empty(chunk, empty)
    return chunk


def _append_chunk(obj: dict[str, Any], time_ns: int, events: list[Event]) -> None:
    """Append a ``ChunkReceived`` for a chunk with choices, then a ``UsageReceived`` for usage."""
    usage = obj.get("usage")
    if usage is not None and type(usage) is not dict:  # parsed JSON: no dict subclasses
        usage = None
    choices = obj.get("choices")
    if type(choices) is list and choices:
        content, reasoning, finish = (
            _read_choice(choices[0]) if len(choices) == 1 else _read_choices(choices)
        )
        completion = _int_or_none(usage.get("completion_tokens")) if usage else None
        empty = not content and not reasoning and _empty_token(choices)
        events.append(_chunk_received(time_ns, content, reasoning, finish, completion, empty))
    if usage is not None:
        events.append(
            UsageReceived(
                time_ns,
                prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
                completion_tokens=_int_or_none(usage.get("completion_tokens")),
            )
        )
    timings = obj.get("timings")
    if timings is not None and type(timings) is dict:
        values = {
            k: float(v)
            for k, v in timings.items()
            if k in TIMINGS_FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if values:
            events.append(TimingsReceived(time_ns, values))


def _read_choices(choices: list[Any]) -> tuple[str, str, str | None]:
    """Content, reasoning and first finish reason over all choices (stream or whole body)."""
    if len(choices) == 1:  # the usual case, taken once per streamed token: no lists, no joins
        return _read_choice(choices[0])
    content: list[str] = []
    reasoning: list[str] = []
    finish: str | None = None
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        # "delta" in a stream chunk, "message" in a whole chat body; "text" for completions.
        message = choice.get("delta")
        if not isinstance(message, dict):
            message = choice.get("message")
        if isinstance(message, dict):
            content.append(_str(message.get("content")))
            reasoning.append(
                _str(message.get("reasoning_content")) or _str(message.get("reasoning"))
            )
        content.append(_str(choice.get("text")))
        reason = choice.get("finish_reason")
        if finish is None and isinstance(reason, str):
            finish = reason
    return "".join(content), "".join(reasoning), finish


def _read_choice(choice: Any) -> tuple[str, str, str | None]:
    if type(choice) is not dict:
        return "", "", None
    message = choice.get("delta")
    if type(message) is not dict:
        message = choice.get("message")
    content = reasoning = ""
    if type(message) is dict:
        value = message.get("content")
        content = value if type(value) is str else ""
        value = message.get("reasoning_content") or message.get("reasoning")
        reasoning = value if type(value) is str else ""
    text = choice.get("text")  # completions
    if type(text) is str:
        content += text
    reason = choice.get("finish_reason")
    return content, reasoning, reason if type(reason) is str else None


def _empty_token(choices: list[Any]) -> bool:
    """A choice holds a text field (empty) that is not a role announcement's."""
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("text"), str):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and "role" not in delta:
            keys = ("content", "reasoning_content", "reasoning")
            if any(isinstance(delta.get(k), str) for k in keys):
                return True
    return False


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, float) and abs(value) >= 2**63 and value.is_integer():
        return int(value)  # orjson reads an integer beyond 64 bits as a float; json as an int
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json_error_message(obj: dict[str, Any]) -> str | None:
    error = obj.get("error")
    if isinstance(error, dict):
        error = error.get("message")
    if isinstance(error, str) and error:
        return error
    if obj.get("object") == "error" and isinstance(obj.get("message"), str):
        return str(obj["message"])
    detail = obj.get("detail")
    return detail if isinstance(detail, str) and detail else None
