"""The HTTP/2 pool (one connection per origin) and what the connector hands over to HTTP/2."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from ..timeline import TlsInfo

if TYPE_CHECKING:
    from ._h2stream import H2Stream
    from .http2 import H2Connection

__all__ = ["H2Pool", "HandoffToHTTP2"]


class HandoffToHTTP2:
    """A dialled connection ALPN (or prior knowledge) gave to HTTP/2, as the connector's
    :meth:`~.connector.TimedConnector.dial` returns it.

    When the dialling request was opened on it inside the handshake's last callback
    (``RequestState.h2_open``), ``conn`` and ``stream`` are that connection and the request's
    stream, already sent.
    """

    __slots__ = ("conn", "early", "peer", "stream", "tls", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        tls: TlsInfo | None,
        peer: str | None,
        early: list[tuple[bytes, int]],
    ) -> None:
        self.transport = transport
        self.tls = tls
        self.peer = peer
        self.early = early  # (bytes, arrival ns) received before the hand-over
        self.conn: H2Connection | None = None
        self.stream: H2Stream | None = None


class H2Pool:
    """One HTTP/2 connection per origin, shared by every stream to it.

    Requests to an origin whose first connection is still being dialled wait for it (their
    ``pool_wait``) instead of dialling their own; ``None`` as the outcome means the server chose
    HTTP/1.1, and they go the HTTP/1.1 way.
    """

    def __init__(self) -> None:
        self._conns: dict[str, H2Connection] = {}  # the connection new streams to an origin use
        self._live: set[H2Connection] = set()  # every connection not yet closed, pooled or not
        self._dialling: dict[str, asyncio.Future[H2Connection | None]] = {}
        self._abandoned: set[str] = set()  # dials still running when the pool was closed
        self.http1_origins: set[str] = set()

    def get(self, origin: str) -> H2Connection | None:
        conn = self._conns.get(origin)
        if conn is not None and not conn.usable:  # closed under us: it cannot stay
            self._release(conn, origin)
            return None
        return conn

    def dialling(self, origin: str) -> asyncio.Future[H2Connection | None] | None:
        return self._dialling.get(origin)

    def begin_dial(self, origin: str) -> None:
        self._abandoned.discard(origin)
        self._dialling[origin] = asyncio.get_running_loop().create_future()

    def end_dial(self, origin: str, conn: H2Connection | None, http1: bool = False) -> None:
        """The dial for ``origin`` ended: with a connection, with HTTP/1.1, or failed.

        A connection from a dial that outlived :meth:`close` is closed, not pooled: its
        request fails as any request in flight at close does.
        """
        if conn is not None and origin in self._abandoned:
            self._abandoned.discard(origin)
            conn.transport.close()
        elif conn is not None:
            self._conns[origin] = conn
            self._live.add(conn)
            conn.on_closing = functools.partial(self._release, origin=origin)
            conn.closed.add_done_callback(lambda _: self._live.discard(conn))
        elif http1:
            self.http1_origins.add(origin)
        future = self._dialling.pop(origin, None)
        if future is not None and not future.done():
            future.set_result(conn)

    def _release(self, conn: H2Connection, origin: str) -> None:
        """``conn`` takes no new streams (GOAWAY, error, never settled): out of the pool."""
        if self._conns.get(origin) is conn:
            del self._conns[origin]

    async def close(self, timeout: float = 2.0) -> None:
        """Close every connection and wait until each is closed (its socket released).

        A TLS connection closes only after the peer answers our close_notify; a peer that
        does not answer within ``timeout`` seconds has its connection aborted. Without the
        wait, a loop that ends right after ``close`` would never release the socket.
        """
        conns = list(self._live | set(self._conns.values()))
        self._conns.clear()
        for conn in conns:
            conn.transport.close()
        self._abandoned.update(self._dialling)
        for future in self._dialling.values():
            if not future.done():
                future.set_result(None)
        self._dialling.clear()
        try:
            pending = [conn.closed for conn in conns if not conn.closed.done()]
            if pending:
                await asyncio.wait(pending, timeout=timeout)
        finally:  # also when cancelled: nothing is left half closed
            stragglers = [conn for conn in conns if not conn.closed.done()]
            for conn in stragglers:
                conn.transport.abort()  # connection_lost follows on the next loop step
        if stragglers:
            await asyncio.wait([conn.closed for conn in stragglers], timeout=1.0)
