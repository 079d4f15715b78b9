"""Fuzzing every parser that reads what a server or a user hands us.

Two properties per parser:

* **only documented errors escape**: SSE, OpenAI chunks, Server-Timing, TGI headers and OTLP
  JSON lines never raise on bad input (they skip, count or report it); OTLP protobuf and JSON
  raise ``PayloadError``; scenario TOML raises ``UsageError``; Prometheus text raises
  ``MetricsParseError``;
* **time linear in the input**: 4× the input costs at most 6× the CPU time, on adversarial
  input shapes (long lines fed in small pieces, unclosed quotes, many tiny items).

The number of examples per property is ``LATENCY_FUZZ_EXAMPLES`` (100 in the normal suite,
which CI runs; ``nox -s fuzz`` runs thousands). Under ``CI=true`` examples are derandomized, so
CI is reproducible; ``nox -s fuzz`` explores afresh each time.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from latency_analyzer import UsageError
from latency_analyzer.capture.openai import ChunkReceived, OpenAIStreamParser
from latency_analyzer.capture.sse import SSEParser
from latency_analyzer.load import load_scenario
from latency_analyzer.merge import merge_headers
from latency_analyzer.metrics import MetricsParseError
from latency_analyzer.metrics import parse as parse_metrics
from latency_analyzer.server import (
    OTLPJsonLinesParser,
    PayloadError,
    decode_otlp_json,
    decode_otlp_protobuf,
    parse_server_timing,
    tgi_header_stages,
)
from latency_analyzer.timeline import Recorder

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
OTLP_PB = (FIXTURES / "vllm-0.32-otlp-request-spans.pb").read_bytes()
PROM = (FIXTURES / "vllm-0.32-metrics.prom").read_text()
SSE = (FIXTURES / "vllm-0.32-chat-stream-usage.sse").read_bytes()

FUZZ = settings(
    max_examples=int(os.environ.get("LATENCY_FUZZ_EXAMPLES", "100")),
    deadline=None,
    derandomize=os.environ.get("CI") == "true",
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=25,
)


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def _mutated(base: bytes) -> st.SearchStrategy[bytes]:
    """A real payload truncated, with bytes overwritten, or spliced with random bytes."""

    def mutate(args: tuple[int, int, bytes]) -> bytes:
        at, cut, junk = args
        at %= len(base)
        return base[:at] + junk + base[at + cut :]

    return st.tuples(st.integers(0, 10**6), st.integers(0, 64), st.binary(max_size=16)).map(mutate)


# -- only documented errors escape --------------------------------------------------------------


def _chunk_frames() -> st.SearchStrategy[bytes]:
    openai = st.fixed_dictionaries(
        {"choices": st.lists(st.fixed_dictionaries({"delta": JSON_VALUES}), max_size=2)},
        optional={"usage": JSON_VALUES, "error": JSON_VALUES},
    )
    payload = st.one_of(openai.map(json.dumps), JSON_VALUES.map(json.dumps), st.text(max_size=30))
    line = st.one_of(
        payload.map(lambda p: f"data: {p}"),
        st.sampled_from(["data: [DONE]", ": keep-alive", "event: x", "id: 1", "retry: 9", ""]),
        st.text(max_size=20),
    )
    sep = st.sampled_from(["\n", "\r\n", "\r", "\n\n"])
    return st.lists(st.tuples(line, sep), max_size=12).map(
        lambda parts: "".join(a + b for a, b in parts).encode()
    )


@FUZZ
@given(
    data=st.one_of(_chunk_frames(), st.binary(max_size=300), _mutated(SSE)),
    cuts=st.lists(st.integers(0, 4000), max_size=8),
)
def test_sse_and_openai_chunks_never_raise(data: bytes, cuts: list[int]) -> None:
    """Whatever the bytes and however they are cut: no exception, and every event carries the
    time of the ``feed`` that completed it (no event is stamped with an earlier read's time)."""
    sse, chunks = SSEParser(), OpenAIStreamParser()
    for i, piece in enumerate(_splits(data, cuts)):
        assert {e.time_ns for e in sse.feed(piece, i)} <= {i}
        assert {e.time_ns for e in chunks.feed(piece, i)} <= {i}
    sse.close(len(cuts) + 1)
    chunks.close(len(cuts) + 1)


_TOKEN_HEAD = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":'
_TOKEN_TAIL = b'},"finish_reason":null}]}\n\n'
_CONTENT = st.one_of(
    st.text(max_size=6).map(lambda t: json.dumps(t, ensure_ascii=False).encode()),
    st.text(max_size=6).map(lambda t: json.dumps(t).encode()),  # \u escapes
    st.binary(max_size=6).map(lambda b: b'"' + b + b'"'),  # raw bytes: JSON or not
)


@FUZZ
@given(contents=st.lists(_CONTENT, max_size=12))
def test_feed_token_reads_any_token_stream_as_feed_does(contents: list[bytes]) -> None:
    """A stream whose reads differ only in their content's bytes: the text ``feed_token``
    gives (with or without a parse) is the chunk ``feed`` gives, and its other reads' events
    are ``feed``'s."""
    reads = [_TOKEN_HEAD + c + _TOKEN_TAIL for c in [b'"a"', b'"b"', *contents]]
    plain, token = OpenAIStreamParser(learn=False), OpenAIStreamParser()
    for read in reads:
        expected = plain.feed(read, 1)
        out = token.feed_token(read, 1)
        if isinstance(out, str):
            assert [(type(e), e.content, e.reasoning, e.finish_reason) for e in expected] == [
                (ChunkReceived, out, "", None)
            ]
            assert not expected[0].empty_token and expected[0].completion_tokens is None
        else:
            assert out == expected
    assert token.chunks == plain.chunks


@FUZZ
@given(contents=st.lists(_CONTENT, max_size=12), cuts=st.lists(st.integers(0, 3000), max_size=8))
def test_learnt_tokens_read_as_every_json_parsed(contents: list[bytes], cuts: list[int]) -> None:
    """The same streams cut anywhere, read by ``feed``: what it learns from parsed plain
    tokens changes nothing it reads."""
    data = b"".join(_TOKEN_HEAD + c + _TOKEN_TAIL for c in [b'"a"', b'"b"', *contents])
    plain, learning = OpenAIStreamParser(learn=False), OpenAIStreamParser()
    for i, piece in enumerate(_splits(data, cuts)):
        assert learning.feed(piece, i) == plain.feed(piece, i)
    assert learning.close(9) == plain.close(9) and learning.chunks == plain.chunks


HEADER_TEXT = st.text(
    alphabet=st.sampled_from(list(' \t,;="\\dur=desc1e400.-+xnaif²\n')), max_size=60
)


@FUZZ
@given(value=st.one_of(HEADER_TEXT, st.text(max_size=60)))
@example(value="x;dur=1e400")
@example(value='a;desc="\\')
def test_server_timing_never_raises_and_keeps_only_finite_durations(value: str) -> None:
    for metric in parse_server_timing(value):
        assert metric.dur_ms is None or 0 <= metric.dur_ms < float("inf")


@FUZZ
@given(
    headers=st.dictionaries(
        st.sampled_from(
            ["x-validation-time", "x-queue-time", "x-inference-time", "x-time-per-token"]
        ),
        st.one_of(st.text(max_size=25), st.integers(-10, 10**30).map(str)),
    ),
    timing=st.one_of(st.none(), HEADER_TEXT),
)
@example(headers={"x-queue-time": "²"}, timing=None)
@example(headers={"x-inference-time": "9" * 5000}, timing="x;dur=1e400")
def test_tgi_headers_and_merge_headers_never_raise(
    headers: dict[str, str], timing: str | None
) -> None:
    tgi_header_stages(headers)
    rec = Recorder("POST", "http://x/v1", start_ns=0)
    rec.add("send", 1_000, 2_000)
    rec.response_headers(3_000_000, 200)
    rec.attributes.update({f"http.{k}": v for k, v in headers.items()})
    if timing is not None:
        rec.attributes["http.server-timing"] = timing
    merge_headers(rec.finish(4_000_000))


@FUZZ
@given(body=st.one_of(st.binary(max_size=400), _mutated(OTLP_PB)))
def test_otlp_protobuf_raises_only_payload_error(body: bytes) -> None:
    with contextlib.suppress(PayloadError):
        decode_otlp_protobuf(body)


def _otlp_json_shapes() -> st.SearchStrategy[Any]:
    span = st.dictionaries(
        st.sampled_from(
            ["traceId", "spanId", "parentSpanId", "name", "startTimeUnixNano", "attributes", "kind"]
        ),
        JSON_VALUES,
    )
    spans = st.fixed_dictionaries({"spans": st.lists(span, max_size=3)})
    rs = st.fixed_dictionaries({"scopeSpans": st.lists(spans, max_size=2)})
    return st.one_of(
        st.fixed_dictionaries({"resourceSpans": st.lists(rs, max_size=2)}), JSON_VALUES
    )


@FUZZ
@given(obj=_otlp_json_shapes(), junk=st.binary(max_size=50))
def test_otlp_json_and_json_lines_raise_nothing_undocumented(obj: Any, junk: bytes) -> None:
    text = json.dumps(obj).encode()
    for body in (text, junk, text[: len(text) // 2]):
        with contextlib.suppress(PayloadError):
            decode_otlp_json(body)
    parser = OTLPJsonLinesParser()
    for piece in _splits(text + b"\n" + junk + b"\n" + text, [7, 50, 51, 300]):
        parser.feed(piece)
    parser.close()


_KEYS = ["url", "requests", "concurrency", "mode", "rate", "duration", "arrival", "think_time"]


@FUZZ
@given(
    table=st.dictionaries(
        st.one_of(st.sampled_from(_KEYS), st.text(min_size=1, max_size=8)),
        st.one_of(
            st.integers(-5, 10**20),
            st.floats(),
            st.text(max_size=10),
            st.booleans(),
            st.lists(st.integers(), max_size=3),
            st.dictionaries(
                st.sampled_from(["fixed", "uniform", "x"]),
                st.one_of(st.integers(-3, 9), st.floats(), st.text(max_size=3)),
                max_size=2,
            ),
        ),
        max_size=6,
    ),
    raw=st.binary(max_size=60),
)
@example(table={"concurrency": "4", "url": "http://x/", "requests": 1}, raw=b'url = "\xff"')
def test_scenario_files_raise_only_usage_error(table: dict[str, Any], raw: bytes) -> None:
    lines = [f"{json.dumps(k)} = {_toml(v)}" for k, v in table.items()]
    with tempfile.TemporaryDirectory() as tmp:
        for content in ("\n".join(lines).encode(), raw):
            path = Path(tmp) / "s.toml"
            path.write_bytes(content)
            try:
                load_scenario(path)
            except UsageError as exc:
                assert str(exc).startswith(f"{path}: ")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan"
            if value != value
            else ("inf" if value > 0 else "-inf")
            if abs(value) == float("inf")
            else repr(value)
        )
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


PROM_TEXT = st.text(
    alphabet=st.sampled_from(list('abc_:{}="\\,# \n0123456789.eE+-NaInf')), max_size=120
)


@FUZZ
@given(
    text=st.one_of(PROM_TEXT, _mutated(PROM.encode()).map(lambda b: b.decode("utf-8", "replace"))),
    openmetrics=st.booleans(),
)
def test_prometheus_text_raises_only_metrics_parse_error(text: str, openmetrics: bool) -> None:
    ctype = "application/openmetrics-text; version=1.0.0" if openmetrics else None
    with contextlib.suppress(MetricsParseError):
        parse_metrics(text, ctype)


# -- linear time ---------------------------------------------------------------------------------


def _cpu(func: Callable[[Any], object], arg: Any, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        func(arg)
        best = min(best, time.process_time() - start)
    return best


def assert_linear(func: Callable[[Any], object], make: Callable[[int], Any], n: int) -> None:
    """``func(make(4n))`` costs at most 6× ``func(make(n))``, in CPU time (min of 3 runs).

    ``n`` is doubled until one run takes 5 ms (timer noise), and a failed comparison is
    measured once more before it counts (another process may have shared the core).
    """
    while _cpu(func, make(n), 1) < 0.005 and n < 1 << 22:
        n *= 2
    small, large = make(n), make(4 * n)
    for _attempt in range(2):
        t1, t4 = _cpu(func, small), _cpu(func, large)
        if t4 <= 6 * t1:
            return
    raise AssertionError(f"4× the input ({n} → {4 * n} units) took {t4 / t1:.1f}× the time")


def _fed(
    parser_factory: Callable[[], Any], piece: int, *close_args: int
) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        parser = parser_factory()
        if close_args:
            for i in range(0, len(data), piece):
                parser.feed(data[i : i + piece], 0)
            parser.close(*close_args)
        else:
            for i in range(0, len(data), piece):
                parser.feed(data[i : i + piece])
            parser.close()

    return run


def _one_call(data: bytes) -> None:
    OpenAIStreamParser().feed(data, 0)


def _otlp_json_request(spans: int) -> bytes:
    span = {
        "traceId": "ab" * 16,
        "spanId": "cd" * 8,
        "name": "llm_request",
        "startTimeUnixNano": "1",
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span] * spans}]}]}).encode()


