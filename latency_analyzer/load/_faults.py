"""Fault injection: a TCP proxy that can go down for a window, and what the run saw of it.

:class:`FaultProxy` listens on loopback and forwards to an upstream ``host:port``. During an
outage it closes its listener (new connects are refused) and resets every open connection;
afterwards it listens on the same port again, possibly forwarding to a restarted upstream.
:func:`outage_report` reads a run's set: time until errors started, their count, time to
recovery and the success rate after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..analysis import WaterfallSet
from ..timeline import process_anchor

__all__ = ["FaultProxy", "OutageReport", "outage_report"]

_BUFFER = 256 * 1024


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a crashed server's kernel would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """A loopback TCP proxy in front of ``upstream`` that can be taken down and back up.

    Args:
        upstream_host, upstream_port: where to forward.
        host: loopback address to listen on; the port is picked once and kept across outages.
    """

    def __init__(self, upstream_host: str, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.outages: list[tuple[int, int]] = []  # (down, up) perf_counter_ns

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> FaultProxy:
        await self.up()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.down()
        # handlers end once their connections are reset; wait so none is left to cancel
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)

    async def up(self) -> None:
        """Listen (again, on the same port)."""
        if self._server is None:
            self._server = await asyncio.start_server(
                self._handle, self.host, self.port, reuse_address=True
            )
            self.port = int(self._server.sockets[0].getsockname()[1])

    def down(self) -> None:
        """Stop listening (connects are refused) and reset every open connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            _reset(w)
        self._writers.clear()

    async def outage(self, seconds: float, at_ns: int | None = None) -> tuple[int, int]:
        """Go down at ``at_ns`` (perf ns; None: now) for ``seconds``; returns (down, up) ns."""
        if at_ns is not None:
            await asyncio.sleep(max(0.0, (at_ns - time.perf_counter_ns()) / 1e9))
        start = time.perf_counter_ns()
        self.down()
        await asyncio.sleep(seconds)
        await self.up()
        span = (start, time.perf_counter_ns())
        self.outages.append(span)
        return span

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:  # upstream down (a killed server): the client sees its connection reset
            _reset(writer)
            return
        pair = {writer, up_writer}
        self._writers |= pair
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._writers -= pair
            for w in pair:
                w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_BUFFER):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    if not writer.transport.is_closing():
        writer.transport.abort()


@dataclass(frozen=True)
class OutageReport:
    """What a run saw of an outage; times in seconds from the outage's start.

    Attributes:
        injected_s: how long the outage lasted (down → up).
        first_error_s: the first failed request's intended start (None: no error).
        errors: failed requests from the outage's start on.
        recovery_s: the first request that succeeded after the last failure (its intended
            start); None if the run ended failing.
        success_rate_after: share of requests after recovery that succeeded (1.0 by the
            definition of recovery; lower means failures returned later... which recovery
            excludes, so it is reported for runs with several outages).
    """

    injected_s: float
    first_error_s: float | None
    errors: int
    recovery_s: float | None
    success_rate_after: float | None
    requests_after: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def outage_report(ws: WaterfallSet, down_ns: int, up_ns: int) -> OutageReport:
    """Read an outage (``perf_counter_ns`` instants of this process) out of a run's set."""
    anchor = process_anchor()
    t = (ws.column("epoch_ns") - anchor.to_epoch_ns(down_ns)) / 1e9
    ok = ws.ok
    after = t >= 0
    failed = after & ~ok
    first_error = float(t[failed].min()) if failed.any() else None
    recovery = None
    rate = None
    n_after = 0
    if failed.any():
        last_fail = float(t[failed].max())
        later_ok = t[(t > last_fail) & ok]
        if later_ok.size:
            recovery = float(later_ok.min())
            tail = t >= recovery
            n_after = int(tail.sum())
            rate = float(np.mean(ok[tail]))
    return OutageReport(
        (up_ns - down_ns) / 1e9, first_error, int(failed.sum()), recovery, rate, n_after
    )
