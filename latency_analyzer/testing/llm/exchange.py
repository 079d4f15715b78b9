"""One request to the test-bed LLM server: its timeline, written at its deadlines.

:class:`Exchange` is a parsed request; :func:`respond` sends its response (streamed,
whole, or one of the faults of :class:`~latency_analyzer.testing.LLMServer`), stamping the
:class:`~.records.RecordBuilder` just before each write, so no byte can reach the client
before the instant recorded for it.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .._timing import abort_with_rst, deadline_after, sleep_until
from .behavior import Behavior, chunk_bounds
from .records import RecordBuilder
from .telemetry import server_timing
from .wire import DONE, OpenAIEncoder, error_body, model_name, sse, token_texts

__all__ = ["Exchange", "close", "respond", "send_json"]


@dataclass
class Exchange:
    """One parsed request: what to send and when."""

    request: web.Request
    chat: bool
    body: Mapping[str, Any]
    behavior: Behavior
    recorder: RecordBuilder
    request_id: str
    created: int
    server_timing: bool = False

    @functools.cached_property
    def encoder(self) -> OpenAIEncoder:
        """The payloads of this response."""
        model = model_name(self.body, self.behavior.model)
        return OpenAIEncoder(self.request_id, model, self.chat, self.created)

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

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        """The ``usage`` object of this response."""
        prompt = self.recorder.prompt_tokens
        return self.encoder.usage_for(self.behavior, prompt, completion_tokens)


def _full_body(ex: Exchange) -> dict[str, Any]:
    """The non-streamed response body."""
    reasoning, content = token_texts(ex.behavior, ex.chat, 0, ex.behavior.tokens)
    return ex.encoder.body(content, reasoning, ex.usage(ex.behavior.tokens))


async def respond(ex: Exchange) -> web.StreamResponse:
    """Send ``ex``'s response: a fault before the headers, a stream or a whole body."""
    if ex.behavior.fault in ("close_before_headers", "http_error"):
        return await _fail_before_headers(ex)
    return await (_stream(ex) if ex.recorder.stream else _unary(ex))


def _event_stream() -> web.StreamResponse:
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    return web.StreamResponse(headers=headers)


def close(request: web.BaseRequest) -> None:
    """Close the connection with a FIN, without a response."""
    if request.transport is not None:
        request.transport.close()


