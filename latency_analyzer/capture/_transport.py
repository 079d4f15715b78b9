"""How a Client's request reaches the server: on HTTP/2 or HTTP/1.1, dialled or pooled.

:class:`ClientTransport` is the part of :class:`~.client.Client` below ``request()``: the
aiohttp session (HTTP/1.1, with the timed connector), the HTTP/2 pool, and per request the
choice between a pooled HTTP/2 connection, waiting on another request's dial, or dialling:
the connector's :meth:`~.connector.TimedConnector.dial` returns an HTTP/1.1 connection for
aiohttp's exchange to take, or the HTTP/2 connection ALPN chose, this request's stream on it
already sent (opened inside the handshake's last callback).
"""

from __future__ import annotations

import asyncio
import io
import ssl as _ssl
from collections.abc import Coroutine, Mapping
from typing import Any, cast

import aiohttp
from aiohttp import hdrs
from aiohttp.helpers import parse_content_type

from ..errors import UsageError
from ..timeline._info import connection_info
from ._build import (
    _client_timeout,
    _connect_timeout,
    _h2_request_parts,
    _h2_target,
    _http_version,
    _json_body,
    _left,
    _origin,
)
from ._consume import ResponseConsumer, note_server_headers, notes_any
from ._hold import SendSchedule
from ._stale import restart, retry_allowed
from ._state import RequestState, now_ns
from ._tcpinfo import tcp_info_of
from .connector import TimedConnector, TimedProtocol
from .http2 import (
    H2Connection,
    H2Pool,
    H2Stream,
    HandoffToHTTP2,
    PreparedStart,
    prepare_first_stream,
)
from .resolver import DnsResolver

__all__ = ["ClientTransport"]


