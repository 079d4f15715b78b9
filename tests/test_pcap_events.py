"""``Flow.content_event_ns`` (the capture's time of each streamed event that carries text) and
``Flow.round_trips`` (the samples the client's kernel timed), on flows built here segment by
segment, so the answer is known."""

from __future__ import annotations

import json

import pytest

from latency_analyzer.testing.pcap import Flow, Packet

CLIENT, SERVER = ("127.0.0.1", 40000), ("127.0.0.1", 8000)
SYN, ACK, FIN = 0x02, 0x10, 0x01


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


def _handshake(isn: int = 100) -> list[Packet]:
    return [
        Packet(1_000, CLIENT, SERVER, SYN, isn, b""),
        Packet(21_000, SERVER, CLIENT, SYN | ACK, 7, b"", ack_no=isn + 1),
    ]


def test_each_ack_of_new_data_is_timed_from_the_oldest_segment_it_covers() -> None:
    isn = 2**32 - 3  # sequence numbers wrap inside the flow
    base = isn + 1
    packets = [
        *_handshake(isn),
        Packet(22_000, CLIENT, SERVER, ACK, base % 2**32, b"a" * 10),
        Packet(23_000, CLIENT, SERVER, ACK, (base + 10) % 2**32, b"b" * 10),
        # one ACK for both: timed from the first
        Packet(45_000, SERVER, CLIENT, ACK, 8, b"x", ack_no=(base + 20) % 2**32),
        Packet(46_000, SERVER, CLIENT, ACK, 9, b"y", ack_no=(base + 20) % 2**32),  # nothing new
        Packet(50_000, CLIENT, SERVER, ACK | FIN, (base + 20) % 2**32, b""),  # a FIN counts
        Packet(71_000, SERVER, CLIENT, ACK | FIN, 10, b"", ack_no=(base + 21) % 2**32),
    ]
    flow = Flow(CLIENT, SERVER, packets)
    assert flow.round_trips() == [(21_000, 20_000), (45_000, 23_000), (71_000, 21_000)]


def test_an_ack_covering_part_of_a_segment_is_not_a_sample() -> None:
    packets = [
        *_handshake(),
        Packet(22_000, CLIENT, SERVER, ACK, 101, b"a" * 10),
        Packet(40_000, SERVER, CLIENT, ACK, 8, b"", ack_no=105),
        Packet(44_000, SERVER, CLIENT, ACK, 8, b"", ack_no=111),
    ]
    assert Flow(CLIENT, SERVER, packets).round_trips() == [(21_000, 20_000), (44_000, 22_000)]


def test_a_resent_segment_makes_the_round_trips_unknown() -> None:
    packets = [
        *_handshake(),
        Packet(22_000, CLIENT, SERVER, ACK, 101, b"a" * 10),
        Packet(300_000, CLIENT, SERVER, ACK, 101, b"a" * 10),
        Packet(320_000, SERVER, CLIENT, ACK, 8, b"", ack_no=111),
    ]
    assert Flow(CLIENT, SERVER, packets).round_trips() is None


def test_a_resend_cut_differently_from_the_first_copy_still_makes_them_unknown() -> None:
    packets = [
        *_handshake(),
        Packet(22_000, CLIENT, SERVER, ACK, 101, b"a" * 10),
        Packet(23_000, CLIENT, SERVER, ACK, 111, b"b" * 10),
        Packet(300_000, CLIENT, SERVER, ACK, 101, b"a" * 10 + b"b" * 5),  # collapsed, re-cut
        Packet(320_000, SERVER, CLIENT, ACK, 8, b"", ack_no=121),
    ]
    assert Flow(CLIENT, SERVER, packets).round_trips() is None


def test_a_flow_without_its_syn_says_so() -> None:
    packets = [Packet(22_000, CLIENT, SERVER, ACK, 101, b"a" * 10)]
    with pytest.raises(ValueError, match="no SYN"):
        Flow(CLIENT, SERVER, packets).round_trips()
