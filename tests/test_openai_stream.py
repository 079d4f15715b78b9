"""OpenAIStreamParser and the body helpers, against real recorded vLLM / llama-cpp-python output."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import astuple
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latency_analyzer.capture.openai import (
    ChunkReceived,
    ErrorReceived,
    Event,
    MalformedChunk,
    OpenAIStreamParser,
    StreamDone,
    StreamTruncated,
    UsageReceived,
    error_message_from_body,
    parse_openai_body,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
VLLM_CHAT = "vllm-0.32-chat-stream-usage.sse"
VLLM_COMPLETIONS = "vllm-0.32-completions-stream.sse"
LLAMA_CHAT = "llama-cpp-python-0.3.36-chat-stream.sse"
STREAMS = [VLLM_CHAT, VLLM_COMPLETIONS, LLAMA_CHAT]


def read(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def run(chunks: Iterable[bytes], t: int = 0) -> tuple[list[Event], OpenAIStreamParser]:
    """The reference reading: every event's JSON parsed (nothing learnt)."""
    parser = OpenAIStreamParser(learn=False)
    events = [e for c in chunks for e in parser.feed(c, t)]
    events += parser.close(t)
    return events, parser


def untimed(events: Iterable[Event]) -> list[tuple[Any, ...]]:
    return [(type(e).__name__, *astuple(e)[1:]) for e in events]


def sse(*payloads: str) -> bytes:
    return b"".join(f"data: {p}\n\n".encode() for p in payloads)


def chunks(events: Iterable[Event]) -> list[ChunkReceived]:
    return [e for e in events if isinstance(e, ChunkReceived)]


def reference(raw: bytes) -> list[dict[str, Any]]:
    """The fixture's JSON chunks, read the simple way (LF framing, one `data: ` line each)."""
    payloads = [b.removeprefix("data: ") for b in raw.decode().split("\n\n") if b]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def reference_text(raw: bytes) -> tuple[str, int]:
    """Joined text and the number of chunks with non-empty text."""
    pieces = []
    for obj in reference(raw):
        for choice in obj["choices"]:
            pieces.append(choice.get("delta", {}).get("content") or choice.get("text") or "")
    return "".join(pieces), sum(1 for p in pieces if p)


# --- the recorded streams ----------------------------------------------------------------------


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_text_and_token_chunks_match_reference(name: str) -> None:
    raw = read(name)
    events, parser = run([raw])
    text, token_chunks = reference_text(raw)
    got = chunks(events)
    assert "".join(c.content for c in got) == text
    assert sum(c.carries_token for c in got) == token_chunks
    assert parser.chunks == len(reference(raw))
    assert parser.done
    assert isinstance(events[-1], StreamDone)
    assert not any(isinstance(e, (MalformedChunk, ErrorReceived, StreamTruncated)) for e in events)


def test_vllm_chat_stream_with_usage() -> None:
    events, parser = run([read(VLLM_CHAT)])
    got = chunks(events)
    assert len(got) == 17  # role chunk + one per generated token (max_tokens 16)
    assert parser.chunks == 18  # + the final `choices: []` usage chunk
    first = got[0]
    assert (first.content, first.carries_token) == ("", False)  # role-only: not a token
    assert got[1].content == " queue"
    # vLLM holds back bytes of an incomplete UTF-8 character: those chunks have content "".
    assert sum(c.carries_token for c in got) == 9
    assert [c.finish_reason for c in got].count("length") == 1
    assert got[-1].finish_reason == "length"
    assert {c.completion_tokens for c in got} == {None}
    assert events[-2:] == [UsageReceived(0, 28, 16), StreamDone(0)]
    assert [type(e) for e in events[-3:]] == [ChunkReceived, UsageReceived, StreamDone]


def test_vllm_completions_stream() -> None:
    events, parser = run([read(VLLM_COMPLETIONS)])
    got = chunks(events)
    assert len(got) == 12 == parser.chunks
    assert sum(c.carries_token for c in got) == 5
    assert got[-1].finish_reason == "length"
    assert got[-1].carries_token is False
    assert not any(isinstance(e, UsageReceived) for e in events)


