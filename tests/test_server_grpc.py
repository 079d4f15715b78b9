"""The OTLP/gRPC receiver: OpenTelemetry's own gRPC exporter
(``opentelemetry-exporter-otlp-proto-grpc``) exports vLLM-schema spans from an in-test
TracerProvider; hostile messages come through a raw gRPC channel. Ground truth: the spans the
test made (ids, times, attributes) and, for the merge, a waterfall built with known instants.

Without grpcio the module is skipped, except under ``CI=true``, where the missing extra fails
the run: CI installs ``.[test]``, which brings ``grpc``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import os
import sys
from collections.abc import Iterator

import pytest

try:
    import grpc
    import grpc.aio
except ModuleNotFoundError:
    if os.environ.get("CI") == "true":
        raise  # the extra must be there under CI: a collection error, never a skip
    pytest.skip(
        "grpcio is not installed: pip install 'latency-analyzer[grpc]'", allow_module_level=True
    )

from conftest import assert_exact
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import latency_analyzer as la
from latency_analyzer.capture.propagation import TraceContext, inject
from latency_analyzer.errors import UsageError
from latency_analyzer.merge import MERGED, amerge
from latency_analyzer.server import OTLPHttpReceiver, ServerSpan, SpanStore, map_request
from latency_analyzer.server.otlp_grpc import EXPORT_METHOD, OTLPGrpcReceiver, import_grpc
from latency_analyzer.timeline import ClockAnchor, Recorder

MS = 1_000_000
EPOCH = 1_800_000_000_000_000_000
SCOPE = "vllm.tracing.otel"
# vLLM's numbers for one request (seconds): queue 15 ms, prefill 40 ms (first token at
# 7.5 + 15 + 40 = 62.5 ms after arrival), decode 95 ms, e2e 160 ms
LATENCY = {
    "gen_ai.latency.time_in_queue": 0.015,
    "gen_ai.latency.time_to_first_token": 0.0625,
    "gen_ai.latency.time_in_model_prefill": 0.040,
    "gen_ai.latency.time_in_model_decode": 0.095,
    "gen_ai.latency.e2e": 0.160,
}


def _spans(provider: TracerProvider, arrivals_ns: list[int]) -> list[TraceContext]:
    """One vLLM ``llm_request`` SERVER span per arrival, child of a fresh ``inject``ed context."""
    tracer = provider.get_tracer(SCOPE)
    contexts = []
    for i, arrival in enumerate(arrivals_ns):
        headers: dict[str, str] = {}
        contexts.append(inject(headers))
        parent = TraceContextTextMapPropagator().extract(headers)
        attrs = {
            **LATENCY,
            "gen_ai.request.id": f"chatcmpl-{i}",
            "gen_ai.usage.completion_tokens": 20,
        }
        span = tracer.start_span(
            "llm_request", parent, SpanKind.SERVER, attributes=attrs, start_time=arrival
        )
        span.end(end_time=arrival + 160 * MS)
    return contexts


def _provider(exporter: OTLPSpanExporter | object) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[arg-type]  # a stand-in exporter is accepted too
    return provider


def _check_span(span: ServerSpan, ctx: TraceContext, arrival_ns: int, index: int) -> None:
    assert (span.trace_id, span.parent_span_id) == (ctx.trace_id, ctx.span_id)
    assert (span.name, span.kind, span.scope) == ("llm_request", "server", SCOPE)
    assert (span.start_ns, span.end_ns) == (arrival_ns, arrival_ns + 160 * MS)
    assert span.resource["service.name"] == "vllm"
    assert span.attributes == {
        **LATENCY,
        "gen_ai.request.id": f"chatcmpl-{index}",
        "gen_ai.usage.completion_tokens": 20,
    }


@pytest.fixture
def receiver() -> Iterator[OTLPGrpcReceiver]:
    with OTLPGrpcReceiver(SpanStore()).run_in_thread() as running:
        yield running


def test_the_real_grpc_exporter_delivers_every_span_exactly(receiver: OTLPGrpcReceiver) -> None:
    exporter = OTLPSpanExporter(endpoint=receiver.endpoint, timeout=5)
    provider = _provider(exporter)
    arrivals = [EPOCH + i * 1_000 * MS + 7 for i in range(5)]
    try:
        contexts = _spans(provider, arrivals)
    finally:
        provider.shutdown()
    assert (receiver.accepted, receiver.rejected) == (5, 0)  # SimpleSpanProcessor: one each
    for i, (ctx, arrival) in enumerate(zip(contexts, arrivals, strict=True)):
        (span,) = receiver.store.trace(ctx.trace_id)
        _check_span(span, ctx, arrival, i)
        stages = map_request([span], ctx.span_id)
        assert stages is not None and stages.schema == "vllm"
        durations = {s.name: s.end_ns - s.start_ns for s in stages.stages}
        assert durations == {
            "preprocess": 7_500_000,
            "server_queue": 15 * MS,
            "prefill": 40 * MS,
            "decode": 95 * MS,
            "postprocess": 2_500_000,
        }


def test_grpc_and_http_receivers_decode_the_same_export_identically(
    receiver: OTLPGrpcReceiver,
) -> None:
    """One batch of SDK spans, sent by the gRPC and by the HTTP exporter: equal ServerSpans."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = _provider(memory)
    _spans(provider, [EPOCH + i * MS for i in range(3)])
    batch: tuple[ReadableSpan, ...] = memory.get_finished_spans()
    http_store = SpanStore()
    with OTLPHttpReceiver(http_store).run_in_thread() as http:
        http_exporter = HttpExporter(endpoint=http.endpoint, timeout=5)
        assert http_exporter.export(batch) is SpanExportResult.SUCCESS
        http_exporter.shutdown()
    grpc_exporter = OTLPSpanExporter(endpoint=receiver.endpoint, timeout=5)
    assert grpc_exporter.export(batch) is SpanExportResult.SUCCESS
    grpc_exporter.shutdown()
    provider.shutdown()
    assert receiver.accepted == 1 and len(receiver.store) == 3
    for trace_id in http_store.trace_ids():
        assert receiver.store.trace(trace_id) == http_store.trace(trace_id)
    assert sorted(receiver.store.trace_ids()) == sorted(http_store.trace_ids())


