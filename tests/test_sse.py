"""SSEParser: WHATWG event-stream interpretation, any split of the input, arrival times."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latency_analyzer.capture.sse import SSEEvent, SSEParser

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
STREAMS = [
    "vllm-0.32-chat-stream-usage.sse",
    "vllm-0.32-completions-stream.sse",
    "llama-cpp-python-0.3.36-chat-stream.sse",
]

Fields = tuple[str, str, str | None, int | None]


def fields(events: Iterable[SSEEvent]) -> list[Fields]:
    """Everything but the arrival time."""
    return [(e.data, e.event, e.id, e.retry) for e in events]


def parse(chunks: Iterable[bytes], t: int = 0) -> tuple[list[SSEEvent], SSEParser]:
    parser = SSEParser()
    events = [e for c in chunks for e in parser.feed(c, t)]
    assert parser.close(t) == []
    return events, parser


def split_at(data: bytes, points: Sequence[int]) -> list[bytes]:
    cuts = sorted({min(max(p, 0), len(data)) for p in points})
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]


def reference_data(raw: bytes) -> list[str]:
    """The fixtures' framing, read the simple way: LF only, blocks of `data: ` lines."""
    blocks = raw.decode("utf-8").split("\n\n")
    assert blocks[-1] == ""
    out = []
    for block in blocks[:-1]:
        lines = block.split("\n")
        assert all(line.startswith("data: ") for line in lines)
        out.append("\n".join(line[len("data: ") :] for line in lines))
    return out


# --- the recorded fixtures ---------------------------------------------------------------------


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_whole_matches_reference(name: str) -> None:
    raw = (FIXTURES / name).read_bytes()
    events, parser = parse([raw])
    expected = reference_data(raw)
    assert [e.data for e in events] == expected
    assert {(e.event, e.id, e.retry) for e in events} == {("message", None, None)}
    assert events[-1].data == "[DONE]"
    assert not parser.truncated
    assert parser.comments == 0


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_byte_by_byte(name: str) -> None:
    raw = (FIXTURES / name).read_bytes()
    whole, _ = parse([raw])
    one_by_one, parser = parse([raw[i : i + 1] for i in range(len(raw))])
    assert fields(one_by_one) == fields(whole)
    assert not parser.truncated


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_with_trailing_partial_event(name: str) -> None:
    raw = (FIXTURES / name).read_bytes()
    whole, _ = parse([raw])
    for trailer in (b'data: {"half', b"data: x\n", b"event: x\n", b"dat"):
        events, parser = parse([raw + trailer])
        assert fields(events) == fields(whole)
        assert parser.truncated, trailer


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_with_trailing_comment_is_not_truncated(name: str) -> None:
    raw = (FIXTURES / name).read_bytes()
    events, parser = parse([raw + b": keep-alive\n"])
    assert len(events) == len(reference_data(raw))
    assert parser.comments == 1
    assert not parser.truncated


@pytest.mark.parametrize("name", STREAMS)
def test_fixture_truncated_tail(name: str) -> None:
    raw = (FIXTURES / name).read_bytes()
    whole, _ = parse([raw])
    # Without its final LF the [DONE] event has no blank line: it must not be dispatched.
    events, parser = parse([raw[:-1]])
    assert fields(events) == fields(whole[:-1])
    assert parser.truncated
    # Cut in the middle of the last JSON chunk.
    cut = raw.rindex(b"data: {") + 20
    events, parser = parse([raw[:cut]])
    assert fields(events) == fields(whole[:-2])
    assert parser.truncated


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(STREAMS),
    points=st.lists(st.integers(min_value=0, max_value=4000), max_size=40),
)
def test_fixture_any_split(name: str, points: list[int]) -> None:
    raw = (FIXTURES / name).read_bytes()
    whole, _ = parse([raw])
    events, parser = parse(split_at(raw, points))
    assert fields(events) == fields(whole)
    assert not parser.truncated


# --- synthetic streams: generated with a model of what they must parse to ----------------------