def test_llama_cpp_stream() -> None:
    events, _ = run([read(LLAMA_CHAT)])
    got = chunks(events)
    assert len(got) == 14
    assert (got[0].content, got[0].carries_token) == ("", False)  # {"role": "assistant"} only
    last = got[-1]  # empty delta, finish_reason "length": not a token
    assert (last.content, last.finish_reason, last.carries_token) == ("", "length", False)
    assert sum(c.carries_token for c in got) == 12  # max_tokens 12
    assert got[1].content == " kleinen"
    assert not any(isinstance(e, UsageReceived) for e in events)


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_byte_by_byte(name: str) -> None:
    raw = read(name)
    whole, _ = run([raw])
    one_by_one, _ = run([raw[i : i + 1] for i in range(len(raw))])
    assert untimed(one_by_one) == untimed(whole)


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_with_trailing_bytes_after_done(name: str) -> None:
    raw = read(name)
    whole, _ = run([raw])
    events, parser = run([raw + b'data: {"choi'])
    assert untimed(events) == untimed(whole)  # [DONE] seen: close() adds nothing
    assert parser.truncated


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_truncated_tail(name: str) -> None:
    raw = read(name)
    whole, _ = run([raw])
    events, parser = run([raw[:-1]], t=9)  # "[DONE]\n" without its blank line
    assert not parser.done
    assert untimed(events[:-1]) == untimed(whole[:-1])
    assert events[-1] == StreamTruncated(
        9, "stream ended without [DONE]; a partial event was pending"
    )


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_cut_between_events(name: str) -> None:
    raw = read(name)
    cut = raw.rindex(b"data: [DONE]")
    events, parser = run([raw[:cut]], t=4)
    assert events[-1] == StreamTruncated(4, "stream ended without [DONE]")
    assert not parser.truncated
    assert not any(isinstance(e, StreamDone) for e in events)


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from(STREAMS),
    points=st.lists(st.integers(min_value=0, max_value=4000), max_size=40),
)
def test_fixture_any_split(name: str, points: list[int]) -> None:
    raw = read(name)
    whole, _ = run([raw])
    cuts = sorted({min(p, len(raw)) for p in points})
    bounds = [0, *cuts, len(raw)]
    events, _ = run([raw[a:b] for a, b in pairwise(bounds)])
    assert untimed(events) == untimed(whole)


def test_event_times_come_from_the_completing_feed() -> None:
    parser = OpenAIStreamParser()
    one = sse('{"choices":[{"delta":{"content":"a"}}]}')
    assert parser.feed(one[:-1], 1) == []
    assert parser.feed(one[-1:] + b"data: [DO", 2) == [ChunkReceived(2, "a", "", None, None)]
    assert parser.feed(b"NE]\n\n", 3) == [StreamDone(3)]
    assert parser.close(4) == []


# --- semantics on synthetic streams ------------------------------------------------------------


def test_malformed_chunk_in_the_middle_does_not_stop_parsing() -> None:
    raw = sse(
        '{"choices":[{"delta":{"content":"a"}}]}',
        '{"choices":[{"delta":{"content":',
        "[1, 2]",
        '{"choices":[{"delta":{"content":"b"}}]}',
        "[DONE]",
    )
    events, parser = run([raw], t=5)
    assert [c.content for c in chunks(events)] == ["a", "b"]
    bad = [e for e in events if isinstance(e, MalformedChunk)]
    assert [b.raw for b in bad] == ['{"choices":[{"delta":{"content":', "[1, 2]"]
    assert bad[0].reason.startswith("invalid JSON")
    assert bad[1].reason == "not a JSON object: list"
    assert parser.chunks == 2
    assert parser.done


def test_mid_stream_error_openai_shape() -> None:
    raw = sse(
        '{"choices":[{"delta":{"content":"a"}}]}',
        '{"error":{"message":"overloaded","type":"server_error","code":"503"}}',
    )
    events, parser = run([raw], t=7)
    assert events[1:] == [
        ErrorReceived(7, "overloaded", "503"),
        StreamTruncated(7, "stream ended without [DONE]"),
    ]
    assert parser.chunks == 1


def test_mid_stream_error_vllm_shape() -> None:
    raw = sse(
        '{"object":"error","message":"boom","type":"InternalServerError","code":500}', "[DONE]"
    )
    events, _ = run([raw], t=1)
    assert events == [ErrorReceived(1, "boom", 500), StreamDone(1)]


