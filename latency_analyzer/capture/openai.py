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

This module reads the stream (SSE events, JSON decoding, ``[DONE]``) and whole bodies; what a
decoded object carries (choices' text, usage counts, timings, errors) is read in
:mod:`._openai_chunk`, and the event types are defined in :mod:`._openai_events`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, cast

from latency_analyzer._redact import redact_text
from latency_analyzer.capture.sse import SSEParser

from ._openai_chunk import _append_chunk, _append_error, _chunk_received
from ._openai_events import TIMINGS_FIELDS as TIMINGS_FIELDS
from ._openai_events import (
    ChunkReceived,
    ErrorReceived,
    Event,
    MalformedChunk,
    StreamDone,
    StreamTruncated,
    TimingsReceived,
    UsageReceived,
)

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
_DONE_BYTES = _DONE.encode()  # a stream's last event, as received: no JSON parse tried on it


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
#: orjson's ``loads`` when installed: it reads an event's UTF-8 bytes without a str in between
#: (and refuses invalid UTF-8, which then goes the way of decoded text, with U+FFFD).
_bytes_loads: Callable[[str | bytes], Any] | None = None if _loads is _stdlib_loads else _loads
_MAX_TEXT_MESSAGE = 200  # characters of a non-JSON error body worth showing to a person
#: A content string's key with a string value (JSON allows whitespace around the colon).
_CONTENT_KEY = re.compile(rb'"content"[ \t\r\n]*:[ \t\r\n]*"')
#: What a JSON string's characters cannot be taken as they are: its end, an escape, controls.
_NOT_PLAIN = re.compile(rb'["\\\x00-\x1f]')
_MAX_MISSES = 4  # attempts to learn that failed or did not last, before parsing every event
_SERVED = 16  # events that learnt bytes must serve for their replacement not to be a miss


class OpenAIStreamParser:
    """OpenAI streaming semantics on top of ``SSEParser``: ``feed(bytes, t)`` then ``close(t)``."""

    def __init__(self, *, learn: bool = True) -> None:
        """``learn=False``: parse every event's JSON (the reference reading of a stream)."""
        self._sse = SSEParser()
        # A plain token learnt from one that was parsed (see _learn): the bytes before and
        # after its content string, in an event's data and in the whole read of one event;
        # empty until then. A stream that keeps changing them stops learning.
        self._raw_head = self._raw_tail = self._head = self._tail = b""
        self._misses = 0 if learn else _MAX_MISSES
        self._learnt_at = 0  # self.chunks when the bytes were learnt
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
        loads = _loads
        from_bytes = loads is _bytes_loads  # json.loads(bytes) would guess UTF-16 or -32
        head, tail = self._raw_head, self._raw_tail
        for raw in self._sse.feed_raw(data):
            if type(raw) is bytes:  # a whole event as received
                text = _between(raw, head, tail)
                if text is not None:  # a learnt plain token: what _append_chunk makes
                    self.chunks += 1
                    events.append(_chunk_received(time_ns, text, "", None, None, False))
                    continue
                try:
                    obj: Any = (
                        None
                        if raw == _DONE_BYTES  # a parse would raise, and a raise costs
                        else loads(raw if from_bytes else raw.decode("utf-8", "replace"))
                    )
                except (ValueError, RecursionError):
                    obj = None
                if type(obj) is dict:
                    if obj.get("error") is None and obj.get("object") != "error":
                        self.chunks += 1
                        _append_chunk(obj, time_ns, events)
                        if self._misses < _MAX_MISSES and not _matches(raw, head, tail):
                            content = _plain_content(obj)
                            if content is not None:
                                self._learn(raw, content)
                                head, tail = self._raw_head, self._raw_tail
                    else:
                        self._on_object(obj, time_ns, events)
                    continue
                # [DONE], or data that is not a JSON object: read as text, which says why
                raw = raw.decode("utf-8", "replace")
            self._on_data(cast(str, raw), time_ns, events)
        return events

    def feed_token(self, data: bytes, time_ns: int) -> str | list[Event]:
        """Like :meth:`feed`, returning just the text when ``data`` is the usual read of a
        stream: one whole event holding one chunk of one choice whose delta is its content
        alone, with no usage, timings or finish reason. Any other read gives its events.

        A stream's plain tokens differ in their content alone: every byte before the content
        string and after it is the same (id, model, created ...). Once one such read has been
        parsed, a read made of those bytes around a string with no quote, backslash or
        control character, valid UTF-8, is that string's token without a JSON parse: the
        same characters cannot end the string elsewhere or mean anything else.
        """
        text = _between(data, self._head, self._tail)
        if text is not None and self._sse.idle:
            self.chunks += 1
            return text
        raw = self._sse.take_single(data) if _bytes_loads is not None else None
        if raw is None:
            return self.feed(data, time_ns)
        raw_head, raw_tail = self._raw_head, self._raw_tail
        text = _between(raw, raw_head, raw_tail)
        if text is not None:  # learnt from an event of a longer read: this read's framing
            self.chunks += 1
            self._frame(data, raw)
            return text
        try:
            obj: Any = None if raw == _DONE_BYTES else _bytes_loads(raw)  # type: ignore[misc]
        except (ValueError, RecursionError):
            obj = None
        if type(obj) is not dict:  # [DONE], or not a JSON object: read as text, which says why
            events: list[Event] = []
            self._on_data(raw.decode("utf-8", "replace"), time_ns, events)
            return events
        content = _plain_content(obj)
        if content is not None:
            self.chunks += 1
            learn = self._misses < _MAX_MISSES and not _matches(raw, raw_head, raw_tail)
            if learn and self._learn(raw, content):
                self._frame(data, raw)
            return content
        events = []
        self._on_object(obj, time_ns, events)
        return events

    def _frame(self, data: bytes, raw: bytes) -> None:
        """The learnt bytes as a whole read of one event shows them: ``data``, whose event's
        data is ``raw``, with its framing (``data:``, a space or not, the blank line)."""
        start = len(data) - len(raw) - 2
        self._head, self._tail = data[:start] + self._raw_head, self._raw_tail + data[-2:]

    def _learn(self, raw: bytes, content: str) -> bool:
        """Keep the bytes of an event's data ``raw``, a plain token's JSON, around its content
        string when that string is found there as it reads; tell whether it was.

        ``raw`` must hold no backslash at all: then every key is spelt as it reads (no
        ``\\u0063ontent``, no escaped quote inside a key), so the delta's key is among the
        matches of ``"content":"``; it must be the only match, and the next quote ends its
        value, which must be ``content``'s UTF-8. Every attempt counts against
        ``_MAX_MISSES`` but one that replaces bytes which served ``_SERVED`` events or more:
        a stream that never fits stops trying, one whose bytes change now and then (a
        ``created`` of whole seconds) keeps learning."""
        if self._raw_head and self.chunks - self._learnt_at >= _SERVED:
            self._misses -= 1  # replaced after serving its share: not a miss
        self._misses += 1
        self._raw_head = self._raw_tail = self._head = self._tail = b""
        if b"\\" in raw:
            return False
        found = _CONTENT_KEY.findall(raw)
        if len(found) != 1:
            return False
        begin = raw.find(found[0]) + len(found[0])
        end = raw.find(b'"', begin)
        if raw[begin:end] != content.encode():
            return False
        self._learnt_at = self.chunks
        self._raw_head, self._raw_tail = raw[:begin], raw[end:]
        return True

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
        self._on_object(obj, time_ns, events)

    def _on_object(self, obj: dict[str, Any], time_ns: int, events: list[Event]) -> None:
        """One decoded JSON object: a chunk, or an error the server sent in the stream."""
        if (obj.get("error") is None and obj.get("object") != "error") or not _append_error(
            obj, time_ns, events
        ):
            self.chunks += 1
            _append_chunk(obj, time_ns, events)


def _between(data: bytes, head: bytes, tail: bytes) -> str | None:
    """The text between ``head`` and ``tail`` (learnt: not empty) when ``data`` is exactly
    those around a JSON string's plain characters (at least one; no quote, backslash or
    control character; valid UTF-8)."""
    if head and len(data) > len(head) + len(tail) and data.startswith(head) and data.endswith(tail):
        middle = data[len(head) : len(data) - len(tail)]
        if _NOT_PLAIN.search(middle) is None:
            try:
                return middle.decode()
            except UnicodeDecodeError:
                return None
    return None


def _matches(data: bytes, head: bytes, tail: bytes) -> bool:
    """``data`` has the learnt bytes around it (its content is what stopped it, if anything)."""
    return bool(head) and data.startswith(head) and data.endswith(tail)


def _plain_content(obj: dict[str, Any]) -> str | None:
    """The content of a plain token chunk: one choice whose delta is its content alone, with
    no usage, timings, error or finish reason; else None."""
    try:  # subscripts that succeed only on a list of one dict holding a dict
        (choice,) = obj["choices"]
        delta = choice["delta"]
        content = delta["content"]
    except (KeyError, TypeError, ValueError):
        return None
    if (
        type(content) is str
        and content
        and len(delta) == 1
        and choice.get("finish_reason") is None
        and "text" not in choice
        and obj.get("usage") is None
        and obj.get("timings") is None
        and obj.get("error") is None
        and obj.get("object") != "error"
    ):
        return content
    return None


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