VALUE = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=8)


@st.composite
def sse_streams(draw: st.DrawFn) -> tuple[bytes, list[Fields]]:
    """An event stream with mixed CRLF/LF/CR, comments, ids, retries, and its expected events."""
    lines: list[str] = []
    expected: list[Fields] = []
    last_id: str | None = None
    for _ in range(draw(st.integers(0, 6))):
        data = draw(st.lists(VALUE, max_size=3))
        event = draw(st.one_of(st.none(), st.sampled_from(["", "delta", "é v"])))
        new_id = draw(st.one_of(st.none(), st.sampled_from(["", "7", "a b", "x\0y"])))
        retry = draw(st.one_of(st.none(), st.sampled_from(["0", "1500", "12a", " 5", "١٢"])))
        if draw(st.booleans()):
            lines.append(":" + draw(VALUE))
        values = []
        for value in data:
            sep = draw(st.sampled_from([": ", ":"]))
            lines.append("data" + sep + value)
            after_colon = sep[1:] + value  # one leading space of this is dropped
            values.append(after_colon[1:] if after_colon[:1] == " " else after_colon)
        if event is not None:
            lines.append("event: " + event)
        if new_id is not None:
            lines.append("id:" + new_id)
            last_id = new_id if "\0" not in new_id else last_id
        if retry is not None:
            lines.append("retry: " + retry)
        lines.append("")
        if data:
            retry_ms = (
                int(retry) if retry is not None and retry.isascii() and retry.isdigit() else None
            )
            expected.append(("\n".join(values), event or "message", last_id, retry_ms))
    return _join_lines(draw, lines), expected


def _join_lines(draw: st.DrawFn, lines: list[str]) -> bytes:
    out = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    previous = ""
    for line in lines:
        choices = ["\r\n", "\n", "\r"]
        if previous == "\r" and line == "":
            choices.remove("\n")  # CR then a bare LF would be one CRLF, not two terminators
        previous = draw(st.sampled_from(choices))
        out.append(line.encode() + previous.encode())
    return b"".join(out)


