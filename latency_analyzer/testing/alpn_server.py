"""One TLS port that speaks both HTTP/2 and HTTP/1.1, chosen per connection by ALPN.

A real inference endpoint behind a modern proxy offers ``h2`` and ``http/1.1``; which one a
client gets depends on what the client offers. :class:`ALPNLLMServer` accepts a TCP
connection, optionally waits ``tls_delay`` before it reads the ClientHello (a slow TLS
terminator: the client's ``tls`` stage grows by exactly that much), performs the handshake,
and hands the connection to the HTTP/2 server (:class:`~latency_analyzer.testing.H2LLMServer`)
or the HTTP/1.1 one (:class:`~latency_analyzer.testing.LLMServer`) by the protocol selected.
Both serve the same :class:`~latency_analyzer.testing.Behavior` knobs.

Example::

    ca = TestCA()
    async with ALPNLLMServer(ssl=ca.server_context(alpn=()), prefill=0.018) as server:
        ...  # https://127.0.0.1:{server.port}/v1/chat/completions, h2 or http/1.1
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._timing import Service, check_loopback, deadline_after, sleep_until
from .h2_server import H2LLMServer, _Conn
from .llm import LLMServer

__all__ = ["ALPNLLMServer", "Handshake"]

_HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Handshake:
    """Ground truth for one TLS connection (``perf_counter_ns`` instants).

    Attributes:
        accepted_ns: the TCP connection was accepted.
        tls_start_ns: the server began reading the ClientHello (``accepted_ns + tls_delay``).
        tls_done_ns: the server finished the handshake (after the client's Finished).
        alpn: the protocol selected, or None (no ALPN: served as HTTP/1.1).
    """

    accepted_ns: int
    tls_start_ns: int
    tls_done_ns: int
    alpn: str | None


class _Dispatch(asyncio.Protocol):
    """Holds a fresh TCP connection until its handshake is done, then hands it on."""

    def __init__(self, server: ALPNLLMServer) -> None:
        self.server = server
        self.accepted_ns = time.perf_counter_ns()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        # bytes that arrive with the client's Finished (TLS 1.3 clients send the request at
        # once) reach this protocol before the hand-off: kept and replayed to the next one
        self.early = bytearray()
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.pause_reading()  # the ClientHello waits in the kernel until the handshake
        self.task = asyncio.ensure_future(self._handshake(transport))
        self.server._pending.add(self.task)
        self.task.add_done_callback(self.server._pending.discard)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.early += data

    def eof_received(self) -> None:
        self.eof = True  # over TLS the transport closes itself after this; nothing to keep

    async def _handshake(self, raw: asyncio.Transport) -> None:
        server = self.server
        await sleep_until(deadline_after(self.accepted_ns, server.tls_delay))
        tls_start = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                raw, self, server.ssl, server_side=True, ssl_handshake_timeout=_HANDSHAKE_TIMEOUT_S
            )
        except (OSError, ssl_module.SSLError, ConnectionError, asyncio.TimeoutError):
            raw.abort()
            return
        if tls is None:
            raw.abort()
            return
        ssl_object = tls.get_extra_info("ssl_object")
        alpn = None if ssl_object is None else ssl_object.selected_alpn_protocol()
        done = time.perf_counter_ns()
        server.handshakes.append(Handshake(self.accepted_ns, tls_start, done, alpn))
        inner = server._protocol_for(alpn)
        tls.set_protocol(inner)
        inner.connection_made(tls)
        if self.early and isinstance(inner, asyncio.Protocol):
            inner.data_received(bytes(self.early))
        if self.eof and isinstance(inner, asyncio.Protocol):
            inner.eof_received()


class ALPNLLMServer(Service):
    """The LLM test server over TLS, HTTP/2 or HTTP/1.1 as each connection's ALPN selects.

    Args:
        ssl: a server context with the certificate; its ALPN list is set to ``protocols``.
        protocols: what the server offers, in its order of preference (``h2`` first, as
            servers do: a client offering both gets HTTP/2).
        tls_delay: seconds between accepting a connection and reading its ClientHello.
        host, port: loopback address and port (0: any free port).
        **knobs: the :class:`~latency_analyzer.testing.Behavior` of both protocols.

    Attributes:
        handshakes: one :class:`Handshake` per TLS connection, in completion order.
        h1: the HTTP/1.1 server (``records``: its :class:`RequestRecord` ground truth).
        h2: the HTTP/2 server (``records``: its :class:`H2StreamRecord` ground truth).
    """

    def __init__(
        self,
        *,
        ssl: ssl_module.SSLContext,
        protocols: Sequence[str] = ("h2", "http/1.1"),
        tls_delay: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        **knobs: Any,
    ) -> None:
        if tls_delay < 0:
            raise ValueError("tls_delay must be >= 0")
        self.ssl = ssl
        ssl.set_alpn_protocols(list(protocols))
        self.protocols = tuple(protocols)
        self.tls_delay = tls_delay
        self._host, self._port = check_loopback(host), port
        # the HTTP/1.1 server listens on a port of its own too; only its handler is used here
        self.h1 = LLMServer(host=self._host, **knobs)
        self.h2 = H2LLMServer(host=self._host, **knobs)
        self.handshakes: list[Handshake] = []
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """Base URL, ``https://127.0.0.1:PORT``."""
        return self._base_url("https")

    def _protocol_for(self, alpn: str | None) -> asyncio.BaseProtocol:
        if alpn == "h2":
            return _Conn(self.h2)
        return self.h1._new_connection()

    async def start(self) -> None:
        """Start both servers' handlers and bind the TLS port."""
        await self.h1.start()
        await self._listen(lambda: _Dispatch(self))

    async def stop(self) -> None:
        """Close the port, every connection and both servers."""
        self._close_listener()
        for task in list(self._pending):
            task.cancel()
        for conn in list(self.h2.open):
            if conn.transport is not None:
                conn.transport.abort()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self.h1.stop()
