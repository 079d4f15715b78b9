"""HTTP/2 without an extra round trip: the first request follows the client preface at once.

The wire is the truth: a packet capture on ``lo`` (kernel stamps) of an h2c connection through
the delay proxy shows the request's HEADERS frame leaving before the server's SETTINGS arrive.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import assert_exact, chat_body

import latency_analyzer as la
from latency_analyzer import Span
from latency_analyzer.report import to_chrome_trace
from latency_analyzer.testing import DelayProxy, H2LLMServer
from latency_analyzer.timeline import Recorder, exclusive_ns

# The delay proxy's delay each way for the capture: a 40 ms round trip, so a busy host that
# stalls this process for a few ms cannot reorder what the wire shows.
ONE_WAY = 0.020
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, SETTINGS = 0x1, 0x4


# -- the attribution rule for a stage that runs alongside later ones --------------------------


def test_h2_setup_overlapping_the_request_keeps_only_the_uncovered_time() -> None:
    """h2_setup from the preface (100) to the server's SETTINGS (600), while send (110-130)
    and wait (130-700) run: h2_setup is given 100-110, the rest stays with send and wait."""
    root = Span(
        "request",
        0,
        800,
        children=(
            Span("tls", 0, 100),
            Span("h2_setup", 100, 600),
            Span("send", 110, 130),
            Span("wait", 130, 700),
        ),
    )
    got = exclusive_ns(root)
    assert got == {"tls": 100, "h2_setup": 10, "send": 20, "wait": 570, "other": 100}
    assert sum(got.values()) == root.duration_ns


def test_h2_setup_before_the_request_is_attributed_as_before() -> None:
    """Sequential stages (a server whose SETTINGS came first): nothing changes."""
    root = Span(
        "request",
        0,
        100,
        children=(Span("tls", 0, 10), Span("h2_setup", 10, 30), Span("send", 35, 40)),
    )
    assert exclusive_ns(root) == {"tls": 10, "h2_setup": 20, "send": 5, "other": 65}


def test_h2_setup_outliving_the_request_gets_the_time_after_it() -> None:
    root = Span(
        "request", 0, 100, children=(Span("h2_setup", 10, 90), Span("send", 20, 30))
    )  # fmt: skip
    assert exclusive_ns(root) == {"send": 10, "h2_setup": 70, "other": 20}


def test_the_chrome_trace_nests_an_overlapping_h2_setup() -> None:
    rec = Recorder("GET", "http://x/", start_ns=1_000)
    rec.add("h2_setup", 1_100, 60_000)
    rec.add("send", 1_200, 1_300)
    rec.response_headers(70_000, 200)
    wf = rec.finish(80_000)
    assert_exact(wf)
    events = [e for e in to_chrome_trace([wf])["traceEvents"] if e["ph"] in "BE"]
    stack: list[str] = []
    last = 0.0
    for e in events:
        assert e["ts"] >= last
        last = e["ts"]
        if e["ph"] == "B":
            stack.append(e["name"])
        else:
            assert stack, e
            stack.pop()
    assert stack == []
    h2_end = next(e for e in events if e["ph"] == "E" and e["ts"] == 0.2)  # ends at send's start
    assert h2_end["args"]["end_us"] == 59.0


# -- a packet capture of the real thing ----------------------------------------------------------


@dataclass(frozen=True)
class _Segment:
    t_ns: int  # the kernel's stamp
    src: int  # TCP ports
    dst: int
    seq: int
    payload: bytes


def _tcpdump() -> str:
    path = shutil.which("tcpdump")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tcpdump is required in CI (.ci/run installs it)")
        pytest.skip("tcpdump is not installed (apt-get install tcpdump)")
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("capturing on lo needs root, as CI runs")
        pytest.skip("capturing on lo needs root")
    return path


@pytest.fixture
def capture(tmp_path: Path) -> Iterator[_Capture]:
    cap = _Capture(_tcpdump(), tmp_path / "lo.pcap")
    try:
        yield cap
    finally:
        cap.stop()


class _Capture:
    """tcpdump on ``lo`` writing a nanosecond pcap, started before and stopped after the I/O."""

    def __init__(self, binary: str, path: Path) -> None:
        self.binary, self.path = binary, path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, port: int) -> None:
        args = [self.binary, "-i", "lo", "-n", "-U", "--immediate-mode", "-s", "0"]
        args += ["--time-stamp-precision=nano"]
        args += ["-w", str(self.path), "tcp", "port", str(port)]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()  # "listening on lo ...": the capture is running
        assert b"listening on" in line, line

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(5)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def segments(self) -> list[_Segment]:
        self.stop()
        return _read_pcap(self.path.read_bytes())


def _read_pcap(data: bytes) -> list[_Segment]:
    """TCP segments with payload from a classic pcap (Ethernet or Linux cooked, IPv4/IPv6)."""
    magic = struct.unpack("<I", data[:4])[0]
    assert magic in (0xA1B23C4D, 0xA1B2C3D4), hex(magic)
    scale = 1 if magic == 0xA1B23C4D else 1000
    linktype = struct.unpack("<I", data[20:24])[0]
    link_len = {1: 14, 113: 16, 276: 20}[linktype]
    out, pos = [], 24
    while pos + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack("<IIII", data[pos : pos + 16])
        frame = data[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        ip = frame[link_len:]
        if ip[0] >> 4 == 4:
            ihl, proto, total = (ip[0] & 0xF) * 4, ip[9], struct.unpack("!H", ip[2:4])[0]
            tcp, ip_end = ip[ihl:total], total
        else:
            proto, plen = ip[6], struct.unpack("!H", ip[4:6])[0]
            tcp, ip_end = ip[40 : 40 + plen], 40 + plen
        if proto != 6 or ip_end > len(ip):
            continue
        src, dst, seq = struct.unpack("!HHI", tcp[:8])
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if payload:
            out.append(_Segment(sec * 1_000_000_000 + frac * scale, src, dst, seq, payload))
    return out


def _frames(segments: list[_Segment], src: int, skip: int) -> list[tuple[int, int, int]]:
    """(type, flags, kernel stamp of the segment that completed it) of each frame one side sent.

    The side's bytes are put back in order (retransmitted bytes counted once); ``skip`` bytes
    at the start (the client preface) are not frames.
    """
    stream, ends = bytearray(), []  # ends: (byte offset reached, stamp)
    next_seq: int | None = None
    for seg in (s for s in segments if s.src == src):
        start = seg.seq if next_seq is None else next_seq
        offset = (start - seg.seq) % 2**32
        if offset >= len(seg.payload):
            continue  # all of it seen already
        stream += seg.payload[offset:]
        next_seq = (seg.seq + len(seg.payload)) % 2**32
        ends.append((len(stream), seg.t_ns))
    frames, pos = [], skip
    while pos + 9 <= len(stream):
        length = int.from_bytes(stream[pos : pos + 3], "big")
        kind, flags = stream[pos + 3], stream[pos + 4]
        end = pos + 9 + length
        if end > len(stream):
            break
        frames.append((kind, flags, next(t for reached, t in ends if reached >= end)))
        pos = end
    return frames


async def test_the_first_request_leaves_before_the_servers_settings_arrive(
    capture: _Capture,
) -> None:
    """h2c through a 40 ms round trip: on the wire, our HEADERS go out right behind our
    preface, before the server's SETTINGS (sent when the proxy connected to it, so arriving
    20 ms after our connect) reach us. Waiting for those SETTINGS first put HEADERS after."""
    async with H2LLMServer(tokens=2) as server:
        async with DelayProxy(server.host, server.port, delay=ONE_WAY) as proxy:
            capture.start(proxy.port)
            async with la.Client(proxy.url, http2=True) as client:
                wf = await client.request(
                    "/v1/chat/completions", json=chat_body(include_usage=False)
                )
            await asyncio.sleep(0.05)  # the capture has every segment written
    segments = capture.segments()
    assert_exact(wf)
    assert wf.ok and wf.http_version == "2", wf.error
    ours = next(s.src for s in segments if s.dst == proxy.port)
    sent = _frames(segments, ours, len(PREFACE))
    received = _frames(segments, proxy.port, 0)
    first_data = next(s.t_ns for s in segments if s.src == ours)  # the preface
    headers_out = next(t for kind, _, t in sent if kind == HEADERS)
    settings_in = next(t for kind, flags, t in received if kind == SETTINGS and not flags & 1)
    ms = 1e6
    print(
        f"\npreface -> HEADERS {(headers_out - first_data) / ms:.3f} ms, "
        f"HEADERS -> server SETTINGS in {(settings_in - headers_out) / ms:.3f} ms"
    )
    assert first_data <= headers_out < settings_in
    # the waterfall says the same: h2_setup runs under send and wait, and is not charged them
    setup, send = wf.stages["h2_setup"], wf.stages["send"]
    assert send.start_ns < setup.end_ns
    assert wf.attribution_ns()["h2_setup"] < setup.duration_ns // 2
    assert setup.duration >= ONE_WAY * 0.9  # it still ends at the server's SETTINGS


async def test_a_body_sent_before_the_settings_survives_a_smaller_window() -> None:
    """A 100 KB body goes out under the initial 64 KiB stream window; the server's SETTINGS,
    arriving later, shrink it to 16 KiB. h2 takes the difference off the open stream (its
    window goes negative), we wait for WINDOW_UPDATEs, and every byte arrives."""
    body = chat_body(include_usage=False)
    body["messages"] = [{"role": "user", "content": "x" * 100_000}]
    async with H2LLMServer(tokens=2, initial_window_size=16384) as server:
        async with DelayProxy(server.host, server.port, delay=ONE_WAY) as proxy:
            async with la.Client(proxy.url, http2=True, timeout=10) as client:
                wf = await client.request("/v1/chat/completions", json=body)
    assert_exact(wf)
    assert wf.ok, wf.error
    assert server.records[-1].body_bytes > 100_000
    assert wf.stages["send"].start_ns < wf.stages["h2_setup"].end_ns
    assert wf.stages["send"].attributes["flow_control_wait_ms"] > 0  # the window did shut