@settings(max_examples=300, deadline=None)
@given(stream=sse_streams(), points=st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_synthetic_any_split(stream: tuple[bytes, list[Fields]], points: list[int]) -> None:
    raw, expected = stream
    events, parser = parse(split_at(raw, points))
    assert fields(events) == expected
    assert not parser.truncated


# --- WHATWG edge cases -------------------------------------------------------------------------


def test_crlf_split_across_feeds_is_one_terminator() -> None:
    events, _ = parse([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"])
    assert fields(events) == [("a\nb", "message", None, None)]


def test_empty_feed_keeps_pending_cr() -> None:
    events, _ = parse([b"data: a\r", b"", b"\n\r\n"])
    assert fields(events) == [("a", "message", None, None)]


def test_cr_only_lines() -> None:
    events, _ = parse([b"data: a\rdata: b\r\rdata: c\r\r"])
    assert [e.data for e in events] == ["a\nb", "c"]


def test_multiline_data_and_empty_data_lines() -> None:
    events, _ = parse([b"data: one\ndata:\ndata: three\n\ndata\n\n"])
    assert [e.data for e in events] == ["one\n\nthree", ""]


def test_comments_are_counted_and_ignored() -> None:
    events, parser = parse([b": ping\n\n:\ndata: x\n: inside\n\n"])
    assert [e.data for e in events] == ["x"]
    assert parser.comments == 3


def test_only_one_space_after_colon_is_removed() -> None:
    events, _ = parse([b"data:x\n\ndata:  y\n\ndata: \n\n"])
    assert [e.data for e in events] == ["x", " y", ""]


def test_retry_needs_ascii_digits() -> None:
    events, parser = parse(
        [b"retry: 12a\ndata: a\n\nretry: 1500\ndata: b\n\nretry: \xd9\xa1\ndata: c\n\n"]
    )
    assert [e.retry for e in events] == [None, 1500, None]
    assert parser.retry == 1500


def test_retry_without_data_updates_parser_only() -> None:
    events, parser = parse([b"retry: 3000\n\ndata: a\n\n"])
    assert fields(events) == [("a", "message", None, None)]
    assert parser.retry == 3000


def test_id_persists_and_nul_id_is_ignored() -> None:
    events, _ = parse([b"id: 1\ndata: a\n\ndata: b\n\nid: 2\x003\ndata: c\n\nid\ndata: d\n\n"])
    assert [e.id for e in events] == ["1", "1", "1", ""]


def test_bom_stripped_once() -> None:
    events, _ = parse([b"\xef\xbb\xbfdata: a\n\n\xef\xbb\xbfdata: b\n\n"])
    # The second BOM is part of a field name, "\ufeffdata", which is unknown: no event.
    assert [e.data for e in events] == ["a"]


def test_bom_split_across_feeds() -> None:
    raw = b"\xef\xbb\xbfdata: a\n\n"
    events, _ = parse([raw[i : i + 1] for i in range(len(raw))])
    assert [e.data for e in events] == ["a"]


def test_bom_like_prefix_that_is_not_a_bom() -> None:
    events, _ = parse([b"\xef", b"\xbbdata: a\n\ndata: b\n\n"])
    assert [e.data for e in events] == ["b"]


def test_event_type_resets_after_dispatch_and_after_empty_block() -> None:
    events, _ = parse(
        [b"event: delta\ndata: a\n\ndata: b\n\nevent: x\n\ndata: c\n\nevent:\ndata: d\n\n"]
    )
    assert [(e.event, e.data) for e in events] == [
        ("delta", "a"),
        ("message", "b"),
        ("message", "c"),
        ("message", "d"),
    ]


def test_unknown_fields_ignored() -> None:
    events, _ = parse([b"data : x\nfoo: bar\nDATA: y\ndata: z\n\n"])
    assert fields(events) == [("z", "message", None, None)]


def test_utf8_character_split_across_feeds() -> None:
    raw = "data: é€😀\n\n".encode()
    events, _ = parse([raw[:7], raw[7:9], raw[9:13], raw[13:]])
    assert [e.data for e in events] == ["é€😀"]


def test_invalid_utf8_is_replaced() -> None:
    events, _ = parse([b"data: a\xffb\n\n"])
    assert [e.data for e in events] == ["a\ufffdb"]


def test_incomplete_event_at_close_is_dropped_and_flagged() -> None:
    parser = SSEParser()
    assert fields(parser.feed(b"data: a\n\ndata: b\n", 1)) == [("a", "message", None, None)]
    assert parser.close(2) == []
    assert parser.truncated
    assert parser.closed


def test_partial_line_at_close_is_flagged() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a", 1) == []
    parser.close(2)
    assert parser.truncated


def test_clean_close_is_not_truncated() -> None:
    parser = SSEParser()
    parser.feed(b"data: a\n\n", 1)
    parser.close(2)
    assert not parser.truncated


def test_feed_after_close_raises() -> None:
    parser = SSEParser()
    parser.close(1)
    with pytest.raises(RuntimeError, match="after close"):
        parser.feed(b"data: a\n\n", 2)


# --- arrival times -----------------------------------------------------------------------------


def test_event_gets_time_of_feed_that_completed_it() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n", 1) == []
    got = parser.feed(b"\ndata: b\n\ndata: c", 2)
    got += parser.feed(b"\n\n", 3)
    assert [(e.data, e.time_ns) for e in got] == [("a", 2), ("b", 2), ("c", 3)]


def test_time_with_crlf_blank_line_split() -> None:
    parser = SSEParser()
    got = parser.feed(b"data: a\r\n\r", 1)  # the blank line ends at its CR: dispatched now
    got += parser.feed(b"\ndata: b\r\n\r", 2)
    got += parser.feed(b"\n", 3)  # only completes a CRLF: no new blank line
    assert [(e.data, e.time_ns) for e in got] == [("a", 1), ("b", 2)]
