"""Scraping live endpoints: clock stamps against the server's own handling instant, gaps for
hanging / failing / garbage endpoints, the test bed's own ``/metrics``, and the acceptance runs:
a load at ρ > 1 whose queue gauge rises with TTFT and joins to each request, and a load whose
rate does not move when the scrape endpoints misbehave.

Servers are loopback aiohttp apps started here; the load target runs in its own process."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from latency_analyzer.capture._wire import kernel_stamps_supported
from latency_analyzer.errors import UsageError
from latency_analyzer.load import RunResult, Scenario, run
from latency_analyzer.metrics import Scraper, Target, explain, join, parse, request_instants
from latency_analyzer.metrics import _scraper as scraper_module
from latency_analyzer.metrics._join import correlate
from latency_analyzer.testing import LLMServer, RequestRecord

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
VLLM_TEXT = (FIXTURES / "vllm-0.32-metrics.prom").read_text()
CHAT = "/v1/chat/completions"


class Stub:
    """Loopback metrics endpoints that behave well and badly; each handler stamps its entry."""

    def __init__(self) -> None:
        self.handled: dict[str, list[int]] = defaultdict(list)
        self.hanging = 0
        self.max_hanging = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def __aenter__(self) -> Stub:
        app = web.Application()
        app.router.add_get("/vllm", self._vllm)
        app.router.add_get("/hang", self._hang)
        app.router.add_get("/500", self._500)
        app.router.add_get("/garbage", self._garbage)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # a started site has a server
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _vllm(self, request: web.Request) -> web.Response:
        self.handled["/vllm"].append(time.perf_counter_ns())
        return web.Response(text=VLLM_TEXT, content_type="text/plain")

    async def _hang(self, request: web.Request) -> web.Response:
        self.handled["/hang"].append(time.perf_counter_ns())
        self.hanging += 1
        self.max_hanging = max(self.max_hanging, self.hanging)
        try:
            await asyncio.sleep(3600)
        finally:
            self.hanging -= 1
        return web.Response()

    async def _500(self, request: web.Request) -> web.Response:
        self.handled["/500"].append(time.perf_counter_ns())
        return web.Response(status=500, text="boom")

    async def _garbage(self, request: web.Request) -> web.Response:
        self.handled["/garbage"].append(time.perf_counter_ns())
        return web.Response(text="<html>not metrics</html>", content_type="text/html")


@pytest.fixture
async def stub() -> AsyncIterator[Stub]:
    async with Stub() as s:
        yield s


@pytest.mark.parametrize("parser", ["process", "thread"])
async def test_each_scrape_is_stamped_around_the_servers_own_handling(
    stub: Stub, parser: Literal["process", "thread"]
) -> None:
    target = Target(stub.url("/vllm"), name="vllm")
    async with Scraper(target, interval=0.1, parser=parser) as scraper:
        await asyncio.sleep(0.55)
    cols = scraper.series.scrapes("vllm")
    handled = np.array(stub.handled["/vllm"])
    n = len(cols["ok"])
    assert cols["ok"].all()
    # stop() may cancel a scrape the server already answered: at most one handled, unstored
    assert len(handled) - n in (0, 1)
    inside = (cols["send_ns"][:, None] <= handled) & (handled <= cols["done_ns"][:, None])
    # ground truth: each stored scrape's bracket holds the server's handling of exactly it
    assert (inside.sum(axis=1) == 1).all()
    # absolute ticks every 100 ms (6 in 0.55 s, fewer if a busy machine stalls us) + the final
    assert 3 <= n <= 8
    ticks = np.diff(cols["send_ns"][:-1]) / 1e9
    assert np.median(ticks) == pytest.approx(0.1, abs=0.01)
    assert len(scraper.series.find("vllm:num_requests_waiting")) == 1
    waiting = scraper.series.gauge("vllm:num_requests_waiting")
    np.testing.assert_array_equal(waiting.t_ns, cols["t_ns"])
    assert waiting.values.tolist() == [0.0] * n


class SchedClock:
    """The scraper module's ``time``: each ``perf_counter_ns()`` it hands out is noted with the
    kernel's account of the calling thread just before and just after it: ns on a CPU (its
    CPU-time clock) and ns runnable but waiting for one (``/proc/thread-self/schedstat``,
    brought up to date each time the thread gets a CPU, so exact while it runs)."""

    def __init__(self) -> None:
        self.account: dict[int, tuple[int, int]] = {}

    @staticmethod
    def _busy_ns() -> int:
        with open("/proc/thread-self/schedstat") as f:
            waiting = int(f.read().split()[1])
        return time.thread_time_ns() + waiting

    def perf_counter_ns(self) -> int:
        before = self._busy_ns()
        now = time.perf_counter_ns()
        self.account[now] = (before, self._busy_ns())
        return now

    def asleep_s(self, start_ns: int, end_ns: int) -> float:
        """Seconds of [start_ns, end_ns] (two stamps it handed out) the thread spent neither on
        a CPU nor waiting for one: the time its timers made it sleep. The busy time is taken
        from the reading before the start to the one after the end, so a preemption next to a
        stamp can only make the sleep look shorter."""
        busy = self.account[end_ns][1] - self.account[start_ns][0]
        return (end_ns - start_ns - busy) / 1e9

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


async def test_failing_endpoints_are_gaps_with_reasons_and_never_pile_up(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = SchedClock()
    monkeypatch.setattr(scraper_module, "time", clock)
    refused = socket_port_closed()
    targets = [
        Target(stub.url("/hang"), name="hang"),
        Target(stub.url("/500"), name="500"),
        Target(stub.url("/garbage"), name="garbage"),
        Target(f"http://127.0.0.1:{refused}/metrics", name="down"),
    ]
    async with Scraper(targets, interval=0.1) as scraper:
        await asyncio.sleep(0.5)
    ms = scraper.series
    by: dict[str, set[str]] = defaultdict(set)
    for gap in ms.gaps:
        by[gap.target].add(gap.reason)
    # The stub answers on this test's loop, so a scrape of a failing endpoint can also time
    # out when that loop got to its answer late (one did, once, in a quiet CI run of the
    # whole suite); what must never be seen is another endpoint's reason, or none
    timeout = "timeout after 0.1 s"
    assert by["hang"] == {timeout}
    assert by["500"] - {timeout} == {"http 500"}
    (garbage,) = by["garbage"] - {timeout}
    assert garbage.startswith("not a metrics exposition")
    (down,) = by["down"] - {timeout}
    assert "ClientConnectorError" in down
    for t in ("hang", "500", "garbage", "down"):
        assert not ms.scrapes(t)["ok"].any()
        assert 5 <= len(ms.scrapes(t)["ok"]) <= 8  # every tick tried, one at a time
    assert stub.max_hanging == 1  # a hanging endpoint never gets a second request at once
    # the timeout is the interval: 100 ms, not more. A timer never fires early; it may fire
    # late, by the time the host kept this thread off the CPU or the loop spent on other work
    # (the kernel's account of both), but the thread sleeps no longer than the timeout (+ 1 ms:
    # the selector rounds its wait up to whole milliseconds)
    hang = [g for g in ms.gaps if g.target == "hang"]
    assert hang
    for gap in hang:
        assert (gap.end_ns - gap.start_ns) / 1e9 >= 0.1
        assert clock.asleep_s(gap.start_ns, gap.end_ns) <= 0.1 + 0.001


class LateLoopEndpoint:
    """A metrics endpoint in a thread of its own, so that it answers while the test's loop is
    stuck. Its first request makes that loop block (a callback that sleeps ``block_s``), waits
    until it does, and is answered ``answer_after_s`` into the block. It notes when the answer
    had been written (``sendall`` returned: on loopback the bytes are in our socket's queue)."""

    TEXT = "# TYPE queue_depth gauge\nqueue_depth 7\n"

    def __init__(self, loop: asyncio.AbstractEventLoop, answer_after_s: float, block_s: float):
        self.loop, self.answer_after_s, self.block_s = loop, answer_after_s, block_s
        self.blocked_ns: list[int] = []
        self.wrote_ns: list[int] = []
        self._blocking = threading.Event()
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, a Content-Length body

            def do_GET(self) -> None:
                if not endpoint.wrote_ns:
                    endpoint.loop.call_soon_threadsafe(endpoint._block)
                    assert endpoint._blocking.wait(10)
                    time.sleep(endpoint.answer_after_s)
                body = endpoint.TEXT.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                endpoint.wrote_ns.append(time.perf_counter_ns())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _block(self) -> None:
        self.blocked_ns.append(time.perf_counter_ns())
        self._blocking.set()
        time.sleep(self.block_s)  # the whole loop stops here: a late wake-up for everyone
        self.blocked_ns.append(time.perf_counter_ns())

    def __enter__(self) -> LateLoopEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@pytest.mark.skipif(kernel_stamps_supported() is not None, reason="needs kernel receive stamps")
@pytest.mark.parametrize(("answer_after_s", "kept"), [(0.01, True), (0.3, False)])
async def test_the_timeout_is_judged_by_when_the_answer_arrived(
    answer_after_s: float, kept: bool
) -> None:
    """Our loop stops (a blocking callback) from just after the request to 0.3 s past the
    200 ms deadline. An answer that arrived 10 ms into the stop is kept though our loop read it
    late; one that arrived 300 ms into it, after the deadline, is a timeout."""
    timeout = 0.2
    with LateLoopEndpoint(asyncio.get_running_loop(), answer_after_s, block_s=0.5) as endpoint:
        scraper = Scraper(Target(endpoint.url, name="m"), interval=timeout, parser="thread")
        await scraper.start()
        try:
            while not len(scraper.series.scrapes("m")["ok"]):
                await asyncio.sleep(0.01)
        finally:
            await scraper.stop(final_scrape=False)
    first = {k: v[0] for k, v in scraper.series.scrapes("m").items()}
    blocked, woke = endpoint.blocked_ns
    deadline = int(first["send_ns"]) + round(timeout * 1e9)
    wrote = endpoint.wrote_ns[0]
    # the ground truth: the loop was stopped before the answer came and woke after the
    # deadline, and the answer was written on the side of the deadline the case says
    assert first["send_ns"] < blocked < wrote < woke
    assert woke > deadline
    assert (wrote < deadline) == kept, (wrote - deadline) / 1e6
    if kept:
        assert first["ok"]
        assert scraper.series.gauge("queue_depth").values[0] == 7.0
        assert not scraper.series.gaps
    else:
        assert not first["ok"]
        assert [g.reason for g in scraper.series.gaps][:1] == ["timeout after 0.2 s"]


def test_scraper_arguments_are_checked() -> None:
    with pytest.raises(UsageError):
        Scraper("http://127.0.0.1:1/metrics", interval=0.05)  # under the 100 ms floor
    with pytest.raises(UsageError):
        Scraper([])
    with pytest.raises(UsageError):
        Scraper(["http://127.0.0.1:1/metrics", "http://127.0.0.1:1/metrics"])  # one name twice
    s = Scraper(Target("http://u:secret@127.0.0.1:1/metrics"), interval=2.0, timeout=5.0)
    assert s.timeout == 2.0  # never longer than the interval
    assert s.series.targets == {"127.0.0.1:1": "http://127.0.0.1:1/metrics"}  # no user info


def socket_port_closed() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on exit: connects are refused


async def test_the_testbed_exposes_its_own_queue_gauges() -> None:
    """slots=1, a 0.3 s service, three requests: ``/metrics`` read while the first is served
    says what the server's log says of its queue at that instant."""
    server = LLMServer(slots=1, header_delay=0.3, tokens=1)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            reqs = [
                asyncio.create_task(session.post(server.url + CHAT, json=body)) for _ in range(3)
            ]
            while server.requests < 3:  # all three in (a scheduling matter, so no fixed sleep)
                await asyncio.sleep(0.005)
            send = time.perf_counter_ns()
            async with session.get(server.url + "/metrics") as resp:
                text = await resp.text()
                assert resp.status == 200
            done = time.perf_counter_ns()
            for r in await asyncio.gather(*reqs):
                r.release()
            async with session.get(server.url + "/metrics") as resp:
                after = parse(await resp.text())
    finally:
        await server.stop()
    values = {s.name: s.value for s in parse(text)}
    types = {s.family: s.type for s in parse(text)}
    assert types == {
        "testbed_requests_waiting": "gauge",
        "testbed_requests_running": "gauge",
        "testbed_requests": "counter",
        "testbed_queue_time_seconds": "histogram",
    }
    # the server's log: request i arrived at arrive[i] and was served over [start[i], end[i]];
    # the read was answered at one instant between send and done. On a quiet host the first
    # is being served all through it (2 waiting, 1 running, 3 in); a host that stalls this
    # process may move that instant, never the log's account of it
    records = sorted(server.records, key=lambda r: r.received_ns)
    start = np.array([r.received_ns for r in records])
    arrive = start - np.array([r.slot_wait_ns for r in records])
    end = np.array([r.end_ns for r in records])
    assert (start[1:] >= end[:-1]).all()  # one slot: served one after another
    lo, hi = true_waiting(records, send, done)
    assert lo <= values["testbed_requests_waiting"] <= hi
    serving = ((start <= send) & (done < end)).any()  # one service spans the whole read
    assert values["testbed_requests_running"] in ((1.0,) if serving else (0.0, 1.0))
    assert values["testbed_requests_total"] == 3.0  # all three were in before the read
    finished = {s.name: s.value for s in after if s.name != "testbed_queue_time_seconds_bucket"}
    waits = (start - arrive) / 1e9
    assert finished["testbed_queue_time_seconds_count"] == 3
    assert finished["testbed_queue_time_seconds_sum"] == pytest.approx(waits.sum(), abs=1e-9)
    # each service lasts at least the injected 0.3 s (the server never answers early) and
    # each request waited out the service ahead of it
    assert (end - start >= 0.3e9).all()
    assert (waits[1:] >= (end[:-1] - arrive[1:]) / 1e9).all()
    assert (finished["testbed_requests_waiting"], finished["testbed_requests_running"]) == (0, 0)


def true_waiting(records: list[RequestRecord], lo: int, hi: int) -> tuple[int, int]:
    """Least and most requests waiting for the slot at any instant in [lo, hi] (server
    records: a request waited from ``received_ns - slot_wait_ns`` to ``received_ns``)."""
    arr = np.array([r.received_ns - r.slot_wait_ns for r in records])
    got = np.array([r.received_ns for r in records])
    points = np.concatenate(
        ([lo, hi], arr[(arr > lo) & (arr <= hi)], got[(got > lo) & (got <= hi)])
    )
    counts = [int(np.count_nonzero((arr <= t) & (t < got))) for t in points]
    # just before each change too (a request that got the slot at t was waiting until t)
    counts += [int(np.count_nonzero((arr <= t - 1) & (t - 1 < got))) for t in points[2:]]
    return min(counts), max(counts)


async def test_overload_queue_gauge_rises_with_ttft_and_joins_to_each_request() -> None:
    """ρ ≈ 1.6: the test bed's queue grows through the run; scraped every 100 ms."""
    interval = 0.1
    for _attempt in range(3):  # a run stalled by the shared machine (> 100 ms) is rerun
        with LLMServer(slots=1, header_delay=0.020, tokens=1).run_in_subprocess() as s:
            sc = Scenario(s.url + CHAT, mode="open", rate=80.0, arrival="constant", duration=1.5)
            target = Target(s.url + "/metrics", name="testbed")
            async with Scraper(target, interval=interval) as scraper:
                result = await run(sc, rtt_samples=0)
            records = s.records
        if result.client.loop_lag["max_s"] < 0.1:
            break
    ws, ms = result.set, scraper.series
    assert not ms.gaps and len(ws) == 120 and ws.ok.all()
    waiting = ms.gauge("testbed_requests_waiting")
    assert waiting.values.max() >= 20  # 80/s offered, < 50/s served, for 1.5 s

    cols = join(ws, ms, "testbed")
    depth = cols["testbed_waiting@start"]
    assert np.isfinite(depth).all()
    rho_t = correlate(ws, cols, "ttft")
    top = {c.column: c.rho for c in rho_t}
    assert top["testbed_waiting@start"] > 0.9  # TTFT grew with the server's queue ...
    assert abs(top["network(dns+connect+tls+send)"]) < 0.5  # ... not with the network
    assert explain(ws, cols).startswith("ttft grew with testbed_waiting@")

    # ground truth per request: the joined value is the server's true queue depth at the
    # scrape it came from, the last one before the request's start, at most one interval
    # earlier (+ 10 ms) for 95% of requests; a busy 2-core machine may delay one tick, so
    # every request's is within two intervals
    scr = ms.scrapes("testbed")
    start = request_instants(ws, "start", ms)
    idx = np.searchsorted(scr["t_ns"], start, side="right") - 1
    ages = (start - scr["t_ns"][idx]) / 1e9
    assert np.all(ages >= 0) and np.all(ages <= 2 * interval + 0.030), np.sort(ages)[-5:]
    assert np.quantile(ages, 0.95) <= interval + 0.010
    for i, k in enumerate(idx):
        lo, hi = true_waiting(records, int(scr["send_ns"][k]), int(scr["done_ns"][k]))
        assert lo <= depth[i] <= hi, (i, depth[i], lo, hi)

    # "P99 TTFT when more than 8 requests were waiting" is a filter away
    busy = ws.where(depth > 8)
    calm = ws.where(depth <= 8)
    assert 0 < len(busy) < len(ws)
    assert busy.percentiles("ttft")["p99"].value > calm.percentiles("ttft")["p99"].value


async def _rate_run(url: str, targets: list[Target] | None) -> tuple[RunResult, Scraper | None]:
    """A constant 100/s open loop for 2 s; scraping (started before it, as documented) or not."""
    sc = Scenario(url + CHAT, mode="open", rate=100.0, arrival="constant", duration=2.0)
    if not targets:
        return await run(sc, rtt_samples=0), None
    scraper = Scraper(targets, interval=0.1)
    await scraper.start()
    try:
        result = await run(sc, hooks=[scraper.hook], rtt_samples=0)
    finally:
        await scraper.stop()
    return result, scraper


def sent_rate(result: RunResult) -> float:
    """Requests per second actually sent: the inverse of the least-squares slope of the
    actual send instants (intended start + schedule lag) over the request index, so one
    stall of a busy machine moves it little while a scraper delaying every send would not."""
    ws = result.set
    start = np.sort(ws.column("start_ns") + ws.column("stage:schedule_lag")) / 1e9
    slope = np.polyfit(np.arange(start.size), start, 1)[0]
    return float(1.0 / slope)


async def test_misbehaving_scrape_endpoints_leave_the_load_rate_alone(stub: Stub) -> None:
    """Acceptance: the same open loop with and without scraping a hanging, a 500, a garbage
    and a big (vLLM-sized, parsed in the worker process) endpoint every 100 ms: request rates
    within 2%, every request answered, the bad endpoints recorded as gaps.

    Measured at a quiet moment (same setup, 4 pairs): rate 100.0 vs
    100.0-100.1 /s; loop-lag max 1.5-3.9 ms without scraping, 3.6-4.0 ms with (one 38.6 ms);
    the thread parser: 9-15 ms."""
    targets = [
        Target(stub.url(p), name=p.strip("/")) for p in ("/hang", "/500", "/garbage", "/vllm")
    ]
    with LLMServer(tokens=1).run_in_subprocess() as s:
        for _attempt in range(3):
            base, _ = await _rate_run(s.url, None)
            stub.handled.clear()  # the stub's log of this scraped run alone
            scraped, scraper = await _rate_run(s.url, targets)
            # a 2-core machine shared with other suites sometimes stalls this whole process
            # for 0.5 s (seen in runs with and without scraping); the runner's loop monitor
            # sees it, and such a pair is run again. A scraper stalling the loop itself would
            # fail every attempt's rate check below.
            if max(base.client.loop_lag["max_s"], scraped.client.loop_lag["max_s"]) < 0.1:
                break
    assert scraper is not None
    assert int(scraped.set.ok.sum()) == int(base.set.ok.sum()) == 200
    assert sent_rate(base) == pytest.approx(100.0, rel=0.02)
    assert sent_rate(scraped) == pytest.approx(sent_rate(base), rel=0.02)
    ms = scraper.series
    assert {g.target for g in ms.gaps} >= {"hang", "500", "garbage"}
    # the good endpoint kept being read: each of its scrapes either brought the stub's answer
    # (its bracket holds a handling in the stub's log, or more if the stub only got round to a
    # request the scraper had given up on) or timed out. How many time out is the host's doing
    # (a busy 2-core machine can keep this loop from reading an answer for 100 ms), never the
    # bad endpoints': no other reason, no parser falling behind
    vllm = ms.scrapes("vllm")
    handled = np.array(stub.handled["/vllm"])
    ok = vllm["ok"]
    inside = (vllm["send_ns"][ok, None] <= handled) & (handled <= vllm["done_ns"][ok, None])
    assert ok.any() and (inside.sum(axis=1) >= 1).all()
    vllm_gaps = {g.reason for g in ms.gaps if g.target == "vllm"}
    assert vllm_gaps <= {"timeout after 0.1 s"}, vllm_gaps


async def test_the_hook_alone_starts_and_stops_the_scraper(stub: Stub) -> None:
    # a parser thread: a parser process starts inside the run (its imports take 0.5 s on a
    # quiet host, seconds on a busy one), which is why the docs start the scraper before it
    with LLMServer(tokens=1).run_in_subprocess() as s:
        scraper = Scraper(Target(stub.url("/vllm"), name="vllm"), interval=0.1, parser="thread")
        sc = Scenario(s.url + CHAT, mode="open", rate=50.0, arrival="constant", duration=1.5)
        await run(sc, hooks=[scraper.hook], rtt_samples=0)
    assert not scraper.running
    assert int(scraper.series.scrapes("vllm")["ok"].sum()) >= 3
    assert not scraper.series.gaps


async def test_a_run_that_ends_while_the_hooks_parser_starts_leaves_no_process(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from latency_analyzer.metrics._worker import ProcessParser

    spawned = asyncio.Event()  # the parser process runs; its first answer (imports done) is due
    first_parse = ProcessParser.parse

    async def parse(self: ProcessParser, text: str, ctype: str | None) -> object:
        spawned.set()
        return await first_parse(self, text, ctype)

    monkeypatch.setattr(ProcessParser, "parse", parse)
    scraper = Scraper(Target(stub.url("/vllm"), name="vllm"), interval=0.1)
    hook = asyncio.create_task(scraper.hook(0))
    await spawned.wait()
    assert scraper._pool is not None
    hook.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await hook
    assert scraper._pool is None and not scraper.running  # the child was reaped
