"""What a response body means, whatever carried it: bytes and arrival times in, marks out.

HTTP/1.1 (aiohttp) and HTTP/2 (h2) both feed a ``ResponseConsumer``, so streaming semantics
(which chunk is a token, usage, errors in the stream, truncation) live in one place.
"""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict, MultiMapping

from .._redact import redact_text, redact_url
from ._state import RequestState
from .openai import (
    ChunkReceived,
    ErrorReceived,
    Event,
    MalformedChunk,
    OpenAIStreamParser,
    StreamTruncated,
    TimingsReceived,
    UsageReceived,
    error_message_from_body,
    parse_openai_body,
)

__all__ = ["SERVER_HEADERS", "ResponseConsumer", "note_server_headers", "notes_any"]

#: Response headers in which servers report their own timings; kept on the waterfall as
#: ``attributes["http.<name>"]`` (``latency_analyzer.merge.merge_headers`` reads them).
SERVER_HEADERS = frozenset(
    {
        "server-timing",
        "x-queue-time",
        "x-inference-time",
        "x-validation-time",
        "x-time-per-token",
        "x-compute-time",
        "x-prompt-tokens",
        "x-generated-tokens",
    }
)


_NOTED = tuple(sorted(SERVER_HEADERS | {"location"}))

# Set operations on a case-insensitive keys view match names case-insensitively since
# multidict 6.3; before it, the pure-Python view (no C extension) compared them as written
# and would have found no ``Location`` or ``Server-Timing`` in a response.
_CASELESS_SET_OPS = not CIMultiDict([("A", "")]).keys().isdisjoint(("a",))


def notes_any(headers: MultiMapping[str]) -> bool:
    """Whether response headers ``headers`` (a case-insensitive multidict, as aiohttp's
    are) would note anything (most say none), before the per-header loop of
    :func:`note_server_headers`: one set test of the keys view, made in C, where multidict
    makes it without regard to case, else a membership test per name."""
    if _CASELESS_SET_OPS:
        return not headers.keys().isdisjoint(_NOTED)
    return any(map(headers.__contains__, _NOTED))


def note_server_headers(state: RequestState, headers: Iterable[tuple[str, str]]) -> None:
    """Keep the server-timing headers of a response (repeated ones joined with ``, ``)."""
    attributes = state.recorder.attributes
    for name, value in headers:
        key = name.lower()
        if key == "location":
            state.location = value
            attributes["http.location"] = redact_url(value)
        elif key in SERVER_HEADERS:
            value = redact_text(value)  # a server may echo the request in its timing headers
            previous = attributes.get(f"http.{key}")
            attributes[f"http.{key}"] = f"{previous}, {value}" if previous else value


_ERROR_BODY_CAP = 64 * 1024  # enough for any error message; the rest is read and dropped
_JSON_BODY_CAP = 16 * 1024 * 1024


def _is_token(ev: Event) -> bool:
    return type(ev) is ChunkReceived and ev.carries_token


def _token_before_more(events: list[Event]) -> bool:
    """A token completed before other events of the same read: its stamp, the read's, is
    when the later bytes came (how much later is not known)."""
    return any(_is_token(ev) for ev in events[:-1])


