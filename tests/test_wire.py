"""Stamped sockets: reads carry the kernel's receive time, sends are noted, fallbacks say so.

Ground truth here is causality on one host clock: the peer's ``perf_counter_ns`` before it
sent (CLOCK_MONOTONIC), the kernel's stamp (CLOCK_REALTIME through the process anchor), and
ours after the read must come in that order. The precision against a packet capture is
tests/test_wire_capture.py's subject.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from conftest import assert_exact

import latency_analyzer as la
from latency_analyzer.capture import _wire
from latency_analyzer.errors import UsageError
from latency_analyzer.testing import LLMServer
from latency_analyzer.timeline import Recorder


@pytest.fixture
def pair() -> Iterator[tuple[_wire.StampedSocket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        client = _wire.StampedSocket(socket.AF_INET, socket.SOCK_STREAM)
        client.connect(srv.getsockname())
        peer, _ = srv.accept()
        with client, peer:
            yield client, peer


@pytest.mark.skipif(_wire.kernel_stamps_supported() is not None, reason="no kernel stamps here")
@pytest.mark.parametrize("method", ["recv", "recv_into"])
def test_a_read_carries_the_kernel_stamp_between_send_and_read(
    pair: tuple[_wire.StampedSocket, socket.socket], method: str
) -> None:
    client, peer = pair
    assert client.wire.kernel and client.wire.refused is None
    before = time.perf_counter_ns()
    peer.sendall(b"hello")
    time.sleep(0.005)  # the bytes wait in the kernel: our read is 5 ms late, the stamp is not
    if method == "recv":
        assert client.recv(100) == b"hello"
    else:
        buf = bytearray(100)
        assert client.recv_into(buf, 50) == 5 and bytes(buf[:5]) == b"hello"
    wire = client.wire
    assert wire.read_stamped
    assert before <= wire.read_kernel_ns < before + 1_000_000  # loopback: well within 1 ms
    assert wire.read_user_ns - wire.read_kernel_ns >= 5_000_000  # the lag we slept is seen


def test_sends_are_stamped_around_the_syscall(
    pair: tuple[_wire.StampedSocket, socket.socket],
) -> None:
    client, peer = pair
    client.wire.mark_request()
    before = time.perf_counter_ns()
    assert client.send(b"abc") == 3
    after = time.perf_counter_ns()
    first = client.wire.first_send_ns
    assert first is not None and before <= first <= client.wire.sent_ns <= after
    client.send(b"def")
    assert client.wire.first_send_ns == first  # the request's first byte stays the first
    assert client.wire.send_start_ns > first
    assert peer.recv(10) in (b"abcdef", b"abc")


def test_a_platform_without_kernel_stamps_reads_in_userspace_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_wire, "_UNSUPPORTED", "kernel stamps are off in this test")
    with socket.create_server(("127.0.0.1", 0)) as srv:
        client = _wire.StampedSocket(socket.AF_INET, socket.SOCK_STREAM)
        with client:
            client.connect(srv.getsockname())
            peer, _ = srv.accept()
            with peer:
                peer.sendall(b"x")
                assert client.recv(10) == b"x"
    assert not client.wire.kernel and not client.wire.read_stamped
    assert client.wire.refused == "kernel stamps are off in this test"
    assert client.wire.read_kernel_ns == client.wire.read_user_ns


async def test_waterfalls_name_their_clock_and_read_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"messages": [], "stream": True, "testbed": {"tokens": 5, "decode": 0.002}}
    async with LLMServer(prefill=0.005) as server:
        async with la.Client(server.url) as client:
            kernel = await client.request("/v1/chat/completions", json=body)
        monkeypatch.setattr(_wire, "_UNSUPPORTED", "kernel stamps are off in this test")
        async with la.Client(server.url) as client:
            user = await client.request("/v1/chat/completions", json=body)
    for wf in (kernel, user):
        assert wf.ok, wf.error
        assert_exact(wf)
        assert wf.reads >= 5  # headers and five tokens at least (some may share a read)
        assert la.Waterfall.from_dict(wf.to_dict()) == wf
    if _wire.kernel_stamps_supported() is None:
        assert kernel.clock_source == "kernel"
        assert kernel.read_lag_p50_ns is not None and kernel.read_lag_max_ns is not None
        assert 0 <= kernel.read_lag_p50_ns <= kernel.read_lag_max_ns
    assert user.clock_source == "userspace" and user.read_lag_p50_ns is None
    assert user.attributes["clock_note"] == "kernel stamps are off in this test"
    assert user.summary()["clock_source"] == "userspace"


def test_recorder_begin_knows_the_stage_vocabulary() -> None:
    rec = Recorder("GET", "http://x/", start_ns=0)
    rec.begin("connect", 1)
    with pytest.raises(UsageError, match="'conect' is not a client stage"):
        rec.begin("conect", 2)
