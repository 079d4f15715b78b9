"""TCP_INFO: decoded from the kernel's struct, read at connect and at each request's end."""

from __future__ import annotations

import struct
import sys
import time

import pytest
from conftest import assert_exact

import latency_analyzer as la
from latency_analyzer.capture._tcpinfo import decode_tcp_info
from latency_analyzer.report.har import har_entry
from latency_analyzer.report.row_exports import TCP_COLUMNS, to_csv
from latency_analyzer.testing import H2LLMServer, LLMServer, TestCA
from latency_analyzer.timeline import process_anchor


def _struct(length: int) -> bytes:
    """A ``struct tcp_info`` with recognisable values at the kernel's offsets."""
    raw = bytearray(length)
    for fmt, offset, value in (
        ("B", 2, 4),  # retransmits
        ("I", 8, 201_000),  # rto
        ("I", 32, 2),  # lost
        ("I", 68, 20_123),  # rtt
        ("I", 72, 500),  # rttvar
        ("I", 80, 10),  # snd_cwnd
        ("I", 88, 3),  # reordering
        ("I", 100, 7),  # total_retrans
        ("I", 136, 99),  # segs_out
        ("I", 148, 20_001),  # min_rtt
        ("Q", 160, 1_250_000),  # delivery_rate
        ("Q", 208, 4096),  # bytes_retrans
        ("I", 224, 5),  # rcv_ooopack
    ):
        if offset + struct.calcsize(fmt) <= length:
            struct.pack_into("=" + fmt, raw, offset, value)
    return bytes(raw)


def test_fields_are_read_at_the_kernel_offsets() -> None:
    info = decode_tcp_info(_struct(232), at_ns=5)
    assert info is not None
    assert (info.rtt_us, info.rttvar_us, info.min_rtt_us, info.rto_us) == (
        20_123,
        500,
        20_001,
        201_000,
    )
    assert (info.retransmits, info.total_retrans, info.lost, info.reordering) == (4, 7, 2, 3)
    assert (info.snd_cwnd, info.delivery_rate, info.bytes_retrans) == (10, 1_250_000, 4096)
    assert (info.segs_out, info.rcv_ooopack, info.at_ns) == (99, 5, 5)


def test_an_older_kernels_shorter_struct_leaves_the_newer_fields_out() -> None:
    info = decode_tcp_info(_struct(104), at_ns=0)  # up to tcpi_total_retrans (Linux 2.6)
    assert info is not None and info.total_retrans == 7
    assert info.min_rtt_us is None and info.delivery_rate is None and info.rcv_ooopack is None
    assert decode_tcp_info(_struct(60), at_ns=0) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO is Linux's")
async def test_a_request_carries_the_connection_readings_into_its_exports() -> None:
    async with LLMServer() as llm:
        async with la.Client(llm.url) as client:
            first = await client.request("/health")
            first_returned = time.perf_counter_ns()
            second = await client.request("/health")  # reuses the connection
            second_returned = time.perf_counter_ns()
    slack = process_anchor().uncertainty_ns  # end_ns is a kernel stamp mapped onto perf ns
    for wf, returned in ((first, first_returned), (second, second_returned)):
        assert wf.ok and wf.tcp_connect is not None and wf.tcp_end is not None
        assert_exact(wf)
        assert wf.tcp_end.total_retrans == 0 and wf.tcp_end.lost == 0  # loopback loses nothing
        assert 0 < wf.tcp_end.rtt_us < 20_000  # loopback: microseconds
        # read by our loop once it had read the response's last byte, before the request
        # returned: how long after the byte's arrival is the loop's lateness, so no fixed bound
        assert wf.end_ns - slack <= wf.tcp_end.at_ns <= returned
        assert la.Waterfall.from_dict(wf.to_dict()) == wf
    # read once set up, and again after each request: the segments the requests sent show
    assert first.tcp_connect is not None and first.tcp_end is not None
    assert second.tcp_connect == first.tcp_connect  # the same connection's set-up reading
    assert first.tcp_connect.segs_out is not None and first.tcp_end.segs_out is not None
    assert first.tcp_end.segs_out > first.tcp_connect.segs_out
    assert second.tcp_end is not None and second.tcp_end.at_ns > first.tcp_end.at_ns
    header, row = to_csv([first, second]).splitlines()[1:3]
    assert header.endswith(",".join(TCP_COLUMNS))
    assert row.endswith(f"{first.tcp_end.rtt_us / 1e3},{first.tcp_end.min_rtt_us / 1e3},0,0,"
                        f"{first.tcp_end.snd_cwnd}")  # fmt: skip
    har = har_entry(second)["_latency_analyzer"]
    assert har["tcp_end"]["rtt_us"] == second.tcp_end.rtt_us
    assert second.summary()["tcp"] == pytest.approx(
        {"rtt_s": second.tcp_end.rtt_us / 1e6, "min_rtt_s": second.tcp_end.min_rtt_us / 1e6,
         "total_retrans": 0, "lost": 0}
    )  # fmt: skip


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO is Linux's")
async def test_a_connection_its_response_closed_has_no_end_reading() -> None:
    """The end reading is taken while aiohttp still holds the connection's transport: one
    closed with its response (no keep-alive) keeps its set-up reading only."""
    async with LLMServer() as llm:
        async with la.Client(llm.url, keepalive=False) as client:
            wf = await client.request("/health")
    assert wf.ok and wf.connection.requests_before == 0
    assert wf.tcp_connect is not None and wf.tcp_end is None


def test_a_waterfall_without_readings_serialises_as_before() -> None:
    wf = la.Waterfall(root=la.Span("request", 0, 10), method="GET", url="http://x/")
    assert "tcp_connect" not in wf.to_dict() and "tcp_end" not in wf.to_dict()
    assert "tcp" not in wf.summary()


async def test_http2_streams_read_the_connection_at_their_end(ca: TestCA) -> None:
    async with H2LLMServer(ssl=ca.server_context()) as server:
        async with la.Client(server.url, ssl=ca.client_context()) as client:
            first = await client.request("/health")
            second = await client.request("/health")  # a stream on the same connection
    assert first.http_version == second.http_version == "2"
    assert first.tcp_connect is not None  # the stream that opened the connection
    for wf in (first, second):
        assert wf.ok and wf.tcp_end is not None and wf.tcp_end.total_retrans == 0
        assert_exact(wf)
    assert first.tcp_end is not None and second.tcp_end is not None
    assert second.tcp_end.at_ns > first.tcp_end.at_ns