class ResponseConsumer:
    """Interprets one response body as it arrives.

    Args:
        state: the request's capture state (its recorder gets the marks).
        status: HTTP status; 400 and above keep the body for the error message.
        content_type: ``text/event-stream`` is parsed as an OpenAI stream, JSON bodies that
            look like completions as a whole completion; anything else is only timed.
        reason: the HTTP reason phrase, used when an error body says nothing.
    """

    __slots__ = ("_body", "_cap", "_kind", "_parser", "_reason", "_seen", "_state", "_status")

    def __init__(
        self, state: RequestState, status: int, content_type: str, reason: str = ""
    ) -> None:
        self._state = state
        self._status = status
        self._reason = reason
        self._seen = 0  # the cumulative completion tokens of the chunks so far (_delta)
        self._body = bytearray()
        self._parser: OpenAIStreamParser | None = None
        if status >= 400:
            self._kind, self._cap = "error", _ERROR_BODY_CAP
        elif content_type == "text/event-stream":
            self._kind, self._cap, self._parser = "sse", 0, OpenAIStreamParser()
        elif content_type == "application/json":
            self._kind, self._cap = "json", _JSON_BODY_CAP
        else:
            self._kind, self._cap = "other", 0

    @property
    def wants_arrival_times(self) -> bool:
        """True when each piece's own arrival time matters (streams), not just the end."""
        return self._parser is not None

    def feed(self, data: bytes, time_ns: int) -> None:
        """Body bytes that arrived at ``time_ns`` (one read's bytes, or part of one)."""
        if self._parser is not None:
            events = self._parser.feed_token(data, time_ns)
            if isinstance(events, str):  # one token, the usual read: its text
                self._state.recorder.chunk(time_ns, len(events))
                answer = self._state.answer
                if answer is not None:
                    answer.append(events)
                return
            if len(events) > 1 and _token_before_more(events):
                rec = self._state.recorder
                before = rec.chunk_count
                self._apply(events)
                after = rec.chunk_count - (1 if _is_token(events[-1]) else 0)
                rec.multi_event_read(range(before, after))
            else:
                self._apply(events)
        elif len(self._body) < self._cap:
            self._body += data[: self._cap - len(self._body)]

    def close(self, time_ns: int) -> None:
        """The body ended (cleanly) at ``time_ns``."""
        if self._parser is not None:
            closing = self._parser.close(time_ns)
            if self._parser.chunks == 0:  # not an OpenAI stream: a missing [DONE] says nothing
                closing = [e for e in closing if not isinstance(e, StreamTruncated)]
            self._apply(closing)
        elif self._kind == "error":
            reason = error_message_from_body(bytes(self._body)) or self._reason
            message = f"HTTP {self._status}: {reason}"
            self._state.fail("http_status", message, time_ns, terminal=False)
        elif self._kind == "json" and b'"choices"' in self._body:  # a completion, not any JSON
            self._apply(parse_openai_body(bytes(self._body), time_ns), per_chunk_usage=False)

    def _delta(self, cumulative: int | None) -> int | None:
        """A chunk's own token count from cumulative per-chunk usage (vLLM's continuous
        usage stats): what it adds to the chunks before it, None when it adds nothing."""
        if cumulative is None or cumulative <= self._seen:
            return None
        step, self._seen = cumulative - self._seen, cumulative
        return step

    def _apply(self, events: list[Event], per_chunk_usage: bool = True) -> None:
        state = self._state
        rec = state.recorder
        answer = state.answer
        for ev in events:
            if type(ev) is ChunkReceived:  # nearly every event: checked first, exactly
                content = ev.content
                if content:  # carries_token, with an answer
                    cumulative = ev.completion_tokens
                    if cumulative is None or not per_chunk_usage:
                        rec.chunk(ev.time_ns, len(content) + len(ev.reasoning))
                    else:
                        known = self._delta(cumulative)
                        rec.chunk(ev.time_ns, len(content) + len(ev.reasoning), known)
                    if answer is not None:
                        answer.append(content)
                elif ev.reasoning:  # carries_token: reasoning alone (it is there: a token came)
                    cumulative = ev.completion_tokens
                    known = (
                        self._delta(cumulative)
                        if per_chunk_usage and cumulative is not None
                        else None
                    )
                    rec.chunk(ev.time_ns, len(ev.reasoning), known, True)
                elif ev.empty_token:
                    rec.empty_chunk(ev.time_ns)
            elif isinstance(ev, UsageReceived):
                rec.usage(ev.prompt_tokens, ev.completion_tokens)
            elif isinstance(ev, TimingsReceived):  # the last one holds the request's totals
                rec.attributes.update({f"timings.{k}": v for k, v in ev.values.items()})
            elif isinstance(ev, ErrorReceived):
                message = f"server error in stream: {ev.message}"
                state.fail("stream_error", message, ev.time_ns, terminal=False)
            elif isinstance(ev, MalformedChunk):
                # masked before it is cut, so no part of a key survives the cut
                message = f"malformed chunk ({ev.reason}): {redact_text(ev.raw[:1024])[:80]!r}"
                state.fail("malformed_chunk", message, ev.time_ns, terminal=False)
            elif isinstance(ev, StreamTruncated):
                message = f"stream ended without [DONE] ({ev.reason})"
                state.fail("truncated", message, ev.time_ns, terminal=False)
