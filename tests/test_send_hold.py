"""Requests prepared before their instant and sent at it (``capture._hold``).

A request asked for with an ``intended_start_ns`` still to come does its client work at once
and hands its bytes to the kernel at the instant. The truths: a packet capture on ``lo`` (the
kernel's stamp of each segment, which no load on this process moves) for when the bytes left,
and the test-bed server's own log for when each request arrived. Nothing here bounds how
close to the instant the bytes leave (that is a benchmark's figure, ``bench_overhead.py``'s
``presend_100``); what is asserted is order: nothing leaves before its instant, every
waterfall starts at it, and a stamp never follows the segment it describes.
"""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from conftest import chat_body

import latency_analyzer as la
from latency_analyzer.capture import _hold
from latency_analyzer.capture._wire import kernel_stamps_supported
from latency_analyzer.testing import H2LLMServer, SubprocessLLMServer
from latency_analyzer.testing.pcap import PacketCapture, require_tcpdump
from latency_analyzer.timeline import process_anchor

LLM_KNOBS = {"header_delay": 0.002}
N = 20
ANCHOR_NS = 20_000  # how far apart the anchor may map two instants of different clocks
CHAT = "/v1/chat/completions"


def _perf(epoch_ns: int) -> int:
    return process_anchor().to_perf_ns(epoch_ns)


def _no_span_before(wf: la.Waterfall, t_ns: int) -> None:
    assert wf.start_ns == t_ns, wf
    for span in wf.root.walk():
        assert span.start_ns >= t_ns, (span.name, span.start_ns - t_ns)


@pytest.mark.skipif(kernel_stamps_supported() is not None, reason=str(kernel_stamps_supported()))
async def test_requests_due_together_leave_at_their_instant(llm: SubprocessLLMServer) -> None:
    """20 requests due at one instant on kept-alive connections: each is prepared at once,
    its request segment crosses ``lo`` at or after the instant (never before), its ``send``
    stamp (the instant before the syscall) precedes that segment, and its waterfall starts at
    the instant with no stage before it."""
    require_tcpdump()
    async with la.Client(llm.url, limit=N) as client:
        with PacketCapture(llm.port) as cap:
            warm = await asyncio.gather(*(client.request("/health") for _ in range(N)))
            assert all(wf.ok for wf in warm)
            due = time.perf_counter_ns() + 100_000_000
            asked = time.perf_counter_ns()
            wfs = await asyncio.gather(
                *(client.request("/health", intended_start_ns=due) for _ in range(N))
            )
        assert asked < due  # asked ahead: the requests were held, not late
    assert all(wf.ok and wf.connection.reused for wf in wfs), [wf.error for wf in wfs]
    for wf in wfs:
        _no_span_before(wf, due)
        lag = wf.stage("schedule_lag")
        assert lag is not None and lag.duration_ns == 0  # not started late: prepared ahead
        pool = wf.stage("pool_wait")
        assert pool is not None and pool.duration_ns == 0  # the connection was taken earlier
    flows = cap.flows()
    assert len(flows) == N
    left = []
    for flow in flows:
        out = flow.data("out")
        second = out.index(b"GET ", 1)  # each connection carried the warm-up, then the held one
        left.append(_perf(flow.time_of_byte("out", second)))
    # the capture's stamps are CLOCK_REALTIME, mapped through the process anchor: the order
    # of two instants microseconds apart is held to the mapping's precision (as in
    # test_wire_capture), nothing looser
    assert min(left) >= due - ANCHOR_NS, (min(left) - due) / 1e3
    # each segment follows its own send stamp, so the k-th earliest follows the k-th earliest
    sends = sorted(wf.stage("send").start_ns for wf in wfs)  # type: ignore[union-attr]
    for send, wire in zip(sends, sorted(left), strict=True):
        assert due <= send <= wire + ANCHOR_NS, (send - due, wire - send)


async def test_a_request_that_needs_a_connection_dials_at_its_instant(
    llm: SubprocessLLMServer,
) -> None:
    """No pooled connection: the request waits for its instant before it dials, so its
    ``connect`` is measured as it happens (the server's log: it arrived after the instant)."""
    before = len(llm.records)
    async with la.Client(llm.url) as client:
        due = time.perf_counter_ns() + 50_000_000
        wf = await client.request(CHAT, json=chat_body(stream=False), intended_start_ns=due)
    assert wf.ok, wf.error
    _no_span_before(wf, due)
    connect = wf.stage("connect")
    assert connect is not None and connect.start_ns >= due
    assert not wf.connection.reused
    (record,) = llm.records[before:]
    assert record.received_ns > connect.end_ns >= due


