"""OTLP decoding (protobuf, JSON with hex ids, JSON lines) and the OTLP/HTTP receiver's
behaviour on good and hostile payloads. Real vLLM 0.32 export bodies are the fixtures."""

from __future__ import annotations

import base64
import gzip
import io
import json
import zlib
from pathlib import Path

import aiohttp
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from latency_analyzer.server import (
    OTLPHttpReceiver,
    OTLPJsonLinesParser,
    PayloadError,
    SpanStore,
    decode_otlp,
    decode_otlp_json,
    inflate,
    map_request,
    read_otlp_jsonl,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
REQUEST_SPANS = (FIXTURES / "vllm-0.32-otlp-request-spans.pb").read_bytes()
STARTUP_SPANS = (FIXTURES / "vllm-0.32-otlp-startup-spans.pb").read_bytes()
PROTOBUF = "application/x-protobuf"
PARENTS = {"1" * 32: "2" * 16, "3" * 32: "4" * 16, "5" * 32: "6" * 16}


def _otlp_json(body: bytes) -> dict[str, object]:
    """The OTLP JSON form of a protobuf body: protobuf JSON with ids rewritten to hex."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    data = json_format.MessageToDict(request)
    for rs in data["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return data


def test_real_vllm_export_decodes_to_three_request_spans() -> None:
    spans = decode_otlp(REQUEST_SPANS, PROTOBUF)
    assert {(s.trace_id, s.parent_span_id) for s in spans} == set(PARENTS.items())
    assert {s.name for s in spans} == {"llm_request"}
    assert all(s.kind == "server" and s.scope == "vllm.tracing.otel" for s in spans)
    assert spans[0].resource["service.name"] == "vllm"
    first = next(s for s in spans if s.trace_id == "1" * 32)
    assert first.span_id == "52829667cfbb85df"
    assert first.start_ns == 1796022668644664064
    assert first.attributes["gen_ai.usage.completion_tokens"] == 16
    assert first.attributes["gen_ai.latency.e2e"] == pytest.approx(0.052633047103881836)


def test_startup_spans_are_not_taken_for_requests() -> None:
    spans = decode_otlp(STARTUP_SPANS, PROTOBUF)
    assert {s.name for s in spans} == {"Prepare model", "EngineCoreProc init"}
    assert map_request(spans) is None
    trace_id = spans[0].trace_id
    assert map_request(spans, trace_id[:16]) is None


def test_otlp_json_reads_hex_ids_not_base64() -> None:
    data = _otlp_json(REQUEST_SPANS)
    from_json = decode_otlp_json(json.dumps(data).encode())
    assert from_json == decode_otlp(REQUEST_SPANS, PROTOBUF)
    # timestamps as strings, as the spec's JSON mapping writes 64-bit integers
    span = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]  # type: ignore[index]  # parsed JSON, typed as object
    assert isinstance(span["startTimeUnixNano"], str)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}',
        b'{"resourceSpans": "x"}',
        b"[" * 100_000,
    ],
)
def test_bad_otlp_json_raises_payload_error(body: bytes) -> None:
    with pytest.raises(PayloadError):
        decode_otlp_json(body)


def test_bad_protobuf_raises_payload_error() -> None:
    with pytest.raises(PayloadError):
        decode_otlp(REQUEST_SPANS[: len(REQUEST_SPANS) // 2], PROTOBUF)
    with pytest.raises(PayloadError):
        decode_otlp(b"\xff" * 64, PROTOBUF)


def test_json_lines_file_one_byte_at_a_time_and_a_torn_line(tmp_path: Path) -> None:
    line = json.dumps(_otlp_json(REQUEST_SPANS)).encode()
    text = line + b"\n" + b'{"resourceSpans": [tor\n' + line  # last line without a newline
    parser = OTLPJsonLinesParser()
    spans = [s for i in range(len(text)) for s in parser.feed(text[i : i + 1])]
    spans += parser.close()
    assert len(spans) == 6
    assert [n for n, _ in parser.errors] == [2]
    path = tmp_path / "traces.jsonl"
    path.write_bytes(text)
    from_file, errors = read_otlp_jsonl(path)
    assert from_file == spans and len(errors) == 1


def test_inflate_caps_output_and_rejects_truncation() -> None:
    bomb = gzip.compress(b"\0" * (8 * 1024 * 1024))
    with pytest.raises(Exception, match="inflates past"):
        inflate(bomb, 1024 * 1024)
    assert inflate(gzip.compress(b"abc"), 3) == b"abc"
    with pytest.raises(PayloadError, match="truncated"):
        inflate(gzip.compress(b"abc" * 1000)[:-10], 10_000)
    with pytest.raises(PayloadError):
        inflate(zlib.compress(b"abc"), 100)  # zlib framing is not gzip


# --- the receiver ----------------------------------------------------------------------


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, ctype: str = PROTOBUF, **headers: str
) -> int:
    data = io.BytesIO(body)  # aiohttp warns about large raw-bytes bodies
    async with session.post(url, data=data, headers={"Content-Type": ctype, **headers}) as resp:
        await resp.read()
        return resp.status


async def test_receiver_stores_protobuf_json_and_gzip() -> None:
    store = SpanStore()
    async with OTLPHttpReceiver(store) as receiver, aiohttp.ClientSession() as session:
        assert receiver.host == "127.0.0.1"
        assert await _post(session, receiver.endpoint, REQUEST_SPANS) == 200
        assert len(store) == 3
        store.clear()
        body = json.dumps(_otlp_json(REQUEST_SPANS)).encode()
        assert (
            await _post(
                session,
                receiver.endpoint,
                gzip.compress(body),
                "application/json",
                **{"Content-Encoding": "gzip"},
            )
            == 200
        )
        assert sorted(store.trace_ids()) == sorted(PARENTS)
        assert receiver.accepted == 2 and receiver.rejected == 0


async def test_receiver_answers_hostile_payloads_with_4xx_and_keeps_serving() -> None:
    store = SpanStore()
    bomb = gzip.compress(b"\0" * (256 * 1024 * 1024))  # 256 MiB of zeros in ~250 KiB
    gz = {"Content-Encoding": "gzip"}
    cases = [
        (b"\x00garbage\xff" * 10, PROTOBUF, {}, 400),
        (REQUEST_SPANS[:-7], PROTOBUF, {}, 400),  # truncated
        (b"{not json", "application/json", {}, 400),
        (gzip.compress(REQUEST_SPANS)[:-12], PROTOBUF, gz, 400),  # truncated gzip
        (b"plain bytes", PROTOBUF, gz, 400),  # says gzip, is not
        (bomb, PROTOBUF, gz, 413),
        (b"\0" * (2 * 1024 * 1024), PROTOBUF, {}, 413),  # over max_body
        (REQUEST_SPANS, "text/plain", {}, 415),
        (REQUEST_SPANS, PROTOBUF, {"Content-Encoding": "br"}, 415),
    ]
    receiver = OTLPHttpReceiver(store, max_body=1024 * 1024, max_decompressed=4 * 1024 * 1024)
    async with receiver, aiohttp.ClientSession() as session:
        for body, ctype, headers, status in cases:
            assert await _post(session, receiver.endpoint, body, ctype, **headers) == status
        assert len(store) == 0
        assert await _post(session, receiver.endpoint, REQUEST_SPANS) == 200  # still serving
    assert receiver.rejected == len(cases) and len(store) == 3


def test_store_is_bounded() -> None:
    spans = decode_otlp(REQUEST_SPANS, PROTOBUF)
    store = SpanStore(max_traces=2)
    store.add(spans)
    assert len(store.trace_ids()) == 2 and store.dropped == 1
    one = SpanStore(max_spans_per_trace=1)
    one.add(decode_otlp(STARTUP_SPANS, PROTOBUF))
    assert len(one) == 1 and one.dropped == 1
