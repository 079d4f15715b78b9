"""What one decoded OpenAI object carries: its choices' text, usage, timings or an error.

The accounting side of :mod:`.openai`: content and reasoning text of the choices, the token
counts of ``usage`` (integers only, whatever the JSON library made of them), llama.cpp's
``timings``, and error objects, each appended to the events as the model's type.
"""

from __future__ import annotations

import json
from typing import Any

from ..timeline._unfrozen import unfrozen
from ._openai_events import (
    TIMINGS_FIELDS,
    ChunkReceived,
    ErrorReceived,
    Event,
    TimingsReceived,
    UsageReceived,
)


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


#: One is built per streamed token: filled in with plain slot stores (see ``timeline._unfrozen``)
_OpenChunk = unfrozen(ChunkReceived)


def _chunk_received(
    time_ns: int,
    content: str,
    reasoning: str,
    finish: str | None,
    completion: int | None,
    empty: bool,
) -> ChunkReceived:
    """``ChunkReceived(time_ns, content, reasoning, finish, completion, empty)``, cheaply."""
    chunk = object.__new__(_OpenChunk)
    chunk.time_ns = time_ns
    chunk.content = content
    chunk.reasoning = reasoning
    chunk.finish_reason = finish
    chunk.completion_tokens = completion
    chunk.empty_token = empty
    chunk.__class__ = ChunkReceived
    built: ChunkReceived = chunk
    return built


def _append_chunk(obj: dict[str, Any], time_ns: int, events: list[Event]) -> None:
    """Append a ``ChunkReceived`` for a chunk with choices, then a ``UsageReceived`` for usage."""
    usage = obj.get("usage")
    # A streamed token, nearly always: one choice whose delta has text, no usage. Read as
    # _read_choice reads it, without the checks and lookups that cannot find anything: these
    # subscripts succeed only on a list of one dict holding a dict (parsed JSON has no other
    # types that take a string subscript).
    try:
        (choice,) = obj["choices"]
        delta = choice["delta"]
        content = delta["content"]
    except (KeyError, TypeError, ValueError):
        content = None
    if type(content) is str and content and type(usage) is not dict and "text" not in choice:
        if len(delta) == 1:  # content alone: no reasoning
            reasoning = ""
        else:
            value = delta.get("reasoning_content") or delta.get("reasoning")
            reasoning = value if type(value) is str else ""
        reason = choice.get("finish_reason")
        chunk = object.__new__(_OpenChunk)  # _chunk_received(), inlined
        chunk.time_ns = time_ns
        chunk.content = content
        chunk.reasoning = reasoning
        chunk.finish_reason = reason if type(reason) is str else None
        chunk.completion_tokens = None
        chunk.empty_token = False  # it has text
        chunk.__class__ = ChunkReceived
        events.append(chunk)  # a ChunkReceived now
        timings = obj.get("timings")
        if timings is not None and type(timings) is dict:
            _append_timings(timings, time_ns, events)
        return
    choices = obj.get("choices")
    if usage is not None and type(usage) is not dict:  # parsed JSON: no dict subclasses
        usage = None
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
        _append_timings(timings, time_ns, events)


def _append_timings(timings: dict[str, Any], time_ns: int, events: list[Event]) -> None:
    """Append a ``TimingsReceived`` with the numeric fields of ``TIMINGS_FIELDS``, if any."""
    values = {
        k: float(v)
        for k, v in timings.items()
        if k in TIMINGS_FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    if values:
        events.append(TimingsReceived(time_ns, values))


def _read_choices(choices: list[Any]) -> tuple[str, str, str | None]:
    """Content, reasoning and first finish reason over all choices (stream or whole body):
    each choice read as :func:`_read_choice` reads the usual single one."""
    read = [_read_choice(choice) for choice in choices]
    finish = next((reason for _, _, reason in read if reason is not None), None)
    return "".join(c for c, _, _ in read), "".join(r for _, r, _ in read), finish


def _read_choice(choice: Any) -> tuple[str, str, str | None]:
    """One choice's text, reasoning and finish reason: "delta" in a stream chunk, "message"
    in a whole chat body, "text" for completions; anything not a string reads as nothing."""
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


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, float) and abs(value) >= 2**63 and value.is_integer():
        return int(value)  # orjson reads an integer beyond 64 bits as a float; json as an int
    return value if isinstance(value, int) and not isinstance(value, bool) else None