def test_error_without_message_keeps_the_json() -> None:
    events, _ = run([sse('{"error":{"code":"x"}}', '{"error":"plain"}', "[DONE]")], t=1)
    assert events[:2] == [ErrorReceived(1, '{"code": "x"}', "x"), ErrorReceived(1, "plain", None)]


def test_reasoning_chunks() -> None:
    raw = sse(
        '{"choices":[{"delta":{"role":"assistant","content":""}}]}',
        '{"choices":[{"delta":{"reasoning_content":"think"}}]}',
        '{"choices":[{"delta":{"reasoning":"more","content":null}}]}',
        '{"choices":[{"delta":{"content":"ok"},"finish_reason":"stop"}]}',
        "[DONE]",
    )
    got = chunks(run([raw])[0])
    assert [(c.content, c.reasoning, c.carries_token) for c in got] == [
        ("", "", False),
        ("", "think", True),
        ("", "more", True),
        ("ok", "", True),
    ]
    assert got[-1].finish_reason == "stop"


def test_continuous_usage_on_choice_chunks() -> None:
    raw = sse(
        '{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}',
        '{"choices":[{"delta":{"content":"bc"}}],"usage":{"prompt_tokens":5,"completion_tokens":3}}',
        '{"choices":[],"usage":null}',
        "[DONE]",
    )
    events, parser = run([raw], t=2)
    assert events == [
        ChunkReceived(2, "a", "", None, 1),
        UsageReceived(2, 5, 1),
        ChunkReceived(2, "bc", "", None, 3),
        UsageReceived(2, 5, 3),
        StreamDone(2),
    ]
    assert parser.chunks == 3


def test_several_choices_are_concatenated() -> None:
    raw = sse('{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b","finish_reason":"stop"}]}')
    got = chunks(run([raw])[0])
    assert [(c.content, c.finish_reason) for c in got] == [("ab", "stop")]


def test_done_with_event_type_and_crlf() -> None:
    raw = b'event: message\r\ndata: {"choices":[{"text":"x"}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    events, _ = run([raw], t=3)
    assert events == [ChunkReceived(3, "x", "", None, None), StreamDone(3)]


def test_empty_data_is_malformed() -> None:
    events, _ = run([b"data:\n\n: ping\n\ndata: [DONE]\n\n"], t=1)
    assert len(events) == 2 and events[1] == StreamDone(1)
    malformed = events[0]
    assert isinstance(malformed, MalformedChunk) and (malformed.time_ns, malformed.raw) == (1, "")
    # the decoder's own words follow (they differ between orjson and the standard library)
    assert malformed.reason.startswith("invalid JSON: ") and "line 1 column 1" in malformed.reason


def test_comments_are_exposed() -> None:
    _, parser = run([b": ping\n\n: ping\n\ndata: [DONE]\n\n"])
    assert parser.comments == 2


# --- whole bodies ------------------------------------------------------------------------------


def test_vllm_nonstream_body() -> None:
    raw = read("vllm-0.32-chat-nonstream.json")
    ref = json.loads(raw)
    events = parse_openai_body(raw, 11)
    assert events == [
        ChunkReceived(11, ref["choices"][0]["message"]["content"], "", "length", 8),
        UsageReceived(11, 19, 8),
    ]


def test_completions_body_with_reasoning_message() -> None:
    body = (
        b'{"choices":[{"message":{"content":"hi","reasoning_content":"r"},"finish_reason":"stop"}]}'
    )
    assert parse_openai_body(body, 1) == [ChunkReceived(1, "hi", "r", "stop", None)]
    body = b'{"choices":[{"text":"abc","finish_reason":"length"}],"usage":{"completion_tokens":3}}'
    assert parse_openai_body(body, 1) == [
        ChunkReceived(1, "abc", "", "length", 3),
        UsageReceived(1, None, 3),
    ]