class ClientTransport:
    """The session, the HTTP/2 pool and the routing of a request between them.

    Its fields are set by :class:`~.client.Client`'s constructor.
    """

    dns_timeout: float
    http2: bool | None
    h2_settle_timeout: float
    _resolver_spec: str | None
    _ssl: _ssl.SSLContext
    _h2: H2Pool
    _limit: int
    _keepalive: bool
    _headers: dict[str, str]
    _session: aiohttp.ClientSession | None
    _sends: SendSchedule | None
    _loop: asyncio.AbstractEventLoop | None
    _closed: bool

    def _send_schedule(self) -> SendSchedule:
        """Where requests prepared ahead of their instant wait for it (one per Client)."""
        self._check_usable()
        if self._sends is None:
            self._sends = SendSchedule(asyncio.get_running_loop())
        return self._sends

    def _check_usable(self) -> None:
        """A closed Client would silently open a new pool (and leak it); one used from a second
        event loop would fail every request with "Event loop is closed"."""
        if self._closed:
            raise UsageError("this Client is closed; create a new one")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise UsageError(
                "this Client was opened on another event loop; create one Client per loop"
            )

    def _open(self) -> aiohttp.ClientSession:
        self._check_usable()
        if self._session is None:
            connector = TimedConnector(
                resolver=DnsResolver(self._resolver_spec, timeout=self.dns_timeout),
                limit=self._limit,
                force_close=not self._keepalive,
                ssl=self._ssl,
            )
            # default headers go with each request (``sent``), so a redirect can leave them out
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
            # aiohttp resends an idempotent request that broke on a pooled connection, even
            # after response bytes, on the same recorder: the failed attempt's stages would mix
            # with the new one's. ``_exchange`` retries instead, by the rules of ._stale.
            self._session._retry_connection = False
        return self._session

    def _h2_mode(self, scheme: str) -> str | None:
        if self.http2 is True:
            return "require"
        return "prefer" if self.http2 is None and scheme == "https" else None

    def _route(
        self,
        state: RequestState,
        method: str,
        url: str,
        json: Any,
        data: bytes | str | None,
        headers: Mapping[str, str] | None,
        limit: float,
    ) -> Coroutine[Any, Any, None]:
        """HTTP/2 on a pooled connection when there is one, else dial (and maybe hand over).

        A request that may only travel on HTTP/1.1 is the exchange itself: no coroutine of
        this method's own runs between the caller and aiohttp.
        """
        scheme, origin = _origin(url)
        state.h2_mode = self._h2_mode(scheme)
        deadline = state.recorder.start_ns + int(limit * 1e9)
        if state.h2_mode is None:
            return self._exchange(state, method, url, json, data, headers, deadline)
        return self._route_h2(state, origin, method, url, json, data, headers, deadline)

    async def _route_h2(
        self,
        state: RequestState,
        origin: str,
        method: str,
        url: str,
        json: Any,
        data: bytes | str | None,
        headers: Mapping[str, str] | None,
        deadline: int,
    ) -> None:
        """``_route`` for a request HTTP/2 may carry."""
        while origin not in self._h2.http1_origins:
            conn = self._h2.get(origin)
            if conn is not None:
                await self._h2_exchange(state, conn, method, url, json, data, headers, deadline)
                return
            dialling = self._h2.dialling(origin)
            if dialling is None:
                break
            if not state.recorder.is_open("pool_wait"):  # the first stream is being dialled
                state.begin("pool_wait", now_ns())
            await asyncio.wait_for(asyncio.shield(dialling), _left(deadline))
        # a pool_wait still open (waiting on another request's dial) goes on in the connector
        dialler = origin not in self._h2.http1_origins
        if dialler:
            self._h2.begin_dial(origin)
            # settled as soon as ALPN is known, not when this request's body ends: others
            # waiting on this dial must not queue behind a whole HTTP/1.1 response
            state.alpn_settled = lambda: self._h2.end_dial(origin, None, http1=True)

            # called by the connector as soon as the TLS handshake chose h2; prepare while
            # the handshake is under way
            dial = _H2Dial(self, state, origin, method, url, json, data, headers)
            state.h2_open, state.h2_prepare = dial.open, dial.prepare
        try:
            # the dialer first (a pooled HTTP/1.1 connection, or a new one that ALPN makes
            # either), then the protocol it became
            connector = cast(TimedConnector, (self._session or self._open()).connector)
            got = await connector.dial(state, origin, url, _connect_timeout(_left(deadline)))
            if isinstance(got, HandoffToHTTP2):
                dialler = False
                if got.conn is None:  # not opened inside the handshake: not the origin's dialler
                    _H2Dial(self, state, origin, method, url, json, data, headers).open(got)
                assert got.conn is not None and got.stream is not None
                await self._h2_exchange(
                    state, got.conn, method, url, json, data, headers, deadline, got.stream
                )
                return
            await self._exchange(state, method, url, json, data, headers, deadline)
        finally:
            unused, state.ready = state.ready, None
            if unused is not None:  # the exchange failed before aiohttp took it
                unused.release()
            if dialler:  # no HTTP/2 from this dial: HTTP/1.1 chosen, or the dial failed
                http1 = state.recorder.http_version is not None
                self._h2.end_dial(origin, None, http1=http1)

    async def _h2_exchange(
        self,
        state: RequestState,
        conn: H2Connection,
        method: str,
        url: str,
        json: Any,
        data: bytes | str | None,
        headers: Mapping[str, str] | None,
        deadline: int,
        opened: H2Stream | None = None,
    ) -> None:
        """One request on ``conn``: a stream ``_H2Dial.open`` already sent, or a new one."""
        if opened is None and state.hold is not None:
            # a stream shares its connection's writes: it is encoded at its instant, not held
            await asyncio.wait_for(state.hold.wait(), _left(deadline))
        rec = state.recorder
        rec.http_version, rec.tls = "2", conn.tls
        rec.connection = connection_info(
            opened is None, conn.connection_id, conn.peer, conn.requests_served
        )
        if opened is not None:
            try:
                await asyncio.wait_for(conn.run_stream(opened), _left(deadline))
            finally:
                conn.abandon(opened)  # nothing left to do unless run_stream never started
            rec.tcp_end = tcp_info_of(conn.transport)
            return
        if not rec.is_open("pool_wait"):
            state.begin("pool_wait", now_ns())
        body, fields = _h2_request_parts({}, headers, json, data)  # headers: defaults merged
        target = _h2_target(url)

        async def run() -> None:
            await conn.ready()  # the server's stream limit is known before we add a stream
            await conn.acquire_slot()
            if rec.is_open("pool_wait"):
                state.end("pool_wait", now_ns())
            await conn.run_stream(conn.open_stream(state, method, target, fields, body))
            rec.tcp_end = tcp_info_of(conn.transport)

        await asyncio.wait_for(run(), _left(deadline))

    async def _exchange(
        self,
        state: RequestState,
        method: str,
        url: str,
        json: Any,
        data: bytes | str | None,
        headers: Mapping[str, str] | None,
        deadline: int,
    ) -> None:
        """The request on HTTP/1.1 (aiohttp), sent once more on the pool's next connection
        when a reused one broke before any response byte (the rules of ._stale)."""
        session = self._session or self._open()  # request() checked the client is usable
        retried = False
        while True:
            try:
                # aiohttp's own timeout (no extra task per request), for the time left, exact
                timer = _client_timeout(_left(deadline))
                body: bytes | str | io.BytesIO | None = data
                fields = headers
                if json is not None:  # encoded for each attempt: a stream is read only once
                    body, fields = _json_body(json, headers)
                if isinstance(body, bytes) and body and _inlinable(fields):
                    # written with the headers, in the request's own step: aiohttp would
                    # write a body from a task of its own (before Python 3.12), a loop turn
                    # later, after whatever else was ready (other requests' work, in a burst)
                    state.inline_body, fields = body, _with_length(fields, len(body))
                    body = None
                async with session.request(
                    method, url, data=body, headers=fields, timeout=timer, allow_redirects=False
                ) as resp:
                    rec = state.recorder
                    rec.status = resp.status
                    rec.http_version = _http_version(resp.version)
                    proto: TimedProtocol = state.protocol
                    if notes_any(resp.headers):
                        note_server_headers(state, resp.headers.items())
                    consumer = ResponseConsumer(
                        state, resp.status, _content_type(resp.headers), resp.reason or ""
                    )
                    content = resp.content
                    if consumer.wants_arrival_times:  # a stream: fed in each read's callback
                        proto.stream_to(consumer, content)
                        try:
                            await _until_end(content, _left(deadline))
                        finally:
                            proto.stop_streaming()
                    else:
                        # ``iter_any()`` without its iterator: one coroutine less per read,
                        # and no StopAsyncIteration raised at the end (b"" ends both)
                        while chunk := await content.readany():
                            consumer.feed(chunk, 0)
                    consumer.close(state.body_end_ns or now_ns())
                    rec.tcp_end = proto.tcp_info()
                return
            except Exception as exc:  # a broken reused connection, or re-raised as it was
                failed_at = now_ns()
                if retried or not retry_allowed(state, exc) or _left(deadline) <= 0:
                    raise  # 0 left: no timer at all for a retry
                restart(state, exc, failed_at)  # once, on the pool's next connection; attempt kept
                retried = True


