"""Scraper: polls Prometheus endpoints in the background while probes or a load run go on.

::

    async with Scraper(["http://127.0.0.1:8000/metrics"], interval=0.5) as scraper:
        result = await load.run(scenario)
    scraper.series.gauge("vllm:num_requests_waiting")

    # or as a load-runner hook: started with the run, stopped (cancelled) when it ends
    result = await load.run(scenario, hooks=[scraper.hook])

Why the load never waits for it: each target is its own task on its own ``aiohttp`` session
(not the load's client, not its connection pool), every scrape has a timeout no longer than the
interval, ticks are absolute (a slow scrape is never followed by a burst of catch-up scrapes),
and the text is parsed in a worker *process*: vLLM's 50 kB exposition costs ~11 ms of pure
Python, which in a thread would still hold the GIL against the load's event loop (measured: loop
lag P99 2–5 ms → 9–19 ms scraping four endpoints every 100 ms). The loop only stamps, reads the
bytes and stores the samples that come back, in scrape order.

The timeout is about the endpoint, not about us: an answer is in time when its bytes arrived
before the deadline, by the kernel's receive stamp of the reads that brought them (the
sockets are :mod:`latency_analyzer.capture`'s stamped ones). A loop that wakes late, with the
answer already waiting and the deadline passed, reads it and keeps it; a read whose bytes
arrived after the deadline ends the scrape as a timeout. Where the kernel gives no stamp, the
read's own instant stands in.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Coroutine, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from ssl import SSLContext
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
from aiohttp import ClientRequest, ClientTimeout
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from .._redact import redact_text, redact_url, remember_request
from ..capture._wire import StampedSocket, WireStamps, wire_of
from ..errors import UsageError
from ._parse import ACCEPT, MetricsParseError, ParsedSample
from ._series import MetricSeries
from ._worker import ProcessParser, ThreadParser

__all__ = ["MIN_INTERVAL_S", "Scraper", "Target"]

MIN_INTERVAL_S = 0.1
_MAX_BYTES = 16 * 1024 * 1024
_MAX_PENDING = 4  # parses queued per target before a scrape is dropped (as a gap)
_IDLE_TURNS = 2  # loop turns past the deadline a scrape may take without reading anything


class _Failed(Exception):
    """A scrape that got an answer, but not a usable one (its message is the gap's reason)."""


class _Attempt:
    """One scrape's deadline and the stamps of the connection it travels on."""

    __slots__ = ("deadline_ns", "steps", "wire")

    def __init__(self, deadline_ns: int) -> None:
        self.deadline_ns = deadline_ns
        self.wire: WireStamps | None = None
        self.steps = 0  # headers and body chunks handed to the scrape so far

    def step(self) -> None:
        """The scrape got more of the answer; past the deadline, only bytes that arrived
        before it count (the socket's last read is the one that brought them)."""
        self.steps += 1
        now = time.perf_counter_ns()
        if now <= self.deadline_ns:
            return
        wire = self.wire
        if wire is None or not wire.read_user_ns or wire.read_kernel_ns > self.deadline_ns:
            raise TimeoutError  # arrived late, or nothing says when it arrived


_ATTEMPT: ContextVar[_Attempt | None] = ContextVar("scrape_attempt", default=None)


def _stamped_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    family, type_, proto = addr_info[:3]
    return StampedSocket(family, type_, proto)


class _Connector(aiohttp.TCPConnector):
    """Connections whose reads carry the kernel's receive stamp, known to the scrape that
    takes one (new or pooled)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(socket_factory=_stamped_socket, **kwargs)

    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: ClientTimeout
    ) -> Connection:
        conn = await super().connect(req, traces, timeout)
        attempt = _ATTEMPT.get()
        if attempt is not None:
            attempt.wire = wire_of(conn.transport)
        return conn


@dataclass(frozen=True)
class Target:
    """One endpoint to scrape.

    Attributes:
        url: the full URL, e.g. ``http://gpu-1:9400/metrics``.
        name: how its series are labelled (default: ``host:port``).
        headers: sent with each scrape (e.g. Authorization); never stored.
    """

    url: str
    name: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        parts = urlsplit(self.url)
        return parts.netloc.rsplit("@", 1)[-1] or self.url


class Scraper:
    """Background scraper of one or more Prometheus / OpenMetrics endpoints.

    Args:
        targets: URLs or :class:`Target` objects.
        interval: seconds between scrapes of each target (at least 0.1).
        timeout: seconds a scrape may take (default and maximum: ``interval``).
        path: stream the samples to this JSONL file (see :class:`MetricSeries`).
        series: store into this series instead of a new one.
        ssl: passed to aiohttp for HTTPS targets (a context, or False to skip verification).
        parser: parse in a worker ``"process"`` (default: no GIL contention with the load) or
            a ``"thread"`` (no process start, for small expositions).

    Raises:
        UsageError: no targets, an interval under 0.1 s, or two targets with one name.
    """

    def __init__(
        self,
        targets: str | Target | Sequence[str | Target],
        *,
        interval: float = 1.0,
        timeout: float | None = None,
        path: str | os.PathLike[str] | None = None,
        series: MetricSeries | None = None,
        ssl: SSLContext | bool = True,
        parser: Literal["process", "thread"] = "process",
    ) -> None:
        if isinstance(targets, (str, Target)):
            targets = [targets]
        self.targets = [t if isinstance(t, Target) else Target(t) for t in targets]
        if not self.targets:
            raise UsageError("Scraper needs at least one target")
        if not interval >= MIN_INTERVAL_S:
            raise UsageError(f"interval={interval} s; the shortest is {MIN_INTERVAL_S} s")
        self.interval = float(interval)
        self.timeout = min(self.interval, timeout if timeout is not None else self.interval)
        self._owns_series = series is None
        self.series = series if series is not None else MetricSeries(path)
        for t in self.targets:
            remember_request(t.url)  # a key in a scrape URL is masked wherever it is echoed
            self.series.add_target(t.label, redact_url(t.url), self.interval)
        self._ssl = ssl
        self._session: aiohttp.ClientSession | None = None
        if parser not in ("process", "thread"):
            raise UsageError(f"parser={parser!r}; expected 'process' or 'thread'")
        self._parser = parser
        self._pool: ProcessParser | ThreadParser | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[str, list[asyncio.Future[None]]] = {t.label: [] for t in self.targets}

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return bool(self._tasks)

    async def start(self) -> None:
        """Start the parser (a worker process is up before this returns, so its start-up is
        not inside the run) and one scraping task per target (the first scrape is immediate).
        """
        if self._tasks:
            raise UsageError("the scraper is already running")
        self._pool = ProcessParser() if self._parser == "process" else ThreadParser()
        await self._pool.start()
        connector = _Connector(limit=0, ssl=self._ssl)
        # no timeout of aiohttp's own: it would cancel at our loop's wake-up (_in_time judges)
        self._session = aiohttp.ClientSession(connector=connector, timeout=ClientTimeout())
        self._tasks = [asyncio.create_task(self._loop(t)) for t in self.targets]

    async def stop(self, *, final_scrape: bool = True) -> None:
        """Stop the tasks; by default scrape every target once more, so the last interval
        reaches the end of the run (bounded by ``timeout``)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if final_scrape and self._session is not None:
            await asyncio.gather(*(self._scrape(t) for t in self.targets))
        for pending in self._pending.values():  # store what is still being parsed
            await asyncio.gather(*pending)
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._owns_series:
            self.series.flush()

    async def __aenter__(self) -> Scraper:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def hook(self, t0_ns: int) -> None:
        """A load-runner hook (``load.run(sc, hooks=[scraper.hook])``): scrapes until the
        runner cancels its hooks at the end of the run.

        A scraper already started (``await scraper.start()`` before the run, so the parser's
        start-up and the first scrape precede the load) keeps running and must be stopped by
        its starter; one the hook started is stopped by the hook.
        """
        owner = not self.running
        try:  # a run may end while the parser is still starting: it is stopped all the same
            if owner:
                await self.start()
            await asyncio.Event().wait()  # until cancelled
        finally:
            if owner:
                await self.stop()

    # -- scraping -------------------------------------------------------------------------
    async def _loop(self, target: Target) -> None:
        step = round(self.interval * 1e9)
        origin = time.perf_counter_ns()
        k = 0
        while True:
            await self._scrape(target)
            # absolute ticks; a scrape that overran (at most by the timeout) is followed at once
            # by one for the latest tick it missed, never by a burst of catch-up scrapes
            k = max(k + 1, (time.perf_counter_ns() - origin) // step)
            await asyncio.sleep(max(0, origin + k * step - time.perf_counter_ns()) / 1e9)

    async def _scrape(self, target: Target) -> None:
        name = target.label
        send = time.perf_counter_ns()
        try:
            body, ctype = await self._in_time(target, send + round(self.timeout * 1e9))
        except _Failed as exc:
            self.series.add_gap(name, send, time.perf_counter_ns(), redact_text(str(exc)))
            return
        except (asyncio.TimeoutError, TimeoutError):
            reason = f"timeout after {self.timeout:g} s"
            self.series.add_gap(name, send, time.perf_counter_ns(), reason)
            return
        except (aiohttp.ClientError, OSError) as exc:
            reason = redact_text(f"{type(exc).__name__}: {exc}")[:200]  # aiohttp quotes the URL
            self.series.add_gap(name, send, time.perf_counter_ns(), reason)
            return
        done = time.perf_counter_ns()
        self._store_later(name, send, done, body, ctype)

    def _store_later(self, name: str, send: int, done: int, body: str, ctype: str | None) -> None:
        """Parse off the loop; store in scrape order (one worker: results come back FIFO)."""
        pending = self._pending[name]
        pending[:] = [f for f in pending if not f.done()]
        if len(pending) >= _MAX_PENDING or self._pool is None:
            self.series.add_gap(name, send, done, "parser behind: scrape dropped")
            return
        # tasks start in creation order and the parser answers in order: stored in scrape order
        work = self._pool.parse(body, ctype)
        pending.append(asyncio.create_task(self._store(name, send, done, work)))

    async def _store(
        self, name: str, send: int, done: int, work: Coroutine[Any, Any, list[ParsedSample]]
    ) -> None:
        try:
            samples = await work
        except MetricsParseError as exc:
            self.series.add_gap(name, send, done, exc.message)
            return
        self.series.add_scrape(name, send, done, samples)

    async def _in_time(self, target: Target, deadline_ns: int) -> tuple[str, str | None]:
        """The answer, if it arrived before ``deadline_ns``; else TimeoutError.

        Our timer may fire late, in the same loop turn that read an answer which arrived in
        time: then the fetch goes on, turn by turn, for as long as each turn hands it bytes
        that arrived in time (:meth:`_Attempt.step` ends it at the first that did not), and
        stops after ``_IDLE_TURNS`` turns that hand it nothing.
        """
        attempt = _Attempt(deadline_ns)
        fetch = asyncio.ensure_future(self._fetch(target, attempt))
        late = False
        try:
            left = max(0, deadline_ns - time.perf_counter_ns()) / 1e9
            await asyncio.wait({fetch}, timeout=left)
            idle = 0
            while not fetch.done() and idle < _IDLE_TURNS:
                seen = attempt.steps
                await asyncio.sleep(0)
                idle = 0 if attempt.steps != seen else idle + 1
        finally:
            late = not fetch.done()
            if late:
                fetch.cancel()
            await asyncio.wait({fetch})  # the cancelled fetch lets its connection go
            if not fetch.cancelled():
                fetch.exception()  # retrieved: raised below, or moot when we are cancelled
        if late:
            raise TimeoutError
        return fetch.result()

    async def _fetch(self, target: Target, attempt: _Attempt) -> tuple[str, str | None]:
        assert self._session is not None
        _ATTEMPT.set(attempt)  # this task's own context: the connector finds it there
        headers = {"Accept": ACCEPT, **target.headers}
        async with self._session.get(target.url, headers=headers) as resp:
            attempt.step()
            if resp.status != 200:
                raise _Failed(f"http {resp.status}")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(65536):
                attempt.step()
                body += chunk
                if len(body) > _MAX_BYTES:
                    raise _Failed(f"exposition larger than {_MAX_BYTES} bytes")
            charset = resp.charset or "utf-8"
            try:
                text = bytes(body).decode(charset, errors="replace")
            except LookupError:  # a charset Python has no codec for: a gap, not a crash
                raise _Failed(f"unknown charset {charset[:40]!r}") from None
            return text, resp.content_type
