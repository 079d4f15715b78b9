"""Any packet, TCP or UDP, as ground truth: run tcpdump on an interface, read what it wrote.

:mod:`.pcap` follows TCP connections (flows, byte offsets); this module reads every packet,
datagrams included, which is what a DNS lookup's truth needs.

The stamps in a capture are the kernel's, taken as each packet crosses the interface, so a
busy client process cannot move them. ``tcpdump`` writes nanosecond stamps
(``--time-stamp-precision=nano``) on ``CLOCK_REALTIME``; a clock anchor maps them onto the
``perf_counter_ns`` clock waterfalls use (``process_anchor().to_perf_ns(packet.epoch_ns)``).

    with TcpDump("udp port 5354") as capture:
        ...  # traffic
    for packet in capture.packets():
        print(packet.epoch_ns, packet.src, packet.sport, packet.payload)

Capturing needs root (or ``CAP_NET_RAW``) and the ``tcpdump`` binary.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["EndMark", "Packet", "TcpDump", "read_pcap"]

_NS_MAGIC, _US_MAGIC = 0xA1B23C4D, 0xA1B2C3D4
_LINK_ETHERNET, _LINK_RAW, _LINK_SLL, _LINK_SLL2 = 1, 101, 113, 276
_TCP, _UDP = 6, 17
_TCP_FLAGS = {"F": 0x01, "S": 0x02, "R": 0x04, "P": 0x08, "A": 0x10}


@dataclass(frozen=True, slots=True)
class Packet:
    """One captured IPv4/IPv6 TCP or UDP packet.

    Attributes:
        epoch_ns: the kernel's capture stamp, Unix epoch nanoseconds.
        proto: ``"tcp"`` or ``"udp"``.
        src, dst: addresses as text; sport, dport: ports.
        payload: the transport payload (what the application sent).
        flags: TCP flags as letters (``"S"``, ``"SA"``, ``"PA"``, ...); empty for UDP.
        seq: the TCP sequence number (0 for UDP).
    """

    epoch_ns: int
    proto: str
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes
    flags: str = ""
    seq: int = 0


def read_pcap(path: str | Path) -> list[Packet]:
    """The TCP and UDP packets of a classic pcap file (other packets are skipped).

    Raises:
        ValueError: not a pcap file, or a link type this reader does not know.
    """
    data = Path(path).read_bytes()
    if len(data) < 24:
        return []
    magic_le = struct.unpack_from("<I", data)[0]
    order = "<" if magic_le in (_NS_MAGIC, _US_MAGIC) else ">"
    magic, _, _, _, _, _, link = struct.unpack_from(order + "IHHiIII", data)
    if magic not in (_NS_MAGIC, _US_MAGIC):
        raise ValueError(f"{path}: not a pcap file (magic {magic:#x})")
    scale = 1 if magic == _NS_MAGIC else 1000
    out: list[Packet] = []
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, caplen, _ = struct.unpack_from(order + "IIII", data, pos)
        frame = data[pos + 16 : pos + 16 + caplen]
        pos += 16 + caplen
        packet = _decode(sec * 1_000_000_000 + frac * scale, link, frame)
        if packet is not None:
            out.append(packet)
    return out


def _decode(epoch_ns: int, link: int, frame: bytes) -> Packet | None:
    if link == _LINK_ETHERNET:
        ethertype, ip = int.from_bytes(frame[12:14], "big"), frame[14:]
    elif link == _LINK_SLL:
        ethertype, ip = int.from_bytes(frame[14:16], "big"), frame[16:]
    elif link == _LINK_SLL2:
        ethertype, ip = int.from_bytes(frame[0:2], "big"), frame[20:]
    elif link == _LINK_RAW:
        ethertype, ip = (0x86DD if frame[:1] and frame[0] >> 4 == 6 else 0x0800), frame
    else:
        raise ValueError(f"link type {link} is not supported")
    if ethertype == 0x0800 and len(ip) >= 20:
        header = (ip[0] & 0x0F) * 4
        total = int.from_bytes(ip[2:4], "big")
        proto, src, dst = ip[9], ip[12:16], ip[16:20]
        body = ip[header:total]
    elif ethertype == 0x86DD and len(ip) >= 40:
        proto, src, dst = ip[6], ip[8:24], ip[24:40]
        body = ip[40 : 40 + int.from_bytes(ip[4:6], "big")]
    else:
        return None
    return _transport(epoch_ns, proto, _text(src), _text(dst), body)


def _text(raw: bytes) -> str:
    return str(ipaddress.ip_address(raw))


def _transport(epoch_ns: int, proto: int, src: str, dst: str, body: bytes) -> Packet | None:
    if proto == _UDP and len(body) >= 8:
        sport, dport = struct.unpack_from("!HH", body)
        return Packet(epoch_ns, "udp", src, sport, dst, dport, body[8:])
    if proto == _TCP and len(body) >= 20:
        sport, dport, seq = struct.unpack_from("!HHI", body)
        offset = (body[12] >> 4) * 4
        bits = body[13]
        flags = "".join(letter for letter, bit in _TCP_FLAGS.items() if bits & bit)
        return Packet(epoch_ns, "tcp", src, sport, dst, dport, body[offset:], flags, seq)
    return None


class EndMark:
    """The end of a loopback capture, as tcpdump sees it: a datagram we send ourselves.

    tcpdump reads the kernel's capture ring when it is scheduled, which on a busy host can be
    long after the last packet of interest crossed the interface; stopping it after a fixed
    pause loses what it had not read yet. The ring is in order, so once the mark is in the
    file every packet before it is too. The mark goes to a UDP port of our own on 127.0.0.1,
    added to the capture filter with :meth:`bpf`; readers leave it out (:meth:`is_mark`).
    Other interfaces do not see loopback datagrams: there, :meth:`wait` pauses instead.
    """

    def __init__(self, interface: str) -> None:
        self.interface = interface
        self._sock: socket.socket | None = None
        self.port = 0
        self._token = b"la-capture-end-" + os.urandom(16).hex().encode()

    def bpf(self, bpf: str) -> str:
        """``bpf`` widened to take the mark in too (on ``lo``: the mark's port is taken now,
        until :meth:`close`)."""
        if self.interface != "lo":
            return bpf
        if self._sock is None:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._sock.bind(("127.0.0.1", 0))
            self.port = self._sock.getsockname()[1]
        if not bpf.strip():
            return bpf
        return f"({bpf}) or (udp and dst host 127.0.0.1 and dst port {self.port})"

    def is_mark(self, dport: int, proto: str) -> bool:
        return self.port != 0 and proto == "udp" and dport == self.port

    def wait(self, path: Path, settle_s: float, timeout_s: float = 10.0) -> None:
        """Send the mark and return once tcpdump has written it to ``path`` (at most
        ``timeout_s``; the packets it has not written by then are missing from the file).
        Where there is no mark (not ``lo``), pause ``settle_s`` instead."""
        if self._sock is None:
            time.sleep(settle_s)
            return
        self._sock.sendto(self._token, ("127.0.0.1", self.port))
        deadline, seen, tail = time.monotonic() + timeout_s, 0, b""
        while time.monotonic() < deadline:
            try:
                with path.open("rb") as f:
                    f.seek(seen)
                    new = f.read()
            except FileNotFoundError:
                new = b""
            seen += len(new)
            if self._token in tail + new:
                return
            tail = (tail + new)[-len(self._token) :]
            time.sleep(0.005)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class TcpDump:
    """tcpdump writing a nanosecond pcap of ``interface`` while the block runs.

    Args:
        bpf: a capture filter (``"udp port 5354"``).
        interface: the interface to capture on (``"lo"``).
        tcpdump: the binary (default: found on PATH).

    Raises:
        FileNotFoundError: tcpdump is not installed.
        RuntimeError: tcpdump exited before it started capturing (its message included).
    """

    def __init__(self, bpf: str = "", interface: str = "lo", tcpdump: str | None = None) -> None:
        binary = tcpdump or shutil.which("tcpdump")
        if binary is None:
            raise FileNotFoundError("tcpdump is not installed")
        self._dir = tempfile.TemporaryDirectory(prefix="la-pcap-")
        self.path = Path(self._dir.name) / "capture.pcap"
        self._mark = EndMark(interface)
        self._argv = [
            binary,
            "-i",
            interface,
            "-n",
            "-U",
            "--immediate-mode",
            "--time-stamp-precision=nano",
            "-s",
            "262144",
            "-B",  # KiB of capture ring: room for what crosses lo while tcpdump waits for a CPU
            "65536",
            "-w",
            str(self.path),
        ]
        self._bpf = bpf
        self._proc: subprocess.Popen[bytes] | None = None
        self._packets: list[Packet] | None = None

    def __enter__(self) -> TcpDump:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start tcpdump and return once it is capturing."""
        marked = self._mark.bpf(self._bpf)
        argv = [*self._argv, marked] if marked.strip() else self._argv
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._proc = proc
        assert proc.stderr is not None
        said: list[str] = []
        for raw in _lines(proc.stderr):
            said.append(raw)
            if "listening on" in raw:
                return
        proc.wait()
        self._proc = None
        self._mark.close()
        raise RuntimeError(f"tcpdump did not start: {' '.join(said).strip()}")

    def stop(self, settle: float = 0.05) -> None:
        """Once tcpdump has written the last packets, stop it: on ``lo`` it waits for the
        :class:`EndMark`, elsewhere it pauses ``settle`` seconds."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._mark.wait(self.path, settle)
        self._mark.close()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()

    def packets(self) -> list[Packet]:
        """What was captured (read once, after :meth:`stop`)."""
        if self._packets is None:
            read = read_pcap(self.path) if self.path.exists() else []
            self._packets = [p for p in read if not self._mark.is_mark(p.dport, p.proto)]
            self._dir.cleanup()
        return self._packets


def _lines(stream: IO[bytes]) -> Iterator[str]:
    while raw := stream.readline():
        yield raw.decode(errors="replace")
