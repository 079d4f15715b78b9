"""A new TLS connection's handshake runs in a worker thread and our own transport carries it.

Truth: a packet capture on ``lo`` (what left in which segment), the bytes a server received
(digests), and the protocol callbacks the transport made, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from conftest import assert_exact, chat_body, open_sockets
from handshakes import during, handshakes

import latency_analyzer as la
from latency_analyzer.capture import _tlsthread, connector
from latency_analyzer.capture._dial import _PromptSocket
from latency_analyzer.capture._tlstransport import TlsTransport
from latency_analyzer.testing import ALPNLLMServer, H2LLMServer, TestCA
from latency_analyzer.testing.pcap import require_tcpdump
from latency_analyzer.testing.tcpdump import TcpDump

CHAT = "/v1/chat/completions"


async def test_the_request_leaves_in_the_segment_of_the_finished(
    ca: TestCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread sends the client's Finished and the first flight (preface, SETTINGS,
    HEADERS, encoded by the loop meanwhile) in one ``send``: on the wire, the client's first
    bytes after the server's flight carry both, and nothing of the client's came between
    its ClientHello and them. The request's ``send`` starts at that syscall."""
    require_tcpdump()
    flights: list[int] = []
    encode = connector._Flight.encode

    def encoded(self: connector._Flight) -> bytes | None:
        data = encode(self)
        flights.append(len(data or b""))
        return data

    monkeypatch.setattr(connector._Flight, "encode", encoded)
    server = H2LLMServer(ssl=ca.server_context(alpn=("h2",)), tokens=3)
    async with server:
        port = int(server.url.rsplit(":", 1)[1])
        with TcpDump(f"tcp port {port}") as capture:
            async with la.Client(server.url, ssl=ca.client_context(), http2=True) as client:
                wf = await client.request(CHAT, json=chat_body())
    assert wf.ok and wf.http_version == "2" and wf.output_tokens == 3, wf.error
    assert_exact(wf)
    (flight,) = flights
    assert flight > 24 + 9  # the preface and a frame at least
    hs = during(handshakes(capture.packets(), port), wf.root.start_ns, wf.root.end_ns)
    assert hs.hello_ns is not None and hs.second_ns is not None
    first_t, first_len = hs.client_bytes[0]
    assert first_t == hs.second_ns
    # a TLS 1.3 Finished is one record of 5 + 32 + 4 + 16 + 1 bytes; the flight's records
    # come on top, each at least as long as its plaintext
    assert first_len >= 58 + flight, (first_len, flight)
    sent = wf.stages["send"].start_ns
    # the send syscall was entered before its segment crossed ``lo``, within the syscall
    assert 0 <= hs.second_ns - sent < 5_000_000, hs.second_ns - sent


# -- HTTP/1.1 over the transport: what a server that does not speak h2 gets --


_uploads: list[tuple[int, str]] = []


@pytest.fixture
async def bulk_server(ca: TestCA) -> AsyncIterator[str]:
    """An HTTPS (HTTP/1.1 only) server: POST /up notes the body's length and SHA-256 in
    ``_uploads``, GET /down/N answers N bytes (with their Content-Length)."""
    _uploads.clear()

    async def up(request: web.Request) -> web.Response:
        body = await request.read()
        _uploads.append((len(body), hashlib.sha256(body).hexdigest()))
        return web.Response(text="ok")

    async def down(request: web.Request) -> web.StreamResponse:
        n = int(request.match_info["n"])
        resp = web.StreamResponse()
        resp.content_length = n
        await resp.prepare(request)
        chunk = bytes(range(256)) * 256
        while n:
            take = min(n, len(chunk))
            await resp.write(chunk[:take])
            n -= take
        return resp

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/up", up)
    app.router.add_get("/down/{n}", down)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ca.server_context(alpn=("http/1.1",)))
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_http11_bodies_cross_our_transport_whole(bulk_server: str, ca: TestCA) -> None:
    """A client offering h2 to a server that chose HTTP/1.1 speaks it over the thread's TLS
    session: a 1 MB upload and a 16 MiB download arrive whole, and the connection is reused
    between them (the transport's own back-up and drain are tested below)."""
    body = hashlib.sha256(b"seed").digest() * 31250  # 1 MB: aiohttp warns of larger bytes
    async with la.Client(bulk_server, ssl=ca.client_context()) as client:
        up = await client.request("/up", data=body)
        down = await client.request("/down/16777216")  # short of its Content-Length: failed
    for wf in (up, down):
        assert wf.ok and wf.http_version == "1.1", wf.error
        assert_exact(wf)
        assert wf.tls is not None and wf.tls.alpn == "http/1.1"
    assert down.connection.reused and down.connection.connection_id == up.connection.connection_id
    assert _uploads == [(len(body), hashlib.sha256(body).hexdigest())]


