"""A loopback HTTP/1.1 server that misbehaves on purpose: it echoes what it was sent, answers
with bytes that are not HTTP, redirects, and cuts unframed bodies with a TCP RST.

The request path picks the behaviour (the query string is echoed, never interpreted, except
``to=`` of ``/redirect``)::

    /echo/401, /echo/500   that status, a JSON body repeating the request line and headers
    /invalid               a status line that is not HTTP, repeating the request line
    /sse-echo              200 text/event-stream: one malformed chunk repeating the headers
    /redirect/<code>?to=U  that 3xx status with ``Location: U`` (no ``to``: to itself)
    /unframed-rst          200 with no Content-Length and no chunking, a part body, then RST
    /nested/<status>?depth=N  that status, a JSON body of N nested arrays
    /nested-sse?depth=N    200 text/event-stream: one token chunk, then a chunk of N nested
                           arrays, then [DONE]
    /claims?completion=C&prompt=P  200 text/event-stream: two one-word token chunks, then a
                           usage chunk claiming C completion and P prompt tokens
    anything else          200 JSON ``{"headers": {...}, "target": "..."}``, the same echoed
                           in a ``Server-Timing`` header

Every request is kept in :attr:`HostileServer.requests` (target and headers, as received), so
a test can check what a client forwarded.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from ._timing import Service, abort_with_rst, check_loopback

__all__ = ["HostileServer", "ReceivedRequest"]

_MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as the server read it."""

    method: str
    target: str
    headers: dict[str, str] = field(default_factory=dict)


class HostileServer(Service):
    """See the module docstring. ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        check_loopback(host)
        self._host = host
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.Transport] = set()
        self.requests: list[ReceivedRequest] = []

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for transport in list(self._transports):
                transport.abort()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        assert isinstance(transport, asyncio.Transport)
        self._transports.add(transport)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._transports.discard(transport)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > _MAX_HEAD:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = [*lines[0].split(" ", 2), "", ""][:3]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip()] = value.strip()
        length = int(headers.get("Content-Length", headers.get("content-length", "0")) or 0)
        if length:
            await reader.readexactly(min(length, _MAX_HEAD))
        self.requests.append(ReceivedRequest(method, target, headers))
        path = urlsplit(target).path
        echo = {"error": {"message": f"refused {method} {target}"}, "headers": headers}
        if path.startswith("/echo/"):
            status = int(path.rsplit("/", 1)[-1])
            self._send(writer, status, "application/json", json.dumps(echo).encode())
        elif path == "/invalid":
            writer.write(f"HTTP/1.1 2x0 {method} {target} {headers}\r\n\r\n".encode())
            await writer.drain()
            return False
        elif path == "/sse-echo":
            body = f"data: {{not json {target} {headers}\n\ndata: [DONE]\n\n".encode()
            self._send(writer, 200, "text/event-stream", body)
        elif path.startswith("/redirect/"):
            to = parse_qs(urlsplit(target).query).get("to", [target])[0]  # none: a loop
            status = int(path.rsplit("/", 1)[-1])
            extra = f"Location: {to}\r\n"
            self._send(writer, status, "text/plain", b"moved", extra)
        elif path.startswith("/nested"):
            self._nested(writer, path, _int_arg(target, "depth", 100_000))
        elif path == "/claims":
            completion, prompt = _int_arg(target, "completion", 0), _int_arg(target, "prompt", 0)
            usage = {"completion_tokens": completion, "prompt_tokens": prompt}
            chunks = [_token_chunk("tok0 "), _token_chunk("tok1 "), {"choices": [], "usage": usage}]
            body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
            self._send(writer, 200, "text/event-stream", body + b"data: [DONE]\n\n")
        elif path == "/unframed-rst":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart of a body")
            await writer.drain()
            await asyncio.sleep(0.01)  # the part arrives first, then the reset
            abort_with_rst(writer.transport)
            return False
        else:
            body = json.dumps({"headers": headers, "target": target}).encode()
            timing = f'Server-Timing: echo;desc="{target} {headers}"\r\n'
            self._send(writer, 200, "application/json", body, timing)
        await writer.drain()
        return True

    def _nested(self, writer: asyncio.StreamWriter, path: str, depth: int) -> None:
        deep = b"[" * depth + b"]" * depth
        if path == "/nested-sse":
            first = b"data: " + json.dumps(_token_chunk("tok0 ")).encode() + b"\n\n"
            body = first + b"data: " + deep + b"\n\ndata: [DONE]\n\n"
            self._send(writer, 200, "text/event-stream", body)
        else:
            self._send(writer, int(path.rsplit("/", 1)[-1]), "application/json", deep)

    @staticmethod
    def _send(
        writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes, extra: str = ""
    ) -> None:
        head = (
            f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)


def _int_arg(target: str, name: str, default: int) -> int:
    values = parse_qs(urlsplit(target).query).get(name)
    return int(values[0]) if values else default


def _token_chunk(text: str) -> dict[str, object]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }
