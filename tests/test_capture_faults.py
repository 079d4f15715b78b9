"""Bad input and faults: always a Waterfall with ``error`` set and every stage that happened."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time

import pytest
from conftest import assert_exact, chat_body

import latency_analyzer as la
from latency_analyzer.testing import DNSServer, LLMServer, TestCA

TOKENS = 8
LLM_KNOBS = {"tokens": TOKENS, "decode": 0.002}


def _names(wf: la.Waterfall) -> list[str]:
    return [s.name for s in wf.root.children]


async def _chat(server: LLMServer, timeout: float = 5.0, **testbed: object) -> la.Waterfall:
    wf = await la.aprobe(
        f"{server.url}/v1/chat/completions", json=chat_body(**testbed), timeout=timeout
    )
    assert_exact(wf)
    return wf


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_connection_refused() -> None:
    wf = await la.aprobe(f"http://127.0.0.1:{_free_port()}/v1/chat/completions", json=chat_body())
    assert_exact(wf)
    assert wf.error_type == "connect" and "Cannot connect" in (wf.error or "")
    assert _names(wf) == ["pool_wait", "connect"]
    assert wf.stages["connect"].attributes["interrupted"] is True
    assert wf.status is None and wf.ttft is None


async def test_reset_mid_stream_keeps_the_tokens_that_came(llm_in_process: LLMServer) -> None:
    wf = await _chat(llm_in_process, fault="reset", fault_after=3)
    assert wf.error_type == "reset", wf.error
    assert wf.status == 200 and len(wf.chunk_times_ns) == 3
    assert _names(wf)[-4:] == ["wait", "first_token", "decode", "tail"]
    assert wf.stages["tail"].attributes["interrupted"] is True


async def test_truncated_stream_without_done(llm_in_process: LLMServer) -> None:
    wf = await _chat(llm_in_process, fault="truncate", fault_after=4)
    assert wf.error_type == "truncated" and "[DONE]" in (wf.error or "")
    assert len(wf.chunk_times_ns) == 4 and wf.output_tokens == 4
    assert "interrupted" not in wf.stages["tail"].attributes  # the HTTP response ended cleanly


async def test_malformed_chunk_is_recorded_and_the_stream_goes_on(
    llm_in_process: LLMServer,
) -> None:
    wf = await _chat(llm_in_process, fault="malformed", fault_after=2)
    assert wf.error_type == "malformed_chunk" and "invalid JSON" in (wf.error or "")
    assert len(wf.chunk_times_ns) == TOKENS - 1  # the malformed chunk's token is lost
    # decode runs from the first token to the last one read, the server's last: the same
    # span as the server's log of its sends (shared loop: within a millisecond)
    decode = wf.stages["decode"]
    assert (decode.start_ns, decode.end_ns) == (wf.chunk_times_ns[0], wf.chunk_times_ns[-1])
    sent = llm_in_process.records[-1].chunk_ns
    assert decode.duration == pytest.approx((sent[-1] - sent[0]) / 1e9, abs=0.001)
    assert "tail" in wf.stages


async def test_error_object_inside_the_stream(llm_in_process: LLMServer) -> None:
    wf = await _chat(llm_in_process, fault="stream_error", fault_after=2)
    assert wf.error_type == "stream_error" and len(wf.chunk_times_ns) == 2


@pytest.mark.parametrize("status", [400, 503])
async def test_http_error_status_with_json_body(llm_in_process: LLMServer, status: int) -> None:
    wf = await _chat(llm_in_process, fault="http_error", fault_status=status)
    assert wf.status == status and wf.error_type == "http_status"
    assert (wf.error or "").startswith(f"HTTP {status}: ")
    assert len(wf.error or "") > len(f"HTTP {status}: ") + 5  # the server's message is kept
    assert _names(wf)[-2:] == ["wait", "tail"]
    assert not any(s.attributes.get("interrupted") for s in wf.root.children)


async def test_server_that_never_answers_times_out_in_wait(llm_in_process: LLMServer) -> None:
    t0 = time.perf_counter()
    wf = await _chat(llm_in_process, timeout=0.3, fault="hang")
    assert time.perf_counter() - t0 < 1.0  # no hang
    assert wf.error_type == "timeout" and "during wait" in (wf.error or "")
    assert wf.stages["wait"].attributes["interrupted"] is True
    assert wf.e2e == pytest.approx(0.3, abs=0.05)


async def test_close_before_headers(llm_in_process: LLMServer) -> None:
    wf = await _chat(llm_in_process, fault="close_before_headers")
    assert wf.error_type == "disconnected" and wf.status is None
    assert "send" in wf.stages and "wait" in wf.stages


async def test_nxdomain() -> None:
    async with DNSServer(nxdomain=("missing.test",)) as dns:
        wf = await la.aprobe("http://missing.test:9/x", resolver=dns.nameserver)
    assert_exact(wf)
    assert wf.error_type == "dns" and "NXDOMAIN" in (wf.error or "")
    assert wf.stages["dns"].attributes["interrupted"] is True and "connect" not in wf.stages


async def test_dns_timeout() -> None:
    async with DNSServer(drop=("slow.test",)) as dns:
        wf = await la.aprobe("http://slow.test:9/x", resolver=dns.nameserver, dns_timeout=0.3)
    assert_exact(wf)
    assert wf.error_type == "dns" and "within 0.3 s" in (wf.error or "")
    # dnspython gives up a little after its lifetime (it checks it between tries)
    assert 0.3 <= wf.stages["dns"].duration < 0.6
    assert wf.stages["dns"].attributes["interrupted"] is True


async def test_tls_certificate_error(ca: TestCA) -> None:
    async with LLMServer(ssl=ca.server_context()) as server:
        untrusting = ssl.create_default_context(cafile=None)
        untrusting.load_verify_locations(cadata=TestCA().ca_pem.decode())  # some other CA
        wf = await la.aprobe(f"{server.url}/health", ssl=untrusting)
        assert_exact(wf)
        assert wf.error_type == "tls" and "CERTIFICATE_VERIFY_FAILED" in (wf.error or "")
        assert wf.stages["tls"].attributes["interrupted"] is True and "connect" in wf.stages
        ok = await la.aprobe(f"{server.url}/health", insecure=True)
        assert ok.ok and ok.tls is not None and ok.tls.version == "TLSv1.3"


class _Answer(list[str]):
    """The answer's text pieces, as the client collects them; ``arrived`` is set at the n-th."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.arrived = asyncio.Event()
        self._n = n

    def append(self, piece: str) -> None:
        super().append(piece)
        if len(self) >= self._n:
            self.arrived.set()


