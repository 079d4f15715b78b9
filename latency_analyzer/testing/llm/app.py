"""The test-bed LLM server: an OpenAI-compatible SSE server on aiohttp.web.

Its knobs are :class:`~.behavior.Behavior`; each request's timeline is written by
:mod:`.exchange`; ground truth is kept in :attr:`LLMServer.records`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ssl as ssl_module
import time
from typing import Any

from aiohttp import web

from .._rx import rx_socket_of
from .._timing import Service, check_loopback
from .behavior import Behavior, parse_body, prompt_tokens
from .exchange import Exchange, close, respond, send_json
from .process import SubprocessLLMServer
from .records import RecordBuilder, RequestRecord
from .telemetry import SpanEmitter, exposition
from .wire import error_body

__all__ = ["LLMServer"]

_SHUTDOWN_TIMEOUT_S = 0.5

_OTEL_OPTIONS = ("otlp_endpoint", "clock_skew", "otlp_batch_delay", "server_timing")


class LLMServer(Service):
    """OpenAI-compatible SSE server on aiohttp.web, with precisely injected delays.

    Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed when
    ``"stream": true``), ``GET /health``, ``GET /v1/models`` and ``GET /metrics`` (Prometheus
    text: ``testbed_requests_waiting``, ``testbed_requests_running``, the counter
    ``testbed_requests_total`` and the histogram ``testbed_queue_time_seconds``).

    Faults (``fault`` knob; "slot k" is when token chunk ``k = min(fault_after, chunks)``
    would be sent, ``chunks`` meaning right after the last one):

    * ``"reset"``: at slot k, abort the TCP connection with an RST.
    * ``"truncate"``: at slot k, end the HTTP response cleanly, without ``[DONE]``.
    * ``"malformed"``: chunk k is invalid JSON (its tokens are lost); the stream continues.
    * ``"stream_error"``: at slot k, a ``{"error": {...}}`` event, then ``[DONE]``.
    * ``"http_error"``: at ``header_delay``, status ``fault_status`` with vLLM's error body.
    * ``"hang"``: read the request, never answer; the connection is closed when the server
      stops.
    * ``"close_before_headers"``: at ``header_delay``, close the connection (FIN), no response.

    Non-streamed requests: reset/truncate/malformed/stream_error strike when the body is due
    (RST; half a body then FIN; a cut JSON body; a 500 error body).

    Args:
        ssl: server-side context for HTTPS (see :class:`~latency_analyzer.testing.TestCA`).
        host: loopback address to bind ("127.0.0.1" or "::1").
        port: port to bind; leave 0 to let the OS pick.
        otlp_endpoint: when set (``http://127.0.0.1:PORT/v1/traces``), every request that
            produced tokens is traced as vLLM v1 traces it: one ``llm_request`` SERVER span,
            child of the request's ``traceparent``, with ``gen_ai.latency.*`` attributes,
            exported over OTLP/HTTP (protobuf, gzip) through the OpenTelemetry SDK. Needs
            ``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http``.
        clock_skew: seconds added to the span clock (a server whose wall clock is off).
        otlp_batch_delay: the span processor's export delay, in seconds.
        server_timing: send a ``Server-Timing`` header: a non-streamed response names
            ``preprocess`` (header_delay), ``server_queue``, ``prefill`` and ``decode``; a
            streamed one, whose headers leave before any of it happened, only ``preprocess``.
        slots: requests served at once (0: no limit). Requests beyond it wait for a slot, in
            arrival order, before their own timeline (header_delay, queue, ...) starts: a
            server with one worker and a deterministic service time is an M/D/1 queue.
        record_requests: keep each request's JSON body and headers in its record (what a
            load test sent; off by default, since long prompts make records large).
        header_delay, queue, prefill, decode, tokens, tokens_per_chunk, usage, role_chunk,
            reasoning_tokens, keepalive, fault, fault_after, fault_status, model,
            empty_tokens, empty_last_tokens, timings: the default :class:`Behavior` (see
            there for what each knob means).

    Attributes:
        records: one :class:`RequestRecord` per completion request, in completion order.
        connections: TCP connections accepted.
        requests: completion requests received.
        waiting: requests waiting for a slot right now.
        running: requests being served right now.
    """

    def __init__(
        self,
        *,
        header_delay: float = 0.0,
        queue: float = 0.0,
        prefill: float = 0.0,
        decode: float = 0.0,
        tokens: int = 16,
        tokens_per_chunk: int = 1,
        usage: bool = True,
        role_chunk: bool = True,
        reasoning_tokens: int = 0,
        keepalive: bool = True,
        fault: str | None = None,
        fault_after: int = 0,
        fault_status: int = 400,
        model: str = "testbed-model",
        ssl: ssl_module.SSLContext | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        slots: int = 0,
        otlp_endpoint: str | None = None,
        clock_skew: float = 0.0,
        otlp_batch_delay: float = 0.05,
        server_timing: bool = False,
        empty_tokens: int = 0,
        empty_last_tokens: int = 0,
        timings: bool = False,
        record_requests: bool = False,
    ) -> None:
        knobs = dict(locals())
        for name in ("self", "ssl", "host", "port", "slots", "record_requests", *_OTEL_OPTIONS):
            del knobs[name]
        self.otel: dict[str, Any] = {
            "otlp_endpoint": otlp_endpoint,
            "clock_skew": clock_skew,
            "otlp_batch_delay": otlp_batch_delay,
            "server_timing": server_timing,
        }
        self._emitter: SpanEmitter | None = None
        if slots < 0:
            raise ValueError("slots must be >= 0 (0: no limit)")
        self.slots = slots
        self.record_requests = record_requests
        self.waiting = 0  # requests queued for a slot right now (a server-side queue gauge)
        self.running = 0  # requests being served right now
        self.behavior = Behavior().override(knobs)
        self.ssl = ssl
        self._host = check_loopback(host)
        self._port = port
        self.records: list[RequestRecord] = []
        self.connections = 0
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self._slot_free: asyncio.Semaphore | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:PORT`` (no trailing slash, no ``/v1``)."""
        scheme = "https" if self.ssl is not None else "http"
        return self._base_url(scheme)

    async def start(self) -> None:
        """Bind and start serving."""
        app = web.Application(client_max_size=64 * 1024 * 1024)  # 128K-token prompts fit
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        self._slot_free = asyncio.Semaphore(self.slots) if self.slots else None
        endpoint = self.otel["otlp_endpoint"]
        if endpoint is not None:
            self._emitter = SpanEmitter(
                endpoint, self.otel["clock_skew"], self.otel["otlp_batch_delay"]
            )
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)
        await self._runner.setup()
        self._stopping = asyncio.Event()
        await self._listen(self._new_connection, ssl=self.ssl, stamped=True)

    async def stop(self) -> None:
        """Stop: release hanging requests, close the listener and every connection."""
        self._stopping.set()
        self._close_listener()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._emitter is not None:
            emitter, self._emitter = self._emitter, None
            await asyncio.get_running_loop().run_in_executor(None, emitter.shutdown)

    def run_in_subprocess(self, tls_pem: str | None = None) -> SubprocessLLMServer:
        """Return a sync context manager running this configuration in a child process.

        Args:
            tls_pem: for HTTPS, a key + chain PEM file (``TestCA.server_pem_path``); an
                ``ssl`` context object cannot cross the process boundary.
        """
        if self.ssl is not None and tls_pem is None:
            raise ValueError("run_in_subprocess needs tls_pem= to serve HTTPS")
        config: dict[str, Any] = {"knobs": dataclasses.asdict(self.behavior), "host": self._host}
        config["slots"] = self.slots
        config["record_requests"] = self.record_requests
        config["tls_pem"] = tls_pem
        config["otel"] = dict(self.otel)
        return SubprocessLLMServer(config)

    def _new_connection(self) -> asyncio.BaseProtocol:
        assert self._runner is not None and self._runner.server is not None
        self.connections += 1
        return self._runner.server()

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.behavior.model, "object": "model", "created": int(time.time())}
        model["owned_by"] = "latency-analyzer"
        return web.json_response({"object": "list", "data": [model]})

    async def _metrics(self, request: web.Request) -> web.Response:
        text = exposition(self.waiting, self.running, self.requests, self.records)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        raw = await request.read()
        recorder = RecordBuilder(
            request.path, _peer(request), time.perf_counter_ns(), self.behavior
        )
        recorder.arrived_ns = _arrival(request)
        recorder.sink = self.records
        if self.record_requests:
            recorder.headers = dict(request.headers)
        self.requests += 1
        try:
            if self._slot_free is None:
                return await self._running(request, raw, chat, recorder)
            self.waiting += 1
            try:
                await self._slot_free.acquire()
            finally:
                self.waiting -= 1
            try:
                start = time.perf_counter_ns()  # service starts: the request's timeline t0
                recorder.slot_wait_ns, recorder.received_ns = start - recorder.received_ns, start
                return await self._running(request, raw, chat, recorder)
            finally:
                self._slot_free.release()
        except ConnectionError:  # the client went away mid-response
            return web.Response()
        finally:
            recorder.publish()

    async def _running(
        self, request: web.Request, raw: bytes, chat: bool, recorder: RecordBuilder
    ) -> web.StreamResponse:
        self.running += 1
        try:
            return await self._dispatch(request, raw, chat, recorder)
        finally:
            self.running -= 1

    async def _dispatch(
        self, request: web.Request, raw: bytes, chat: bool, recorder: RecordBuilder
    ) -> web.StreamResponse:
        try:
            body, behavior = parse_body(raw, self.behavior)
        except ValueError as exc:
            return await send_json(request, recorder, 400, error_body(400, str(exc)))
        recorder.behavior = behavior
        recorder.stream = body.get("stream") is True
        recorder.prompt_tokens = prompt_tokens(body)
        if self.record_requests:
            recorder.body = dict(body)
        prefix = "chatcmpl" if chat else "cmpl"
        ex = Exchange(
            request, chat, body, behavior, recorder, f"{prefix}-{self.requests}", int(time.time())
        )
        ex.server_timing = bool(self.otel["server_timing"])
        emitter = self._emitter
        if emitter is not None:
            recorder.on_publish = functools.partial(emitter.emit, request.headers, ex.request_id)
        if behavior.fault == "hang":
            return await self._hang(ex)
        return await respond(ex)

    async def _hang(self, ex: Exchange) -> web.StreamResponse:
        await self._stopping.wait()
        ex.recorder.publish()
        close(ex.request)
        return web.Response()


def _arrival(request: web.Request) -> int | None:
    """When the read that completed ``request`` reached this host: its socket's last read, as
    long as aiohttp has read no later request whole on the connection (one sent before this
    one's response ended: pipelining), whose read that would be. None when not known."""
    sock = rx_socket_of(request.transport)
    later = getattr(request.protocol, "_messages", None)  # requests parsed, not yet served
    if sock is None or not sock.stamped or later is None or len(later):
        return None
    return sock.rx_ns


def _peer(request: web.BaseRequest) -> tuple[str, int]:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return (str(peer[0]), int(peer[1])) if peer else ("", 0)
