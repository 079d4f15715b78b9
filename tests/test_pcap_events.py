"""``Flow.content_event_ns``: the capture's time of each streamed event that carries text, on
a flow built here segment by segment, so the answer is known."""

from __future__ import annotations

import json

from latency_analyzer.testing.pcap import Flow, Packet

CLIENT, SERVER = ("127.0.0.1", 40000), ("127.0.0.1", 8000)
SYN, ACK = 0x02, 0x10


def _event(delta: dict[str, str]) -> bytes:
    return b"data: " + json.dumps({"choices": [{"delta": delta}]}).encode() + b"\n\n"


def test_each_text_event_is_timed_by_the_segment_carrying_its_last_byte() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    role = _event({"role": "assistant", "content": ""})  # no text: left out
    first, second = _event({"content": "a"}), _event({"content": "b"})
    split = len(second) // 2  # the second event straddles two segments
    segments = [head + role + first + second[:split], second[split:] + b"data: [DONE]\n\n"]
    isn = 1000
    packets = [
        Packet(1, CLIENT, SERVER, SYN, 5, b""),
        Packet(2, SERVER, CLIENT, SYN | ACK, isn, b""),
    ]
    seq = isn + 1
    for t, payload in zip((10, 20), segments, strict=True):
        packets.append(Packet(t, SERVER, CLIENT, ACK, seq, payload))
        seq += len(payload)
    flow = Flow(CLIENT, SERVER, packets)
    assert flow.content_event_ns() == [10, 20]
