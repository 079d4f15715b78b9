"""A cold HTTP/2 request's first flight is encoded while the TLS handshake is under way.

Truth: the bytes themselves (a prepared flight is what encoding at the hand-over would have
written, frame for frame) and the order of the calls on a real TLS dial to our h2 server.
"""

from __future__ import annotations

import h2.connection
import pytest
from conftest import assert_exact

import latency_analyzer as la
from latency_analyzer.capture import _h2frames, _transport, http2
from latency_analyzer.testing import H2LLMServer, TestCA

TARGET = ("https", "example.test:443", "/v1/chat/completions")
FIELDS = [("user-agent", "t"), ("content-type", "application/json"), ("content-length", "70000")]


def _encoded_at_hand_over(body: bytes) -> bytes:
    machine = h2.connection.H2Connection(config=_h2frames._CONFIG)
    machine.initiate_connection()
    sid = machine.get_next_available_stream_id()
    machine.send_headers(sid, _h2frames._request_fields("POST", TARGET, FIELDS), end_stream=False)
    _h2frames._queue_body(machine, sid, memoryview(body))
    return machine.data_to_send()


def test_a_prepared_flight_is_the_one_the_hand_over_would_write() -> None:
    """A body larger than the initial window: what fits goes with the HEADERS, the rest waits
    for the window, exactly as when the stream is opened on the live connection."""
    body = bytes(range(256)) * 274  # 70144 bytes > 65535
    prepared = http2.prepare_first_stream("POST", TARGET, FIELDS, body)
    assert prepared.stream_id == 1
    assert prepared.machine.data_to_send() == _encoded_at_hand_over(body)
    assert len(prepared.rest) == len(body) - 65535
    assert bytes(prepared.rest) == body[65535:]


async def test_a_cold_tls_dial_prepares_before_the_handshake_ends_and_sends_it(
    ca: TestCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_prepare, real_open = _transport._H2Dial.prepare, _transport._H2Dial.open

    def prepare(self: _transport._H2Dial) -> None:
        real_prepare(self)
        calls.append("prepared" if self.prepared is not None else "not prepared")

    def open_(self: _transport._H2Dial, handoff: http2.HandoffToHTTP2) -> None:
        calls.append("open with prepared" if self.prepared is not None else "open")
        real_open(self, handoff)

    monkeypatch.setattr(_transport._H2Dial, "prepare", prepare)
    monkeypatch.setattr(_transport._H2Dial, "open", open_)
    server = H2LLMServer(ssl=ca.server_context(alpn=("h2",)), tokens=3)
    async with server, la.Client(server.url, ssl=ca.client_context(), http2=True) as client:
        wf = await client.request("/v1/chat/completions", json={"stream": True, "messages": []})
    assert wf.ok and wf.http_version == "2", wf.error
    assert_exact(wf)
    assert wf.output_tokens == 3
    assert calls == ["prepared", "open with prepared"]
    assert wf.stages["send"].start_ns < wf.stages["h2_setup"].end_ns  # no wait for SETTINGS


def test_a_request_h2_cannot_encode_is_left_to_the_hand_over() -> None:
    """A header h2 refuses (a connection-specific one with a bad value) is not prepared:
    the hand-over encodes it again and raises where the caller sees the failure."""
    dial = _transport._H2Dial(
        la.Client(),  # never opened: prepare only reads its default headers
        None,  # type: ignore[arg-type]  # prepare does not touch the request state
        "https://example.test:443",
        "GET",
        "https://example.test/",
        None,
        None,
        {"te": "gzip"},  # HTTP/2 allows only "te: trailers"
    )
    dial.prepare()
    assert dial.prepared is None
