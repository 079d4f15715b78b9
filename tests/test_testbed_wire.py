"""Every test-bed server writes one OpenAI format: the HTTP/1.1 and HTTP/2 streams agree.

Both servers encode through ``testing/llm/wire.py``; read with raw clients (http.client and
the ``h2`` state machine on a plain socket, never the library's own client), the events they
send for the same knobs are the same but for the response id and ``created``.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

import h2.config
import h2.connection
import h2.events

from latency_analyzer.testing import H2LLMServer, LLMServer

CHAT = "/v1/chat/completions"
KNOBS: dict[str, Any] = {
    "tokens": 5,
    "tokens_per_chunk": 2,
    "reasoning_tokens": 2,
    "empty_last_tokens": 1,
}
BODY = {
    "model": "m",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "one two three"}],
}


def _events(raw: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded (``[DONE]`` kept as a string)."""
    events = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _h1_stream(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            "POST", CHAT, body=json.dumps(BODY), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read()
    finally:
        conn.close()


def _h2_stream(port: int) -> bytes:
    """One request over prior-knowledge h2c; the response's DATA, in order."""
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    body = json.dumps(BODY).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        conn.initiate_connection()
        headers = [(":method", "POST"), (":path", CHAT), (":scheme", "http")]
        headers += [(":authority", f"127.0.0.1:{port}"), ("content-type", "application/json")]
        conn.send_headers(1, headers)
        conn.send_data(1, body, end_stream=True)
        sock.sendall(conn.data_to_send())
        data = bytearray()
        while True:
            received = sock.recv(65536)
            assert received, "the server closed the connection mid-stream"
            for event in conn.receive_data(received):
                if isinstance(event, h2.events.DataReceived):
                    data += event.data or b""
                    conn.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded):
                    return bytes(data)
            sock.sendall(conn.data_to_send())


def _without_identity(events: list[Any]) -> list[Any]:
    return [
        {k: v for k, v in e.items() if k not in ("id", "created")} if isinstance(e, dict) else e
        for e in events
    ]


def test_http1_and_http2_servers_send_the_same_events() -> None:
    with LLMServer(**KNOBS).run_in_thread() as h1, H2LLMServer(**KNOBS).run_in_thread() as h2s:
        one, two = _events(_h1_stream(h1.port)), _events(_h2_stream(h2s.port))
    assert _without_identity(one) == _without_identity(two)
    # and what they agree on is the format: role, reasoning, content, usage, [DONE]
    assert one[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"] for e in one[1:4]]
    assert deltas == [
        {"reasoning_content": "tok0000 tok0001 "},
        {"content": "tok0002 tok0003 "},
        {"content": ""},  # the last token, sent with empty text
    ]
    assert one[-2]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
        "total_tokens": 8,
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    assert one[-1] == "[DONE]" and two[-1] == "[DONE]"
    assert {e["id"] for e in two[:-1]} == {"h2-1"}
