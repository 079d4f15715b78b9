"""A packet capture as ground truth: tcpdump on the loopback interface (or another device),
read back here.

The capture's stamps are the kernel's, taken as each packet crosses the device, so no load on
the measuring process can move them. They are ``CLOCK_REALTIME`` nanoseconds; map them onto a
process's ``perf_counter_ns`` with its clock anchor
(``latency_analyzer.timeline.process_anchor().to_perf_ns``).

::

    with PacketCapture(port=server.port) as cap:
        ...  # traffic to 127.0.0.1:port
    for flow in cap.flows():            # one per TCP connection, in SYN order
        flow.syn_ns, flow.syn_ack_ns
        flow.time_of_byte("in", offset)   # when the server's byte ``offset`` crossed the device
        flow.data("in")                   # the server's bytes, reassembled

The reader is pure Python: pcap (micro- or nanosecond, either byte order) with Ethernet
(Linux ``lo``), Linux cooked (SLL, SLL2), raw IP (a TUN device) or BSD loopback links,
IPv4 and IPv6, TCP only.
:func:`require_tcpdump` is the test-side check: outside CI a missing tcpdump skips the test
with a reason, under ``CI=true`` it fails it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from .tcpdump import EndMark

__all__ = ["Flow", "Packet", "PacketCapture", "read_pcap", "require_tcpdump", "tcpdump_missing"]

_SYN, _ACK, _FIN, _RST = 0x02, 0x10, 0x01, 0x04
_SSE_EVENT = re.compile(rb"data: ([^\n]*)\n\n")
_MAGIC = {
    b"\xd4\xc3\xb2\xa1": ("<", 1_000),
    b"\xa1\xb2\xc3\xd4": (">", 1_000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),
    b"\xa1\xb2\x3c\x4d": (">", 1),
}


@dataclass(frozen=True, slots=True)
class Packet:
    """One TCP segment as captured. ``time_ns`` is CLOCK_REALTIME (epoch) nanoseconds."""

    time_ns: int
    src: tuple[str, int]
    dst: tuple[str, int]
    flags: int
    seq: int
    payload: bytes
    length: int = -1
    """Payload bytes on the wire (more than ``payload`` holds when the snap length cut it)."""
    ack_no: int = 0
    """The acknowledgment number (meaningful when :attr:`ack` is set)."""

    @property
    def size(self) -> int:
        return len(self.payload) if self.length < 0 else self.length

    @property
    def syn(self) -> bool:
        return bool(self.flags & _SYN)

    @property
    def ack(self) -> bool:
        return bool(self.flags & _ACK)


def read_pcap(path: str | os.PathLike[str]) -> list[Packet]:
    """Every TCP segment in a pcap file, in capture order.

    Raises:
        ValueError: not a pcap file, or a link type this reader does not know.
    """
    data = Path(path).read_bytes()
    if len(data) < 24 or data[:4] not in _MAGIC:
        raise ValueError(f"{path}: not a pcap file")
    order, scale = _MAGIC[data[:4]]
    link = struct.unpack_from(order + "I", data, 20)[0] & 0x0FFFFFFF
    record = struct.Struct(order + "IIII")
    out: list[Packet] = []
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, caplen, _ = record.unpack_from(data, pos)
        pos += 16
        frame = data[pos : pos + caplen]
        pos += caplen
        packet = _decode(link, frame, sec * 1_000_000_000 + frac * scale)
        if packet is not None:
            out.append(packet)
    return out


def _decode(link: int, frame: bytes, t: int) -> Packet | None:
    if link == 1:  # Ethernet: lo on Linux has a zeroed one
        ethertype, ip = int.from_bytes(frame[12:14], "big"), frame[14:]
    elif link == 113:  # Linux cooked v1
        ethertype, ip = int.from_bytes(frame[14:16], "big"), frame[16:]
    elif link == 276:  # Linux cooked v2
        ethertype, ip = int.from_bytes(frame[0:2], "big"), frame[20:]
    elif link in (101, 12, 14):  # raw IP (a TUN device): the version nibble says which
        ethertype, ip = (0x86DD if frame[:1] and frame[0] >> 4 == 6 else 0x0800), frame
    elif link == 0:  # BSD loopback: an address family word, AF_INET is 2 in either order
        family = frame[0] | frame[3]
        ethertype, ip = (0x0800 if family == 2 else 0x86DD), frame[4:]
    else:
        raise ValueError(f"pcap link type {link} is not read here")
    if ethertype == 0x0800 and len(ip) >= 20 and ip[9] == 6:
        ihl, total = (ip[0] & 0x0F) * 4, int.from_bytes(ip[2:4], "big")
        src, dst = _ipv4(ip[12:16]), _ipv4(ip[16:20])
        return _tcp(ip[ihl:total], total - ihl, src, dst, t)
    if ethertype == 0x86DD and len(ip) >= 40 and ip[6] == 6:  # no extension headers on lo
        length = int.from_bytes(ip[4:6], "big")
        return _tcp(ip[40 : 40 + length], length, _ipv6(ip[8:24]), _ipv6(ip[24:40]), t)
    return None


def _tcp(seg: bytes, wire_len: int, src: str, dst: str, t: int) -> Packet | None:
    if len(seg) < 20:
        return None
    sport, dport, seq, ack_no = struct.unpack_from(">HHII", seg)
    offset, flags = (seg[12] >> 4) * 4, seg[13]
    payload = bytes(seg[offset:])
    return Packet(t, (src, sport), (dst, dport), flags, seq, payload, wire_len - offset, ack_no)


def _ipv4(raw: bytes) -> str:
    return ".".join(str(b) for b in raw)


def _ipv6(raw: bytes) -> str:
    import ipaddress

    return str(ipaddress.IPv6Address(raw))


@dataclass
class Flow:
    """One TCP connection: ``out`` is client → server, ``in`` is server → client."""

    client: tuple[str, int]
    server: tuple[str, int]
    packets: list[Packet] = field(default_factory=list)

    @property
    def syn_ns(self) -> int:
        """The client's SYN (the first, if it was retransmitted)."""
        return next(p.time_ns for p in self.packets if p.syn and not p.ack)

    @property
    def syn_ack_ns(self) -> int:
        return next(p.time_ns for p in self.packets if p.syn and p.ack)

    def segments(self, direction: str) -> list[Packet]:
        """Payload-carrying segments one way, first transmissions only, in stream order."""
        src = self.client if direction == "out" else self.server
        isn = next(p.seq for p in self.packets if p.syn and p.src == src)
        seen: dict[int, Packet] = {}
        for p in self.packets:
            if p.src == src and p.size:
                seen.setdefault((p.seq - isn - 1) % 2**32, p)
        return [seen[k] for k in sorted(seen)]

    def data(self, direction: str) -> bytes:
        """The bytes sent one way, reassembled (overlaps keep the first copy; bytes the snap
        length cut off read as NUL)."""
        out = bytearray()
        for offset, packet in self._offsets(direction):
            if offset > len(out):
                out += bytes(offset - len(out))
            payload = packet.payload.ljust(packet.size, b"\0")
            if offset + len(payload) > len(out):
                out += payload[len(out) - offset :]
        return bytes(out)

    def round_trips(self) -> list[tuple[int, int]] | None:
        """The round trips the client's kernel timed on this connection, as ``(arrival_ns,
        rtt_ns)`` per sample, in order; None if any sequence space was sent twice (a
        retransmission's round trip is ambiguous, and the kernel times it differently).

        Linux takes a sample from an ACK that covers, in full, a segment it had not seen
        acked, timed from the send of the oldest such segment (the SYN counts, so the SYN-ACK
        is the first sample) to the ACK's arrival; an ACK that covers nothing new, or only
        part of a segment, is not a sample. The capture's stamps stand in for the kernel's
        and err one way: a send is captured after TCP stamped it, an arriving ACK as the
        device queues it, before TCP times it (tens of microseconds on a TUN device), so
        each sample here is the kernel's or a little shorter.

        Raises:
            ValueError: the capture holds no SYN from the client.
        """
        isn = next((p.seq for p in self.packets if p.syn and p.src == self.client), None)
        if isn is None:
            raise ValueError(f"no SYN from {self.client} in the capture: no sequence origin")
        sent: dict[int, int] = {}  # relative end sequence -> send time
        high = 0  # the furthest sequence sent so far: a segment starting below it is a resend
        for p in self.packets:
            if p.src != self.client:
                continue
            span = p.size + (1 if p.syn else 0) + (1 if p.flags & _FIN else 0)
            if not span:
                continue
            start = (p.seq - isn) % 2**32
            if start < high:  # resent, perhaps cut differently from the first copy
                return None
            high = start + span
            sent[high] = p.time_ns
        pending = sorted(sent.items())
        acked, out = 0, []
        for p in self.packets:
            if p.src != self.server or not p.ack:
                continue
            upto = (p.ack_no - isn) % 2**32
            if upto <= acked:
                continue
            acked = upto
            covered = [t for end, t in pending if end <= upto]
            pending = [(end, v) for end, v in pending if end > upto]
            if covered:
                out.append((p.time_ns, p.time_ns - covered[0]))
        return out

    def time_of_byte(self, direction: str, offset: int) -> int:
        """When the segment carrying stream byte ``offset`` (0-based) crossed the device."""
        offsets = self._offsets(direction)
        i = bisect_right([o for o, _ in offsets], offset) - 1
        if i < 0 or offset >= offsets[i][0] + offsets[i][1].size:
            raise ValueError(f"byte {offset} of {direction!r} was not captured")
        return offsets[i][1].time_ns

    def content_event_ns(self) -> list[int]:
        """When the last byte of each OpenAI streaming event with text (``delta.content``)
        crossed the device, epoch ns: the truth for a stream's token stamps (the role-only first
        event, empty-text events and ``[DONE]`` left out)."""
        data = self.data("in")
        out = []
        for match in _SSE_EVENT.finditer(data, data.index(b"\r\n\r\n")):
            raw = match.group(1)
            if raw != b"[DONE]":
                choices = json.loads(raw).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    out.append(self.time_of_byte("in", match.end() - 1))
        return out

    def _offsets(self, direction: str) -> list[tuple[int, Packet]]:
        src = self.client if direction == "out" else self.server
        isn = next(p.seq for p in self.packets if p.syn and p.src == src)
        return [((p.seq - isn - 1) % 2**32, p) for p in self.segments(direction)]


