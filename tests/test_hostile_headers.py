"""Response headers a hostile server controls: ``Server-Timing`` and TGI's ``x-*-time``.

Whatever the header says, the parsers return (malformed entries skipped), ``merge_headers``
returns a waterfall, and the Server-Timing parser's time grows linearly with the header.
"""

from __future__ import annotations

import time

import pytest

from latency_analyzer.merge import NO_OFFSET_FITS, NO_SERVER_DATA, merge_headers
from latency_analyzer.server import (
    ServerTimingMetric,
    parse_server_timing,
    server_timing_stages,
    tgi_header_stages,
)
from latency_analyzer.timeline import ClockAnchor, Recorder, Waterfall

MS = 1_000_000
ANCHOR = ClockAnchor(perf_ns=0, epoch_ns=1_800_000_000_000_000_000, uncertainty_ns=0)


def _waterfall(**headers: str) -> Waterfall:
    rec = Recorder("POST", "http://x/v1/chat/completions", start_ns=0, anchor=ANCHOR)
    rec.add("connect", 1 * MS, 10 * MS)
    rec.add("send", 10 * MS, 11 * MS)
    rec.response_headers(30 * MS, 200)
    rec.chunk(40 * MS, 8)
    rec.attributes.update({f"http.{k.replace('_', '-')}": v for k, v in headers.items()})
    return rec.finish(50 * MS)


@pytest.mark.parametrize("dur", ["1e400", "-1e400", "nan", "inf", "1e305", "-1"])
def test_a_non_finite_or_negative_duration_is_a_malformed_entry(dur: str) -> None:
    assert parse_server_timing(f"x;dur={dur}, queue;dur=4") == [ServerTimingMetric("queue", 4.0)]
    assert server_timing_stages(f"x;dur={dur}") is None


def test_merge_headers_survives_an_overflowing_server_timing() -> None:
    assert merge_headers(_waterfall(server_timing="x;dur=1e400")).attributes["server.status"] == (
        NO_SERVER_DATA
    )
    # finite but far longer than the request: placed nowhere, said so
    merged = merge_headers(_waterfall(server_timing="x;dur=1e300"))
    assert merged.attributes["server.status"] == NO_OFFSET_FITS


@pytest.mark.parametrize("value", ["²", "١٢", "-1", "1.5", "+3", "9" * 19, "1 2", ""])
def test_tgi_values_other_than_ascii_digits_are_ignored(value: str) -> None:
    assert tgi_header_stages({"x-queue-time": value}) is None
    st = tgi_header_stages({"x-queue-time": "15", "x-time-per-token": value})
    assert st is not None and st.attributes == {}
    merged = merge_headers(_waterfall(x_queue_time=value, x_inference_time="²"))
    assert merged.attributes["server.status"] == NO_SERVER_DATA


def test_tgi_values_are_read_with_surrounding_whitespace() -> None:
    st = tgi_header_stages({"x-queue-time": " 15\t", "x-generated-tokens": "007"})
    assert st is not None and [s.duration_ns for s in st.stages] == [15 * MS]
    assert st.attributes == {"x-generated-tokens": 7}


def test_quoted_strings_keep_working_with_escapes_and_newlines() -> None:
    got = parse_server_timing('a;desc="x\\"y\\\\", b;desc="\\\n", c;desc="open')
    assert [(m.name, m.desc) for m in got] == [("a", 'x"y\\'), ("b", "\n")]
    # an unclosed quote does not hide the next entry's comma
    assert [m.name for m in parse_server_timing('bad "x, c;dur=1')] == ["c"]


def _cpu(func: object, text: str) -> float:
    assert callable(func)
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        func(text)
        best = min(best, time.process_time() - t)
    return best


@pytest.mark.parametrize("unit", ['x \\"', 'a;b=\\"', "a;dur=1, ", '"\\"', "a;" * 3])
def test_server_timing_parse_time_is_linear(unit: str) -> None:
    """16× the header costs at most 40× the CPU time (min of 5 runs each): linear is 16×,
    quadratic 256×, so neither a noisy host nor a cache effect can pass for the other (the
    quadratic parser this guards against took ~16× for 4× at 24 KB)."""
    small = unit * (6_000 // len(unit))
    t1, t16 = _cpu(parse_server_timing, small), _cpu(parse_server_timing, small * 16)
    assert t16 <= 40 * max(t1, 1e-4), (t1, t16)