async def test_cancelled_before_its_instant_sends_nothing(llm: SubprocessLLMServer) -> None:
    """Cancelled while held: no byte leaves (the server never sees it) and the row says it
    was cancelled, with no stage before its instant."""
    async with la.Client(llm.url) as client:
        assert (await client.request(CHAT, json=chat_body())).ok
        before = len(llm.records)
        due = time.perf_counter_ns() + 300_000_000
        rows: list[la.Waterfall] = []
        task = asyncio.ensure_future(
            client.request(CHAT, json=chat_body(), intended_start_ns=due, on_cancel=rows.append)
        )
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(max(0.0, (due - time.perf_counter_ns()) / 1e9) + 0.1)
        assert len(llm.records) == before  # nothing was sent, not even at the instant
        assert (await client.request(CHAT, json=chat_body())).ok  # and the client goes on
        assert len(llm.records) == before + 1
    (row,) = rows
    assert row.error_type == "cancelled" and row.stage("send") is None
    _no_span_before(row, due)


class _Writer:
    def __init__(self, log: list[tuple[str, bytes, int]], name: str) -> None:
        self.log, self.name = log, name

    def send_held(self, data: bytes) -> int:
        t = time.perf_counter_ns()
        self.log.append((self.name, data, t))
        return t

    def settle_held(self, before_ns: int) -> None:
        self.log.append((self.name, b"settled", before_ns))


@pytest.mark.parametrize("kernel_timer", [True, False])
async def test_schedule_releases_each_instant_once_in_order(
    kernel_timer: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two instants, two requests each: every write of an instant goes out (joined per
    writer, in write order) before any bookkeeping, never before the instant, and the later
    instant after the earlier; a dropped hold sends nothing. With asyncio's timers instead of
    a timerfd the order and the never-early rule are the same."""
    if not kernel_timer:
        monkeypatch.setattr(_hold, "kernel_timer", lambda: None)
    loop = asyncio.get_running_loop()
    schedule = _hold.SendSchedule(loop)
    assert schedule.kernel_timer is (kernel_timer and sys.platform.startswith("linux"))
    log: list[tuple[str, bytes, int]] = []
    now = time.perf_counter_ns()
    first, second = now + 30_000_000, now + 60_000_000
    a, b, c, dropped = (schedule.hold(t) for t in (second, first, first, second))
    a.add(_Writer(log, "a"), b"A")
    wb = _Writer(log, "b")
    b.add(wb, b"B1")
    b.add(wb, b"B2")
    c.add(_Writer(log, "c"), b"C")
    dropped.add(_Writer(log, "d"), b"D")
    dropped.drop()
    await asyncio.wait_for(a.wait(), 1.0)
    assert b.released and c.released and a.released
    names = [(name, data) for name, data, _ in log]
    assert names == [
        ("b", b"B1B2"),
        ("c", b"C"),
        ("b", b"settled"),
        ("c", b"settled"),
        ("a", b"A"),
        ("a", b"settled"),
    ]
    sent = {name: t for name, data, t in log if data != b"settled"}
    assert sent["b"] >= first and sent["c"] >= first and sent["a"] >= second
    schedule.close()


async def test_an_http2_stream_waits_for_its_instant() -> None:
    """On a pooled HTTP/2 connection the stream is opened at its instant (the connection's
    writes are shared, so nothing is held): the server's log receives it after the instant."""
    async with H2LLMServer(tokens=2) as server:
        async with la.Client(server.url, http2=True) as client:
            assert (await client.request(CHAT, json=chat_body())).ok
            due = time.perf_counter_ns() + 50_000_000
            wf = await client.request(CHAT, json=chat_body(), intended_start_ns=due)
        record = server.records[-1]
    assert wf.ok and wf.http_version == "2" and wf.connection.reused, wf.error
    _no_span_before(wf, due)
    send = wf.stage("send")
    assert send is not None and due <= send.start_ns <= record.received_ns
