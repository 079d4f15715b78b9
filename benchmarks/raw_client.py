"""The least a Python asyncio streaming client can do: asyncio's loop, a socket, nothing else.

    python benchmarks/raw_client.py URL --model M --tokens N --requests R
        (--concurrency C | --rate X) [--warmup W] [--seed S] --out r.json

Below ``bare_client.py`` (aiohttp): each connection is an ``asyncio.Protocol`` on asyncio's
own loop that writes one request encoded once for the whole run, and is handed each read of
the response in ``data_received``. It keeps the read's time only while it looks for the first
token, then counts reads until the chunked body's last chunk; it parses no HTTP, no SSE and
no JSON beyond that, keeps no waterfall and no kernel stamp. It serves only a server that
answers as the test bed does (HTTP/1.1, chunked, keep-alive): what it costs is what a wake,
``epoll`` and a ``recv`` per read cost on this interpreter, which is what ``bench_peers.py``
runs it for (a floor beside the peers, not a peer). Connections are kept alive: one per user
in a closed loop (``--concurrency``), reused from an idle pool or dialled for Poisson
arrivals (``--rate``); ``--warmup`` requests go first, as one wave, left out of the figures.

Writes TTFT P50/P95/P99 and mean TPOT (ms), completed and failed counts to ``--out``, as
``bare_client.py`` does. TTFT ends at the read that brought the first event whose delta has
content; TPOT spreads the time from there to the last read over the tokens asked for less
one (the test bed writes exactly that many).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

from bare_client import chat_body, cli, drive, figures

_END = b"\r\n0\r\n\r\n"  # the last chunk, after the previous chunk's CRLF
_CONTENT = b'"content":'
_TIMEOUT_S = 120.0  # a response that takes longer counts as failed


class _Conn(asyncio.Protocol):
    """One kept-alive connection: one request at a time, its reads timed until a token."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[tuple[float, float]] | None = None
        self.first = 0.0
        self.last = 0.0
        self.tail = b""
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes) -> asyncio.Future[tuple[float, float]]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.first = self.last = 0.0
        self.tail = b""
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.first and _has_token(data):
            self.first = now
        self.last = now
        tail = self.tail + data[-len(_END) :]
        if tail.endswith(_END):
            done, self.done = self.done, None
            if done is not None and not done.done():
                done.set_result((self.first, self.last))
        else:
            self.tail = tail[-len(_END) :]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc or ConnectionResetError("closed mid-response"))
        if not self.lost.done():
            self.lost.set_result(None)


def _has_token(data: bytes) -> bool:
    """A read holding an event whose delta has non-empty content (the role chunk's is empty)."""
    at = data.find(_CONTENT)
    while at >= 0:
        rest = data[at + len(_CONTENT) :].lstrip(b" ")
        if rest[:1] == b'"' and rest[1:2] != b'"':
            return True
        at = data.find(_CONTENT, at + 1)
    return False


def _request(url: str, body: dict[str, Any]) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Accept: text/event-stream\r\n\r\n"
    )
    return parts.hostname or "127.0.0.1", parts.port or 80, head.encode() + payload


async def main(args: argparse.Namespace) -> dict[str, Any]:
    host, port, request = _request(args.url, chat_body(args))
    loop = asyncio.get_running_loop()
    idle: list[_Conn] = []
    results: list[tuple[float, float, float]] = []
    failed = 0

    async def one(keep: bool) -> None:
        nonlocal failed
        start = time.perf_counter()
        while idle and (idle[-1].transport is None or idle[-1].transport.is_closing()):
            idle.pop()  # closed by the server while idle
        conn = idle.pop() if idle else None
        try:
            if conn is None:
                _, conn = await loop.create_connection(_Conn, host, port)
            first, last = await asyncio.wait_for(conn.send(request), _TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            failed += keep
            if conn is not None and conn.transport is not None:
                conn.transport.close()  # not reused: a late answer would end the next one
            return
        idle.append(conn)
        if keep and first:
            results.append((start, first, last))
        elif keep:
            failed += 1

    await drive(args, one)
    for conn in idle:
        if conn.transport is not None:
            conn.transport.close()
    ttft = [(first - start) * 1e3 for start, first, _ in results]
    tpot = [(last - first) * 1e3 / (args.tokens - 1) for _, first, last in results]
    return figures(ttft, tpot if args.tokens > 1 else [], len(results), failed)


if __name__ == "__main__":
    cli(__doc__ or "", main)