def tcpdump_missing() -> str | None:
    """None when tcpdump can capture here, else why not."""
    if shutil.which("tcpdump") is None:
        return "tcpdump is not installed"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "capturing on lo needs root"
    return None


def require_tcpdump() -> None:
    """For tests: skip when tcpdump cannot run (fail instead under ``CI=true``)."""
    import pytest

    reason = tcpdump_missing()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}, and CI must run the capture tests (.ci/run installs it)")
    pytest.skip(reason)


class PacketCapture:
    """tcpdump on ``lo`` for TCP traffic to or from ``port``, for the ``with`` block.

    Args:
        port: the server's port (the filter is ``tcp port PORT``).
        interface: ``lo`` unless you capture elsewhere.
        settle_s: on an interface other than ``lo``, how long to wait after the block for the
            last packets to be written (on ``lo`` the capture waits for its own end mark).
        snaplen: bytes kept of each packet. The capture ring holds buffer / snaplen packets
            (a 256 KiB snap length on lo's 64 KiB MTU leaves room for few), so keep it to
            what the test reads.
    """

    def __init__(
        self, port: int, interface: str = "lo", settle_s: float = 0.05, snaplen: int = 4096
    ) -> None:
        self.port = port
        self.snaplen = snaplen
        self.interface = interface
        self.settle_s = settle_s
        self.packets: list[Packet] = []
        self.dropped: int | None = None
        """Packets the kernel dropped before tcpdump read them (tcpdump's own count)."""
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._mark = EndMark(interface)

    def __enter__(self) -> PacketCapture:
        reason = tcpdump_missing()
        if reason is not None:
            raise RuntimeError(reason)
        self._dir = tempfile.TemporaryDirectory(prefix="la-pcap-")
        path = Path(self._dir.name) / "capture.pcap"
        args = ["tcpdump", "-i", self.interface, "-n", "-U", "--immediate-mode"]
        args += ["-s", str(self.snaplen), "-B", "32768"]
        args += ["-Z", "root", "--time-stamp-precision=nano", "-w", str(path)]
        if "adapter_unsynced" in _stamp_types(self.interface):
            args += ["-j", "adapter_unsynced"]
        args.append(self._mark.bpf(f"tcp port {self.port}"))
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_listening()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._dir is not None:
                self._mark.wait(Path(self._dir.name) / "capture.pcap", self.settle_s)
            self._stop()
            if self._dir is not None and exc[0] is None:
                self.packets = read_pcap(Path(self._dir.name) / "capture.pcap")
        finally:
            if self._dir is not None:
                self._dir.cleanup()

    def _wait_listening(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None
        deadline = time.monotonic() + 10.0
        line = b""
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if b"listening on" in line:
                return
            if not line and proc.poll() is not None:
                break
        self._stop()
        raise RuntimeError(f"tcpdump did not start: {line.decode(errors='replace').strip()}")

    def _stop(self) -> None:
        self._mark.close()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)  # flushes and writes its counts
        try:
            proc.wait(10.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10.0)
        if proc.stderr is not None:
            tail = proc.stderr.read().decode(errors="replace")
            proc.stderr.close()
            found = re.search(r"(\d+) packets? dropped by kernel", tail)
            self.dropped = int(found.group(1)) if found else None

    def flows(self) -> list[Flow]:
        """Every connection the capture saw open (a SYN from the client), in SYN order."""
        flows: dict[tuple[tuple[str, int], tuple[str, int]], Flow] = {}
        for p in self.packets:
            if p.dst[1] == self.port:
                key = (p.src, p.dst)
            elif p.src[1] == self.port:
                key = (p.dst, p.src)
            else:
                continue
            if key not in flows:
                if not (p.syn and not p.ack and p.dst[1] == self.port):
                    continue  # began before the capture
                flows[key] = Flow(client=key[0], server=key[1])
            flows[key].packets.append(p)
        return sorted(flows.values(), key=lambda f: f.syn_ns)


def _stamp_types(interface: str) -> str:
    try:
        done = subprocess.run(
            ["tcpdump", "-J", "-i", interface], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout + done.stderr).decode(errors="replace")