def _waterfall(ctx: TraceContext) -> la.Waterfall:
    """Client: send 10→11 ms, headers 30 ms, 20 tokens 80, 85, ..., 175 ms, end 176 ms."""
    anchor = ClockAnchor(perf_ns=0, epoch_ns=EPOCH, uncertainty_ns=0)
    rec = Recorder("POST", "http://x/v1/chat/completions", start_ns=0, anchor=anchor)
    rec.add("connect", 1 * MS, 10 * MS)
    rec.add("send", 10 * MS, 11 * MS)
    rec.response_headers(30 * MS, 200)
    for i in range(20):
        rec.chunk(80 * MS + i * 5 * MS, 8)
    wf = rec.finish(176 * MS)
    ids = {"trace_id": ctx.trace_id, "span_id": ctx.span_id}
    return dataclasses.replace(wf, attributes={**wf.attributes, **ids})


async def test_async_receiver_gzip_export_merges_into_the_waterfall() -> None:
    """``async with`` on the test's loop; the exporter (blocking) runs in a worker thread.

    The server's clock is 250 ms ahead; arrival at client 12 ms, first token 74.5 ms, last token
    169.5 ms: the merge must find the skew within its bracket and place queue/prefill/decode.
    """
    from opentelemetry.exporter.otlp.proto.grpc.exporter import Compression

    skew = 250 * MS
    store = SpanStore()
    async with OTLPGrpcReceiver(store) as receiver:
        exporter = OTLPSpanExporter(
            endpoint=receiver.endpoint, timeout=5, compression=Compression.Gzip
        )
        provider = _provider(exporter)
        (ctx,) = await asyncio.to_thread(_spans, provider, [EPOCH + skew + 12 * MS])
        await asyncio.to_thread(provider.shutdown)
        (merged,) = await amerge([_waterfall(ctx)], store, grace=5.0)
    assert receiver.accepted == 1
    assert merged.attributes["server.status"] == MERGED
    assert merged.attributes["server.schema"] == "vllm"
    # causality brackets the offset: arrival (12 ms) − send start (10 ms) ≥ offset − skew ≥
    # last token (169.5 ms) − client's last token (175 ms)
    offset = merged.attributes["server.offset_ns"]
    assert isinstance(offset, int)
    assert skew - 5_500_000 <= offset <= skew + 2 * MS
    assert_exact(merged)
    attribution = merged.attribution()
    assert attribution["server_queue"] == pytest.approx(0.015, abs=1e-9)
    assert attribution["prefill"] == pytest.approx(0.040, abs=1e-9)
    assert attribution["decode"] == pytest.approx(0.095, abs=1e-9)


