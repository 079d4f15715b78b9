"""An OpenAI-compatible streaming server with injected, precisely timed delays.

Timeline of one request, all deadlines absolute from ``t0`` = request body fully read::

    t0 ── header_delay ──▶ headers (+ role chunk) ── queue + prefill ──▶ token 0
       ── decode ──▶ token 1 ── decode ──▶ ... token N-1 ──▶ usage chunk, [DONE]

A chunk carrying ``tokens_per_chunk`` tokens leaves when its last token is due
(``t_first + index_of_last_token * decode``). A non-streamed response is sent whole when the
last token is due, i.e. ``t0 + header_delay + queue + prefill + (tokens - 1) * decode``.

Every knob may be overridden per request with ``"testbed": {...}`` in the JSON body;
``max_tokens`` in the body sets ``tokens``. Ground truth is kept in :attr:`LLMServer.records`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import ssl as ssl_module
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ._timing import Service, abort_with_rst, check_loopback, deadline_after, sleep_until
from .tls import server_context_from_pem

__all__ = [
    "FAULTS",
    "Behavior",
    "LLMServer",
    "RequestRecord",
    "SubprocessLLMServer",
    "token_text",
]

#: Accepted values of the ``fault`` knob.
FAULTS = frozenset(
    {
        "reset",
        "truncate",
        "malformed",
        "http_error",
        "hang",
        "close_before_headers",
        "stream_error",
    }
)

_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}
_SHUTDOWN_TIMEOUT_S = 0.5


def token_text(index: int) -> str:
    """Return the text of output token ``index``: one fixed-width word, ``"tok0042 "``."""
    return f"tok{index % 10000:04d} "


@dataclass(frozen=True)
class Behavior:
    """What the server does with one request. Durations are in seconds.

    Attributes:
        header_delay: from request fully read to response headers sent.
        queue: simulated scheduler queue, after the headers, before prefill.
        prefill: from the end of the queue to the first token chunk.
        decode: between consecutive output tokens.
        tokens: output tokens per response.
        tokens_per_chunk: tokens carried by each streamed chunk.
        usage: send usage (the final ``choices: []`` chunk when the request asks for it with
            ``stream_options.include_usage``; always in non-streamed bodies).
        role_chunk: send a vLLM-style ``{"role": "assistant", "content": ""}`` chunk right
            after the headers.
        reasoning_tokens: the first N tokens go to ``delta.reasoning_content`` (chat only).
        empty_tokens, empty_last_tokens: the first / last N tokens are sent with empty text
            (``content: ""`` or ``text: ""``), as a byte-level model streams partial UTF-8
            pieces; each is still its own chunk, stamped in ``RequestRecord.chunk_ns``.
        timings: end a stream with llama.cpp server's closing chunk (empty delta,
            ``finish_reason``) carrying its ``timings``: ``prompt_ms`` from the end of the
            queue to the first token's write, ``predicted_ms`` from the first token's write to
            the last's (both from ``RequestRecord`` stamps), ``prompt_n``, ``predicted_n``.
        keepalive: if False, every response carries ``Connection: close``.
        fault: one of :data:`FAULTS` or None; see :class:`LLMServer`.
        fault_after: token chunks sent before the fault strikes (stream faults).
        fault_status: HTTP status of ``fault="http_error"``.
        model: model name reported when the request names none.
    """

    header_delay: float = 0.0
    queue: float = 0.0
    prefill: float = 0.0
    decode: float = 0.0
    tokens: int = 16
    tokens_per_chunk: int = 1
    usage: bool = True
    role_chunk: bool = True
    reasoning_tokens: int = 0
    empty_tokens: int = 0
    empty_last_tokens: int = 0
    timings: bool = False
    keepalive: bool = True
    fault: str | None = None
    fault_after: int = 0
    fault_status: int = 400
    model: str = "testbed-model"

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {sorted(FAULTS)}")
        if self.tokens < 0 or self.tokens_per_chunk < 1 or self.fault_after < 0:
            raise ValueError("tokens and fault_after must be >= 0, tokens_per_chunk >= 1")
        if self.empty_tokens < 0 or self.empty_last_tokens < 0:
            raise ValueError("empty_tokens and empty_last_tokens must be >= 0")
        for name in ("header_delay", "queue", "prefill", "decode"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def override(self, changes: Mapping[str, Any]) -> Behavior:
        """Return a copy with ``changes`` applied, checking names and types.

        Raises:
            ValueError: an unknown knob or a value of the wrong type.
        """
        checked = {name: _check_knob(name, value) for name, value in changes.items()}
        return dataclasses.replace(self, **checked)


_TYPES_BY_ANNOTATION: dict[str, tuple[type, ...]] = {
    "float": (int, float),
    "int": (int,),
    "bool": (bool,),
    "str": (str,),
    "str | None": (str, type(None)),
}
_KNOB_TYPES = {f.name: _TYPES_BY_ANNOTATION[str(f.type)] for f in dataclasses.fields(Behavior)}


def _check_knob(name: str, value: Any) -> Any:
    """Return ``value`` if it suits knob ``name``; raise ValueError otherwise."""
    if name not in _KNOB_TYPES:
        raise ValueError(f"unknown testbed knob {name!r}; expected one of {sorted(_KNOB_TYPES)}")
    expected = _KNOB_TYPES[name]
    is_bool = isinstance(value, bool)
    if not isinstance(value, expected) or (is_bool and bool not in expected):
        raise ValueError(f"testbed knob {name!r} got {value!r}")
    return value


@dataclass(frozen=True)
class RequestRecord:
    """Ground truth for one request; instants are ``time.perf_counter_ns()`` values.

    ``perf_counter_ns`` is CLOCK_MONOTONIC on Linux, shared by every process on the host, so
    records from :meth:`LLMServer.run_in_subprocess` compare directly with the caller's clock.

    Attributes:
        path: request path.
        stream: whether the response was streamed.
        status: HTTP status sent (0 if no response was sent).
        peer: client (host, port); equal ports mean the same TCP connection.
        behavior: the effective knobs after per-request overrides.
        received_ns: request body fully read (``t0``).
        headers_ns: just before the response headers were written (None if never).
        chunk_ns: just before each token chunk was written (valid token chunks only).
        chunk_tokens: tokens carried by each of those chunks.
        end_ns: response finished, connection aborted, or handler stopped.
        prompt_tokens: whitespace-separated words in the prompt (at least 1).
        slot_wait_ns: time spent waiting for a free slot (``LLMServer(slots=N)``) before
            ``received_ns``, which then marks the start of service.
        server_timing: the ``Server-Timing`` header sent (``LLMServer(server_timing=True)``).
        body: the JSON body received (``LLMServer(record_requests=True)``; else None).
        headers: the request headers received (``record_requests=True``; else None).
    """

    path: str
    stream: bool
    status: int
    peer: tuple[str, int]
    behavior: Behavior
    received_ns: int
    headers_ns: int | None
    chunk_ns: tuple[int, ...]
    chunk_tokens: tuple[int, ...]
    end_ns: int
    prompt_tokens: int
    slot_wait_ns: int = 0
    server_timing: str | None = None
    body: dict[str, Any] | None = field(default=None, hash=False)
    headers: dict[str, str] | None = field(default=None, hash=False)

    @property
    def first_token_ns(self) -> int | None:
        """When the first token chunk was written, if any."""
        return self.chunk_ns[0] if self.chunk_ns else None

    @property
    def output_tokens(self) -> int:
        """Tokens sent in valid chunks (or in the non-streamed body)."""
        return sum(self.chunk_tokens)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict (inverse of :meth:`from_json`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRecord:
        """Rebuild a record from :meth:`to_json` output."""
        fields = dict(data)
        fields["peer"] = tuple(fields["peer"])
        fields["behavior"] = Behavior(**fields["behavior"])
        fields["chunk_ns"] = tuple(fields["chunk_ns"])
        fields["chunk_tokens"] = tuple(fields["chunk_tokens"])
        return cls(**fields)


@dataclass
class _Recorder:
    """Mutable ground truth while a request is being served."""

    path: str
    peer: tuple[str, int]
    received_ns: int
    behavior: Behavior = field(default_factory=Behavior)
    stream: bool = False
    status: int = 0
    prompt_tokens: int = 1
    headers_ns: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    sink: list[RequestRecord] = field(default_factory=list)
    published: bool = False
    slot_wait_ns: int = 0
    server_timing: str | None = None
    on_publish: Callable[[RequestRecord], None] | None = None
    body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None

    def publish(self) -> None:
        """Freeze the record (``end_ns`` = now) into ``sink``, once.

        Called just before the response's final write, so a client that has seen the end
        of its response always finds the record.
        """
        if not self.published:
            self.published = True
            record = self.freeze()
            self.sink.append(record)
            if self.on_publish is not None:
                self.on_publish(record)

    def freeze(self) -> RequestRecord:
        return RequestRecord(
            path=self.path,
            stream=self.stream,
            status=self.status,
            peer=self.peer,
            behavior=self.behavior,
            received_ns=self.received_ns,
            headers_ns=self.headers_ns,
            chunk_ns=tuple(self.chunk_ns),
            chunk_tokens=tuple(self.chunk_tokens),
            end_ns=time.perf_counter_ns(),
            prompt_tokens=self.prompt_tokens,
            slot_wait_ns=self.slot_wait_ns,
            server_timing=self.server_timing,
            body=self.body,
            headers=self.headers,
        )


@dataclass
class _Exchange:
    """One parsed request: what to send and when."""

    request: web.Request
    chat: bool
    body: Mapping[str, Any]
    behavior: Behavior
    recorder: _Recorder
    request_id: str
    created: int
    server_timing: bool = False

    @property
    def model(self) -> str:
        model = self.body.get("model")
        return model if isinstance(model, str) else self.behavior.model

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options")
        wanted = isinstance(options, Mapping) and options.get("include_usage") is True
        return wanted and self.behavior.usage

    @property
    def headers_due(self) -> int:
        return deadline_after(self.recorder.received_ns, self.behavior.header_delay)

    def token_due(self, index: int) -> int:
        """Deadline of output token ``index``."""
        b = self.behavior
        return deadline_after(self.headers_due, b.queue + b.prefill + index * b.decode)


# --- OpenAI payloads -------------------------------------------------------------------


def _sse(payload: Mapping[str, Any] | str) -> bytes:
    """Frame one server-sent event: ``data: ...`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _chunk_envelope(ex: _Exchange, choices: list[dict[str, Any]]) -> dict[str, Any]:
    kind = "chat.completion.chunk" if ex.chat else "text_completion"
    return {
        "id": ex.request_id,
        "object": kind,
        "created": ex.created,
        "model": ex.model,
        "choices": choices,
    }


def _texts(ex: _Exchange, start: int, stop: int) -> tuple[str, str]:
    """Return (reasoning, content) text of tokens ``start..stop-1``."""
    b = ex.behavior
    split = min(max(b.reasoning_tokens if ex.chat else 0, start), stop)
    visible = range(b.empty_tokens, b.tokens - b.empty_last_tokens)

    def text(i: int) -> str:
        return token_text(i) if i in visible else ""

    reasoning = "".join(text(i) for i in range(start, split))
    return reasoning, "".join(text(i) for i in range(split, stop))


def _token_chunk(ex: _Exchange, start: int, stop: int) -> dict[str, Any]:
    """The streamed chunk carrying tokens ``start..stop-1``."""
    finish = "length" if stop == ex.behavior.tokens else None
    reasoning, content = _texts(ex, start, stop)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if not ex.chat:
        choice["text"] = reasoning + content
        return _chunk_envelope(ex, [choice])
    delta: dict[str, Any] = {"reasoning_content": reasoning} if reasoning else {}
    if content or not reasoning:
        delta["content"] = content
    choice["delta"] = delta
    return _chunk_envelope(ex, [choice])


def _role_chunk(ex: _Exchange) -> dict[str, Any]:
    delta = {"role": "assistant", "content": ""}
    return _chunk_envelope(ex, [{"index": 0, "delta": delta, "logprobs": None}])


def _usage(ex: _Exchange, completion_tokens: int) -> dict[str, Any]:
    prompt = ex.recorder.prompt_tokens
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }
    reasoning = min(ex.behavior.reasoning_tokens, completion_tokens) if ex.chat else 0
    if reasoning:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def _full_body(ex: _Exchange) -> dict[str, Any]:
    """The non-streamed response body."""
    reasoning, content = _texts(ex, 0, ex.behavior.tokens)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
    if ex.chat:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        choice["message"] = message
    else:
        choice["text"] = reasoning + content
    body = _chunk_envelope(ex, [choice])
    body["object"] = "chat.completion" if ex.chat else "text_completion"
    body["usage"] = _usage(ex, ex.behavior.tokens)
    return body


def _error_body(status: int, message: str) -> dict[str, Any]:
    """vLLM's error body shape."""
    kind = _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    """Count whitespace-separated words of the prompt or message contents (at least 1)."""
    parts: list[str] = []
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        parts.append(prompt)
    messages = body.get("messages")
    if isinstance(messages, list):
        parts += [
            m["content"]
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("content"), str)
        ]
    return max(1, sum(len(p.split()) for p in parts))


def _chunk_bounds(behavior: Behavior) -> list[tuple[int, int]]:
    """[start, stop) token ranges of the streamed chunks."""
    step = behavior.tokens_per_chunk
    return [(i, min(i + step, behavior.tokens)) for i in range(0, behavior.tokens, step)]


def _parse_body(raw: bytes, defaults: Behavior) -> tuple[Mapping[str, Any], Behavior]:
    """Decode the JSON body and the effective behavior. Raises ValueError if invalid."""
    body = json.loads(raw or b"{}")
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    overrides = body.get("testbed") or {}
    if not isinstance(overrides, dict):
        raise ValueError("'testbed' must be an object")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if isinstance(max_tokens, int) and "tokens" not in overrides:
        overrides = {**overrides, "tokens": max_tokens}
    return body, defaults.override(overrides)


def _peer(request: web.BaseRequest) -> tuple[str, int]:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return (str(peer[0]), int(peer[1])) if peer else ("", 0)


def _event_stream() -> web.StreamResponse:
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    return web.StreamResponse(headers=headers)


def _close(request: web.BaseRequest) -> None:
    """Close the connection with a FIN, without a response."""
    if request.transport is not None:
        request.transport.close()


# --- OpenTelemetry spans in vLLM's schema ------------------------------------------------

_ANCHOR_READS = 9


def _epoch_anchor() -> tuple[int, int]:
    """(perf_counter_ns, time_ns) read together; the tightest of a few brackets."""
    best: tuple[int, int, int] | None = None
    for _ in range(_ANCHOR_READS):
        before, epoch, after = time.perf_counter_ns(), time.time_ns(), time.perf_counter_ns()
        if best is None or after - before < best[2]:
            best = (before + (after - before) // 2, epoch, after - before)
    assert best is not None
    return best[0], best[1]


class _SpanEmitter:
    """One vLLM v1 ``llm_request`` SERVER span per finished request, exported for real.

    Spans go through the OpenTelemetry SDK (a private ``TracerProvider``, never the global one),
    a ``BatchSpanProcessor`` and the OTLP/HTTP protobuf exporter with gzip, so whatever
    receives them sees what a vLLM started with ``--otlp-traces-endpoint`` would send. The
    span's clock is this process's wall clock plus ``clock_skew`` seconds (a server whose clock
    is wrong); its parent is the request's ``traceparent``.
    """

    def __init__(self, endpoint: str, clock_skew: float, batch_delay: float) -> None:
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": "latency-analyzer-testbed"})
        self._provider = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(endpoint=endpoint, compression=Compression.Gzip, timeout=5)
        delay_ms = max(1, round(batch_delay * 1000))
        self._provider.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=delay_ms)
        )
        self._tracer = self._provider.get_tracer("vllm.tracing.otel")  # vLLM's scope name
        perf, epoch = _epoch_anchor()
        self._shift = epoch - perf + round(clock_skew * 1e9)

    def epoch_ns(self, perf_ns: int) -> int:
        """A ``perf_counter_ns`` instant on the span clock (wall clock + skew)."""
        return perf_ns + self._shift

    def emit(self, headers: Mapping[str, str], request_id: str, record: RequestRecord) -> None:
        """Start and end the request's span (ends now; the exporter sends it later)."""
        first = record.first_token_ns
        if first is None or not record.chunk_ns:
            return  # vLLM traces finished requests that produced tokens
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract(headers)
        span = self._tracer.start_span(
            "llm_request",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=self.epoch_ns(record.received_ns),
        )
        span.set_attributes(_vllm_attributes(record, request_id))
        span.end(end_time=self.epoch_ns(time.perf_counter_ns()))

    def shutdown(self) -> None:
        """Export what is pending, then stop."""
        self._provider.shutdown()


def _vllm_attributes(record: RequestRecord, request_id: str) -> dict[str, Any]:
    """vLLM v1's ``gen_ai.latency.*`` attributes (float seconds) from the ground truth.

    The queue runs from the headers deadline for ``queue`` seconds; prefill from there to the
    first token; decode from the first to the last token (vLLM: last − first token time).
    """
    b, start = record.behavior, record.received_ns
    first, last = record.chunk_ns[0], record.chunk_ns[-1]
    queued = deadline_after(start, b.header_delay)
    scheduled = deadline_after(queued, b.queue)
    return {
        "gen_ai.latency.time_in_queue": (scheduled - queued) / 1e9,
        "gen_ai.latency.time_to_first_token": (first - start) / 1e9,
        "gen_ai.latency.time_in_model_prefill": (first - scheduled) / 1e9,
        "gen_ai.latency.time_in_model_decode": (last - first) / 1e9,
        "gen_ai.latency.time_in_model_inference": (last - scheduled) / 1e9,
        "gen_ai.latency.e2e": (record.end_ns - start) / 1e9,
        "gen_ai.usage.prompt_tokens": record.prompt_tokens,
        "gen_ai.usage.completion_tokens": record.output_tokens,
        "gen_ai.request.id": request_id,
        "gen_ai.request.max_tokens": b.tokens,
    }


def _server_timing(parts: list[tuple[str, int]]) -> str:
    """A ``Server-Timing`` value: ``name;dur=<ms>`` entries, in order."""
    return ", ".join(f"{name};dur={ns / 1e6:.3f}" for name, ns in parts)


#: Upper bucket edges (seconds) of ``testbed_queue_time_seconds``, as vLLM's queue histogram.
QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _exposition(waiting: int, running: int, requests: int, records: list[RequestRecord]) -> str:
    """The server's own gauges in the Prometheus text format (version 0.0.4).

    The queue-time histogram counts finished requests (as vLLM observes at completion).
    """
    waits = [r.slot_wait_ns / 1e9 for r in records]
    lines = [
        "# HELP testbed_requests_waiting Requests waiting for a slot.",
        "# TYPE testbed_requests_waiting gauge",
        f"testbed_requests_waiting {waiting}",
        "# HELP testbed_requests_running Requests being served.",
        "# TYPE testbed_requests_running gauge",
        f"testbed_requests_running {running}",
        "# HELP testbed_requests_total Completion requests received.",
        "# TYPE testbed_requests_total counter",
        f"testbed_requests_total {requests}",
        "# HELP testbed_queue_time_seconds Time finished requests waited for a slot.",
        "# TYPE testbed_queue_time_seconds histogram",
    ]
    for edge in QUEUE_BUCKETS:
        count = sum(1 for w in waits if w <= edge)
        lines.append(f'testbed_queue_time_seconds_bucket{{le="{edge}"}} {count}')
    lines.append(f'testbed_queue_time_seconds_bucket{{le="+Inf"}} {len(waits)}')
    lines.append(f"testbed_queue_time_seconds_sum {sum(waits)!r}")
    lines.append(f"testbed_queue_time_seconds_count {len(waits)}")
    return "\n".join(lines) + "\n"


# --- the server ----------------------------------------------------------------------


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
        self._emitter: _SpanEmitter | None = None
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
        self._server: asyncio.Server | None = None
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
            self._emitter = _SpanEmitter(
                endpoint, self.otel["clock_skew"], self.otel["otlp_batch_delay"]
            )
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)
        await self._runner.setup()
        self._stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._new_connection, self._host, self._port, ssl=self.ssl
        )
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop: release hanging requests, close the listener and every connection."""
        self._stopping.set()
        if self._server is not None:
            self._server.close()
            self._server = None
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
        text = _exposition(self.waiting, self.running, self.requests, self.records)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        raw = await request.read()
        recorder = _Recorder(request.path, _peer(request), time.perf_counter_ns(), self.behavior)
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
        self, request: web.Request, raw: bytes, chat: bool, recorder: _Recorder
    ) -> web.StreamResponse:
        self.running += 1
        try:
            return await self._dispatch(request, raw, chat, recorder)
        finally:
            self.running -= 1

    async def _dispatch(
        self, request: web.Request, raw: bytes, chat: bool, recorder: _Recorder
    ) -> web.StreamResponse:
        try:
            body, behavior = _parse_body(raw, self.behavior)
        except ValueError as exc:
            return await _send_json(request, recorder, 400, _error_body(400, str(exc)))
        recorder.behavior = behavior
        recorder.stream = body.get("stream") is True
        recorder.prompt_tokens = _prompt_tokens(body)
        if self.record_requests:
            recorder.body = dict(body)
        prefix = "chatcmpl" if chat else "cmpl"
        ex = _Exchange(
            request, chat, body, behavior, recorder, f"{prefix}-{self.requests}", int(time.time())
        )
        ex.server_timing = bool(self.otel["server_timing"])
        emitter = self._emitter
        if emitter is not None:
            recorder.on_publish = functools.partial(emitter.emit, request.headers, ex.request_id)
        if behavior.fault == "hang":
            return await self._hang(ex)
        if behavior.fault in ("close_before_headers", "http_error"):
            return await _fail_before_headers(ex)
        return await (_stream(ex) if recorder.stream else _unary(ex))

    async def _hang(self, ex: _Exchange) -> web.StreamResponse:
        await self._stopping.wait()
        ex.recorder.publish()
        _close(ex.request)
        return web.Response()


async def _send_json(
    request: web.BaseRequest,
    recorder: _Recorder,
    status: int,
    body: Mapping[str, Any],
    keepalive: bool = True,
    tokens: int = 0,
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """Send a whole JSON response (``tokens`` output tokens) in one write, recording it."""
    resp = web.json_response(body, status=status, headers=headers)
    if not keepalive:
        resp.force_close()
    sent_ns = time.perf_counter_ns()  # before the write: no byte can arrive earlier
    await resp.prepare(request)  # a Response buffers its headers until write_eof
    recorder.status, recorder.headers_ns = status, sent_ns
    if tokens:
        recorder.chunk_ns.append(recorder.headers_ns)
        recorder.chunk_tokens.append(tokens)
    recorder.publish()
    await resp.write_eof()
    return resp


async def _fail_before_headers(ex: _Exchange) -> web.StreamResponse:
    """The ``close_before_headers`` and ``http_error`` faults, at ``header_delay``."""
    await sleep_until(ex.headers_due)
    if ex.behavior.fault == "close_before_headers":
        ex.recorder.publish()
        _close(ex.request)
        return web.Response()
    status = ex.behavior.fault_status
    body = _error_body(status, f"testbed http_error {status}")
    return await _send_json(ex.request, ex.recorder, status, body, ex.behavior.keepalive)


async def _unary(ex: _Exchange) -> web.StreamResponse:
    """Send the non-streamed body when the last token is due."""
    body = _full_body(ex)  # built before the deadline, not after
    await sleep_until(ex.token_due(max(ex.behavior.tokens - 1, 0)))
    fault, recorder = ex.behavior.fault, ex.recorder
    if fault == "reset" and ex.request.transport is not None:
        recorder.publish()
        abort_with_rst(ex.request.transport)
        return web.Response()
    if fault == "stream_error":
        return await _send_json(ex.request, recorder, 500, _error_body(500, "testbed error"))
    if fault in ("truncate", "malformed"):
        return await _send_cut(ex, json.dumps(body).encode(), close=fault == "truncate")
    keepalive, tokens = ex.behavior.keepalive, ex.behavior.tokens
    headers = _unary_timing(ex) if ex.server_timing else None
    return await _send_json(ex.request, recorder, 200, body, keepalive, tokens, headers)


def _unary_timing(ex: _Exchange) -> dict[str, str]:
    """Server-Timing of a whole response: header_delay, queue, prefill, then decode to now."""
    b, start = ex.behavior, ex.recorder.received_ns
    queued = deadline_after(start, b.header_delay)
    scheduled = deadline_after(queued, b.queue)
    first = deadline_after(scheduled, b.prefill)
    parts = [
        ("preprocess", queued - start),
        ("server_queue", scheduled - queued),
        ("prefill", first - scheduled),
        ("decode", time.perf_counter_ns() - first),
    ]
    ex.recorder.server_timing = value = _server_timing(parts)
    return {"Server-Timing": value}


async def _send_cut(ex: _Exchange, data: bytes, close: bool) -> web.StreamResponse:
    """Send half of ``data``; then FIN (``close``, Content-Length promises more) or end."""
    half = data[: len(data) // 2]
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.content_length = len(data) if close else len(half)
    sent_ns = time.perf_counter_ns()
    await resp.prepare(ex.request)
    ex.recorder.status, ex.recorder.headers_ns = 200, sent_ns
    await resp.write(half)
    ex.recorder.publish()
    if close:
        _close(ex.request)
    else:
        await resp.write_eof()
    return resp


async def _stream(ex: _Exchange) -> web.StreamResponse:
    """Send headers (and the role chunk) at ``header_delay``, then the timed token chunks."""
    resp = _event_stream()
    if not ex.behavior.keepalive:
        resp.force_close()
    await sleep_until(ex.headers_due)
    sent_ns = time.perf_counter_ns()  # before the write: no byte can arrive earlier
    if ex.server_timing:
        value = _server_timing([("preprocess", sent_ns - ex.recorder.received_ns)])
        resp.headers["Server-Timing"] = ex.recorder.server_timing = value
    await resp.prepare(ex.request)
    ex.recorder.status, ex.recorder.headers_ns = 200, sent_ns
    if ex.behavior.role_chunk and ex.chat:
        await resp.write(_sse(_role_chunk(ex)))
    if await _stream_tokens(ex, resp):
        await _finish_stream(ex, resp)
    return resp


async def _stream_tokens(ex: _Exchange, resp: web.StreamResponse) -> bool:
    """Send every token chunk at its deadline; return False if a fault ended the stream."""
    bounds = _chunk_bounds(ex.behavior)
    fault_slot = min(ex.behavior.fault_after, len(bounds)) if ex.behavior.fault else -1
    for slot, (start, stop) in enumerate([*bounds, (ex.behavior.tokens, ex.behavior.tokens)]):
        data = _sse(_token_chunk(ex, start, stop))  # built before the deadline, not after
        await sleep_until(ex.token_due(max(stop - 1, 0)))
        if slot == fault_slot:
            if await _stream_fault(ex, resp):
                return False
        elif slot < len(bounds):
            ex.recorder.chunk_ns.append(time.perf_counter_ns())  # stamped before the write
            await resp.write(data)
            ex.recorder.chunk_tokens.append(stop - start)
    return True


async def _stream_fault(ex: _Exchange, resp: web.StreamResponse) -> bool:
    """Apply a mid-stream fault; return True if it ended the stream."""
    fault = ex.behavior.fault
    if fault == "malformed":
        await resp.write(b'data: {"id": "' + ex.request_id.encode() + b'", "choices": [{"del\n\n')
        return False
    ex.recorder.publish()
    if fault == "reset" and ex.request.transport is not None:
        abort_with_rst(ex.request.transport)
    elif fault == "stream_error":
        error = _error_body(500, "testbed stream_error")
        await resp.write_eof(_sse({"error": error}) + _sse("[DONE]"))
    elif fault == "truncate":
        await resp.write_eof()
    return True


def _timings_chunk(ex: _Exchange) -> dict[str, Any]:
    """llama.cpp server's closing chunk: empty delta, finish reason, ``timings`` (ms)."""
    chunks = ex.recorder.chunk_ns
    prefill_start = deadline_after(ex.headers_due, ex.behavior.queue)
    choice = {"index": 0, "delta": {}, "finish_reason": "length"}
    final = _chunk_envelope(ex, [choice])
    final["timings"] = {
        "cache_n": 0,
        "prompt_n": ex.recorder.prompt_tokens,
        "prompt_ms": (chunks[0] - prefill_start) / 1e6,
        "predicted_n": ex.behavior.tokens,
        "predicted_ms": (chunks[-1] - chunks[0]) / 1e6,
    }
    return final


async def _finish_stream(ex: _Exchange, resp: web.StreamResponse) -> None:
    """Send the usage chunk (if asked for) and ``[DONE]``, then end the response."""
    data = _sse("[DONE]")
    if ex.include_usage:
        final = _chunk_envelope(ex, [])
        final["usage"] = _usage(ex, ex.behavior.tokens)
        data = _sse(final) + data
    if ex.behavior.timings and ex.recorder.chunk_ns:
        data = _sse(_timings_chunk(ex)) + data
    ex.recorder.publish()
    await resp.write_eof(data)


# --- subprocess mode -----------------------------------------------------------------

_CHILD_TIMEOUT_S = 10.0


class SubprocessLLMServer:
    """An :class:`LLMServer` in a child process, free of the caller's GIL and event loop.

    Started by ``python -m latency_analyzer.testing llm-server CONFIG_JSON``; the child
    prints ``{"port": ..., "pid": ...}`` on stdout once bound, answers ``records`` and
    ``stats`` commands on stdin, and exits when stdin closes. Use as ``with``.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self._proc: subprocess.Popen[str] | None = None
        self._port = 0
        self._lock = threading.Lock()

    def __enter__(self) -> SubprocessLLMServer:
        args = [sys.executable, "-m", "latency_analyzer.testing", "llm-server"]
        self._proc = subprocess.Popen(
            [*args, json.dumps(self._config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            self._port = int(self._read_reply()["port"])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def host(self) -> str:
        """The bound address."""
        return str(self._config["host"])

    @property
    def port(self) -> int:
        """The bound port."""
        return self._port

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:PORT``."""
        scheme = "https" if self._config.get("tls_pem") else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self._port}"

    @property
    def pid(self) -> int:
        """Process id of the child."""
        if self._proc is None:
            raise RuntimeError("the subprocess server is not running")
        return self._proc.pid

    @property
    def records(self) -> list[RequestRecord]:
        """Ground truth fetched from the child (perf_counter_ns is host-wide on Linux)."""
        return [RequestRecord.from_json(r) for r in self._ask("records")]

    @property
    def connections(self) -> int:
        """TCP connections the child accepted."""
        return int(self._ask("stats")["connections"])

    @property
    def requests(self) -> int:
        """Completion requests the child received."""
        return int(self._ask("stats")["requests"])

    def kill(self) -> None:
        """SIGKILL the child at once (a "server died" fault); later connects are refused."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(_CHILD_TIMEOUT_S)

    def close(self) -> None:
        """Ask the child to stop (close its stdin), kill it if it lingers, reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ValueError):
                proc.stdin.close()
        try:
            proc.wait(_CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(_CHILD_TIMEOUT_S)
        if proc.stdout is not None:
            proc.stdout.close()

    def _ask(self, command: str) -> Any:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.poll() is not None:
            raise RuntimeError("the subprocess server is not running")
        with self._lock:
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
            return self._read_reply()

    def _read_reply(self) -> Any:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait(_CHILD_TIMEOUT_S)
            raise RuntimeError(f"the subprocess server exited (status {code})")
        return json.loads(line)


def serve_in_child(config_json: str) -> None:
    """Child side of :class:`SubprocessLLMServer` (``python -m latency_analyzer.testing``)."""
    asyncio.run(_child_main(json.loads(config_json)))


async def _child_main(config: Mapping[str, Any]) -> None:
    tls_pem = config.get("tls_pem")
    context = server_context_from_pem(tls_pem) if tls_pem else None
    slots = int(config.get("slots", 0))
    otel = config.get("otel", {})
    record = bool(config.get("record_requests", False))
    async with LLMServer(
        ssl=context,
        host=config["host"],
        slots=slots,
        record_requests=record,
        **config["knobs"],
        **otel,
    ) as server:
        print(json.dumps({"port": server.port, "pid": os.getpid()}), flush=True)
        loop = asyncio.get_running_loop()
        while command := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            print(json.dumps(_answer(server, command)), flush=True)


def _answer(server: LLMServer, command: str) -> Any:
    if command == "records":
        return [record.to_json() for record in server.records]
    if command == "stats":
        return {"connections": server.connections, "requests": server.requests}
    return {"error": f"unknown command {command!r}"}
