"""What HTTP/2 needs beside the connection object: request header fields, the first flight
encoded ahead of time, GOAWAY taken out of the byte stream, error-code names and the errors.

Nothing here holds a connection or a socket; :mod:`.http2` and its stream side use these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import h2.config
import h2.connection
import h2.errors

__all__ = [
    "HTTP2Refused",
    "HTTP2SettleTimeout",
    "PreparedStart",
    "prepare_first_stream",
]

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "host",
}


class HTTP2Refused(Exception):
    """``http2=True`` but the server's ALPN choice was not ``h2``."""


class HTTP2SettleTimeout(ConnectionError):
    """The server sent no SETTINGS within the settle bound: the connection was closed."""


class _GoAwayFilter:
    """Takes GOAWAY frames out of the received bytes before ``h2`` sees them.

    ``h2`` closes its whole state machine on GOAWAY, so streams the server promised to finish
    (ids up to ``last_stream_id``) would be lost; RFC 9113 §6.8 says they complete. Only frame
    headers are read: 9 bytes each, payloads pass through untouched.
    """

    __slots__ = ("_goaway", "_head", "_left")

    def __init__(self) -> None:
        self._head = b""  # a partial 9-byte frame header
        self._left = 0  # payload bytes of the current frame still to come
        self._goaway: bytearray | None = None  # the GOAWAY payload being collected

    def feed(self, data: bytes) -> tuple[bytes, list[tuple[int, int]]]:
        """Bytes for ``h2`` and the (last_stream_id, error_code) of each GOAWAY completed."""
        out, goaways, pos = bytearray(), [], 0
        while pos < len(data):
            if self._left:
                take = min(self._left, len(data) - pos)
                piece = data[pos : pos + take]
                if self._goaway is None:
                    out += piece
                else:
                    self._goaway += piece
                self._left -= take
                pos += take
            else:
                need = 9 - len(self._head)
                self._head += data[pos : pos + need]
                pos += min(need, len(data) - pos)
                if len(self._head) < 9:
                    break
                length, kind = int.from_bytes(self._head[:3], "big"), self._head[3]
                self._goaway = bytearray() if kind == 0x7 else None
                if self._goaway is None:
                    out += self._head
                self._head, self._left = b"", length
            if self._goaway is not None and not self._left and len(self._goaway) >= 8:
                last = int.from_bytes(self._goaway[:4], "big") & 0x7FFFFFFF
                goaways.append((last, int.from_bytes(self._goaway[4:8], "big")))
                self._goaway = None
        return bytes(out), goaways


def _request_fields(
    method: str, target: tuple[str, str, str], headers: Sequence[tuple[str, str]]
) -> list[tuple[str, str]]:
    scheme, authority, path = target
    pseudo = [(":method", method), (":scheme", scheme), (":authority", authority), (":path", path)]
    lowered = ((k.lower(), v) for k, v in headers)
    return pseudo + [(k, v) for k, v in lowered if k not in _HOP_BY_HOP]


_CONFIG = h2.config.H2Configuration(client_side=True, header_encoding=None)  # read-only: shared


def _machine() -> h2.connection.H2Connection:
    return h2.connection.H2Connection(config=_CONFIG)


def _queue_body(
    machine: h2.connection.H2Connection, stream_id: int, body: memoryview
) -> memoryview:
    """Queue DATA frames of ``body`` while the flow-control window has room; the rest."""
    while body:
        room = min(machine.local_flow_control_window(stream_id), machine.max_outbound_frame_size)
        if room <= 0:
            break
        chunk, body = body[:room], body[room:]
        machine.send_data(stream_id, bytes(chunk), end_stream=not body)
    return body


class PreparedStart:
    """A new connection's first flight, encoded before the connection is there.

    The client preface, our SETTINGS and the first stream's HEADERS (and what the initial
    window takes of its body) depend only on the request, so they can be built while the TLS
    handshake's round trip leaves the event loop idle: once ALPN says ``h2`` they are
    encrypted and written at once, which is when a C client would write them.

    A dial whose handshake runs in a worker thread takes the encoded bytes out of the machine
    (``flight``) for the thread to send with its Finished; ``sent_ns`` is then when that
    send syscall was entered (0: not sent, ``flight`` is still to be written).
    """

    __slots__ = ("flight", "machine", "rest", "sent_ns", "stream_id")

    def __init__(self, machine: h2.connection.H2Connection, stream_id: int, rest: memoryview):
        self.machine, self.stream_id, self.rest = machine, stream_id, rest
        self.flight = b""
        self.sent_ns = 0


def prepare_first_stream(
    method: str, target: tuple[str, str, str], headers: Sequence[tuple[str, str]], body: bytes
) -> PreparedStart:
    """Encode a connection's preface and its first request stream (see :class:`PreparedStart`)."""
    machine = _machine()
    machine.initiate_connection()
    stream_id = machine.get_next_available_stream_id()
    machine.send_headers(stream_id, _request_fields(method, target, headers), end_stream=not body)
    return PreparedStart(machine, stream_id, _queue_body(machine, stream_id, memoryview(body)))


class _BadResponse(Exception):
    """A response a stream cannot carry (its ``:status`` is not a status code)."""


def _error_code(code: Any) -> Any:
    try:
        return h2.errors.ErrorCodes(code)
    except ValueError:
        return code


def _code_name(code: Any) -> str:
    return getattr(code, "name", str(code))
