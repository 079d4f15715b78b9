"""An HTTP/1.1 request body leaves in the write of its headers, inside the request's own step.

aiohttp writes a body from a task of its own (eagerly only from Python 3.12): a loop turn after
the request's headers were encoded, behind whatever else was ready. With many requests starting
together (a closed loop's users whose streams end together), each one's pre-send time then held
the others' work. Truth: the bytes the server read (raw, as sent) and the loop's turns counted
by a callback that reschedules itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import assert_exact, chat_body

import latency_analyzer as la
from latency_analyzer.capture import _state, _wire
from latency_analyzer.capture._protocol import TimedProtocol, _TimedTransport
from latency_analyzer.testing import LLMServer
from latency_analyzer.timeline import Recorder

CHAT = "/v1/chat/completions"


class _RawServer:
    """Reads one request per connection as bytes and answers 200 with an empty body."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()


@pytest.mark.parametrize(
    ("kwargs", "framing"),
    [
        ({"json": {"a": 1}}, (b"content-type: application/json", b"content-length: 8")),
        ({"data": b"\x00\x01\x02"}, (b"content-type: application/octet-stream",)),
        ({"data": b"xyz", "headers": {"Content-Type": "text/x"}}, (b"content-type: text/x",)),
        ({"data": "text"}, (b"content-type: text/plain",)),  # a str stays aiohttp's
    ],
)
async def test_the_body_and_its_framing_are_what_aiohttp_would_send(
    kwargs: dict[str, Any], framing: tuple[bytes, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[bytes] = []
    send = _wire.StampedSocket.send

    def counted(self: _wire.StampedSocket, data: Any, flags: int = 0) -> int:
        writes.append(bytes(data))
        return send(self, data, flags)

    monkeypatch.setattr(_wire.StampedSocket, "send", counted)
    raw = _RawServer()
    server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, la.Client(f"http://127.0.0.1:{port}") as client:
        wf = await client.request("/x", **kwargs)
    assert wf.ok and wf.status == 200, wf.error
    assert_exact(wf)
    (sent,) = raw.requests
    head, _, body = sent.partition(b"\r\n\r\n")
    lowered = head.lower()
    for field in framing:
        assert field in lowered, (field, head)
    assert lowered.count(b"content-length") == 1 and b"transfer-encoding" not in lowered
    want = b'{"a": 1}' if "json" in kwargs else kwargs["data"]
    assert body == (want.encode() if isinstance(want, str) else want)
    if not isinstance(kwargs.get("data"), str):
        assert writes == [sent]  # headers and body in one send


async def test_requests_started_together_send_before_the_loop_turns() -> None:
    """Ten requests on warm connections, started in one step: each hands its bytes to the
    kernel before the loop turns once, so none waits for the others' work."""
    turns = 0

    def tick() -> None:
        nonlocal turns
        turns += 1
        loop.call_soon(tick)

    made: dict[int, int] = {}
    sent: dict[int, int] = {}
    init, send = _state.RequestState.__init__, _wire.StampedSocket.send

    def noted_init(self: _state.RequestState, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made[id(self)] = turns

    def noted_send(self: _wire.StampedSocket, data: Any, flags: int = 0) -> int:
        state = _state.CURRENT.get()
        if state is not None and id(state) in made:
            sent.setdefault(id(state), turns)
        return send(self, data, flags)

    loop = asyncio.get_running_loop()
    with pytest.MonkeyPatch.context() as mp:
        async with LLMServer(tokens=2) as server, la.Client(server.url, limit=10) as client:
            warm = [client.request(CHAT, json=chat_body(tokens=2)) for _ in range(10)]
            assert all(wf.ok for wf in await asyncio.gather(*warm))
            mp.setattr(_state.RequestState, "__init__", noted_init)
            mp.setattr(_wire.StampedSocket, "send", noted_send)
            loop.call_soon(tick)
            wfs = await asyncio.gather(
                *(client.request(CHAT, json=chat_body(tokens=2)) for _ in range(10))
            )
    assert all(wf.ok and wf.connection.reused for wf in wfs), [wf.error for wf in wfs]
    assert len(sent) == len(made) == 10
    assert all(sent[k] == made[k] for k in made), (made, sent)


def test_headers_written_as_several_chunks_take_the_body_last() -> None:
    """aiohttp writes headers with ``writelines`` when it frames them with more (chunked):
    the body still joins that write, after them, once."""
    sent: list[bytes] = []

    class Sink:
        def writelines(self, chunks: Any) -> None:
            sent.append(b"".join(chunks))

        def get_write_buffer_size(self) -> int:
            return 0

        def __getattr__(self, name: str) -> Any:
            return lambda *a, **k: None

    loop = asyncio.new_event_loop()
    try:
        proto = TimedProtocol(loop)
        state = _state.RequestState(Recorder("POST", "http://x.test/", start_ns=0))
        state.inline_body = b"BODY"
        proto.state = state
        timed = _TimedTransport(Sink(), proto)  # type: ignore[arg-type]
        timed.writelines([b"HEAD", b"\r\n\r\n"])
        timed.writelines([b"NEXT"])
    finally:
        loop.close()
    assert sent == [b"HEAD\r\n\r\nBODY", b"NEXT"]
    assert state.inline_body == b""