def test_vllm_error_body() -> None:
    raw = read("vllm-0.32-error-400-context-length.json")
    message = json.loads(raw)["error"]["message"]
    assert parse_openai_body(raw, 3) == [ErrorReceived(3, message, 400)]
    assert error_message_from_body(raw) == message
    assert message.startswith("This model's maximum context length is 512 tokens.")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<html>502</html>", "invalid JSON"),
        (b"\xff\xfe{", "invalid JSON"),
        (b'"text"', "not a JSON object: str"),
        (b"", "invalid JSON"),
    ],
)
def test_malformed_body(body: bytes, reason: str) -> None:
    (event,) = parse_openai_body(body, 2)
    assert isinstance(event, MalformedChunk)
    assert event.reason.startswith(reason)
    assert event.raw == body.decode("utf-8", "replace")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"object":"error","message":"bad model","type":"NotFoundError","code":404}',
            "bad model",
        ),
        (b'{"error":"Input validation error","error_type":"validation"}', "Input validation error"),
        (b'{"detail":"Not Found"}', "Not Found"),
        (b"  Bad   Gateway\n\n", "Bad Gateway"),
        (b'{"unexpected": 1}', '{"unexpected": 1}'),
        (b"x" * 500, "x" * 200),
        (b"", None),
        (b" \r\n ", None),
    ],
)
def test_error_message_from_body(body: bytes, message: str | None) -> None:
    assert error_message_from_body(body) == message


def test_carries_token_property() -> None:
    assert ChunkReceived(0, "a", "", None, None).carries_token
    assert ChunkReceived(0, "", "r", None, None).carries_token
    assert not ChunkReceived(0, "", "", "stop", None).carries_token


def test_events_are_frozen() -> None:
    event: Sequence[Event] = [StreamDone(1)]
    with pytest.raises(AttributeError):
        event[0].time_ns = 2  # type: ignore[misc]  # frozen: the point of the check


# --- feed_token: the usual read's text, any other read's events ---------------------------------

_SHAPES = [
    '{"choices":[{"delta":{"content":"Hi"}}]}',  # the usual token: its text alone
    '{"choices":[{"index":0,"delta":{"content":" a"},"finish_reason":null}]}',
    '{"choices":[{"delta":{"role":"assistant","content":""}}]}',  # role only: no token
    '{"choices":[{"delta":{"content":"."},"finish_reason":"stop"}]}',
    '{"choices":[{"delta":{"content":"x","reasoning_content":"why"}}]}',
    '{"choices":[{"delta":{"content":"u"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}',
    '{"choices":[{"delta":{"content":"t"}}],"timings":{"predicted_n":1}}',
    '{"choices":[{"delta":{"content":"c"},"text":"d"}]}',
    '{"choices":[{"delta":{"content":"1"}},{"delta":{"content":"2"}}]}',
    '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}',
    '{"error":{"message":"overloaded","code":503}}',
    '{"object":"error","message":"bad"}',
    "not json",
    "[1, 2]",
    "[DONE]",
]


@pytest.mark.parametrize("whole", [True, False], ids=["one-read-each", "byte-by-byte"])
def test_feed_token_reads_as_feed_does(whole: bool) -> None:
    """Each shape, fed as a read of its own (or a byte at a time): ``feed_token`` gives the
    text exactly when ``feed`` gives one plain token chunk, and the same events otherwise."""
    stream = sse(*_SHAPES)
    reads = [sse(p) for p in _SHAPES] if whole else [stream[i : i + 1] for i in range(len(stream))]
    expected, _ = run(reads, t=7)
    parser = OpenAIStreamParser()
    got: list[Event] = []
    texts = 0
    for read_ in reads:
        out = parser.feed_token(read_, 7)
        if isinstance(out, str):
            texts += 1
            got.append(ChunkReceived(7, out, "", None, None))
        else:
            got += out
    got += parser.close(7)
    assert untimed(got) == untimed(expected)
    # the second shape, when each is a read of its own: the first read of a stream (the first
    # shape) goes the general way, which settles whether the stream opens with a BOM
    assert texts == (1 if whole else 0)
    assert parser.chunks == run(reads)[1].chunks


def _vllm_like(content_json: str, created: int = 1700000000, finish: str = "null") -> bytes:
    """One read of a vLLM-style token chunk, ``content_json`` as the server wrote it."""
    return (
        b'data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":%d,'
        b'"model":"m","choices":[{"index":0,"delta":{"content":%s},"logprobs":null,'
        b'"finish_reason":%s}]}\n\n' % (created, content_json.encode(), finish.encode())
    )


