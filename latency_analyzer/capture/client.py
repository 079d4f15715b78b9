"""The measuring HTTP/1.1 client: ``probe``/``aprobe`` for one request, ``Client`` for many.

Every request, failed or not, comes back as a ``Waterfall``; nothing raised by the network is
lost (``Waterfall.error``/``error_type`` say what broke, and the stages before it are kept).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import io
import json as _json
import ssl as _ssl
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import SplitResult, urlsplit

import aiohttp

from .._redact import redact_url, remember_request
from .._version import __version__
from ..errors import UsageError
from ..timeline import ConnectionInfo, Recorder, Waterfall
from ._consume import ResponseConsumer, note_server_headers
from ._errors import classify
from ._redirect import Hop, next_hop, with_chain
from ._stale import restart, retry_allowed
from ._state import CURRENT, RequestState, TraceHook, now_ns
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
from .propagation import inject
from .resolver import DnsResolver

__all__ = ["Client", "aprobe", "probe", "redact_url"]

_STREAM_BODY_OVER = 512 * 1024


def _tls_context(
    context: _ssl.SSLContext | None, insecure: bool, http2: bool | None
) -> _ssl.SSLContext:
    """The TLS context to dial with, its ALPN list matching the HTTP/2 choice."""
    if context is not None and insecure:
        raise UsageError("give either ssl= (a context) or insecure=True, not both")
    if context is None:
        return _default_context(insecure, http2)
    context.set_alpn_protocols(_ALPN[http2])
    return context


_ALPN: dict[bool | None, list[str]] = {False: ["http/1.1"], True: ["h2"], None: ["h2", "http/1.1"]}


@functools.cache
def _default_context(insecure: bool, http2: bool | None) -> _ssl.SSLContext:
    """One context per setting and process: loading the system's CA store costs ~20 ms of CPU,
    which every ``probe()`` (a new Client each time) would otherwise pay again."""
    context = _ssl.create_default_context()
    if insecure:
        context.check_hostname = False
        context.verify_mode = _ssl.CERT_NONE
    context.set_alpn_protocols(_ALPN[http2])
    return context


class Client:
    """Keeps connections between requests, so cold and warm requests can be compared.

    Args:
        base_url: prefix for relative request URLs.
        resolver: ``"HOST:PORT"`` of a DNS server to ask (dnspython); None: the system's
            configuration, with ``/etc/hosts`` first.
        ssl: an ``ssl.SSLContext`` (e.g. one trusting a private CA); None: system defaults.
        insecure: skip certificate verification (``curl -k``).
        timeout: seconds for a whole request, connection to last byte.
        limit: most connections open at once; a request beyond it records ``pool_wait``.
        keepalive: False opens a new connection for every request.
        headers: sent with every request (never recorded in a waterfall or export).
        trace: called as ``trace(event, info)`` for ``capture.<stage>.started/complete/failed``.
        dns_timeout: seconds a DNS lookup may take (at most ``timeout``).
        http2: False: HTTP/1.1 only. True: HTTP/2 required (ALPN ``h2`` over TLS, prior
            knowledge ``h2c`` for ``http://``). None (default): for ``https://`` offer
            ``h2,http/1.1`` and use what the server picks; HTTP/1.1 for ``http://``. The TLS
            context's ALPN list is set to match (a context you pass in is changed so).
        h2_settle_timeout: seconds a new HTTP/2 connection may take to send its SETTINGS.
            Past it the connection is closed and leaves the pool, and its requests fail with
            ``error_type="h2_setup"``.
        follow_redirects: False (default): a 3xx response is the result (its ``Location``,
            redacted, in ``attributes["http.location"]``). True: follow up to
            ``max_redirects`` hops, each a request of its own; the last hop's waterfall is
            returned with the chain before it in ``attributes["redirect.<i>.*"]``. Secret
            headers are not sent to another origin.
        max_redirects: most hops followed; one more is an error of type ``redirect``.

    A Client belongs to the event loop it is first used on, and cannot be used again once
    closed: both misuses raise ``UsageError``.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        resolver: str | None = None,
        ssl: _ssl.SSLContext | None = None,
        insecure: bool = False,
        timeout: float = 60.0,
        limit: int = 100,
        keepalive: bool = True,
        headers: Mapping[str, str] | None = None,
        trace: TraceHook | None = None,
        dns_timeout: float = 5.0,
        http2: bool | None = None,
        h2_settle_timeout: float = 10.0,
        follow_redirects: bool = False,
        max_redirects: int = 10,
    ) -> None:
        self.base_url = base_url
        self.follow_redirects = follow_redirects
        self.max_redirects = max_redirects
        self.timeout = timeout
        self.dns_timeout = min(dns_timeout, timeout)
        self._resolver_spec = resolver
        self.http2 = http2
        self.h2_settle_timeout = h2_settle_timeout
        self._ssl = _tls_context(ssl, insecure, http2)
        self._h2 = H2Pool()
        self._limit = limit
        self._keepalive = keepalive
        self._headers = dict(headers or {})
        self._trace = trace
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def __aenter__(self) -> Client:
        self._open()
        return self

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

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every pooled connection; the Client cannot be used afterwards."""
        self._closed = True
        try:
            await self._h2.close()
        finally:  # a cancelled close still closes the HTTP/1.1 pool
            if self._session is not None:
                session, self._session = self._session, None
                await session.close()

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

    def _url(self, url: str) -> str:
        full = (
            url
            if "://" in url or not self.base_url
            else self.base_url.rstrip("/") + "/" + url.lstrip("/")
        )
        if not _is_http_url(full):
            remember_request(full)
            raise UsageError(f"not an http(s) URL: {redact_url(full)!r}")
        return full

    async def request(
        self,
        url: str = "",
        *,
        method: str | None = None,
        json: Any = None,
        data: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        intended_start_ns: int | None = None,
        on_cancel: Callable[[Waterfall], None] | None = None,
        answer: list[str] | None = None,
    ) -> Waterfall:
        """Send one request and return its waterfall (never raises for network errors).

        ``method`` defaults to POST when there is a body, else GET. ``intended_start_ns`` (a
        ``perf_counter_ns`` value) is when an open-loop schedule wanted this request to start:
        the delay until now becomes ``schedule_lag``. If the request is cancelled, ``on_cancel``
        (when given) gets its waterfall so far, ``error_type="cancelled"``, with every stage
        that happened (open ones end at the cancellation); the cancellation still propagates.
        ``answer``: a list the answer's text (an OpenAI response's ``content``, as it
        arrives) is appended to, e.g. for the next turn of a conversation; it is not kept on
        the waterfall.
        """
        self._check_usable()
        method = method or ("POST" if json is not None or data is not None else "GET")
        sent = {**self._headers, **(headers or {})}
        hop = Hop(method, self._url(url), json, data, sent)
        # echoed back in errors or bodies, these values are masked; noted before the clock
        # starts, so the bookkeeping is not part of the request's time
        remember_request(hop.url, sent)
        wf, location = await self._hop(hop, timeout, intended_start_ns, now_ns(), on_cancel, answer)
        before: list[Waterfall] = []
        while self.follow_redirects and (nxt := next_hop(hop, wf.status, location)) is not None:
            before.append(wf)
            if len(before) > self.max_redirects:
                wf = _too_many_redirects(wf, self.max_redirects)
                break
            hop = nxt
            remember_request(hop.url, hop.headers)
            wf, location = await self._hop(hop, timeout, None, now_ns(), on_cancel, answer)
        return with_chain(wf, before)

    async def _hop(
        self,
        hop: Hop,
        timeout: float | None,
        intended_start_ns: int | None,
        start: int,
        on_cancel: Callable[[Waterfall], None] | None,
        answer: list[str] | None = None,
    ) -> tuple[Waterfall, str | None]:
        """One request: its waterfall and the ``Location`` it answered with, if any."""
        method, full, json, data, sent = hop.method, hop.url, hop.json, hop.data, dict(hop.headers)
        limit = self.timeout if timeout is None else timeout
        recorder = Recorder(
            method, redact_url(full), start_ns=start, intended_start_ns=intended_start_ns
        )
        state = RequestState(recorder, self._trace)
        state.answer = answer
        context = inject(sent)  # W3C traceparent: how server spans find this request
        recorder.attributes.update({"trace_id": context.trace_id, "span_id": context.span_id})
        if context.parent_span_id:
            recorder.attributes["parent_span_id"] = context.parent_span_id
        headers = sent
        token = CURRENT.set(state)
        cancelled = False
        try:
            await self._route(state, method, full, json, data, headers, limit)
        except asyncio.CancelledError:
            cancelled = on_cancel is not None
            if cancelled:
                state.fail("cancelled", "cancelled before the response ended", now_ns())
            raise
        except Exception as exc:  # every network failure becomes data on the waterfall
            failed_at = now_ns()
            if state.protocol is not None and not state.protocol.backlog:
                state.protocol.close_send()  # all bytes had left: the request was sent
            kind, message = classify(exc, state.recorder, limit)
            state.fail(kind, message, failed_at)
        finally:
            CURRENT.reset(token)
            recorder = state.recorder  # a new one if the request was retried (._stale)
            if recorder.tcp_end is None and state.protocol is not None:  # failed: if still open
                recorder.tcp_end = tcp_info_of(state.protocol.transport)
            if state.protocol is not None and state.protocol.state is state:
                state.protocol.detach()
            if cancelled and on_cancel is not None:
                on_cancel(recorder.finish(now_ns()))
        if recorder.interrupted or state.body_end_ns is None:
            return recorder.finish(now_ns()), state.location
        return recorder.finish(state.body_end_ns), state.location

    def _h2_mode(self, scheme: str) -> str | None:
        if self.http2 is True:
            return "require"
        return "prefer" if self.http2 is None and scheme == "https" else None

    async def _route(
        self,
        state: RequestState,
        method: str,
        url: str,
        json: Any,
        data: bytes | str | None,
        headers: Mapping[str, str] | None,
        limit: float,
    ) -> None:
        """HTTP/2 on a pooled connection when there is one, else dial (and maybe hand over)."""
        scheme, origin = _origin(url)
        state.h2_mode = self._h2_mode(scheme)
        deadline = state.recorder.start_ns + int(limit * 1e9)
        while state.h2_mode is not None and origin not in self._h2.http1_origins:
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
        dialler = state.h2_mode is not None and origin not in self._h2.http1_origins
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
            try:
                await self._exchange(state, method, url, json, data, headers, deadline)
            except Exception as exc:  # a broken reused connection, or re-raised as it was
                failed_at = now_ns()
                if not retry_allowed(state, exc) or _left(deadline) <= 0:  # 0: no timer at all
                    raise
                restart(state, exc, failed_at)  # once: on a new connection, the attempt kept
                await self._exchange(state, method, url, json, data, headers, deadline)
        except HandoffToHTTP2 as handoff:
            dialler = False
            if handoff.conn is None:  # the connector did not open it
                _H2Dial(self, state, origin, method, url, json, data, headers).open(handoff)
            assert handoff.conn is not None and handoff.stream is not None
            await self._h2_exchange(
                state, handoff.conn, method, url, json, data, headers, deadline, handoff.stream
            )
        finally:
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
        rec = state.recorder
        rec.http_version, rec.tls = "2", conn.tls
        rec.connection = ConnectionInfo(
            reused=opened is None,
            connection_id=conn.connection_id,
            peer=conn.peer,
            requests_before=conn.requests_served,
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
            await conn.request(state, method, target, fields, body)
            rec.tcp_end = tcp_info_of(conn.transport)

        await asyncio.wait_for(run(), _left(deadline))

    async def _exchange(
        self,
        state: RequestState,
        method: str,
        url: str,
        json: Any,
        data: bytes | str | io.BytesIO | None,
        headers: Mapping[str, str] | None,
        deadline: int,
    ) -> None:
        session = self._open()
        # aiohttp's own timeout (no extra task per request), for the time left, exact
        # (above ceil_threshold aiohttp rounds a timeout up to the next whole second)
        timer = aiohttp.ClientTimeout(total=_left(deadline), ceil_threshold=1e9)
        if json is not None:
            data, headers = _json_body(json, headers)
        async with session.request(
            method, url, data=data, headers=headers, timeout=timer, allow_redirects=False
        ) as resp:
            rec = state.recorder
            rec.status = resp.status
            rec.http_version = _http_version(resp.version)
            proto: TimedProtocol = state.protocol
            note_server_headers(state, resp.headers.items())
            consumer = ResponseConsumer(state, resp.status, resp.content_type, resp.reason or "")
            offset = 0
            async for data in resp.content.iter_any():
                if consumer.wants_arrival_times:
                    for piece, t in proto.arrivals(offset, data):
                        consumer.feed(piece, t)
                    offset += len(data)
                    proto.forget_marks_before(offset)
                else:
                    consumer.feed(data, 0)
            consumer.close(state.body_end_ns or now_ns())
            rec.tcp_end = tcp_info_of(proto.transport)


class _H2Dial:
    """The request dialling a new connection that may turn out to be HTTP/2.

    The connector calls :meth:`open` the moment the TLS handshake chose ``h2`` (in
    ``connection_made``). The request does not wait for the server's SETTINGS (RFC 9113 §3.4
    lets a client send right after its preface, and curl and browsers do): preface, SETTINGS
    and HEADERS leave in one write.
    """

    def __init__(
        self,
        client: Client,
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

    def prepare(self) -> None:
        """Encode the preface and this request's HEADERS ahead (the TLS round trip is idle
        time); a request h2 refuses to encode is left to :meth:`open`, which raises."""
        method, url, json, data, headers = self.request
        try:
            body, fields = _h2_request_parts(self.client._headers, headers, json, data)
            self.prepared = prepare_first_stream(method, _h2_target(url), fields, body)
        except Exception:  # open() builds it again and raises it where it belongs
            self.prepared = None

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


def _too_many_redirects(wf: Waterfall, limit: int) -> Waterfall:
    message = f"more than {limit} redirects (the last to {wf.url})"
    return dataclasses.replace(wf, error=message, error_type="redirect")


# a load run asks for the same few URLs on every request: what they tell is kept
@functools.lru_cache(maxsize=256)
def _is_http_url(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@functools.lru_cache(maxsize=256)
def _origin(url: str) -> tuple[str, str]:
    """``(scheme, "scheme://host:port")``; a bad port raises ``ValueError`` (not kept)."""
    parts = urlsplit(url)
    return parts.scheme, f"{parts.scheme}://{(parts.hostname or '').lower()}:{parts.port or ''}"


def _left(deadline_ns: int) -> float:
    return max(0.0, (deadline_ns - now_ns()) / 1e9)


def _path(parts: SplitResult) -> str:
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _h2_target(url: str) -> tuple[str, str, str]:
    """``(:scheme, :authority, :path)`` of an HTTP/2 request (user info left out)."""
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.rsplit("@", 1)[-1], _path(parts)


def _h2_request_parts(
    defaults: Mapping[str, str],
    headers: Mapping[str, str] | None,
    json: Any,
    data: bytes | str | None,
) -> tuple[bytes, list[tuple[str, str]]]:
    """Body bytes and header fields of an HTTP/2 request (names lowercased later)."""
    merged = {"user-agent": f"latency-analyzer/{__version__}", "accept": "*/*"}
    merged.update({k.lower(): v for k, v in defaults.items()})
    merged.update({k.lower(): v for k, v in (headers or {}).items()})
    if json is not None:
        body = _json.dumps(json).encode()
        merged.setdefault("content-type", "application/json")
    else:
        body = data.encode() if isinstance(data, str) else (data or b"")
    if body:
        merged["content-length"] = str(len(body))
    return body, list(merged.items())


def _json_body(
    obj: Any, headers: Mapping[str, str] | None
) -> tuple[bytes | io.BytesIO, Mapping[str, str]]:
    """Serialise a JSON body; large ones go as a stream (aiohttp warns on raw bytes > 1 MiB)."""
    raw = _json.dumps(obj).encode()
    merged = dict(headers or {})
    if not any(k.lower() == "content-type" for k in merged):
        merged["Content-Type"] = "application/json"
    return (io.BytesIO(raw) if len(raw) > _STREAM_BODY_OVER else raw), merged


def _http_version(version: aiohttp.HttpVersion | None) -> str | None:
    if version is None:
        return None
    return "2" if version.major == 2 else f"{version.major}.{version.minor}"


async def aprobe(
    url: str,
    *,
    method: str | None = None,
    json: Any = None,
    data: bytes | str | None = None,
    headers: Mapping[str, str] | None = None,
    resolver: str | None = None,
    ssl: _ssl.SSLContext | None = None,
    insecure: bool = False,
    timeout: float = 60.0,
    dns_timeout: float = 5.0,
    trace: TraceHook | None = None,
    http2: bool | None = None,
    follow_redirects: bool = False,
) -> Waterfall:
    """One request on a fresh connection (cold: dns, connect, tls all measured).

    Arguments are those of ``Client`` and ``Client.request``.
    """
    client = Client(
        resolver=resolver,
        ssl=ssl,
        insecure=insecure,
        timeout=timeout,
        dns_timeout=dns_timeout,
        trace=trace,
        http2=http2,
        follow_redirects=follow_redirects,
    )
    async with client:
        return await client.request(url, method=method, json=json, data=data, headers=headers)


def probe(url: str, **kwargs: Any) -> Waterfall:
    """Synchronous ``aprobe``; inside a running event loop (a notebook) it uses a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(aprobe(url, **kwargs))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, aprobe(url, **kwargs)).result()
