"""Objects built in the writable twin of a frozen class equal the checked constructor's.

The Recorder's waterfall is compared field by field in ``test_lean_path``; these are the
smaller records built the same way on every request: TCP_INFO readings, the connection's
place in the pool, the trace context sent, the aiohttp timeout of the time left.
"""

from __future__ import annotations

import dataclasses
import random
import struct

import aiohttp
import attrs
import pytest

from latency_analyzer.capture._build import _client_timeout
from latency_analyzer.capture._tcpinfo import _FIELDS, decode_tcp_info
from latency_analyzer.capture.propagation import TraceContext, inject
from latency_analyzer.timeline import ConnectionInfo, Span, TcpInfo
from latency_analyzer.timeline._info import connection_info
from latency_analyzer.timeline._span import prechecked_span
from latency_analyzer.timeline._unfrozen import unfrozen


def _raw_tcp_info(rng: random.Random, length: int) -> bytes:
    raw = bytearray(rng.randbytes(length))
    for _name, fmt, offset in _FIELDS:  # a field's bytes are what the kernel would copy
        size = struct.calcsize(fmt)
        if offset + size <= length:
            raw[offset : offset + size] = rng.randbytes(size)
    return bytes(raw)


@pytest.mark.parametrize("length", [232, 240, 104])
def test_tcp_info_decoded_in_slots_equals_the_constructor(length: int) -> None:
    rng = random.Random(length)
    for at in range(200):
        raw = _raw_tcp_info(rng, length)
        info = decode_tcp_info(raw, at)
        assert info is not None and type(info) is TcpInfo
        values = {
            name: (
                struct.unpack_from("=" + fmt, raw, offset)[0]
                if offset + struct.calcsize(fmt) <= length
                else None
            )
            for name, fmt, offset in _FIELDS
        }
        expected = TcpInfo(at_ns=at, **values)  # type: ignore[arg-type]  # all present here
        assert info == expected and hash(info) == hash(expected)
        with pytest.raises(dataclasses.FrozenInstanceError):
            info.rtt_us = 1  # type: ignore[misc]  # frozen: the point of the check


def test_connection_info_and_span_built_in_slots_equal_the_constructor() -> None:
    built = connection_info(True, 7, "127.0.0.1:80", 3)
    checked = ConnectionInfo(reused=True, connection_id=7, peer="127.0.0.1:80", requests_before=3)
    assert type(built) is ConnectionInfo and built == checked and hash(built) == hash(checked)
    assert connection_info(False, None, None, 0) == ConnectionInfo()
    span, checked_span = prechecked_span("send", 1, 4), Span("send", 1, 4)
    assert type(span) is Span and span == checked_span and hash(span) == hash(checked_span)
    with pytest.raises(dataclasses.FrozenInstanceError):
        span.end_ns = 0  # type: ignore[misc]  # frozen: the point of the check


def test_trace_context_of_a_new_trace_equals_the_constructor() -> None:
    padded = 0
    for seed in range(64):  # ids with leading zero digits among them: padded as ``:032x`` pads
        random.seed(seed)
        headers: dict[str, str] = {}
        ctx = inject(headers)
        random.seed(seed)
        trace = f"{random.getrandbits(128) or 1:032x}"
        span = f"{random.getrandbits(64):016x}"
        assert type(ctx) is TraceContext and ctx == TraceContext(trace, span)
        assert hash(ctx) == hash(TraceContext(trace, span))
        assert headers == {"traceparent": f"00-{trace}-{span}-01"}
        padded += trace.startswith("0") + span.startswith("0")
    assert padded


def test_trace_context_under_a_callers_parent_equals_the_constructor() -> None:
    headers = {"traceparent": f"00-{'1' * 32}-{'2' * 16}-00"}
    ctx = inject(headers)
    checked = TraceContext("1" * 32, ctx.span_id, "2" * 16, sampled=False)
    assert type(ctx) is TraceContext and ctx == checked and hash(ctx) == hash(checked)
    assert headers["traceparent"] == f"00-{'1' * 32}-{ctx.span_id}-00" == ctx.traceparent


@pytest.mark.parametrize("total", [0.0, 0.25, 59.999_987, 3600.0])
def test_client_timeout_built_in_slots_equals_the_constructor(total: float) -> None:
    built = _client_timeout(total)
    checked = aiohttp.ClientTimeout(total=total, ceil_threshold=1e9)
    assert type(built) is aiohttp.ClientTimeout
    # every field aiohttp defines is set, to the constructor's value
    for field in attrs.fields(aiohttp.ClientTimeout):
        assert getattr(built, field.name) == getattr(checked, field.name), field.name
    assert built == checked and hash(built) == hash(checked)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.total = 1.0  # type: ignore[misc]  # frozen: the point of the check


def test_only_slotted_classes_get_a_twin() -> None:
    class Plain:
        pass

    with pytest.raises(TypeError, match="not a slotted class"):
        unfrozen(Plain)
