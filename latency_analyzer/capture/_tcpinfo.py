"""Read Linux ``TCP_INFO`` from a connected socket into a :class:`~..timeline.TcpInfo`.

``struct tcp_info`` (``include/uapi/linux/tcp.h``) grows at its end as kernels add fields, and
``getsockopt`` copies at most what the kernel has: fields past the returned length are left
out (None). Elsewhere than Linux, or on a socket that is not TCP, nothing is read.
"""

from __future__ import annotations

import socket
import struct
import sys
from typing import Any

from ..timeline import TcpInfo
from ..timeline._unfrozen import unfrozen
from ._state import now_ns

__all__ = ["read_tcp_info", "tcp_info_of"]

_TCP_INFO = getattr(socket, "TCP_INFO", 11)
_LENGTH = 232  # up to tcpi_snd_wnd; a longer struct is cut, a shorter one returned as is
# (name, format, offset) of the fields we keep
_FIELDS = (
    ("retransmits", "B", 2),
    ("rto_us", "I", 8),
    ("lost", "I", 32),
    ("rtt_us", "I", 68),
    ("rttvar_us", "I", 72),
    ("snd_cwnd", "I", 80),
    ("reordering", "I", 88),
    ("total_retrans", "I", 100),
    ("segs_out", "I", 136),
    ("min_rtt_us", "I", 148),
    ("delivery_rate", "Q", 160),
    ("bytes_retrans", "Q", 208),
    ("rcv_ooopack", "I", 224),
)


def _whole_struct() -> struct.Struct:
    """One ``Struct`` reading every field of ``_FIELDS`` at once (padding in between)."""
    layout, pos = "=", 0
    for _name, fmt, offset in sorted(_FIELDS, key=lambda f: f[2]):
        layout += f"{offset - pos}x{fmt}" if offset > pos else fmt
        pos = offset + struct.calcsize("=" + fmt)
    return struct.Struct(layout)


_WHOLE = _whole_struct()
_NAMES = tuple(name for name, _, _ in sorted(_FIELDS, key=lambda f: f[2]))
# the order _whole_struct unpacks them in, which _whole spells out field by field
_WHOLE_ORDER = (
    "retransmits",
    "rto_us",
    "lost",
    "rtt_us",
    "rttvar_us",
    "snd_cwnd",
    "reordering",
    "total_retrans",
    "segs_out",
    "min_rtt_us",
    "delivery_rate",
    "bytes_retrans",
    "rcv_ooopack",
)
if _NAMES != _WHOLE_ORDER:
    raise RuntimeError("_WHOLE_ORDER must list _FIELDS by offset")
_OpenTcpInfo = unfrozen(TcpInfo)
_LINUX = sys.platform.startswith("linux")


def _whole(raw: bytes, at_ns: int) -> TcpInfo:
    """Every field of a current kernel's struct, in one unpack, stored straight into the
    slots (a reading is taken at every request's end; the frozen ``__init__`` would set
    its 14 fields one call each)."""
    info = object.__new__(_OpenTcpInfo)
    info.at_ns = at_ns
    (
        info.retransmits,
        info.rto_us,
        info.lost,
        info.rtt_us,
        info.rttvar_us,
        info.snd_cwnd,
        info.reordering,
        info.total_retrans,
        info.segs_out,
        info.min_rtt_us,
        info.delivery_rate,
        info.bytes_retrans,
        info.rcv_ooopack,
    ) = _WHOLE.unpack_from(raw)
    info.__class__ = TcpInfo
    built: TcpInfo = info
    return built


def decode_tcp_info(raw: bytes, at_ns: int) -> TcpInfo | None:
    """The fields of a ``struct tcp_info`` byte string (native order); None if too short."""
    if len(raw) >= _WHOLE.size:  # a current kernel: every field, in one unpack
        return _whole(raw, at_ns)
    values: dict[str, int | None] = {}
    for name, fmt, offset in _FIELDS:
        size = struct.calcsize(fmt)
        values[name] = (
            struct.unpack_from("=" + fmt, raw, offset)[0] if len(raw) >= offset + size else None
        )
    if values["total_retrans"] is None:  # older than any kernel we know: say nothing
        return None
    return TcpInfo(at_ns=at_ns, **values)  # type: ignore[arg-type]  # required ones checked above


def read_tcp_info(sock: Any) -> TcpInfo | None:
    """One reading from ``sock`` (a socket or asyncio's ``TransportSocket``), or None."""
    if not _LINUX or sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _LENGTH)
    except (OSError, ValueError):  # closed, or not a TCP socket
        return None
    if len(raw) >= _WHOLE.size:  # decode_tcp_info's usual case, without its call
        return _whole(raw, now_ns())
    return decode_tcp_info(raw, now_ns())


def tcp_info_of(transport: Any) -> TcpInfo | None:
    """One reading from the socket under an asyncio transport (TLS or plain), or None."""
    if transport is None:
        return None
    return read_tcp_info(transport.get_extra_info("socket"))
