"""The measuring HTTP/1.1 client: ``probe``/``aprobe`` for one request, ``Client`` for many.

Every request, failed or not, comes back as a ``Waterfall``; nothing raised by the network is
lost (``Waterfall.error``/``error_type`` say what broke, and the stages before it are kept).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import json as _json
import ssl as _ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus, urlsplit, urlunsplit

import aiohttp

from ..errors import UsageError
from ..timeline import Recorder, Waterfall
from ._consume import ResponseConsumer
from ._errors import classify
from ._state import CURRENT, RequestState, TraceHook, now_ns
from .connector import TimedConnector, TimedProtocol
from .resolver import DnsResolver

__all__ = ["Client", "aprobe", "probe", "redact_url"]

_SECRET_QUERY_KEYS = {"key", "api_key", "api-key", "apikey", "token", "access_token", "sig"}
_STREAM_BODY_OVER = 512 * 1024


def redact_url(url: str) -> str:
    """The URL without user info and with secret-looking query values replaced by ``***``.

    Other query parameters are kept exactly as written (no re-encoding).
    """
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = "&".join(_redact_param(p) for p in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_param(param: str) -> str:
    key, sep, _ = param.partition("=")
    return f"{key}=***" if sep and unquote_plus(key).lower() in _SECRET_QUERY_KEYS else param


def _ssl_arg(ssl: _ssl.SSLContext | None, insecure: bool) -> _ssl.SSLContext | bool:
    if ssl is not None and insecure:
        raise UsageError("give either ssl= (a context) or insecure=True, not both")
    if insecure:
        return False
    return ssl if ssl is not None else True


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
    ) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self.dns_timeout = min(dns_timeout, timeout)
        self._resolver_spec = resolver
        self._ssl = _ssl_arg(ssl, insecure)
        self._limit = limit
        self._keepalive = keepalive
        self._headers = dict(headers or {})
        self._trace = trace
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = TimedConnector(
                resolver=DnsResolver(self._resolver_spec, timeout=self.dns_timeout),
                limit=self._limit,
                force_close=not self._keepalive,
                ssl=self._ssl,
            )
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, trust_env=False
            )
        return self._session

    def _url(self, url: str) -> str:
        full = (
            url
            if "://" in url or not self.base_url
            else self.base_url.rstrip("/") + "/" + url.lstrip("/")
        )
        if urlsplit(full).scheme not in ("http", "https") or not urlsplit(full).hostname:
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
    ) -> Waterfall:
        """Send one request and return its waterfall (never raises for network errors).

        ``method`` defaults to POST when there is a body, else GET. ``intended_start_ns`` (a
        ``perf_counter_ns`` value) is when an open-loop schedule wanted this request to start:
        the delay until now becomes ``schedule_lag``.
        """
        start = now_ns()
        full = self._url(url)
        method = method or ("POST" if json is not None or data is not None else "GET")
        limit = self.timeout if timeout is None else timeout
        recorder = Recorder(
            method, redact_url(full), start_ns=start, intended_start_ns=intended_start_ns
        )
        state = RequestState(recorder, self._trace)
        token = CURRENT.set(state)
        try:
            # aiohttp's own total timeout: no extra task per request (wait_for makes one)
            timer = aiohttp.ClientTimeout(total=limit)
            await self._exchange(state, method, full, json, data, headers, timer)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every network failure becomes data on the waterfall
            failed_at = now_ns()
            if state.protocol is not None and not state.protocol.backlog:
                state.protocol.close_send()  # all bytes had left: the request was sent
            kind, message = classify(exc, recorder, limit)
            state.fail(kind, message, failed_at)
        finally:
            CURRENT.reset(token)
            if state.protocol is not None and state.protocol.state is state:
                state.protocol.detach()
        if recorder.interrupted or state.body_end_ns is None:
            return recorder.finish(now_ns())
        return recorder.finish(state.body_end_ns)

    async def _exchange(
        self,
        state: RequestState,
        method: str,
        url: str,
        json: Any,
        data: bytes | str | io.BytesIO | None,
        headers: Mapping[str, str] | None,
        timer: aiohttp.ClientTimeout,
    ) -> None:
        session = self._open()
        if json is not None:
            data, headers = _json_body(json, headers)
        async with session.request(method, url, data=data, headers=headers, timeout=timer) as resp:
            rec = state.recorder
            rec.status = resp.status
            rec.http_version = _http_version(resp.version)
            proto: TimedProtocol = state.protocol
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
