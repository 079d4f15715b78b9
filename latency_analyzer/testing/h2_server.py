"""An HTTP/2 variant of the test-bed LLM server, written on the ``h2`` state machine.

Same knobs and timeline as :class:`~latency_analyzer.testing.LLMServer` (``header_delay``,
``queue``, ``prefill``, ``decode``, ``tokens``, ``tokens_per_chunk``, ``usage``, per-request
``"testbed": {...}`` overrides), served over TLS with ALPN ``h2`` or as prior-knowledge
``h2c``. Being hand-written on ``h2`` it can also misbehave on purpose, at the frame level:

* ``"h2_fault": "rst_stream"`` ends that stream with RST_STREAM after ``fault_after`` tokens;
* ``"h2_fault": "goaway"`` sends GOAWAY (last stream id = this stream) after ``fault_after``
  tokens: this stream completes, streams opened after it are refused;
* ``"h2_fault": "close"`` closes the TCP connection after ``fault_after`` tokens;
* ``"h2_fault": "bad_status"`` answers with ``:status: 2x0`` (not a status code) and ends;
* ``"h2_fault": "nested_500"`` answers 500 with a JSON body of 5,000 ``[`` (nesting that a
  recursive parser cannot take).

``max_concurrent_streams`` is announced in the server's SETTINGS. ``send_settings=False``
makes a server that accepts connections, reads them and never sends a byte (no SETTINGS).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import ssl as ssl_module
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame

from ._child import ChildServer, serve_commands
from ._timing import Service, check_loopback, deadline_after, sleep_until
from .llm.behavior import Behavior, chunk_bounds, prompt_tokens
from .llm.wire import DONE, OpenAIEncoder, model_name, sse
from .tls import server_context_from_pem

__all__ = ["H2LLMServer", "H2StreamRecord", "SubprocessH2LLMServer", "serve_h2_in_child"]

H2_FAULTS = frozenset({"rst_stream", "goaway", "close", "bad_status", "nested_500"})

_HEADER_FAULTS = {
    "bad_status": ([(":status", "2x0")], b""),
    "nested_500": ([(":status", "500"), ("content-type", "application/json")], b"[" * 5000),
}


@dataclass(frozen=True)
class H2StreamRecord:
    """Ground truth for one stream (``perf_counter_ns`` instants, stamped before each write)."""

    stream_id: int
    connection: int
    received_ns: int
    headers_ns: int | None
    chunk_ns: tuple[int, ...]
    end_ns: int
    body_bytes: int

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict (inverse of :meth:`from_json`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> H2StreamRecord:
        """Rebuild a record from :meth:`to_json` output."""
        return cls(**{**data, "chunk_ns": tuple(data["chunk_ns"])})


@dataclass
class _Request:
    stream_id: int
    headers: dict[bytes, bytes]
    body: bytearray = field(default_factory=bytearray)


class _Conn(asyncio.Protocol):
    """One server-side HTTP/2 connection."""

    def __init__(self, server: H2LLMServer) -> None:
        self.server = server
        self.number = server.connections = server.connections + 1
        self.h2 = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.transport: asyncio.Transport | None = None
        self.requests: dict[int, _Request] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.window = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream server: always a Transport
        self.server.open.add(self)
        if not self.server.send_settings:
            return
        # in the preface's own SETTINGS (update_settings would send a second frame after it)
        limit = {
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.server.max_concurrent_streams
        }
        self.h2.local_settings = h2.settings.Settings(client=False, initial_values=limit)
        self.h2.initiate_connection()
        if self.server.initial_window_size is not None:
            # a second SETTINGS frame: h2 enforces it only once the client acknowledged it,
            # as RFC 9113 §6.9.2 requires (the first frame's values apply at once)
            window = self.server.initial_window_size
            self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.flush()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server.open.discard(self)
        for task in self.tasks.values():
            task.cancel()
        self.window.set()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if not self.server.send_settings:
            return  # a peer that never settles: everything read is ignored
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            self.on_event(event)
        self.flush()

    def on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            headers = {bytes(k): bytes(v) for k, v in event.headers or ()}
            self.requests[event.stream_id] = _Request(event.stream_id, headers)
        elif isinstance(event, h2.events.DataReceived):
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if event.stream_id in self.requests:
                self.requests[event.stream_id].body += event.data or b""
        elif isinstance(event, h2.events.StreamEnded):
            request = self.requests.pop(event.stream_id, None)
            if request is not None:
                self.start(request)
        elif isinstance(event, h2.events.StreamReset):
            running = self.tasks.get(event.stream_id)
            if running is not None:
                running.cancel()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.window.set()

    def start(self, request: _Request) -> None:
        stream_id = request.stream_id
        task = asyncio.ensure_future(self.serve(request, time.perf_counter_ns()))
        self.tasks[stream_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(stream_id, None))

    async def send(self, stream_id: int, data: bytes, end: bool = False) -> None:
        """DATA frames within the flow-control window (waiting for WINDOW_UPDATE as needed)."""
        view = memoryview(data)
        while view:
            room = min(
                self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size
            )
            if room <= 0:
                self.window.clear()
                await self.window.wait()
                continue
            chunk, view = view[:room], view[room:]
            self.h2.send_data(stream_id, bytes(chunk), end_stream=end and not view)
            self.flush()
        if end and not data:
            self.h2.end_stream(stream_id)
            self.flush()

    async def serve(self, request: _Request, received_ns: int) -> None:
        gone = (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, ConnectionError)
        with contextlib.suppress(*gone):  # the client went away or reset the stream
            await _Exchange(self, request, received_ns).run()


class _Exchange:
    """One request stream: the LLM timeline, chunk by chunk."""

    def __init__(self, conn: _Conn, request: _Request, received_ns: int) -> None:
        self.conn, self.request, self.received_ns = conn, request, received_ns
        self.stream_id = request.stream_id
        body: Mapping[str, Any] = {}
        try:
            loaded = json.loads(request.body or b"{}")
            body = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            pass
        knobs = dict(body.get("testbed") or {})
        self.fault = knobs.pop("h2_fault", None)
        if isinstance(body.get("max_tokens"), int):
            knobs.setdefault("tokens", body["max_tokens"])
        self.behavior: Behavior = conn.server.behavior.override(knobs)
        self.chat = request.headers.get(b":path", b"").endswith(b"/chat/completions")
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.prompt_tokens = prompt_tokens(body)
        model = model_name(body, self.behavior.model)
        self.encoder = OpenAIEncoder(f"h2-{self.stream_id}", model, self.chat)
        self.headers_ns: int | None = None
        self.chunk_ns: list[int] = []

    async def run(self) -> None:
        b = self.behavior
        headers_due = deadline_after(self.received_ns, b.header_delay)
        await sleep_until(headers_due)
        self.headers_ns = time.perf_counter_ns()
        h2c = self.conn.h2
        if self.fault in _HEADER_FAULTS:
            fields, body = _HEADER_FAULTS[self.fault]
            h2c.send_headers(self.stream_id, fields, end_stream=not body)
            self.conn.flush()
            if body:
                await self.conn.send(self.stream_id, body, end=True)
            self._publish()
            return
        h2c.send_headers(
            self.stream_id, [(":status", "200"), ("content-type", "text/event-stream")]
        )
        self.conn.flush()
        try:
            if self.chat and b.role_chunk:
                await self.conn.send(self.stream_id, sse(self.encoder.role_chunk()))
            if await self._tokens(headers_due):
                counts = self.encoder.usage_for(b, self.prompt_tokens, b.tokens)
                asked = b.usage and self.include_usage
                tail = sse(self.encoder.usage_chunk(counts)) if asked else b""
                await self.conn.send(self.stream_id, tail + DONE, end=True)
        finally:
            self._publish()

    async def _tokens(self, headers_due: int) -> bool:
        """Token chunks at their deadlines; False if a fault ended the stream."""
        b = self.behavior
        for slot, (start, stop) in enumerate(chunk_bounds(b)):
            data = sse(self.encoder.tokens_chunk(b, start, stop))
            due = deadline_after(headers_due, b.queue + b.prefill + (stop - 1) * b.decode)
            await sleep_until(due)
            if self.fault and slot == b.fault_after and not self._fault():
                return False
            self.chunk_ns.append(time.perf_counter_ns())
            await self.conn.send(self.stream_id, data)
        return True

    def _fault(self) -> bool:
        """Misbehave; True if this stream carries on (GOAWAY lets it finish)."""
        conn = self.conn
        if self.fault == "rst_stream":
            conn.h2.reset_stream(self.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            conn.flush()
            return False
        if self.fault == "goaway":
            # a graceful GOAWAY written by hand: h2's close_connection() would stop this
            # connection from sending anything more, and this stream is meant to complete
            frame = hyperframe.frame.GoAwayFrame(0)
            frame.last_stream_id, frame.error_code = self.stream_id, 0
            if conn.transport is not None:
                conn.flush()
                conn.transport.write(frame.serialize())
            return True
        if conn.transport is not None:
            conn.transport.close()
        return False

    def _publish(self) -> None:
        record = H2StreamRecord(
            stream_id=self.stream_id,
            connection=self.conn.number,
            received_ns=self.received_ns,
            headers_ns=self.headers_ns,
            chunk_ns=tuple(self.chunk_ns),
            end_ns=time.perf_counter_ns(),
            body_bytes=len(self.request.body),
        )
        self.conn.server.records.append(record)


class H2LLMServer(Service):
    """The LLM test server over HTTP/2 (TLS + ALPN ``h2`` with ``ssl=``, else ``h2c``).

    Args:
        ssl: a server context (ALPN ``h2`` is set on it); None serves prior-knowledge h2c.
        max_concurrent_streams: announced in SETTINGS; streams beyond it are refused by h2.
        send_settings: False: never send SETTINGS (nor anything else) on any connection.
        initial_window_size: announced in SETTINGS (None: the protocol's 65,535 bytes).
        host, port: loopback address and port (0: any free port).
        **knobs: the default :class:`Behavior` (``header_delay``, ``prefill``, ``decode``, ...).

    Attributes:
        records: one :class:`H2StreamRecord` per served stream.
        connections: TCP connections accepted.
    """

    def __init__(
        self,
        *,
        ssl: ssl_module.SSLContext | None = None,
        max_concurrent_streams: int = 100,
        send_settings: bool = True,
        initial_window_size: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        **knobs: Any,
    ) -> None:
        self.behavior = Behavior().override(knobs)
        self.ssl = ssl
        if ssl is not None:
            ssl.set_alpn_protocols(["h2"])
        self.max_concurrent_streams = max_concurrent_streams
        self.send_settings = send_settings
        self.initial_window_size = initial_window_size
        self._host, self._port = check_loopback(host), port
        self.records: list[H2StreamRecord] = []
        self.connections = 0
        self.open: set[_Conn] = set()

    @property
    def url(self) -> str:
        """Base URL, ``http(s)://127.0.0.1:PORT``."""
        return self._base_url("https" if self.ssl is not None else "http")

    async def start(self) -> None:
        """Bind and start serving."""
        await self._listen(lambda: _Conn(self), ssl=self.ssl)

    async def stop(self) -> None:
        """Close the listener and abort every connection."""
        server = self._close_listener()
        if server is not None:
            for conn in list(self.open):
                if conn.transport is not None:
                    conn.transport.abort()
            await server.wait_closed()

    def run_in_subprocess(self, tls_pem: str | None = None) -> SubprocessH2LLMServer:
        """Serve this configuration from a child process (no GIL shared with the caller)."""
        config = {
            "knobs": {k: getattr(self.behavior, k) for k in Behavior.__dataclass_fields__},
            "max_concurrent_streams": self.max_concurrent_streams,
            "tls_pem": tls_pem,
        }
        return SubprocessH2LLMServer(config)


class SubprocessH2LLMServer(ChildServer):
    """Context manager running an :class:`H2LLMServer` in a child process.

    Started by ``python -m latency_analyzer.testing h2-server CONFIG_JSON``; the child
    prints ``{"port": ..., "pid": ...}`` once bound, answers ``records`` and exits when its stdin
    closes.
    """

    host = "127.0.0.1"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__("h2-server", config, "the HTTP/2 subprocess server")

    @property
    def url(self) -> str:
        """Base URL, ``http(s)://127.0.0.1:PORT``."""
        scheme = "https" if self.config.get("tls_pem") else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def records(self) -> list[H2StreamRecord]:
        """The child's ground truth, one record per finished stream, in finishing order."""
        return [H2StreamRecord.from_json(r) for r in self._ask("records")]


def serve_h2_in_child(config_json: str) -> None:
    """Child side of :class:`SubprocessH2LLMServer` (``python -m latency_analyzer.testing``)."""
    asyncio.run(_child_main(json.loads(config_json)))


async def _child_main(config: Mapping[str, Any]) -> None:
    tls_pem = config.get("tls_pem")
    context = server_context_from_pem(tls_pem, alpn=()) if tls_pem else None
    streams = config["max_concurrent_streams"]
    server = H2LLMServer(ssl=context, max_concurrent_streams=streams, **config["knobs"])
    async with server:
        commands = {"records": lambda: [record.to_json() for record in server.records]}
        await serve_commands({"port": server.port, "pid": os.getpid()}, commands)
