"""Stamped sockets: reads carry the kernel's receive time, sends are noted, fallbacks say so.

Ground truth here is causality on one host clock: the peer's ``perf_counter_ns`` before it
sent (CLOCK_MONOTONIC), the kernel's stamp (CLOCK_REALTIME through the process anchor), and
ours after the read must come in that order. The precision against a packet capture is
tests/test_wire_capture.py's subject; the capture reader is checked here on a file written
by the test.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import assert_exact

import latency_analyzer as la
from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.capture import _wire
from latency_analyzer.capture._state import RequestState
from latency_analyzer.errors import UsageError
from latency_analyzer.report.waterfall_text import render_waterfall
from latency_analyzer.testing import LLMServer
from latency_analyzer.testing.pcap import PacketCapture, read_pcap, require_tcpdump
from latency_analyzer.testing.tcpdump import TcpDump
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
        # five tokens; on a busy host several may share a read, so only this holds: each
        # distinct token stamp came from a read of its own
        assert len(wf.chunk_times_ns) == 5
        assert len(set(wf.chunk_times_ns)) <= wf.reads
        assert la.Waterfall.from_dict(wf.to_dict()) == wf
    if _wire.kernel_stamps_supported() is None:
        assert kernel.clock_source == "kernel"
        assert kernel.read_lag_p50_ns is not None and kernel.read_lag_max_ns is not None
        assert 0 <= kernel.read_lag_p50_ns <= kernel.read_lag_max_ns
    assert user.clock_source == "userspace" and user.read_lag_p50_ns is None
    # a set reports the read lag and ttft_wire percentiles beside ttft
    ws = WaterfallSet()
    ws.add(kernel)
    names = {row.name for row in ws.summary().rows}
    assert {"ttft", "ttft_wire", "read_lag", "read_lag_max"} <= names
    assert kernel.ttft_wire_ns == kernel.chunk_times_ns[0] - kernel.stages["send"].start_ns
    assert 0 < kernel.ttft_wire_ns < (kernel.ttft_ns or 0)
    assert f"clock {kernel.clock_source} · read lag median" in render_waterfall(kernel)
    assert "clock userspace" in render_waterfall(user)
    assert user.attributes["clock_note"] == "kernel stamps are off in this test"
    assert user.summary()["clock_source"] == "userspace"


def test_recorder_begin_knows_the_stage_vocabulary() -> None:
    rec = Recorder("GET", "http://x/", start_ns=0)
    rec.begin("connect", 1)
    with pytest.raises(UsageError, match="'conect' is not a client stage"):
        rec.begin("conect", 2)


def _frame(src_port: int, dst_port: int, seq: int, flags: int, payload: bytes) -> bytes:
    tcp = struct.pack(">HHIIBBHHH", src_port, dst_port, seq, 0, 5 << 4, flags, 65535, 0, 0)
    total = 20 + len(tcp) + len(payload)
    ip = struct.pack(
        ">BBHHHBBH4s4s",
        0x45,
        0,
        total,
        0,
        0,
        64,
        6,
        0,
        bytes([127, 0, 0, 1]),
        bytes([127, 0, 0, 1]),
    )
    return b"\0" * 12 + b"\x08\x00" + ip + tcp + payload


def test_the_pcap_reader_reassembles_a_flow_and_times_each_byte(tmp_path: Path) -> None:
    """A nanosecond pcap written here: SYN, SYN-ACK, two server segments (one resent)."""
    frames = [
        (1_000, _frame(5000, 80, 100, 0x02, b"")),
        (2_000, _frame(80, 5000, 900, 0x12, b"")),
        (3_000, _frame(80, 5000, 901, 0x18, b"HTTP/1.1 200")),
        (4_000, _frame(80, 5000, 913, 0x18, b" OK\r\n")),
        (5_000, _frame(80, 5000, 913, 0x18, b" OK\r\n")),  # a retransmission: not a new byte
    ]
    out = bytearray(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
    for t, frame in frames:
        out += struct.pack("<IIII", 1, t, len(frame), len(frame)) + frame
    path = tmp_path / "x.pcap"
    path.write_bytes(bytes(out))
    packets = read_pcap(path)
    assert [p.time_ns for p in packets] == [1_000_001_000 + i * 1_000 for i in range(5)]
    capture = PacketCapture(80)
    capture.packets = packets
    (flow,) = capture.flows()
    assert flow.client == ("127.0.0.1", 5000) and flow.syn_ns == 1_000_001_000
    assert flow.syn_ack_ns == 1_000_002_000
    assert flow.data("in") == b"HTTP/1.1 200 OK\r\n"
    assert flow.time_of_byte("in", 11) == 1_000_003_000
    assert flow.time_of_byte("in", 12) == 1_000_004_000  # the first copy, not the resend
    with pytest.raises(ValueError, match="not captured"):
        flow.time_of_byte("in", 17)


def test_a_stage_context_owns_its_stage_and_emits_started_complete_failed() -> None:
    """httpcore's _trace idea: the exact ordered events, for a block that ends and one that
    raises; the failed stage is kept, interrupted."""
    events: list[tuple[str, dict[str, object]]] = []
    state = RequestState(
        Recorder("GET", "http://x/", start_ns=0), lambda e, info: events.append((e, dict(info)))
    )
    with state.stage("connect", 10, peer="p") as end:
        end.update(end_ns=25, reused=False)
    with pytest.raises(ConnectionResetError), state.stage("tls", 30):
        raise ConnectionResetError("reset by https://user:secret@x/")
    assert [e for e, _ in events] == [
        "capture.connect.started",
        "capture.connect.complete",
        "capture.tls.started",
        "capture.tls.failed",
    ]
    assert events[1][1] == {"t_ns": 25, "reused": False}
    assert events[3][1]["error"] == "ConnectionResetError"  # the type, never the text
    wf = state.recorder.finish(100)
    assert wf.stages["connect"].start_ns == 10 and wf.stages["connect"].end_ns == 25
    assert wf.stages["connect"].attributes == {"peer": "p", "reused": False}
    assert wf.stages["tls"].attributes["interrupted"] is True
    with pytest.raises(UsageError), state.stage("handshake"):
        pass


def _resume_later(pid: int, after_s: float) -> threading.Thread:
    def resume() -> None:
        time.sleep(after_s)
        os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=resume)
    thread.start()
    return thread


def test_a_capture_stopped_while_tcpdump_is_behind_keeps_every_packet() -> None:
    """tcpdump stopped (SIGSTOP) while datagrams and a TCP exchange cross lo, resumed 0.3 s
    into the stop: both captures hold every packet, as a busy host's late tcpdump must, and
    neither shows its end mark."""
    require_tcpdump()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        port = sink.getsockname()[1]
        capture = TcpDump(f"udp port {port}")
        with capture:
            assert capture._proc is not None
            os.kill(capture._proc.pid, signal.SIGSTOP)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
                for i in range(50):
                    out.sendto(b"%d" % i, ("127.0.0.1", port))
            thread = _resume_later(capture._proc.pid, 0.3)
        thread.join()
    assert [p.payload for p in capture.packets()] == [b"%d" % i for i in range(50)]

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with PacketCapture(port) as cap:
            assert cap._proc is not None
            os.kill(cap._proc.pid, signal.SIGSTOP)
            with socket.create_connection(("127.0.0.1", port)) as client:
                peer, _ = listener.accept()
                with peer:
                    for _ in range(20):
                        client.sendall(b"x" * 100)
                        peer.recv(100)
            thread = _resume_later(cap._proc.pid, 0.3)
        thread.join()
    (flow,) = cap.flows()
    assert flow.data("out") == b"x" * 2000
    assert all(p.dst[1] == port or p.src[1] == port for p in cap.packets)


@pytest.mark.parametrize("gap", [0.0, 0.05], ids=["one-write", "apart"])
async def test_headers_read_with_body_bytes_are_marked(gap: float) -> None:
    """A response whose headers came in one read with body bytes says so: the headers'
    stamp (the end of ``wait``) is then that read's newest segment's arrival, the body's."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
        if gap:
            writer.write(head)
            await writer.drain()
            await asyncio.sleep(gap)
            writer.write(b"{}")
        else:
            writer.write(head + b"{}")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, la.Client(f"http://127.0.0.1:{port}") as client:
        wf = await client.request("/x", method="GET")
    assert wf.ok, wf.error
    assert_exact(wf)
    flagged = wf.attributes.get("headers_read_with_body", False)
    headers_at, body_at = wf.stages["wait"].end_ns, wf.root.end_ns
    assert flagged == (headers_at == body_at)  # one read, one stamp
    if not gap:
        assert flagged
    elif not flagged:  # read apart, as the 50 ms between the writes lets the loop do
        assert body_at - headers_at >= gap * 1e9