# -- the transport itself, against a plain asyncio TLS server --


class _Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.data = bytearray()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.calls.append("made")

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> None:
        self.calls.append("eof")

    def pause_writing(self) -> None:
        self.calls.append("pause")

    def resume_writing(self) -> None:
        self.calls.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append("lost")
        self.lost.set_result(exc)


async def _dial(port: int, ca: TestCA) -> tuple[TlsTransport, _Recorder]:
    loop = asyncio.get_running_loop()
    sock = _PromptSocket(socket.AF_INET, socket.SOCK_STREAM, 0)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    ctx = ca.client_context()
    done = await _tlsthread.handshake_in_thread(sock, ctx, "localhost", 5.0)
    return _carry(loop, sock, ctx, done)


def _carry(
    loop: asyncio.AbstractEventLoop,
    sock: _PromptSocket,
    ctx: ssl.SSLContext,
    done: _tlsthread.Handshaken,
) -> tuple[TlsTransport, _Recorder]:
    transport = TlsTransport(
        loop, sock, done.obj, done.incoming, done.outgoing, ctx, done.early, done.unsent, done.ended
    )
    proto = _Recorder()
    transport.start(proto)
    return transport, proto


async def test_the_transport_backs_up_drains_and_closes_with_close_notify(ca: TestCA) -> None:
    """Writes beyond what the kernel takes pause the protocol and resume it once drained;
    every byte arrives in order; ``close`` sends TLS's close_notify after them (the server
    reads a clean end of stream) and the protocol loses the connection once."""
    got = bytearray()
    server_done = asyncio.Event()
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()  # nothing read until the client has backed up
        while data := await reader.read(1 << 20):  # b"": the client's close_notify
            got.extend(data)
        writer.close()
        server_done.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ca.server_context())
    port = server.sockets[0].getsockname()[1]
    async with server:
        transport, proto = await _dial(port, ca)
        transport.set_write_buffer_limits(high=1, low=0)
        payload = bytes(range(251)) * (32 * 1024 * 1024 // 251)
        for i in range(0, len(payload), 1 << 20):
            transport.write(payload[i : i + (1 << 20)])
        assert proto.calls == ["made", "pause"] and transport.get_write_buffer_size() > 0
        release.set()
        transport.close()
        transport.close()  # a second close changes nothing
        assert transport.is_closing()
        await asyncio.wait_for(server_done.wait(), 30)
        assert await asyncio.wait_for(proto.lost, 5) is None
    assert bytes(got) == payload
    assert proto.calls == ["made", "pause", "resume", "lost"]


async def test_the_peers_close_notify_is_an_end_of_stream(ca: TestCA) -> None:
    """The server answers and closes (close_notify, then FIN): the protocol gets the bytes,
    ``eof_received`` and ``connection_lost`` once, in that order."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello and goodbye")
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ca.server_context())
    port = server.sockets[0].getsockname()[1]
    async with server:
        transport, proto = await _dial(port, ca)
        assert await asyncio.wait_for(proto.lost, 5) is None
    assert bytes(proto.data) == b"hello and goodbye"
    assert proto.calls == ["made", "eof", "lost"]
    assert transport.is_closing()


async def test_abort_loses_the_connection_at_once_and_drops_what_was_buffered(
    ca: TestCA,
) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client goes

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ca.server_context())
    port = server.sockets[0].getsockname()[1]
    async with server:
        transport, proto = await _dial(port, ca)
        transport.write(b"x" * (16 * 1024 * 1024))  # more than the socket takes at once
        assert transport.get_write_buffer_size() > 0
        transport.abort()
        assert transport.get_write_buffer_size() == 0
        transport.write(b"after")  # ignored: the transport is closing
        assert await asyncio.wait_for(proto.lost, 5) is None
    assert proto.calls == ["made", "pause", "lost"]


# -- the thread's life --


async def test_a_closed_client_wakes_the_handshake_thread(
    ca: TestCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that accepts and never answers the ClientHello holds the worker thread in
    ``recv``; closing the Client ends the request in ``tls`` as closed, and shuts the socket
    down, which frees the thread at once, not when its socket timeout runs out."""
    started: list[float] = []
    ended: list[float] = []
    handshake = _tlsthread._handshake

    def timed(*args: object) -> object:
        started.append(time.monotonic())
        try:
            return handshake(*args)  # type: ignore[arg-type]
        finally:
            ended.append(time.monotonic())

    monkeypatch.setattr(_tlsthread, "_handshake", timed)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        client = la.Client(ssl=ca.client_context(), timeout=60)
        task = asyncio.ensure_future(client.request(f"https://127.0.0.1:{port}/"))
        for _ in range(500):  # until the thread has the handshake
            if started or task.done():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # its ClientHello out, the thread waits in recv
        assert started and not ended
        closed_at = time.monotonic()
        await client.close()
        wf = await asyncio.wait_for(task, 5)
        for _ in range(100):
            if ended:
                break
            await asyncio.sleep(0.01)
    assert wf.error_type == "closed" and "tls" in wf.stages, (wf.error_type, wf.error)
    assert ended and ended[0] - closed_at < 1.0


async def test_a_handshake_failure_reaches_the_caller_and_closes_the_socket(
    ca: TestCA,
) -> None:
    """A certificate the client does not trust: the thread's error reaches the caller as
    aiohttp's certificate error would, and no socket is left open."""
    other = TestCA()
    async with H2LLMServer(ssl=other.server_context(alpn=("h2",))) as server:
        before = open_sockets()
        async with la.Client(server.url, ssl=ca.client_context(), http2=True) as client:
            wf = await client.request(CHAT, json=chat_body())
        await asyncio.sleep(0.05)  # the server's side of the refused connection goes too
        assert open_sockets() - before == set()
    assert not wf.ok and "tls" in wf.stages
    assert "certificate" in (wf.error or "").lower(), wf.error


async def test_a_dial_never_waits_for_another_dials_handshake(ca: TestCA) -> None:
    """Twenty dials to a server that takes 2 s to answer the ClientHello hold twenty threads;
    a dial to a healthy server meanwhile gets a thread of its own at once: its waterfall
    (and its ``tls`` stage) is milliseconds long, not the stalled server's 2 s."""
    slow = ALPNLLMServer(ssl=ca.server_context(alpn=("h2",)), tls_delay=2.0, tokens=1)
    fast = H2LLMServer(ssl=ca.server_context(alpn=("h2",)), tokens=1)
    async with slow, fast:
        clients = [la.Client(ssl=ca.client_context(), timeout=10) for _ in range(21)]
        stalled = [
            asyncio.ensure_future(c.request(slow.url + CHAT, json=chat_body()))
            for c in clients[:20]
        ]
        await asyncio.sleep(0.2)  # every one of them is in its handshake
        assert not any(task.done() for task in stalled)
        wf = await clients[20].request(fast.url + CHAT, json=chat_body())
        assert not any(task.done() for task in stalled)
        slow_ones = await asyncio.gather(*stalled)  # served once the server's delay ran out
        for c in clients:
            await c.close()
    assert all(w.ok for w in slow_ones), {w.error for w in slow_ones}
    assert wf.ok and wf.http_version == "2", wf.error
    assert_exact(wf)
    assert wf.root.duration_ns < 1_000_000_000 and wf.stages["tls"].duration_ns < 1_000_000_000


async def test_a_flight_larger_than_the_send_buffer_leaves_the_thread_at_once(
    ca: TestCA,
) -> None:
    """A first flight of 64,000 bytes into a 4 KiB send buffer, the server reading nothing
    for 0.3 s: the thread hands the kernel what it takes in one send and returns (it does not
    block for the rest), the flight's send stamp is that syscall's, and the transport sends
    the rest once the server reads: every byte arrives."""
    got: list[int] = []
    reading = threading.Event()

    def serve(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with ca.server_context(alpn=("h2",)).wrap_socket(conn, server_side=True) as tls:
            time.sleep(0.3)
            reading.set()
            total = 0
            while total < 64_000 and (data := tls.recv(65536)):
                total += len(data)
            got.append(total)

    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    loop = asyncio.get_running_loop()
    sock = _PromptSocket(socket.AF_INET, socket.SOCK_STREAM, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, listener.getsockname())
    ctx = ca.client_context(alpn=("h2",))
    done = await _tlsthread.handshake_in_thread(sock, ctx, "localhost", 5.0, lambda: b"\0" * 64_000)
    assert not reading.is_set()  # back before the server read a byte of it
    assert done.unsent  # what the kernel did not take is the transport's to send
    assert done.flight_sent_ns == sock.wire.send_start_ns  # the one send after the ClientHello
    transport, proto = _carry(loop, sock, ctx, done)
    for _ in range(500):
        if got:
            break
        await asyncio.sleep(0.01)
    assert got == [64_000]
    transport.abort()
    await asyncio.wait_for(proto.lost, 5)
    listener.close()


async def test_a_close_notify_that_came_with_the_handshake_ends_the_stream(ca: TestCA) -> None:
    """A TLS 1.2 server sends its last handshake flight, data and its close_notify in one
    segment, then waits for ours before it closes (a bidirectional shutdown): the protocol
    gets the data, the end of stream and the loss at once, and the server our close_notify."""
    answered: list[bool] = []

    def serve(listener: socket.socket) -> None:
        ctx = ca.server_context()
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        conn, _ = listener.accept()
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_side=True)
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                if outgoing.pending:
                    conn.sendall(outgoing.read())
                incoming.write(conn.recv(65536))
        obj.write(b"hello and goodbye")
        with contextlib.suppress(ssl.SSLWantReadError):
            obj.unwrap()
        conn.sendall(outgoing.read())  # Finished, data and close_notify together
        conn.settimeout(5)
        try:
            answered.append(bool(conn.recv(65536)))
        except TimeoutError:
            answered.append(False)
        conn.close()

    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    _, proto = await _dial(listener.getsockname()[1], ca)
    assert await asyncio.wait_for(proto.lost, 2) is None
    assert bytes(proto.data) == b"hello and goodbye"
    assert proto.calls == ["made", "eof", "lost"]
    for _ in range(200):
        if answered:
            break
        await asyncio.sleep(0.01)
    assert answered == [True]
    listener.close()


def test_a_dial_left_in_its_handshake_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """A loop abandoned mid-handshake (a loop in a daemon thread, the process ending): the
    handshake's thread is a daemon too, so the interpreter exits at once."""
    script = tmp_path / "left.py"
    script.write_text(
        "import asyncio, socket, threading, time\n"
        "import latency_analyzer as la\n"
        "from latency_analyzer.testing import TestCA\n"
        "silent = socket.create_server(('127.0.0.1', 0))\n"
        "port = silent.getsockname()[1]\n"
        "ca = TestCA()\n"
        "async def go():\n"
        "    client = la.Client(ssl=ca.client_context(), timeout=60)\n"
        "    await client.request(f'https://127.0.0.1:{port}/')\n"
        "threading.Thread(target=lambda: asyncio.run(go()), daemon=True).start()\n"
        "time.sleep(0.5)\n"
    )
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert time.monotonic() - t0 < 30
