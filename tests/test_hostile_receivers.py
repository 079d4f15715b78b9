"""Receivers under hostile senders: budgets checked before decoding, decoding off the loop,
slow connections closed, the span store bounded in spans and bytes with its drops reported.

Every sender here is a loopback client of a receiver this test starts. Assertions are about
what was answered, decoded, stored or closed, never about how long it took; each test is
bounded by client timeouts of a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from latency_analyzer.load import Scenario, run
from latency_analyzer.server import (
    Limits,
    OTLPHttpReceiver,
    PayloadTooLarge,
    ServerSpan,
    SpanStore,
    decode_otlp,
    spans,
)
from latency_analyzer.server import otlp_grpc as grpc_module
from latency_analyzer.server import otlp_http as http_module
from latency_analyzer.server.otlp_grpc import EXPORT_METHOD, OTLPGrpcReceiver
from latency_analyzer.testing import LLMServer

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
VALID = (FIXTURES / "vllm-0.32-otlp-request-spans.pb").read_bytes()  # 3 spans
PROTOBUF = "application/x-protobuf"
MIB = 1024 * 1024
EMPTY_RESOURCE_SPANS = b"\x0a\x00"  # field 1 (resource_spans), length 0


class Decodes:
    """Counts full protobuf decodes and the threads every decode ran on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.built = 0
        self.threads: list[str] = []
        real_request = spans.ExportTraceServiceRequest
        real_http, real_grpc = http_module.decode_otlp, grpc_module.decode_otlp_protobuf

        def request() -> Any:
            self.built += 1
            return real_request()

        def http(*args: Any) -> Any:
            self.threads.append(threading.current_thread().name)
            return real_http(*args)

        def grpc_decode(*args: Any) -> Any:
            self.threads.append(threading.current_thread().name)
            return real_grpc(*args)

        monkeypatch.setattr(spans, "ExportTraceServiceRequest", request)
        monkeypatch.setattr(http_module, "decode_otlp", http)
        monkeypatch.setattr(grpc_module, "decode_otlp_protobuf", grpc_decode)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Decodes:
    return Decodes(monkeypatch)


async def _post(url: str, body: bytes, **headers: str) -> tuple[int, str]:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        data = io.BytesIO(body)  # aiohttp warns about large raw-bytes bodies
        async with session.post(
            url, data=data, headers={"Content-Type": PROTOBUF, **headers}
        ) as resp:
            return resp.status, await resp.text()


@pytest.fixture
def http_receiver() -> Iterator[OTLPHttpReceiver]:
    with OTLPHttpReceiver(SpanStore()).run_in_thread() as receiver:
        yield receiver


async def test_63_kb_of_gzipped_empty_resource_spans_is_refused_undecoded(
    http_receiver: OTLPHttpReceiver, decodes: Decodes
) -> None:
    bomb = gzip.compress(EMPTY_RESOURCE_SPANS * (32 * MIB), compresslevel=9)  # 64 MiB inflated
    assert len(bomb) < 64 * 1024
    status, text = await _post(http_receiver.endpoint, bomb, **{"Content-Encoding": "gzip"})
    assert (status, "inflates past" in text) == (413, True)
    # inflated within the cap it is still refused, by the resource count, before decoding
    fits = gzip.compress(EMPTY_RESOURCE_SPANS * (4 * MIB))
    status, text = await _post(http_receiver.endpoint, fits, **{"Content-Encoding": "gzip"})
    assert (status, "resource entries" in text) == (413, True)
    assert await _post(http_receiver.endpoint, VALID) == (200, "")
    assert decodes.built == 1 and len(http_receiver.store) == 3
    assert all(name.startswith("otlp-decode") for name in decodes.threads), decodes.threads


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes([*out, n])


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