async def test_server_killed_mid_stream() -> None:
    answer = _Answer(5)
    with LLMServer(decode=0.02, tokens=50).run_in_subprocess() as server:
        async with la.Client(server.url) as client:
            task = asyncio.create_task(
                client.request("/v1/chat/completions", json=chat_body(), answer=answer)
            )
            await answer.arrived.wait()  # five tokens in: mid-stream
            server.kill()
            wf = await asyncio.wait_for(task, 5)
    assert_exact(wf)
    assert wf.error_type == "reset", wf.error
    # what came before the kill is kept, token for token; the 50th never came
    assert 5 <= len(wf.chunk_times_ns) == len(answer) < 50 and "decode" in wf.stages


# -- connections and pool -------------------------------------------------------------------------


async def test_reused_connection_has_no_setup_stages(llm_in_process: LLMServer) -> None:
    async with la.Client(llm_in_process.url) as client:
        cold = await client.request("/health")
        warm = await client.request("/health")
    assert {"connect", "pool_wait"} <= set(cold.stages) and not cold.connection.reused
    assert not {"dns", "connect", "tls"} & set(warm.stages) and warm.connection.reused
    assert warm.connection.connection_id == cold.connection.connection_id
    assert warm.connection.requests_before == 1 and llm_in_process.connections == 1


async def test_keepalive_off_opens_a_connection_per_request(llm_in_process: LLMServer) -> None:
    async with la.Client(llm_in_process.url, keepalive=False) as client:
        wfs = [await client.request("/health") for _ in range(3)]
    assert all("connect" in wf.stages and not wf.connection.reused for wf in wfs)
    assert llm_in_process.connections == 3


async def test_pool_wait_shows_queueing_for_a_connection(llm_in_process: LLMServer) -> None:
    """limit=1: the second request waits for the first to finish.

    Truth: the server's log. The second request began waiting before the first one reached
    the server, and reached it only after its turn came, when the first response ended. Its
    wait beyond those instants (when the host let it start, how soon the client handed the
    connection over) is the client's scheduling, which host load stretches: not compared.
    """
    async with la.Client(llm_in_process.url, limit=1) as client:
        first, second = await asyncio.gather(
            client.request("/v1/chat/completions", json=chat_body(prefill=0.05)),
            client.request("/v1/chat/completions", json=chat_body(prefill=0.05)),
        )
    for wf in (first, second):
        assert wf.ok, wf.error
        assert_exact(wf)
    assert first.attribution()["pool_wait"] < 0.001
    queued = second.stages["pool_wait"]
    received = sorted(r.received_ns for r in llm_in_process.records)
    assert len(received) == 2
    assert queued.start_ns < received[0]  # waiting while the first was served
    assert first.end_ns <= queued.end_ns < received[1]  # its turn, then it was sent
    assert second.connection.reused


async def test_non_streaming_response_ttft_is_the_whole_body(llm_in_process: LLMServer) -> None:
    wf = await la.aprobe(
        f"{llm_in_process.url}/v1/chat/completions", json=chat_body(stream=False, prefill=0.03)
    )
    assert_exact(wf)
    assert wf.ok and wf.output_tokens == TOKENS and wf.output_tokens_source == "usage"
    assert wf.ttft is not None and wf.ttft_ns == wf.stages["first_token"].end_ns - wf.start_ns
    assert wf.tpot is not None and wf.stages["decode"].duration_ns == 0