_STREAM = [
    _vllm_like('"Hi"'),  # the stream's first read: the BOM is settled the general way
    _vllm_like('" there"'),  # parsed, and its bytes around the content learnt
    _vllm_like('" wörld"'),  # the learnt bytes around plain UTF-8: no parse
    _vllm_like('"\\"q\\""'),  # escapes: parsed
    _vllm_like('"a\\\\b"'),
    _vllm_like('"\\u00e9"'),
    b'data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"m","choices":[{"index":0,"delta":{"content":"\x01"},"logprobs":null,'
    b'"finish_reason":null}]}\n\n',  # a raw control character: not JSON, parsed to say so
    b'data: {"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"m","choices":[{"index":0,"delta":{"content":"\xff\xfe"},"logprobs":null,'
    b'"finish_reason":null}]}\n\n',  # not UTF-8: read as decoded text, with U+FFFD
    _vllm_like('"\\"content\\":\\"x"'),  # the key's text inside the content
    _vllm_like('""'),  # empty content: no token
    _vllm_like('"."', created=1700000001),  # the bytes around changed: parsed, learnt again
    _vllm_like('" ok"', created=1700000001),  # no parse
    _vllm_like('"!"', finish='"stop"'),  # the finish: parsed
    b"data: [DONE]\n\n",
]


