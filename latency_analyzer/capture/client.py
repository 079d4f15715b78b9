"""The measuring HTTP/1.1 client: ``probe``/``aprobe`` for one request, ``Client`` for many.

Every request, failed or not, comes back as a ``Waterfall``; nothing raised by the network is
lost (``Waterfall.error``/``error_type`` say what broke, and the stages before it are kept).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import socket
import ssl as _ssl
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from .._redact import redact_url, remember_request
from ..errors import UsageError
from ..timeline import Recorder, Waterfall
from ._build import _is_http_url, _tls_context, _too_many_redirects
from ._errors import classify
from ._hold import Hold, SendSchedule
from ._redirect import Hop, next_hop, with_chain
from ._state import CURRENT, RequestState, TraceHook, now_ns
from ._tcpinfo import tcp_info_of
from ._transport import ClientTransport
from .http2 import H2Pool
from .propagation import _inject_ids

__all__ = ["Client", "aprobe", "probe", "redact_url"]


class Client(ClientTransport):
    """Keeps connections between requests, so cold and warm requests can be compared.

    Args:
        base_url: prefix for relative request URLs.
        resolver: ``"HOST:PORT"`` of a DNS server to ask (dnspython); None: the system's
            configuration, with ``/etc/hosts`` first.
        ssl: an ``ssl.SSLContext`` (e.g. one trusting a private CA); None: system defaults.
            The client sets the context's ALPN list to match ``http2`` (Python's ssl module
            has no per-connection setting, and a context cannot be copied with its keys), so
            other code sharing the same context offers that list too.
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
        self._sends: SendSchedule | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._in_flight: set[RequestState] = set()  # what close() ends

    async def __aenter__(self) -> Client:
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every pooled connection; the Client cannot be used afterwards.

        Requests still in flight end at once, each with its waterfall so far and
        ``error_type="closed"``: connections in use are closed, dials under way (a TCP or TLS
        handshake) shut down, and requests waiting for a connection or for their instant
        stop waiting.
        """
        self._closed = True
        for state in self._in_flight:
            state.client_closed = True
            for sock in state.sockets or ():
                with contextlib.suppress(OSError):  # closed already, or never connected
                    sock.shutdown(socket.SHUT_RDWR)
        if self._sends is not None:
            self._sends.close()
            self._sends = None
        try:
            await self._h2.close()
        finally:  # a cancelled close still closes the HTTP/1.1 pool
            if self._session is not None:
                session, self._session = self._session, None
                await session.close()

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
        the delay until now becomes ``schedule_lag``. An instant still to come is kept: the
        request is prepared at once (a pooled connection taken, headers and body encoded) and
        its bytes are handed to the kernel at that instant, where its waterfall starts; a
        request that needs a new connection dials at the instant. If the request is
        cancelled, ``on_cancel`` (when given) gets its waterfall so far,
        ``error_type="cancelled"``, with every stage that happened (open ones end at the
        cancellation); the cancellation still propagates.
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
        start, hold = now_ns(), None
        if intended_start_ns is not None and intended_start_ns > start:
            # prepared now, sent at its instant (._hold): the waterfall starts there
            start, hold = intended_start_ns, self._send_schedule().hold(intended_start_ns)
        wf, location = await self._hop(
            hop, timeout, intended_start_ns, start, on_cancel, answer, hold
        )
        before: list[Waterfall] = []
        # a hop that failed (its body cut, the client closed) is where the request ended
        while (
            self.follow_redirects
            and wf.error_type is None
            and (nxt := next_hop(hop, wf.status, location)) is not None
        ):
            before.append(wf)
            if len(before) > self.max_redirects:
                wf = _too_many_redirects(wf, self.max_redirects)
                break
            hop = nxt
            remember_request(hop.url, hop.headers)
            wf, location = await self._hop(hop, timeout, None, now_ns(), on_cancel, answer)
        return with_chain(wf, before) if before else wf

    async def _hop(
        self,
        hop: Hop,
        timeout: float | None,
        intended_start_ns: int | None,
        start: int,
        on_cancel: Callable[[Waterfall], None] | None,
        answer: list[str] | None = None,
        hold: Hold | None = None,
    ) -> tuple[Waterfall, str | None]:
        """One request: its waterfall and the ``Location`` it answered with, if any."""
        method, full, json, data, sent = hop.method, hop.url, hop.json, hop.data, dict(hop.headers)
        limit = self.timeout if timeout is None else timeout
        recorder = Recorder(
            method, redact_url(full), start_ns=start, intended_start_ns=intended_start_ns
        )
        state = RequestState(recorder, self._trace)
        state.answer, state.hold = answer, hold
        self._in_flight.add(state)
        # W3C traceparent: how server spans find this request
        trace_id, span_id, parent_span_id, _ = _inject_ids(sent)
        attributes = recorder.attributes
        attributes["trace_id"], attributes["span_id"] = trace_id, span_id
        if parent_span_id:
            attributes["parent_span_id"] = parent_span_id
        headers = sent
        token = CURRENT.set(state)
        cancelled = False
        try:
            await self._route(state, method, full, json, data, headers, limit)
        except asyncio.CancelledError:
            if not (state.client_closed and _not_cancelling()):  # the caller's cancellation
                cancelled = on_cancel is not None
                if cancelled:
                    state.fail("cancelled", "cancelled before the response ended", now_ns())
                raise
            # a wait our close cancelled (a pool slot, the request's instant), not this task
            state.fail_closed(now_ns())
        except Exception as exc:  # every network failure becomes data on the waterfall
            failed_at = now_ns()
            if state.protocol is not None and not state.protocol.backlog:
                state.protocol.close_send()  # all bytes had left: the request was sent
            if state.client_closed:  # what broke it was our close, whatever it looked like
                state.fail_closed(failed_at)
            else:
                state.fail(*classify(exc, state.recorder, limit), failed_at)
        finally:
            CURRENT.reset(token)
            self._in_flight.discard(state)
            state.sockets = None
            recorder = state.recorder  # a new one if the request was retried (._stale)
            if recorder.tcp_end is None and state.protocol is not None:  # failed: if still open
                recorder.tcp_end = tcp_info_of(state.protocol.transport)
            if state.protocol is not None and state.protocol.state is state:
                state.protocol.detach()
            if hold is not None:
                hold.drop()  # ended before its instant: nothing left is sent (else a no-op)
            if cancelled and on_cancel is not None:
                on_cancel(recorder.finish(max(now_ns(), start)))
        if recorder.interrupted or state.body_end_ns is None:
            return recorder.finish(max(now_ns(), start)), state.location
        return recorder.finish(state.body_end_ns), state.location


def _not_cancelling() -> bool:
    """True when the running task has no cancellation asked of it (so a CancelledError came
    from a future someone else cancelled). Python 3.10 cannot tell: False."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is not None and cancelling() == 0


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


def probe(
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
    """Synchronous ``aprobe``; inside a running event loop (a notebook) it uses a worker thread.

    Arguments are those of :func:`aprobe`.
    """
    request = functools.partial(
        aprobe,
        url,
        method=method,
        json=json,
        data=data,
        headers=headers,
        resolver=resolver,
        ssl=ssl,
        insecure=insecure,
        timeout=timeout,
        dns_timeout=dns_timeout,
        trace=trace,
        http2=http2,
        follow_redirects=follow_redirects,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(request())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, request()).result()
