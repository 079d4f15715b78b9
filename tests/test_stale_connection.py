"""A pooled connection the server has closed: found at checkout, or retried once, never hidden.

llama.cpp's ``llama-server`` ends a streamed response with ``Keep-Alive: timeout=5, max=100``
and then closes the connection. The server here does the same, in a thread of its own: a
request sent at once after such a response finds its pooled connection dead while our event
loop has not yet read the FIN. The test blocks the loop until the server has closed the socket
(so the FIN is in our kernel but unread), then sends: exactly the case a real client hits.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

import latency_analyzer as la
from latency_analyzer.capture import connector

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
_SSE = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n'
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Connection: keep-alive\r\nKeep-Alive: timeout=5, max=100\r\n\r\n"
)
_OK = b'{"ok": true}'
_OK_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    b"Connection: keep-alive\r\n\r\n%s" % (len(_OK), _OK)
)


@dataclass
class _ScriptedServer:
    """HTTP/1.1 on 127.0.0.1, one thread per connection; the n-th request (counted over all
    connections) is answered as ``script[n]`` says:

    * ``stream_close``: a chunked SSE response announcing keep-alive, then close (FIN);
    * ``stream_rst``: the same response, then, once ``go_reset`` is set, an RST;
    * ``ok``: a small JSON response, the connection kept;
    * ``drop``: the request read, the connection closed without a response;
    * ``partial``: half a status line, then close.
    """

    script: list[str]
    requests: list[tuple[int, str]] = field(default_factory=list)  # (connection, request line)
    connections: int = 0
    closed: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    go_reset: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def wait_closed(self, timeout: float = 5.0) -> None:
        """Block (the caller's event loop too) until the server closed one more connection."""
        assert self.closed.acquire(timeout=timeout), "the server did not close the connection"

    def stop(self) -> None:
        self._listener.close()
        for thread in self._threads:
            thread.join(5)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                number = self.connections
            thread = threading.Thread(target=self._serve, args=(sock, number), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        reader = sock.makefile("rb")
        try:
            while True:
                line = reader.readline(65536)
                if not line:
                    return
                length = 0
                while (header := reader.readline(65536)) not in (b"\r\n", b""):
                    name, _, value = header.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                reader.read(length)
                with self._lock:
                    self.requests.append((number, line.decode().strip()))
                    action = self.script[len(self.requests) - 1]
                if action == "ok":
                    sock.sendall(_OK_RESPONSE)
                    continue
                if action in ("stream_close", "stream_rst"):
                    chunk = b"%x\r\n%s\r\n" % (len(_SSE), _SSE)
                    sock.sendall(_STREAM_HEAD + chunk + b"0\r\n\r\n")
                if action == "stream_rst":  # after the client has read the response
                    self.go_reset.wait(5)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                elif action == "partial":
                    sock.sendall(b"HTTP/1.1 2")
                return  # stream_close, drop, partial: close
        finally:
            reader.close()
            sock.close()
            self.closed.release()


Scripted = Callable[[list[str]], _ScriptedServer]


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    made: list[_ScriptedServer] = []

    def make(script: list[str]) -> _ScriptedServer:
        server = _ScriptedServer(script)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


def _stage_names(wf: la.Waterfall) -> list[str]:
    return [s.name for s in wf.root.children]


def _check_sums(wf: la.Waterfall) -> None:
    names = _stage_names(wf)
    assert len(names) == len(set(names)), names  # no stage of the failed attempt left over
    assert sum(wf.attribution_ns().values()) == wf.e2e_ns


async def test_a_connection_closed_after_a_stream_is_found_at_checkout(scripted: Scripted) -> None:
    server = scripted(["stream_close", "stream_close"])
    async with la.Client(server.url, timeout=10) as client:
        first = await client.request("/v1/chat/completions", json=BODY)
        server.wait_closed()  # the FIN is in our kernel; our loop has not read it
        second = await client.request("/v1/chat/completions", json=BODY)
    assert first.ok and second.ok, (first.error, second.error)
    assert second.connection.reused is False
    assert second.attributes["stale.discarded"] == 1
    assert "stale.retry_error_type" not in second.attributes
    assert server.connections == 2 and len(server.requests) == 2
    _check_sums(second)


async def test_a_request_that_could_not_be_written_is_retried_on_a_new_connection(
    scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the checkout test switched off: the failure itself must be caught. An RST, not a FIN:
    # the send syscall then fails, so no request byte reaches the kernel, whichever of the
    # send and the loop's read of the RST comes first
    monkeypatch.setattr(connector, "peer_closed", lambda proto: False)
    server = scripted(["stream_rst", "stream_close"])
    async with la.Client(server.url, timeout=10) as client:
        first = await client.request("/v1/chat/completions", json=BODY)
        server.go_reset.set()
        server.wait_closed()
        second = await client.request("/v1/chat/completions", json=BODY)
    assert first.ok and second.ok, (first.error, second.error)
    a = second.attributes
    assert a["stale.retry_sent"] is False  # the send syscall failed: nothing of it left
    assert a["stale.retry_connection_id"] == first.connection.connection_id
    assert second.connection.reused is False
    assert second.connection.connection_id != first.connection.connection_id
    # the failed attempt is inside pool_wait, which ends when the new connection is dialled
    pool = second.stage("pool_wait")
    connect = second.stage("connect")
    assert pool is not None and connect is not None
    assert pool.attributes["retried"] is True
    assert pool.end_ns <= connect.start_ns
    retry_ms = a["stale.retry_ms"]  # the failed attempt, inside the reopened pool_wait
    assert isinstance(retry_ms, float) and 0 <= retry_ms * 1e6 <= pool.end_ns - pool.start_ns
    assert server.connections == 2 and len(server.requests) == 2
    _check_sums(second)


async def test_a_get_sent_on_a_dead_connection_is_sent_again(scripted: Scripted) -> None:
    server = scripted(["ok", "drop", "ok"])
    async with la.Client(server.url, timeout=10) as client:
        first = await client.request("/a")
        second = await client.request("/b")
    assert first.ok and second.ok, (first.error, second.error)
    assert second.attributes["stale.retry_sent"] is True
    assert second.attributes["stale.retry_error_type"] == "ServerDisconnectedError"
    assert [n for n, _ in server.requests] == [1, 1, 2]
    _check_sums(second)


async def test_an_unanswered_post_is_sent_once_more(scripted: Scripted) -> None:
    # the server's FIN crossing the request on the wire: read, then closed without an answer
    server = scripted(["ok", "drop", "ok"])
    async with la.Client(server.url, timeout=10) as client:
        await client.request("/a")
        second = await client.request("/v1/chat/completions", json=BODY)
    assert second.ok, second.error
    assert second.attributes["stale.retry_sent"] is True  # the server may have it twice: said
    assert [n for n, _ in server.requests] == [1, 1, 2]
    _check_sums(second)


async def test_a_retry_that_breaks_too_is_not_retried_again(scripted: Scripted) -> None:
    server = scripted(["ok", "drop", "drop", "ok"])
    async with la.Client(server.url, timeout=10) as client:
        await client.request("/a")
        second = await client.request("/b")
    assert not second.ok
    assert second.error_type == "disconnected"  # the retry met the same fate: its own error
    assert second.attributes["stale.retry_error_type"] == "ServerDisconnectedError"
    assert [n for n, _ in server.requests] == [1, 1, 2]  # sent twice, never a third time
    _check_sums(second)


async def test_no_retry_once_response_bytes_arrived(scripted: Scripted) -> None:
    server = scripted(["ok", "partial", "ok"])
    async with la.Client(server.url, timeout=10) as client:
        await client.request("/a")
        second = await client.request("/b")  # idempotent, yet half a status line came back
    assert not second.ok
    assert not any(k.startswith("stale.") for k in second.attributes)
    assert server.connections == 1 and len(server.requests) == 2
    _check_sums(second)
