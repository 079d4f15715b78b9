"""The capture engine's process: plain asyncio, no gevent, one ``Client`` per Locust user.

A Locust process starts this module as a child (``python -m latency_analyzer.locust._engine
FD``) and talks to it over one end of a socket pair, one JSON object per line:

* ``{"op": "open", "user": U, "options": {...}}``: a ``Client`` for user U (``Client``'s
  keyword arguments: ``http2``, ``limit``, ``keepalive``, ``insecure``, ``timeout``, ...).
* ``{"op": "req", "id": I, "user": U, "url": ..., "method": ..., "json": ..., "data": ...,
  "headers": {...}, "timeout": ...}``: one request; the answer is ``{"id": I, "wf": {...}}``
  (the waterfall's canonical dict) or ``{"id": I, "usage": "..."}`` when the request could
  not be sent at all (a bad URL).
* ``{"op": "close", "user": U}``: close U's connections.

This process never imports Locust, so nothing here is monkey-patched: every timestamp is
taken as in ``latency-analyzer run``, on a loop that shares its GIL with nothing else. When
the Locust process goes away (EOF), in-flight requests finish, connections close, and it
exits.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import Mapping
from typing import Any

from ..capture.client import Client
from ..errors import UsageError

__all__ = ["CLIENT_OPTIONS", "main", "serve"]

#: ``Client`` arguments a user class may set (anything else is refused).
CLIENT_OPTIONS = frozenset(
    {"http2", "limit", "keepalive", "insecure", "timeout", "dns_timeout", "resolver"}
)
_LINE_LIMIT = 256 * 1024 * 1024  # a request line carries its body: long-document prompts


def client_of(options: Mapping[str, Any]) -> Client:
    """A ``Client`` from an ``open`` message's options (checked against ``CLIENT_OPTIONS``)."""
    unknown = set(options) - CLIENT_OPTIONS
    if unknown:
        raise UsageError(f"unknown client options {sorted(unknown)}; use {sorted(CLIENT_OPTIONS)}")
    return Client(**options)


class _Engine:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.clients: dict[int, Client] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.by_user: dict[int, set[asyncio.Task[None]]] = {}

    def reply(self, obj: Mapping[str, Any]) -> None:
        self.writer.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def handle(self, msg: Mapping[str, Any]) -> None:
        op = msg.get("op")
        if op == "req":
            user = int(msg["user"])
            self._spawn(self._request(msg, self.clients.get(user)), user)
        elif op == "open":
            try:
                self.clients[int(msg["user"])] = client_of(msg.get("options") or {})
            except UsageError as exc:
                self.reply({"user": msg["user"], "usage": str(exc)})
        elif op == "close":
            user = int(msg["user"])
            client = self.clients.pop(user, None)
            if client is not None:
                self._spawn(self._close(client, self.by_user.pop(user, set())))

    def _spawn(self, coro: Any, user: int | None = None) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if user is not None:
            mine = self.by_user.setdefault(user, set())
            mine.add(task)
            task.add_done_callback(mine.discard)

    async def _close(self, client: Client, running: set[asyncio.Task[None]]) -> None:
        """A user stopped by Locust mid-request: its requests finish (and are answered)
        before its connections close."""
        if running:
            await asyncio.gather(*list(running), return_exceptions=True)
        await client.close()

    async def _request(self, msg: Mapping[str, Any], client: Client | None) -> None:
        rid = msg["id"]
        if client is None:
            self.reply({"id": rid, "usage": "no client open for this user"})
            return
        try:
            wf = await client.request(
                msg["url"],
                method=msg.get("method"),
                json=msg.get("json"),
                data=msg.get("data"),
                headers=msg.get("headers"),
                timeout=msg.get("timeout"),
            )
        except UsageError as exc:  # nothing was sent: the caller gets the error, not a row
            self.reply({"id": rid, "usage": str(exc)})
            return
        self.reply({"id": rid, "wf": wf.to_dict()})

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        for client in self.clients.values():
            await client.close()
        self.clients.clear()


async def serve(sock: socket.socket) -> None:
    """Answer requests arriving on ``sock`` until its peer closes it."""
    reader, writer = await asyncio.open_connection(sock=sock, limit=_LINE_LIMIT)
    engine = _Engine(writer)
    try:
        while line := await reader.readline():
            engine.handle(json.loads(line))
            if writer.transport.get_write_buffer_size() > 1 << 20:
                await writer.drain()
    finally:
        await engine.drain()
        writer.close()


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m latency_analyzer.locust._engine FD``."""
    args = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(args[0]))
    asyncio.run(serve(sock))


if __name__ == "__main__":
    main()