async def test_16_mib_uncompressed_is_refused_by_the_walk_undecoded(
    http_receiver: OTLPHttpReceiver, decodes: Decodes
) -> None:
    empty = EMPTY_RESOURCE_SPANS * (8 * MIB - 8)
    status, text = await _post(http_receiver.endpoint, empty)
    assert (status, "resource entries" in text) == (413, True)
    # one resource, one scope, 8 M empty attributes of one span: refused by the item count
    span = _field(1, b"\x01" * 16) + _field(2, b"\x02" * 8) + b"\x4a\x00" * (8 * MIB - 64)
    tiny = _field(1, _field(2, _field(2, span)))
    assert len(tiny) <= 16 * MIB
    status, text = await _post(http_receiver.endpoint, tiny)
    assert (status, "protobuf fields" in text) == (413, True)
    assert decodes.built == 0 and http_receiver.rejected == 2


async def test_a_valid_grpc_export_is_not_queued_behind_a_14_mib_flood(decodes: Decodes) -> None:
    store = SpanStore()
    flood = EMPTY_RESOURCE_SPANS * (7 * MIB)  # 14 MiB
    async with (
        OTLPGrpcReceiver(store) as receiver,
        grpc.aio.insecure_channel(receiver.target) as channel,
    ):
        raw = channel.unary_unary(EXPORT_METHOD)
        flooding = [asyncio.ensure_future(raw(flood, timeout=10)) for _ in range(3)]
        await asyncio.sleep(0)
        assert await raw(VALID, timeout=10) == b""
        results = await asyncio.gather(*flooding, return_exceptions=True)
    codes = {r.code() for r in results if isinstance(r, grpc.aio.AioRpcError)}
    # each flood message is refused by the resource count (or, with two in the large lane
    # already, as busy); none is decoded
    assert codes <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}
    assert len(codes) >= 1 and len(results) == 3
    assert decodes.built == 1 and len(store) == 3
    assert all(name.startswith("otlp-decode") for name in decodes.threads), decodes.threads


def _big_export(trace_byte: int, spans_n: int = 500, attr_bytes: int = 30_000) -> bytes:
    """A valid export of ~15 MB: ``spans_n`` spans each with one large string attribute."""
    request = trace_service_pb2.ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(spans_n):
        span = scope.spans.add()
        span.trace_id = bytes([trace_byte]) * 8 + i.to_bytes(8, "big")
        span.span_id = (i + 1).to_bytes(8, "big")
        span.name = "llm_request"
        span.start_time_unix_nano, span.end_time_unix_nano = 10**18, 10**18 + 10**6
        kv = span.attributes.add()
        kv.key, kv.value.string_value = "prompt", "x" * attr_bytes
    return request.SerializeToString()


async def test_four_valid_15_mb_exports_stay_within_the_store_caps() -> None:
    store = SpanStore(max_bytes=20 * MIB, max_spans=1_500)
    with OTLPHttpReceiver(store).run_in_thread() as receiver:
        for k in range(4):
            body = _big_export(k + 1)
            assert 14 * MIB < len(body) < 16 * MIB
            assert (await _post(receiver.endpoint, body))[0] == 200
    kept = len(store)
    assert store.bytes <= store.max_bytes and kept <= store.max_spans
    assert kept >= 500  # the newest export fits on its own
    assert store.dropped == 4 * 500 - kept
    # the oldest went first: all of the newest export is kept, nothing of the first two
    prefixes = [t[:2] for t in store.trace_ids()]
    assert prefixes.count("04") == 500 and not {"01", "02"} & set(prefixes)


def _span(i: int) -> ServerSpan:
    return ServerSpan(f"{i:032x}", f"{i + 1:016x}", None, "llm_request", 0, 1)


async def test_the_run_summary_says_what_the_span_store_dropped() -> None:
    store = SpanStore(max_spans=2)

    async def export_during_the_run(t0: int) -> None:
        store.add(_span(i) for i in range(5))

    with LLMServer(tokens=1).run_in_subprocess() as s:
        sc = Scenario(s.url + "/v1/chat/completions", requests=3)
        result = await run(sc, hooks=[export_during_the_run], spans=store, rtt_samples=0)
    assert result.spans_dropped == 3 and result.to_dict()["spans_dropped"] == 3
    assert any("dropped 3 server spans" in n for n in result.summary().notes)


def _slow_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    return sock