async def send_json(
    request: web.BaseRequest,
    recorder: RecordBuilder,
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


async def _fail_before_headers(ex: Exchange) -> web.StreamResponse:
    """The ``close_before_headers`` and ``http_error`` faults, at ``header_delay``."""
    await sleep_until(ex.headers_due)
    if ex.behavior.fault == "close_before_headers":
        ex.recorder.publish()
        close(ex.request)
        return web.Response()
    status = ex.behavior.fault_status
    body = error_body(status, f"testbed http_error {status}")
    return await send_json(ex.request, ex.recorder, status, body, ex.behavior.keepalive)


async def _unary(ex: Exchange) -> web.StreamResponse:
    """Send the non-streamed body when the last token is due."""
    body = _full_body(ex)  # built before the deadline, not after
    await sleep_until(ex.token_due(max(ex.behavior.tokens - 1, 0)))
    fault, recorder = ex.behavior.fault, ex.recorder
    if fault == "reset" and ex.request.transport is not None:
        recorder.publish()
        abort_with_rst(ex.request.transport)
        return web.Response()
    if fault == "stream_error":
        return await send_json(ex.request, recorder, 500, error_body(500, "testbed error"))
    if fault in ("truncate", "malformed"):
        return await _send_cut(ex, json.dumps(body).encode(), fin=fault == "truncate")
    keepalive, tokens = ex.behavior.keepalive, ex.behavior.tokens
    headers = _unary_timing(ex) if ex.server_timing else None
    return await send_json(ex.request, recorder, 200, body, keepalive, tokens, headers)


def _unary_timing(ex: Exchange) -> dict[str, str]:
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
    ex.recorder.server_timing = value = server_timing(parts)
    return {"Server-Timing": value}


async def _send_cut(ex: Exchange, data: bytes, fin: bool) -> web.StreamResponse:
    """Send half of ``data``; then FIN (``fin``, Content-Length promises more) or end."""
    half = data[: len(data) // 2]
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.content_length = len(data) if fin else len(half)
    sent_ns = time.perf_counter_ns()
    await resp.prepare(ex.request)
    ex.recorder.status, ex.recorder.headers_ns = 200, sent_ns
    await resp.write(half)
    ex.recorder.publish()
    if fin:
        close(ex.request)
    else:
        await resp.write_eof()
    return resp


async def _stream(ex: Exchange) -> web.StreamResponse:
    """Send headers (and the role chunk) at ``header_delay``, then the timed token chunks."""
    resp = _event_stream()
    if not ex.behavior.keepalive:
        resp.force_close()
    await sleep_until(ex.headers_due)
    sent_ns = time.perf_counter_ns()  # before the write: no byte can arrive earlier
    if ex.server_timing:
        value = server_timing([("preprocess", sent_ns - ex.recorder.received_ns)])
        resp.headers["Server-Timing"] = ex.recorder.server_timing = value
    await resp.prepare(ex.request)
    ex.recorder.status, ex.recorder.headers_ns = 200, sent_ns
    if ex.behavior.role_chunk and ex.chat:
        await resp.write(sse(ex.encoder.role_chunk()))
    if await _stream_tokens(ex, resp):
        await _finish_stream(ex, resp)
    return resp


async def _stream_tokens(ex: Exchange, resp: web.StreamResponse) -> bool:
    """Send every token chunk at its deadline; return False if a fault ended the stream."""
    bounds = chunk_bounds(ex.behavior)
    fault_slot = min(ex.behavior.fault_after, len(bounds)) if ex.behavior.fault else -1
    for slot, (start, stop) in enumerate([*bounds, (ex.behavior.tokens, ex.behavior.tokens)]):
        chunk = ex.encoder.tokens_chunk(ex.behavior, start, stop)
        data = sse(chunk)  # built before the deadline, not after
        await sleep_until(ex.token_due(max(stop - 1, 0)))
        if slot == fault_slot:
            if await _stream_fault(ex, resp):
                return False
        elif slot < len(bounds):
            ex.recorder.chunk_ns.append(time.perf_counter_ns())  # stamped before the write
            await resp.write(data)
            ex.recorder.chunk_tokens.append(stop - start)
    return True


async def _stream_fault(ex: Exchange, resp: web.StreamResponse) -> bool:
    """Apply a mid-stream fault; return True if it ended the stream."""
    fault = ex.behavior.fault
    if fault == "malformed":
        await resp.write(b'data: {"id": "' + ex.request_id.encode() + b'", "choices": [{"del\n\n')
        return False
    ex.recorder.publish()
    if fault == "reset" and ex.request.transport is not None:
        abort_with_rst(ex.request.transport)
    elif fault == "stream_error":
        error = error_body(500, "testbed stream_error")
        await resp.write_eof(sse({"error": error}) + DONE)
    elif fault == "truncate":
        await resp.write_eof()
    return True


def _timings_chunk(ex: Exchange) -> dict[str, Any]:
    """llama.cpp server's closing chunk: empty delta, finish reason, ``timings`` (ms)."""
    chunks = ex.recorder.chunk_ns
    prefill_start = deadline_after(ex.headers_due, ex.behavior.queue)
    choice = {"index": 0, "delta": {}, "finish_reason": "length"}
    final = ex.encoder.envelope([choice])
    final["timings"] = {
        "cache_n": 0,
        "prompt_n": ex.recorder.prompt_tokens,
        "prompt_ms": (chunks[0] - prefill_start) / 1e6,
        "predicted_n": ex.behavior.tokens,
        "predicted_ms": (chunks[-1] - chunks[0]) / 1e6,
    }
    return final


async def _finish_stream(ex: Exchange, resp: web.StreamResponse) -> None:
    """Send the usage chunk (if asked for) and ``[DONE]``, then end the response."""
    data = DONE
    if ex.include_usage:
        data = sse(ex.encoder.usage_chunk(ex.usage(ex.behavior.tokens))) + data
    if ex.behavior.timings and ex.recorder.chunk_ns:
        data = sse(_timings_chunk(ex)) + data
    ex.recorder.publish()
    await resp.write_eof(data)