def _otlp_pb_request(exports: int) -> bytes:
    # one ResourceSpans per copy of the real export's resource entry: concatenated messages
    # merge, so this is a valid request with 3 × exports spans
    return OTLP_PB * exports


_SCENARIO_DIR: list[Path] = []  # the running test's tmp_path


def _scenario_file(keys: int) -> Path:
    path = _SCENARIO_DIR[0] / f"s{keys}.toml"
    body = "".join(f'[[templates]]\nname = "t{i}"\nweight = 1\n' for i in range(keys))
    path.write_text(f'url = "http://127.0.0.1:1/x"\nrequests = 1\n{body}')
    return path


LINEAR = {
    "sse: one long line in 16-byte pieces": (
        _fed(SSEParser, 16, 0),
        lambda n: b"data: " + b"x" * n + b"\n\n",
        4096,
    ),
    "sse: many events in one read": (_one_call, lambda n: b"data: {}\n\n" * n, 256),
    "sse: CR line ends": (_fed(SSEParser, 7, 0), lambda n: b"data: x\r\r" * n, 256),
    "openai: chunks in 64-byte pieces": (
        _fed(OpenAIStreamParser, 64, 0),
        lambda n: SSE * n,
        4,
    ),
    "server-timing: unclosed escapes": (parse_server_timing, lambda n: 'x \\"' * n, 1024),
    "server-timing: many entries": (parse_server_timing, lambda n: "a;dur=1;desc=x, " * n, 256),
    "tgi: long values": (
        tgi_header_stages,
        lambda n: {"x-queue-time": "1" * n, "x-inference-time": " " * n + "5"},
        4096,
    ),
    "otlp protobuf: many spans": (decode_otlp_protobuf, _otlp_pb_request, 8),
    "otlp json: many spans": (decode_otlp_json, _otlp_json_request, 64),
    "otlp json lines: a long line in 16-byte pieces": (
        _fed(OTLPJsonLinesParser, 16),
        lambda n: json.dumps({"resourceSpans": [], "pad": "x" * n}).encode() + b"\n",
        8192,
    ),
    "otlp json lines: many short lines": (
        _fed(OTLPJsonLinesParser, 4096),
        lambda n: b'{"resourceSpans": []}\n' * n,
        64,
    ),
    "scenario toml: many templates": (load_scenario, _scenario_file, 16),
    "prometheus: many samples": (
        parse_metrics,
        lambda n: "".join(f'm{{a="{i}"}} {i}\n' for i in range(n)),
        256,
    ),
    "prometheus: a long label value": (parse_metrics, lambda n: 'm{a="' + "x" * n + '"} 1\n', 4096),
}


@pytest.mark.parametrize("case", sorted(LINEAR))
def test_parse_time_is_linear(case: str, tmp_path: Path) -> None:
    _SCENARIO_DIR[:] = [tmp_path]
    func, make, n = LINEAR[case]
    assert_linear(func, make, n)
