"""What a stamped socket's ``recv`` hands back: the bytes that came, at most as many as asked,
with the kernel's stamp, whichever thread reads (each reads into a buffer of its own)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from latency_analyzer.capture._wire import StampedSocket, kernel_stamps_supported


def _pair() -> tuple[StampedSocket, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    client = StampedSocket(socket.AF_INET, socket.SOCK_STREAM)
    client.connect(server.getsockname())
    peer, _ = server.accept()
    server.close()
    client.settimeout(5)
    return client, peer


def _read_exactly(sock: StampedSocket, size: int, bufsize: int = 256 * 1024) -> bytes:
    got = b""
    while len(got) < size:
        data = sock.recv(bufsize)
        assert data, "closed early"
        assert len(data) <= bufsize
        got += data
    return got


def test_recv_returns_what_came_and_no_more_than_asked() -> None:
    client, peer = _pair()
    try:
        for size in (1, 7, 1500, 65_536, 300_000):  # the last one over the read buffer
            body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
            peer.sendall(body)
            assert _read_exactly(client, size) == body
        peer.sendall(b"0123456789")
        first = client.recv(4)
        assert first == b"0123"
        assert _read_exactly(client, 6, bufsize=3) == b"456789"
        if kernel_stamps_supported() is None and client.wire.kernel:
            assert client.wire.read_stamped
        peer.close()
        assert client.recv(1024) == b""  # the end, as a plain socket says it
    finally:
        client.close()
        peer.close()


def test_threads_reading_at_once_each_get_their_own_bytes() -> None:
    pairs = [_pair() for _ in range(2)]
    failures: list[str] = []

    def reader(index: int) -> None:
        client, _ = pairs[index]
        got = _read_exactly(client, 300 * 4096)
        if got != bytes([65 + index]) * (300 * 4096):
            failures.append(f"thread {index} read {set(got)!r}")

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    for _ in range(300):
        for i, (_, peer) in enumerate(pairs):
            peer.sendall(bytes([65 + i]) * 4096)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for client, peer in pairs:
        client.close()
        peer.close()
    assert not any(t.is_alive() for t in threads)
    assert failures == []


@pytest.mark.skipif(kernel_stamps_supported() is not None, reason="no kernel stamps here")
def test_a_read_carries_the_kernel_stamp_of_its_bytes() -> None:
    client, peer = _pair()
    try:
        before = time.perf_counter_ns()
        peer.sendall(b"x" * 100)
        time.sleep(0.05)  # read well after the bytes came: the stamp is their arrival
        assert client.recv(4096) == b"x" * 100
        wire = client.wire
        assert wire.kernel and wire.read_stamped
        assert before <= wire.read_kernel_ns <= before + 40_000_000
        assert wire.read_user_ns - wire.read_kernel_ns >= 45_000_000
    finally:
        client.close()
        peer.close()