async def test_garbage_gets_invalid_argument_and_serving_goes_on() -> None:
    store = SpanStore()
    good = trace_service_pb2.ExportTraceServiceRequest()
    span = good.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, "llm_request"
    span.start_time_unix_nano, span.end_time_unix_nano = EPOCH, EPOCH + MS
    async with OTLPGrpcReceiver(store) as receiver:
        async with grpc.aio.insecure_channel(receiver.target) as channel:
            raw = channel.unary_unary(EXPORT_METHOD)  # bytes in, bytes out
            for garbage in (
                b"\xff\xff\xff\xff",
                b"\x0a\x10only-part-of-a-field",
                b"\x0a\x05\x12\x03\xff",
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await raw(garbage, timeout=5)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, garbage
                assert "ExportTraceServiceRequest" in (err.value.details() or "")
            # the generated stub (what every OTLP exporter uses) still gets through
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            response = await stub.Export(good, timeout=5)
    assert response == trace_service_pb2.ExportTraceServiceResponse()
    assert (receiver.accepted, receiver.rejected) == (1, 3)
    (received,) = store.trace("01" * 16)
    assert (received.span_id, received.start_ns, received.end_ns) == ("02" * 8, EPOCH, EPOCH + MS)


async def test_oversized_and_inflating_messages_are_refused_and_serving_goes_on() -> None:
    limit = 64 * 1024
    store = SpanStore()
    async with OTLPGrpcReceiver(store, max_message=limit) as receiver:
        async with grpc.aio.insecure_channel(receiver.target) as channel:
            raw = channel.unary_unary(EXPORT_METHOD)
            # a valid message just over the cap, then one that gzips to ~1 KiB but inflates
            # to 1 MiB (gRPC's own message compression): both refused before any decoding
            big = trace_service_pb2.ExportTraceServiceRequest()
            big.resource_spans.add().schema_url = "x" * limit
            bomb = b"\x00" * (1024 * 1024)
            assert len(gzip.compress(bomb)) < 2048
            for body, compression in (
                (big.SerializeToString(), None),
                (bomb, grpc.Compression.Gzip),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await raw(body, timeout=5, compression=compression)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "larger than max" in (err.value.details() or "")
            # just under the cap is fine
            ok = trace_service_pb2.ExportTraceServiceRequest()
            ok.resource_spans.add().schema_url = "x" * (limit - 100)
            assert await raw(ok.SerializeToString(), timeout=5) == b""
    assert (receiver.accepted, receiver.rejected) == (1, 0)
    assert len(store) == 0


async def test_defaults_loopback_free_port_and_a_busy_port_is_an_error() -> None:
    async with OTLPGrpcReceiver(SpanStore()) as first:
        assert first.host == "127.0.0.1" and first.port > 0
        assert first.endpoint == f"http://127.0.0.1:{first.port}"
        assert first.max_message == 16 * 1024 * 1024
        with pytest.raises(OSError):
            await OTLPGrpcReceiver(SpanStore(), port=first.port).start()


def test_bad_max_message_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        OTLPGrpcReceiver(SpanStore(), max_message=0)


def test_missing_grpcio_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # a None entry in sys.modules makes the import fail as if grpcio were not installed
    monkeypatch.setitem(sys.modules, "grpc", None)
    monkeypatch.setitem(sys.modules, "grpc.aio", None)
    with pytest.raises(UsageError, match=r"latency-analyzer\[grpc\]"):
        import_grpc()
    with pytest.raises(UsageError, match=r"latency-analyzer\[grpc\]"):
        OTLPGrpcReceiver(SpanStore())


def test_module_imports_without_touching_grpc() -> None:
    """Importing ``server.otlp_grpc`` must not need grpcio: the import happens on use."""
    import subprocess

    code = (
        "import sys; sys.modules['grpc'] = None; "
        "import latency_analyzer.server.otlp_grpc as m; print(m.EXPORT_METHOD)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