def test_feed_token_reads_learnt_tokens_without_a_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream's plain tokens after the first parsed one: ``feed_token`` gives their text
    without a JSON parse, and every read reads as ``feed`` reads it, whatever its content."""
    module = sys.modules[OpenAIStreamParser.__module__]
    if module._bytes_loads is None:
        pytest.skip("feed_token takes reads apart only with orjson (the [fast] extra)")
    expected, reference_parser = run(_STREAM, t=7)
    parsed: list[bytes] = []

    def counting(raw: str | bytes) -> Any:
        parsed.append(raw if isinstance(raw, bytes) else raw.encode())
        return loads(raw)

    loads = module._bytes_loads
    monkeypatch.setattr(module, "_bytes_loads", counting)
    monkeypatch.setattr(module, "_loads", counting)
    parser = OpenAIStreamParser()
    got: list[Event] = []
    for read_ in _STREAM:
        out = parser.feed_token(read_, 7)
        got += [ChunkReceived(7, out, "", None, None)] if isinstance(out, str) else out
    got += parser.close(7)
    assert untimed(got) == untimed(expected)
    assert parser.chunks == reference_parser.chunks
    # read without a parse: " wörld" and " ok", each after bytes learnt from a parsed token,
    # and [DONE], which is no JSON
    unparsed = [r for r in _STREAM if not any(p in r for p in parsed)]
    assert unparsed == [_STREAM[2], _STREAM[11], _STREAM[-1]]
    # and a whole stream of one template: one parse for the stream's first read, one to learn
    parsed.clear()
    parser = OpenAIStreamParser()
    first, *texts = [parser.feed_token(_vllm_like(f'" t{i}"'), 7) for i in range(50)]
    assert untimed(first) == untimed([ChunkReceived(7, " t0", "", None, None)])
    assert texts == [f" t{i}" for i in range(1, 50)] and len(parsed) == 2
    # reads of several events each, through feed: the same, from the second read on
    stream = [_vllm_like(f'" t{i}"') for i in range(48)]
    expected = run(stream, t=7)[0][:-1]  # less the missing [DONE]
    parsed.clear()
    parser = OpenAIStreamParser()
    got = [e for i in range(0, 48, 4) for e in parser.feed(b"".join(stream[i : i + 4]), 7)]
    assert untimed(got) == untimed(expected)
    assert len(parsed) == 2  # the first event (decoded: the BOM unsettled), one to learn from


@pytest.mark.parametrize(
    "name",
    [
        "vllm-0.32-chat-stream-usage.sse",
        "vllm-0.32-completions-stream.sse",
        "llama-server-11434-chat-stream.sse",
        "llama-cpp-python-0.3.36-chat-stream.sse",
    ],
)
def test_real_streams_read_as_the_reference_reads_them(name: str) -> None:
    """Each recorded stream, read as one event per read (``feed_token``), all at once, and
    cut at every 7th byte (``feed``): learnt plain tokens give the events of every event's
    JSON parsed."""
    raw = read(name)
    expected, reference_parser = run([raw])
    events = raw.split(b"\n\n")
    per_event = [e + b"\n\n" for e in events[:-1]]
    assert b"".join(per_event) + events[-1] == raw
    token = OpenAIStreamParser()
    got: list[Event] = []
    for read_ in per_event:
        out = token.feed_token(read_, 0)
        got += [ChunkReceived(0, out, "", None, None)] if isinstance(out, str) else out
    got += token.close(0)
    assert untimed(got) == untimed(expected) and token.chunks == reference_parser.chunks
    for reads in ([raw], [raw[i : i + 7] for i in range(0, len(raw), 7)]):
        parser = OpenAIStreamParser()
        got = [e for r in reads for e in parser.feed(r, 0)] + parser.close(0)
        assert untimed(got) == untimed(expected) and parser.chunks == reference_parser.chunks


@pytest.mark.parametrize(
    "template",
    [
        # the delta's key spelt with an escape, a look-alike elsewhere
        '{"id":"c","meta":{"content":"%s"},"choices":[{"index":0,'
        '"delta":{"\\u0063ontent":"hi"},"finish_reason":null}]}',
        # a key holding an escaped quote and the look-alike
        '{"id\\"content":"%s","choices":[{"index":0,"delta":{"\\u0063ontent":"hi"}}]}',
        # a duplicate key: the last one is the one read
        '{"choices":[{"delta":{"content":"%s"}}],"choices":[{"delta":{"\\u0063ontent":"hi"}}]}',
    ],
)
def test_look_alike_content_keys_are_not_learnt(template: str) -> None:
    """A ``"content":"`` that is not the delta's, its value the token's: what is learnt from
    it would read a later look-alike as the token. Nothing is learnt from an event with an
    escape anywhere, so every key reads as it is spelt."""
    reads = [sse(template % value) for value in ("hi", "hi", "EVIL", "x")]
    expected, _ = run(reads)
    for how in ("feed", "feed_token"):
        parser = OpenAIStreamParser()
        got: list[Event] = []
        for read_ in reads:
            out = getattr(parser, how)(read_, 0)
            got += [ChunkReceived(0, out, "", None, None)] if isinstance(out, str) else out
        got += parser.close(0)
        assert untimed(got) == untimed(expected), how
        assert [e.content for e in chunks(got)] == ["hi"] * 4


def test_learning_stops_for_streams_that_never_fit_and_keeps_up_with_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attempts to learn are bounded for a stream whose tokens never fit (its content
    escaped), and a stream whose ``created`` ticks each second keeps learning."""
    attempts: list[bytes] = []
    learn = OpenAIStreamParser._learn

    def counting(self: OpenAIStreamParser, raw: bytes, content: str) -> bool:
        attempts.append(raw)
        return bool(learn(self, raw, content))

    monkeypatch.setattr(OpenAIStreamParser, "_learn", counting)
    parser = OpenAIStreamParser()
    for i in range(100):
        parser.feed_token(_vllm_like(f'"\\u4e2d{i}"'), 0)
    assert len(attempts) <= 4
    attempts.clear()
    parser = OpenAIStreamParser()
    texts = [
        parser.feed_token(_vllm_like(f'" t{i}"', created=1700000000 + i // 30), 0)
        for i in range(600)
    ]
    assert all(isinstance(t, str) for t in texts[1:])
    assert len(attempts) == 20  # once per second's first token


def test_done_is_read_without_a_json_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """``[DONE]`` ends a stream without a JSON parse tried on it: the parse would raise, and
    building that error was the costliest thing a stream's end did. Fed read by read as a
    response streams (the last read holding the finish and ``[DONE]``) and whole."""
    raised: list[object] = []
    init = json.JSONDecodeError.__init__

    def counting(self: json.JSONDecodeError, *args: Any) -> None:
        raised.append(args)
        init(self, *args)

    monkeypatch.setattr(json.JSONDecodeError, "__init__", counting)
    whole = b"".join(_STREAM)
    for feed, reads in (
        ("feed_token", [*_STREAM[:-2], _STREAM[-2] + _STREAM[-1]]),
        ("feed", [*_STREAM[:-2], _STREAM[-2] + _STREAM[-1]]),
        ("feed", [whole]),
    ):
        parser = OpenAIStreamParser()
        for read_ in reads:
            getattr(parser, feed)(read_, 7)
        assert parser.done
        # the stream's deliberately broken events raise; its end does not
        assert [a for a in raised if "[DONE]" in str(a[1:2])] == [], feed
        raised.clear()
