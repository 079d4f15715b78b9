"""The connector's sockets: a handshake finished inside ``connect`` is reported at once.

Ground truth is the kernel's: ``getpeername`` on the socket, and a listener whose queue is
full (its SYNs go unanswered), which keeps a loopback connect pending.
"""

from __future__ import annotations

import errno
import select
import socket
from collections.abc import Iterator

import pytest

import latency_analyzer as la
from latency_analyzer.capture._dial import _PromptSocket, _socket_factory
from latency_analyzer.testing import LLMServer

ADDR = (socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", 0))


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0), backlog=0) as srv:
        yield srv


def test_a_loopback_handshake_is_done_when_connect_returns(listener: socket.socket) -> None:
    sock = _socket_factory(ADDR)
    assert isinstance(sock, _PromptSocket)
    with sock:
        sock.setblocking(False)
        sock.connect(listener.getsockname())  # no BlockingIOError: connected already
        assert sock.getpeername() == listener.getsockname()


def test_a_pending_handshake_is_left_to_the_event_loop(listener: socket.socket) -> None:
    """A full accept queue drops SYNs: connect stays pending and says so, as a plain socket."""
    opened: list[socket.socket] = []
    try:
        for _ in range(16):
            sock = _socket_factory(ADDR)
            opened.append(sock)
            sock.setblocking(False)
            try:
                sock.connect(listener.getsockname())
            except BlockingIOError:
                with pytest.raises(OSError):
                    sock.getpeername()  # really not connected
                return
        pytest.fail("the accept queue never filled: no connect stayed pending")
    finally:
        for sock in opened:
            sock.close()


def test_a_refused_connect_is_left_to_the_event_loop_with_its_error() -> None:
    """Non-blocking, as aiohttp connects: no handshake, so connect says pending, and the
    socket carries ECONNREFUSED for asyncio's writability callback to raise."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
    sock = _socket_factory(ADDR)
    with sock:
        sock.setblocking(False)
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            select.select([], [sock], [], 2.0)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED
        except ConnectionRefusedError:
            pass  # a kernel that refuses within the call: raised as is, as before
        else:
            pytest.fail("connected to a closed port")


async def test_the_client_connects_through_it_and_times_the_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """End to end: the client's connect went through the prompt path (connected inside the
    call), connect is a loopback handshake (< 5 ms), and a refused port is still a recorded
    connect error."""
    outcomes: list[str] = []
    real = _PromptSocket.connect

    def spy(self: _PromptSocket, address: object) -> None:
        try:
            real(self, address)
        except OSError as exc:
            outcomes.append(type(exc).__name__)
            raise
        outcomes.append("connected")

    monkeypatch.setattr(_PromptSocket, "connect", spy)
    async with LLMServer(prefill=0.005, tokens=2) as server, la.Client(server.url) as client:
        wf = await client.request("/v1/chat/completions", json={"messages": [], "stream": True})
        port = server.port
    assert wf.ok, wf.error
    assert outcomes == ["connected"]
    assert 0 < wf.attribution()["connect"] < 0.005
    async with la.Client() as client:
        failed = await client.request(f"http://127.0.0.1:{port}/v1/chat/completions", json={})
    assert not failed.ok and failed.error_type is not None
    assert "connect" in failed.attribution()
    assert outcomes[1:] in (["BlockingIOError"], ["ConnectionRefusedError"])


def test_without_a_kernel_rtt_sample_the_connect_end_says_userspace() -> None:
    """No handshake, no ``tcpi_rtt``: the end is the instant we had, and it says so."""
    from latency_analyzer.capture._dial import _handshake_end

    sock = _socket_factory(ADDR)
    with sock:
        assert sock.handshake_rtt_ns() is None
        assert _handshake_end(sock, 1_000, 5_000) == (5_000, "userspace")


def test_a_handshake_ends_at_its_start_plus_the_kernels_rtt(listener: socket.socket) -> None:
    """Connected on loopback: the kernel's sample is microseconds, and the end is start + it."""
    from latency_analyzer.capture._dial import _handshake_end

    sock = _socket_factory(ADDR)
    with sock:
        sock.connect(listener.getsockname())
        rtt = sock.handshake_rtt_ns()
        assert rtt is not None and 0 < rtt < 5_000_000
        assert _handshake_end(sock, 1_000, 10**12) == (1_000 + rtt, "kernel")
        assert _handshake_end(sock, 1_000, 1_000)[1] == "userspace"  # later than now: not kept
