"""What TLS settled, and the hand-over of a connection to HTTP/2 when ALPN chose ``h2``.

Two ways over: at ``connection_made`` (:func:`_hand_over_at_once`, the request's first
flight leaves inside the handshake's last read callback, or has left already with the
Finished when the handshake ran in a worker thread), or once the connection is back in
the connector (:func:`_maybe_hand_over`, which also refuses a required ``h2`` the server
did not choose). Either way the hand-over is left on the request (``RequestState.handoff``)
for :meth:`~.connector.TimedConnector.dial` to return.
"""

from __future__ import annotations

import asyncio
from typing import cast

from aiohttp.client_proto import ResponseHandler

from ..timeline import TlsInfo
from ._protocol import TimedProtocol
from ._state import RequestState
from .http2 import HandoffToHTTP2, HTTP2Refused


def _maybe_hand_over(
    state: RequestState,
    transport: asyncio.Transport,
    proto: ResponseHandler,
    info: TlsInfo | None,
    tls: bool,
) -> None:
    """Leave ``state.handoff`` for HTTP/2 when ALPN chose ``h2`` (or ``h2c`` by prior
    knowledge); raise when ``h2`` was required and refused, or opening it failed."""
    if state.h2_mode is None:
        return
    alpn = info.alpn if info is not None else None
    if tls and state.h2_mode == "require" and alpn != "h2":
        transport.close()
        chosen = repr(alpn) if alpn else "no protocol"
        raise HTTP2Refused(f"HTTP/2 required but the server's ALPN chose {chosen} (we offered h2)")
    if tls and alpn != "h2" and state.alpn_settled is not None:  # HTTP/1.1: tell the waiters
        state.alpn_settled()
        state.alpn_settled = None
    timed = cast(TimedProtocol, proto)
    done = timed.handoff
    if isinstance(done, BaseException):  # what h2_open raised inside connection_made
        raise done
    if done is None and (alpn == "h2" or (not tls and state.h2_mode == "require")):
        transport.pause_reading()  # nothing more for aiohttp's parser; the new owner resumes
        done = HandoffToHTTP2(transport, info, _peer(proto), timed.early or [])
        if state.h2_open is not None:  # the request goes out now
            state.h2_open(done)
            state.h2_open = None
    state.handoff = done  # None: the connection stays HTTP/1.1


def _hand_over_at_once(
    state: RequestState,
    tls: bool,
    server_hostname: object,
    proto: TimedProtocol,
    transport: asyncio.Transport,
) -> None:
    """At ``connection_made``: when this is an HTTP/2 connection, open it and send now.

    What ``_maybe_hand_over`` would do once the connection is back in the connector, minus
    the failure cases, which are left to it (HTTP/1.1 chosen, ``h2`` required and refused).
    """
    info = _tls_info(transport, server_hostname) if tls else None
    alpn = info.alpn if info is not None else None
    if state.h2_open is None or not (alpn == "h2" or (not tls and state.h2_mode == "require")):
        return
    transport.pause_reading()
    handoff = HandoffToHTTP2(transport, info, _peer_of(transport), [])
    try:
        state.h2_open(handoff)
    except Exception as exc:  # raised from the connector, not inside asyncio's callback
        proto.handoff = exc
        return
    state.h2_open = None
    proto.handoff = handoff


def _tls_info(transport: asyncio.BaseTransport, server_hostname: object) -> TlsInfo:
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return TlsInfo(server_hostname=str(server_hostname) if server_hostname else None)
    cipher = ssl_object.cipher()
    return TlsInfo(
        version=ssl_object.version(),
        cipher=cipher[0] if cipher else None,
        alpn=ssl_object.selected_alpn_protocol(),
        session_reused=ssl_object.session_reused,
        server_hostname=str(server_hostname) if server_hostname else None,
    )


def _peer(proto: ResponseHandler) -> str | None:
    return _peer_of(proto.transport)


def _peer_of(transport: asyncio.BaseTransport | None) -> str | None:
    peer = transport.get_extra_info("peername") if transport is not None else None
    if not peer:
        return None
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