async def test_reasoning_tokens_are_timed_apart_from_the_answer(llm_in_process: LLMServer) -> None:
    wf = await _chat(llm_in_process, reasoning_tokens=3, decode=0.005)
    assert wf.ok and wf.ttfrt is not None and wf.ttfat is not None
    assert wf.ttft == wf.ttfrt
    # 3 reasoning tokens, 5 ms apart, then the answer: the server's own send times are the
    # ground truth (the answer due 15 ms after the first reasoning token's deadline, never
    # before it; how late a server sharing this process is, is its log's business: its
    # precision is tested in test_testbed, at real-time priority)
    record = llm_in_process.records[-1]
    sent = record.chunk_ns
    assert wf.ttfat - wf.ttfrt == pytest.approx((sent[3] - sent[0]) / 1e9, abs=0.001)
    b = record.behavior
    due = b.header_delay + b.queue + b.prefill + 3 * b.decode  # the answer's deadline
    assert sent[3] - record.received_ns >= round(due * 1e9) - 1  # (deadlines rounded to ns)


async def test_large_request_body_is_sent_before_wait(llm_in_process: LLMServer) -> None:
    body = chat_body()
    body["messages"] = [{"role": "user", "content": "word " * 400_000}]  # 2 MB: flow control
    wf = await la.aprobe(f"{llm_in_process.url}/v1/chat/completions", json=body)
    assert_exact(wf)
    assert wf.ok, wf.error
    assert wf.stages["send"].end_ns <= wf.stages["wait"].start_ns
    assert wf.stages["send"].duration > wf.stages["wait"].duration / 100


async def test_trace_hook_sees_each_stage_in_order(llm_in_process: LLMServer) -> None:
    events: list[str] = []
    wf = await la.aprobe(
        f"{llm_in_process.url}/health", trace=lambda name, info: events.append(name)
    )
    assert wf.ok
    assert events == [
        "capture.pool_wait.started",
        "capture.pool_wait.complete",
        "capture.connect.started",
        "capture.connect.complete",
        "capture.send.started",
        "capture.send.complete",
    ]


def test_sync_probe_works_inside_a_running_loop() -> None:
    async def inner() -> la.Waterfall:
        async with LLMServer() as server:
            return await asyncio.to_thread(la.probe, f"{server.url}/health")

    assert asyncio.run(inner()).ok


def test_bad_url_is_a_usage_error() -> None:
    with pytest.raises(la.UsageError):
        la.probe("ftp://example.invalid/")
    with pytest.raises(la.UsageError):
        la.probe("http://127.0.0.1/", ssl=ssl.create_default_context(), insecure=True)


async def test_bodiless_responses_on_a_reused_connection_keep_their_wait() -> None:
    """HEAD responses share aiohttp's one empty payload: each still gets its own headers time.

    Truth: the handler's own log of when it had the request and when it answered (50 ms
    later, injected); each request's wait holds that interval and the send ended before it.
    """
    from aiohttp import web

    served: list[tuple[int, int]] = []

    async def slow_head(request: web.Request) -> web.Response:
        received = time.perf_counter_ns()
        await asyncio.sleep(0.05)
        served.append((received, time.perf_counter_ns()))
        return web.Response(body=b"abc")  # Content-Length: 3, no body: HEAD

    app = web.Application()
    app.router.add_route("HEAD", "/", slow_head)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # a started site has a server
    try:
        async with la.Client(f"http://127.0.0.1:{port}") as client:
            wfs = [await client.request("/", method="HEAD") for _ in range(3)]
    finally:
        await runner.cleanup()
    assert [wf.connection.reused for wf in wfs] == [False, True, True]
    assert len(served) == 3
    for wf, (received, answered) in zip(wfs, served, strict=True):
        assert_exact(wf)
        send, wait = wf.stages["send"], wf.stages["wait"]
        assert send.end_ns <= received  # the request was out before the server had it
        assert wait.start_ns <= received and answered <= wait.end_ns
        assert answered - received >= 50_000_000


async def test_a_stream_that_stalls_times_out_at_the_request_timeout(
    llm_in_process: LLMServer,
) -> None:
    """The first token comes, the next is 2 s away: the request ends at its 0.3 s timeout,
    in the middle of the body, with the token it got (a stream's reader waits for the
    body's end, which aiohttp's own read timer does not bound)."""
    t0 = time.perf_counter()
    wf = await _chat(llm_in_process, timeout=0.3, tokens=4, decode=2.0)
    assert time.perf_counter() - t0 < 1.0  # no hang
    assert wf.error_type == "timeout" and "response body" in (wf.error or ""), wf.error
    assert len(wf.chunk_times_ns) == 1
    assert wf.e2e == pytest.approx(0.3, abs=0.05)
    assert_exact(wf)