@contextlib.contextmanager
def _slow_clients(receiver: OTLPHttpReceiver, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections that never finish their headers, closed on the way out."""
    slow = [_slow_client(receiver.port) for _ in range(n)]
    try:
        yield slow
    finally:
        for sock in slow:
            sock.close()


async def _refused(receiver: OTLPHttpReceiver, count: int) -> None:
    """Wait (5 s at most) until the receiver has refused ``count`` connections."""
    deadline = time.monotonic() + 5
    while receiver.refused < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return True


async def test_slow_header_connections_are_capped_and_timed_out() -> None:
    receiver = OTLPHttpReceiver(SpanStore(), max_connections=20, header_timeout=1.0)
    with receiver.run_in_thread(), _slow_clients(receiver, 60) as slow:
        await _refused(receiver, 40)
        assert receiver.connections <= 20 and receiver.refused == 40
        # a new exporter still gets in (it replaces the oldest slow connection)
        assert await _post(receiver.endpoint, VALID) == (200, "")
        for sock in slow:  # every slow one is closed: by the cap or the header clock
            sock.settimeout(5)
            assert _closed_by_peer(sock)
        assert receiver.timed_out >= 1 and receiver.connections == 0


async def test_a_replaced_connection_stops_counting_when_the_new_one_is_admitted() -> None:
    """The cap holds at every instant, not only once the replaced connection's loss has run:
    a reader in another thread saw 21 connections under a cap of 20 for that one iteration."""
    receiver = OTLPHttpReceiver(SpanStore(), max_connections=2, header_timeout=5.0)
    seen: list[int] = []
    admit = receiver._admit

    def counted(guard: Any, transport: asyncio.BaseTransport) -> bool:
        admitted = admit(guard, transport)
        seen.append(receiver.connections)  # in the same callback, before the loop turns
        return admitted

    receiver._admit = counted  # type: ignore[method-assign]
    with receiver.run_in_thread(), _slow_clients(receiver, 5):
        await _refused(receiver, 3)
        assert receiver.refused == 3 and len(seen) == 5
        assert max(seen) == 2, seen


async def test_a_body_that_never_arrives_gets_408() -> None:
    receiver = OTLPHttpReceiver(SpanStore(), body_timeout=0.5)
    with receiver.run_in_thread():
        sock = socket.create_connection(("127.0.0.1", receiver.port), timeout=5)
        head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        sock.sendall(head + b"Content-Length: 1000\r\n\r\n" + b"\x0a" * 10)
        reply = sock.recv(4096)
        sock.close()
    assert reply.startswith(b"HTTP/1.1 408") and receiver.timed_out == 1


def test_budgets_apply_to_json_and_to_decode_otlp_itself() -> None:
    tight = Limits(max_spans=2, max_resources=1, max_items=10_000)
    with pytest.raises(PayloadTooLarge, match="more than 2 spans"):
        decode_otlp(VALID, PROTOBUF, tight)
    with pytest.raises(PayloadTooLarge, match="JSON values"):
        decode_otlp(b"[" + b"0," * 20_000 + b"0]", "application/json", tight)
    many = b'{"resourceSpans": [' + b",".join([b"{}"] * 5) + b"]}"
    with pytest.raises(PayloadTooLarge, match="resource entries"):
        decode_otlp(many, "application/json", tight)
    assert len(decode_otlp(VALID, PROTOBUF)) == 3  # the defaults take a real export


async def test_a_full_decode_lane_answers_503_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = http_module.decode_otlp

    def held(*args: Any) -> Any:
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(http_module, "decode_otlp", held)
    big = _big_export(9, spans_n=20, attr_bytes=5_000)  # ~100 KB: the large lane
    with OTLPHttpReceiver(SpanStore()).run_in_thread() as receiver:
        first = [asyncio.ensure_future(_post(receiver.endpoint, big)) for _ in range(2)]
        while receiver._pool is None or not receiver._pool.full(len(big)):
            await asyncio.sleep(0.01)  # one decoding, one queued: the lane is full
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            headers = {"Content-Type": PROTOBUF}
            async with session.post(receiver.endpoint, data=big, headers=headers) as resp:
                status, retry = resp.status, resp.headers.get("Retry-After")
        assert (status, retry) == (503, "1") and receiver.busy == 1
        release.set()
        assert [r[0] for r in await asyncio.gather(*first)] == [200, 200]
    assert receiver.accepted == 2
