"""What the test-bed LLM server tells about itself: vLLM's OTel spans, Server-Timing, metrics.

* :class:`SpanEmitter` exports one vLLM v1 ``llm_request`` span per finished request;
* :func:`server_timing` writes a ``Server-Timing`` value;
* :func:`exposition` renders the server's gauges in the Prometheus text format.

Each is computed from the request's ground truth (:class:`RequestRecord`), so a reader of them
can be checked against what the server really did.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .._timing import deadline_after
from .records import RequestRecord

__all__ = ["QUEUE_BUCKETS", "SpanEmitter", "exposition", "server_timing"]

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


class SpanEmitter:
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


def server_timing(parts: list[tuple[str, int]]) -> str:
    """A ``Server-Timing`` value: ``name;dur=<ms>`` entries, in order."""
    return ", ".join(f"{name};dur={ns / 1e6:.3f}" for name, ns in parts)


#: Upper bucket edges (seconds) of ``testbed_queue_time_seconds``, as vLLM's queue histogram.
QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def exposition(waiting: int, running: int, requests: int, records: list[RequestRecord]) -> str:
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