def _inlinable(headers: Mapping[str, str] | None) -> bool:
    """A body whose framing the caller did not set (their Content-Length or
    Transfer-Encoding goes to aiohttp, which sends it as told)."""
    return not headers or not any(
        k.lower() in ("content-length", "transfer-encoding") for k in headers
    )


def _with_length(headers: Mapping[str, str] | None, size: int) -> dict[str, str]:
    """The headers aiohttp would send with a bytes body of ``size``: its length, and its
    type when the caller gave none."""
    out = dict(headers or {})
    out["Content-Length"] = str(size)
    if not any(k.lower() == "content-type" for k in out):
        out["Content-Type"] = "application/octet-stream"
    return out


async def _until_end(content: aiohttp.StreamReader, left_s: float) -> None:
    """Wait for the end of a body its protocol drains as it reads (``stream_to``); raise
    what ended it otherwise (a cut connection, an error while feeding it, or the request's
    time running out in ``left_s``: aiohttp's timer bounds its own reads, not this wait)."""
    expiry = asyncio.get_running_loop().call_later(left_s, _time_out, content)
    try:
        while not content.is_eof():
            exc = content.exception()
            if exc is not None:
                raise exc
            await content.wait_eof()
        exc = content.exception()
        if exc is not None:
            raise exc
    finally:
        expiry.cancel()


def _time_out(content: aiohttp.StreamReader) -> None:
    if not content.is_eof() and content.exception() is None:
        content.set_exception(asyncio.TimeoutError())


def _content_type(headers: Mapping[str, str]) -> str:
    """``ClientResponse.content_type`` from aiohttp's own (cached) parse of the header,
    without the property's copy of the parameters, which are not read here."""
    raw = headers.get(hdrs.CONTENT_TYPE)
    return "application/octet-stream" if raw is None else parse_content_type(raw)[0]


class _H2Dial:
    """The request dialling a new connection that may turn out to be HTTP/2.

    The connector calls :meth:`open` the moment the TLS handshake chose ``h2`` (in
    ``connection_made``). The request does not wait for the server's SETTINGS (RFC 9113 §3.4
    lets a client send right after its preface, and curl and browsers do): preface, SETTINGS
    and HEADERS leave in one write.
    """

    def __init__(
        self,
        client: ClientTransport,
        state: RequestState,
        origin: str,
        method: str,
        url: str,
        json: Any,
        data: bytes | str | None,
        headers: Mapping[str, str] | None,
    ) -> None:
        self.client, self.state, self.origin = client, state, origin
        self.request = (method, url, json, data, headers)
        self.prepared: PreparedStart | None = None

    def prepare(self) -> PreparedStart | None:
        """Encode the preface and this request's HEADERS ahead (the TLS round trip is idle
        time); a request h2 refuses to encode is left to :meth:`open`, which raises."""
        method, url, json, data, headers = self.request
        try:
            body, fields = _h2_request_parts(self.client._headers, headers, json, data)
            self.prepared = prepare_first_stream(method, _h2_target(url), fields, body)
        except Exception:  # open() builds it again and raises it where it belongs
            self.prepared = None
        return self.prepared

    def open(self, handoff: HandoffToHTTP2) -> None:
        """Pool the new connection and send the request on it."""
        client, state = self.client, self.state
        method, url, json, data, headers = self.request
        prepared, self.prepared = self.prepared, None
        timeout = client.h2_settle_timeout
        conn = H2Connection(handoff.transport, handoff.tls, handoff.peer, timeout, prepared)
        handoff.conn = conn
        conn.start(state)
        try:
            if prepared is not None:
                handoff.stream = conn.open_prepared(state)
            else:
                body, fields = _h2_request_parts(client._headers, headers, json, data)
                handoff.stream = conn.open_stream(state, method, _h2_target(url), fields, body)
        finally:
            conn.resume(handoff.early)
            client._h2.end_dial(self.origin, conn)
