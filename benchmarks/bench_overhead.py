"""The library's own overhead, measured side by side with bare aiohttp in one run.

Run: ``python benchmarks/bench_overhead.py --out bench-results/overhead.json`` (``nox -s bench``);
``--realtime`` runs the client and the server under SCHED_RR.

The server is the project's test bed (:class:`latency_analyzer.testing.LLMServer`) in a child
process on 127.0.0.1, so it does not compete for this process's GIL and
``time.process_time()`` measures the client alone. Variants run in interleaved blocks whose order
is shuffled every round (seeded), after a warm-up, so drift (CPU frequency, caches, the other
core) hits every variant alike.

* ``keepalive_get``: ``GET /health`` on a kept-alive connection, ``la.Client.request`` vs a bare
  ``aiohttp.ClientSession.get`` + ``await resp.read()``. Per-request wall time; the per-request
  ratio pairs the i-th request of an "ours" block with the i-th of the "bare" block of the same
  round. Client CPU per request is ``process_time`` over each block / requests in it.
* ``sse_256``: a 256-token streamed chat completion with ``decode=0`` (the server bursts), three
  variants: ``ours`` (``la.Client.request``: SSE + OpenAI parsing, per-chunk timestamps,
  recorder, waterfall), ``bare`` (``async for data in resp.content.iter_any(): pass``) and
  ``bare_parser`` (the bare loop feeding our sans-IO ``OpenAIStreamParser``). Added CPU per chunk
  is (ours - bare) CPU per request / SSE events per response; ``bare_parser`` splits it into
  parsing and the rest (connector/protocol stamping, recorder, waterfall).
* ``presend_100``: 100 requests due at one instant (one ``intended_start_ns`` for all, as a
  load schedule gives them) on 100 kept-alive connections of one ``la.Client``, in rounds:
  per request, the waterfall's ``send`` start minus the common instant, P50/P95/max over
  every round. The requests are asked for ``PRESEND_AHEAD_MS`` before the instant, as the
  open loop does (the client prepares them and hands their bytes to the kernel at it); its
  target is the P95. ``unannounced`` is the same with the instant already come when they are
  asked for (no preparation ahead), and from each request's own start too (after its
  ``schedule_lag``), which leaves out the wait behind the others. ``floor`` is the same
  instant's sends with nothing of ours or asyncio's: a request of the same headers written on
  each of 100 plain blocking sockets in a loop, a round before each of ours. It measures the
  kernel's own cost of a hundred loopback sends (each runs the receiving side's TCP in the
  sender's system call) and a bare Python loop around them, so ours over it is what our
  schedule, asyncio's transports and our stamps add.
* ``profile``: when a target is missed (or with ``--profile``), the "ours" variant of the
  missed scenario(s) under cProfile: top functions by tottime, waiting in epoll excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import gc
import json
import os
import platform
import pstats
import random
import socket
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import latency_analyzer as la
from latency_analyzer.capture.openai import OpenAIStreamParser
from latency_analyzer.testing import LLMServer
from latency_analyzer.testing._priority import realtime

SCHEMA = 1
KEEPALIVE_RATIO_MAX = 1.05
ADDED_US_PER_CHUNK_MAX = 2.0
PRESEND_P95_MAX_MS = 1.0
PRESEND_STARTS = 100
PRESEND_AHEAD_MS = 50
TOKENS = 256
SEED = 20240601

CHAT_BODY: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": TOKENS,
    "stream_options": {"include_usage": True},  # so the usage chunk is sent
    "testbed": {"decode": 0.0, "tokens": TOKENS},
}

Request = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Plan:
    """How many requests of each kind; ``--quick`` shrinks everything."""

    ka_warmup: int
    ka_n: int
    ka_block: int
    sse_warmup: int
    sse_n: int
    sse_block: int
    profile_ka: int
    profile_sse: int
    presend_rounds: int


FULL = Plan(
    ka_warmup=300,
    ka_n=2000,
    ka_block=20,
    sse_warmup=40,
    sse_n=400,
    sse_block=10,
    profile_ka=1000,
    profile_sse=150,
    presend_rounds=20,
)
QUICK = Plan(
    ka_warmup=20,
    ka_n=100,
    ka_block=10,
    sse_warmup=5,
    sse_n=20,
    sse_block=5,
    profile_ka=50,
    profile_sse=10,
    presend_rounds=3,
)


@dataclass
class Samples:
    """Measurements of one variant: wall ns per request, (CPU ns, requests) per block."""

    wall_ns: list[int] = field(default_factory=list)
    blocks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.wall_ns)

    @property
    def cpu_ns_per_request(self) -> float:
        return sum(c for c, _ in self.blocks) / sum(n for _, n in self.blocks)

    @property
    def cpu_ns_per_request_block_median(self) -> float:
        return statistics.median(c / n for c, n in self.blocks)


class BenchError(RuntimeError):
    """A request of the benchmark failed (the numbers would be meaningless)."""


# --- the variants ----------------------------------------------------------------------


def ours_get(client: la.Client) -> Request:
    async def run() -> None:
        wf = await client.request("/health")
        if not wf.ok:
            raise BenchError(f"ours GET /health failed: {wf.error}")

    return run


def bare_get(session: aiohttp.ClientSession, url: str) -> Request:
    async def run() -> None:
        async with session.get(url) as resp:
            await resp.read()
            if resp.status != 200:
                raise BenchError(f"bare GET /health: HTTP {resp.status}")

    return run


def ours_sse(client: la.Client) -> Request:
    async def run() -> None:
        wf = await client.request("/v1/chat/completions", json=CHAT_BODY)
        if not wf.ok:
            raise BenchError(f"ours SSE failed: {wf.error}")

    return run


def bare_sse(session: aiohttp.ClientSession, url: str) -> Request:
    async def run() -> None:
        async with session.post(url, json=CHAT_BODY) as resp:
            async for _data in resp.content.iter_any():
                pass
            if resp.status != 200:
                raise BenchError(f"bare SSE: HTTP {resp.status}")

    return run


def bare_parser_sse(session: aiohttp.ClientSession, url: str) -> Request:
    async def run() -> None:
        async with session.post(url, json=CHAT_BODY) as resp:
            parser = OpenAIStreamParser()
            async for data in resp.content.iter_any():
                parser.feed_token(data, time.perf_counter_ns())  # as the client reads
            parser.close(time.perf_counter_ns())
            if resp.status != 200 or not parser.done:
                raise BenchError(f"bare+parser SSE: HTTP {resp.status}, done={parser.done}")

    return run


# --- measurement -----------------------------------------------------------------------


async def warm_up(variants: dict[str, Request], n: int) -> None:
    for _ in range(n):
        for run in variants.values():
            await run()


async def interleaved(
    variants: dict[str, Request], n_each: int, block: int, rng: random.Random
) -> dict[str, Samples]:
    """Run ``n_each`` requests of every variant in rounds of one block each, shuffled order."""
    samples = {name: Samples() for name in variants}
    order = list(variants)
    perf, cpu = time.perf_counter_ns, time.process_time_ns
    gc.collect()
    for _ in range(max(1, n_each // block)):
        rng.shuffle(order)
        for name in order:
            run, s = variants[name], samples[name]
            walls = s.wall_ns
            c0 = cpu()
            for _ in range(block):
                t0 = perf()
                await run()
                walls.append(perf() - t0)
            s.blocks.append((cpu() - c0, block))
    return samples


def pct(values: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0-100) by linear interpolation."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def us(ns: float) -> float:
    return round(ns / 1000, 3)


def describe(s: Samples) -> dict[str, Any]:
    return {
        "requests": s.count,
        "wall_us_median": us(statistics.median(s.wall_ns)),
        "wall_us_p90": us(pct(s.wall_ns, 90)),
        "wall_us_p99": us(pct(s.wall_ns, 99)),
        "wall_us_mean": us(statistics.fmean(s.wall_ns)),
        "cpu_us_per_request": us(s.cpu_ns_per_request),
        "cpu_us_per_request_block_median": us(s.cpu_ns_per_request_block_median),
    }


def paired_ratio(a: Samples, b: Samples) -> tuple[float, float]:
    """Median and P90 of a[i]/b[i]: the i-th request of a block vs the same slot of the other."""
    ratios = [x / y for x, y in zip(a.wall_ns, b.wall_ns, strict=True)]
    return statistics.median(ratios), pct(ratios, 90)


# --- stream shape ----------------------------------------------------------------------


async def stream_shape(session: aiohttp.ClientSession, url: str, n: int) -> dict[str, Any]:
    """What one response carries: SSE events by kind, bytes, network reads per response."""
    reads: list[int] = []
    raw = b""
    for _ in range(n):
        parts: list[bytes] = []
        async with session.post(url, json=CHAT_BODY) as resp:
            async for data in resp.content.iter_any():
                parts.append(data)
        reads.append(len(parts))
        raw = b"".join(parts)
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    kinds = {"token": 0, "role": 0, "usage": 0, "done": 0, "other": 0}
    for event in events:
        payload = event.removeprefix(b"data: ")
        if payload == b"[DONE]":
            kinds["done"] += 1
            continue
        obj = json.loads(payload)
        choices = obj.get("choices") or []
        if not choices and "usage" in obj:
            kinds["usage"] += 1
        elif choices and "role" in choices[0].get("delta", {}):
            kinds["role"] += 1
        elif choices and choices[0].get("delta", {}).get("content"):
            kinds["token"] += 1
        else:
            kinds["other"] += 1
    return {
        "sse_events_per_response": len(events),
        "sse_events_by_kind": kinds,
        "bytes_per_response": len(raw),
        "network_reads_per_response_median": statistics.median(reads),
        "network_reads_per_response_min": min(reads),
        "network_reads_per_response_max": max(reads),
    }


# --- pre-send work at synchronised starts ----------------------------------------------


async def presend(base: str, rounds: int) -> dict[str, Any]:
    """Due instant -> first request byte to the kernel, ``PRESEND_STARTS`` requests at once."""
    n = PRESEND_STARTS
    ahead: list[int] = []
    from_due: list[int] = []
    from_own: list[int] = []
    floor: list[int] = []
    plain = SendFloor(base)
    try:
        async with la.Client(base, limit=n) as client:
            for _ in range(2):  # opens the n connections, then runs once warm
                await asyncio.gather(*(client.request("/health") for _ in range(n)))
            gc.collect()
            cpu = 0
            for _ in range(rounds):
                floor += plain.round()  # each round beside ours: the host's state is shared
                c0 = time.process_time_ns()
                for lead, out in ((PRESEND_AHEAD_MS * 1_000_000, ahead), (0, from_due)):
                    due = time.perf_counter_ns() + lead
                    wfs = await asyncio.gather(
                        *(client.request("/health", intended_start_ns=due) for _ in range(n))
                    )
                    for wf in wfs:
                        send = wf.stage("send")
                        if not wf.ok or send is None:
                            raise BenchError(f"pre-send round: {wf.error_type}: {wf.error}")
                        out.append(send.start_ns - due)
                        if not lead:
                            lag = wf.stage("schedule_lag")
                            own_start = wf.start_ns if lag is None else lag.end_ns
                            from_own.append(send.start_ns - own_start)
                cpu += time.process_time_ns() - c0
            reused = sum(1 for wf in wfs if wf.connection.reused)
            kernel_timer = client._sends is not None and client._sends.kernel_timer
    finally:
        plain.close()

    def ms(values: list[int]) -> dict[str, float]:
        return {
            f"p{q}" if q < 100 else "max": round(pct(values, q) / 1e6, 4) for q in (50, 95, 100)
        }

    return {
        "starts_per_round": n,
        "rounds": rounds,
        "requests": len(ahead),
        "endpoint": "GET /health",
        "asked_ahead_ms": PRESEND_AHEAD_MS,
        "instants_kept_by": "timerfd" if kernel_timer else "asyncio timers",
        "last_round_reused_connections": reused,
        "from_due_ms": ms(ahead),
        "floor": {
            "what": f"{n} plain blocking sockets, one send each at the instant, in a loop",
            "from_due_ms": ms(floor),
        },
        "p95_over_floor_ms": round((pct(ahead, 95) - pct(floor, 95)) / 1e6, 4),
        "unannounced": {"from_due_ms": ms(from_due), "from_own_start_ms": ms(from_own)},
        "cpu_us_per_request": us(cpu / (len(ahead) + len(from_due))),
    }


class SendFloor:
    """``PRESEND_STARTS`` plain blocking sockets to the server, each sent one request at an
    instant in a loop: the due instant -> each send's start, with nothing of ours in it."""

    def __init__(self, base: str) -> None:
        host, port = base.split("://", 1)[1].rsplit(":", 1)
        self.request = (
            f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: */*\r\n"
            "Accept-Encoding: gzip, deflate\r\nUser-Agent: Python/3 aiohttp/3\r\n"
            f"traceparent: 00-{'1' * 32}-{'2' * 16}-01\r\n\r\n"
        ).encode()
        self.socks: list[socket.socket] = []
        try:
            for _ in range(PRESEND_STARTS):
                sock = socket.create_connection((host, int(port)), timeout=10)
                self.socks.append(sock)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.round()  # the server's side of each set up before anything counts
        except BaseException:
            self.close()
            raise

    def round(self) -> list[int]:
        clock, request = time.perf_counter_ns, self.request
        self._blocking(None)  # no poll() before each send, as a timeout would make
        due = clock() + 1_000_000
        while clock() < due:  # spun to the instant: no wake-up in the figure
            pass
        sent = []
        for sock in self.socks:
            sent.append(clock())
            sock.sendall(request)
        self._blocking(10.0)  # the reads are not timed: bounded instead
        for sock in self.socks:
            _read_response(sock)
        return [t - due for t in sent]

    def _blocking(self, timeout: float | None) -> None:
        for sock in self.socks:
            sock.settimeout(timeout)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


def _read_response(sock: socket.socket) -> None:
    """One HTTP/1.1 response with a Content-Length, read whole off ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise BenchError("the server closed a floor connection")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        None,
    )
    if length is None:
        raise BenchError("a floor response came without a Content-Length")
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise BenchError("the server closed a floor connection")
        body += chunk


# --- profile ---------------------------------------------------------------------------

_IDLE = ("poll", "select", "epoll")


def _fn_name(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    parts = Path(filename).parts
    for anchor in ("latency_analyzer", "aiohttp", "asyncio", "yarl", "multidict"):
        if anchor in parts:
            rel = "/".join(parts[parts.index(anchor) :])
            return f"{rel}:{line}({name})"
    return f"{Path(filename).name}:{line}({name})"


def _area(key: tuple[str, int, str]) -> str:
    filename = key[0]
    parts = Path(filename).parts
    if "latency_analyzer" in parts:
        i = parts.index("latency_analyzer")
        sub = parts[i + 1] if len(parts) > i + 2 else parts[i + 1].removesuffix(".py")
        return f"latency_analyzer.{sub}"
    for anchor in ("aiohttp", "asyncio", "yarl", "multidict", "json"):
        if anchor in parts:
            return anchor
    if filename == "~":
        return "builtins"
    if Path(filename).name == Path(__file__).name:
        return "benchmark"
    return "other"


async def profiled(
    variants: dict[str, Request], n: int, block: int, rng: random.Random
) -> dict[str, pstats.Stats]:
    """cProfile each variant, in interleaved shuffled blocks like the measurement."""
    profs = {name: cProfile.Profile() for name in variants}
    order = list(variants)
    gc.collect()
    for _ in range(max(1, n // block)):
        rng.shuffle(order)
        for name in order:
            run, prof = variants[name], profs[name]
            prof.enable()
            for _ in range(block):
                await run()
            prof.disable()
    return {name: pstats.Stats(prof) for name, prof in profs.items()}


def _busy_rows(stats: pstats.Stats) -> tuple[dict[Any, tuple[float, int]], float]:
    """{function key: (tottime s, ncalls)} without the selector wait, and that wait."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]  # pstats keeps its table untyped
    rows: dict[Any, tuple[float, int]] = {}
    idle = 0.0
    for key, (_cc, ncalls, tottime, _cum, _callers) in raw.items():
        if key[0] == "~" and any(word in key[2] for word in _IDLE):
            idle += tottime  # waiting for the server, not client work
        else:
            rows[key] = (tottime, ncalls)
    return rows, idle


def profile_entry(
    scenario: str, ours: pstats.Stats, bare: pstats.Stats, n: int, top: int = 10
) -> dict[str, Any]:
    """Top functions of ``ours`` by tottime, and by tottime added over ``bare`` per request."""
    rows, idle = _busy_rows(ours)
    bare_rows, _ = _busy_rows(bare)
    busy = sum(t for t, _ in rows.values()) or 1.0
    bare_busy = sum(t for t, _ in bare_rows.values())
    ranked = sorted(rows.items(), key=lambda kv: kv[1][0], reverse=True)
    by_area: dict[str, float] = {}
    for key, (tottime, _ncalls) in rows.items():
        by_area[_area(key)] = by_area.get(_area(key), 0.0) + tottime
    added = {
        key: (tottime - bare_rows.get(key, (0.0, 0))[0], ncalls - bare_rows.get(key, (0.0, 0))[1])
        for key, (tottime, ncalls) in rows.items()
    }
    added_total = busy - bare_busy
    return {
        "scenario": scenario,
        "tool": "cProfile, wall clock: inflates functions called very often; socket send also holds"
        " time the client is preempted by the server it just woke",
        "requests": n,
        "busy_s": round(busy, 4),
        "idle_in_selector_s_excluded": round(idle, 4),
        "top": [
            {
                "function": _fn_name(key),
                "tottime_s": round(tottime, 4),
                "share": round(tottime / busy, 4),
                "calls_per_request": round(ncalls / n, 1),
            }
            for key, (tottime, ncalls) in ranked[:top]
        ],
        "by_area": {
            k: round(v / busy, 4) for k, v in sorted(by_area.items(), key=lambda kv: -kv[1])
        },
        "added_over_bare_us_per_request": round(added_total / n * 1e6, 2),
        "top_added_over_bare": [
            {
                "function": _fn_name(key),
                "added_us_per_request": round(dt / n * 1e6, 2),
                "share_of_added": round(dt / added_total, 4) if added_total > 0 else None,
                "added_calls_per_request": round(dc / n, 1),
            }
            for key, (dt, dc) in sorted(added.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
        ],
    }


# --- the run ---------------------------------------------------------------------------


async def bench(base: str, plan: Plan, force_profile: bool) -> dict[str, Any]:
    rng = random.Random(SEED)
    health, chat = base + "/health", base + "/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=100)
    async with la.Client(base) as client, aiohttp.ClientSession(connector=connector) as session:
        # (a) keep-alive GET
        ka = {"ours": ours_get(client), "bare": bare_get(session, health)}
        await warm_up(ka, plan.ka_warmup)
        ka_s = await interleaved(ka, plan.ka_n, plan.ka_block, rng)
        ratio, ratio_p90 = paired_ratio(ka_s["ours"], ka_s["bare"])
        o, b = ka_s["ours"], ka_s["bare"]
        keepalive: dict[str, Any] = {
            "endpoint": "GET /health",
            "block": plan.ka_block,
            "warmup_per_variant": plan.ka_warmup,
            "ours": describe(o),
            "bare": describe(b),
            "ratio_of_medians": round(
                statistics.median(o.wall_ns) / statistics.median(b.wall_ns), 4
            ),
            "median_per_request_ratio": round(ratio, 4),
            "p90_per_request_ratio": round(ratio_p90, 4),
            "added_us_median": us(statistics.median(o.wall_ns) - statistics.median(b.wall_ns)),
            "added_cpu_us_per_request": us(o.cpu_ns_per_request - b.cpu_ns_per_request),
        }

        # (b) 256-token SSE stream
        shape = await stream_shape(session, chat, 5)
        sse = {
            "ours": ours_sse(client),
            "bare": bare_sse(session, chat),
            "bare_parser": bare_parser_sse(session, chat),
        }
        await warm_up(sse, plan.sse_warmup)
        sse_s = await interleaved(sse, plan.sse_n, plan.sse_block, rng)
        chunks = shape["sse_events_per_response"]
        cpu = {k: v.cpu_ns_per_request for k, v in sse_s.items()}
        added = cpu["ours"] - cpu["bare"]
        sratio, sratio_p90 = paired_ratio(sse_s["ours"], sse_s["bare"])
        sse_256: dict[str, Any] = {
            "endpoint": "POST /v1/chat/completions (stream, include_usage)",
            "tokens": TOKENS,
            "server_decode_s": 0.0,
            "block": plan.sse_block,
            "warmup_per_variant": plan.sse_warmup,
            **shape,
            "chunks_divided_by": chunks,
            "chunks_divided_by_means": "SSE events per response: "
            + ", ".join(f"{v} {k}" for k, v in shape["sse_events_by_kind"].items() if v),
            "ours": describe(sse_s["ours"]),
            "bare": describe(sse_s["bare"]),
            "bare_parser": describe(sse_s["bare_parser"]),
            "added_cpu_us_per_request": us(added),
            "added_cpu_us_per_chunk": round(added / chunks / 1000, 3),
            "split_cpu_us_per_chunk": {
                "parser": round((cpu["bare_parser"] - cpu["bare"]) / chunks / 1000, 3),
                "rest": round((cpu["ours"] - cpu["bare_parser"]) / chunks / 1000, 3),
            },
            "wall_ratio_of_medians": round(
                statistics.median(sse_s["ours"].wall_ns) / statistics.median(sse_s["bare"].wall_ns),
                4,
            ),
            "wall_median_per_request_ratio": round(sratio, 4),
            "wall_p90_per_request_ratio": round(sratio_p90, 4),
            "added_wall_us_median": us(
                statistics.median(sse_s["ours"].wall_ns) - statistics.median(sse_s["bare"].wall_ns)
            ),
        }

        keepalive_met = keepalive["median_per_request_ratio"] <= KEEPALIVE_RATIO_MAX
        chunk_met = sse_256["added_cpu_us_per_chunk"] <= ADDED_US_PER_CHUNK_MAX

        # (c) pre-send work, 100 requests due at one instant
        presend_100 = await presend(base, plan.presend_rounds)
        presend_met = presend_100["from_due_ms"]["p95"] <= PRESEND_P95_MAX_MS

        # (d) profile what misses
        profile: list[dict[str, Any]] = []
        if force_profile or not chunk_met:
            n = plan.profile_sse // plan.sse_block * plan.sse_block
            pair = {"ours": sse["ours"], "bare": sse["bare"]}
            st = await profiled(pair, n, plan.sse_block, rng)
            profile.append(profile_entry("sse_256/ours", st["ours"], st["bare"], n))
        if force_profile or not keepalive_met:
            n = plan.profile_ka // plan.ka_block * plan.ka_block
            st = await profiled(ka, n, plan.ka_block, rng)
            profile.append(profile_entry("keepalive_get/ours", st["ours"], st["bare"], n))

    return {
        "keepalive_get": keepalive,
        "sse_256": sse_256,
        "presend_100": presend_100,
        "targets": {
            "keepalive_ratio_max": KEEPALIVE_RATIO_MAX,
            "added_us_per_chunk_max": ADDED_US_PER_CHUNK_MAX,
            "presend_p95_max_ms": PRESEND_P95_MAX_MS,
            "keepalive_met": keepalive_met,
            "chunk_met": chunk_met,
            "presend_met": presend_met,
        },
        "profile": profile,
    }


def summary(result: dict[str, Any], seconds: float) -> str:
    ka, sse, t = result["keepalive_get"], result["sse_256"], result["targets"]
    pre = result["presend_100"]
    un = pre["unannounced"]
    ok = {True: "met", False: "MISSED"}
    lines = [
        f"latency_analyzer {result['library_version']} overhead "
        f"({result['machine']['python']}, {result['machine']['cpu_count']} cpus, {seconds:.1f} s)",
        f"keep-alive GET /health, {ka['ours']['requests']} each:",
        f"  wall median ours {ka['ours']['wall_us_median']:.1f} µs, "
        f"bare {ka['bare']['wall_us_median']:.1f} µs (P90 {ka['ours']['wall_us_p90']:.1f} / "
        f"{ka['bare']['wall_us_p90']:.1f})",
        f"  median per-request ratio {ka['median_per_request_ratio']:.3f} "
        f"(target ≤ {t['keepalive_ratio_max']}: {ok[t['keepalive_met']]}), "
        f"+{ka['added_us_median']:.1f} µs/request",
        f"  CPU/request ours {ka['ours']['cpu_us_per_request']:.1f} µs, "
        f"bare {ka['bare']['cpu_us_per_request']:.1f} µs",
        f"SSE {sse['tokens']} tokens, {sse['chunks_divided_by']} events, "
        f"~{sse['network_reads_per_response_median']} reads/response, "
        f"{sse['ours']['requests']} each:",
        f"  CPU/request ours {sse['ours']['cpu_us_per_request']:.0f} µs, "
        f"bare+parser {sse['bare_parser']['cpu_us_per_request']:.0f} µs, "
        f"bare {sse['bare']['cpu_us_per_request']:.0f} µs",
        f"  added CPU {sse['added_cpu_us_per_chunk']:.2f} µs/chunk "
        f"(target ≤ {t['added_us_per_chunk_max']}: {ok[t['chunk_met']]}); "
        f"parser {sse['split_cpu_us_per_chunk']['parser']:.2f}, "
        f"rest {sse['split_cpu_us_per_chunk']['rest']:.2f}",
        f"  wall median ours {sse['ours']['wall_us_median']:.0f} µs, "
        f"bare {sse['bare']['wall_us_median']:.0f} µs "
        f"(per-request ratio {sse['wall_median_per_request_ratio']:.3f})",
        f"pre-send work, {pre['starts_per_round']} requests due at once x {pre['rounds']} rounds:",
        f"  asked {pre['asked_ahead_ms']} ms ahead ({pre['instants_kept_by']}): from the due "
        f"instant P50 {pre['from_due_ms']['p50']:.3f} ms, "
        f"P95 {pre['from_due_ms']['p95']:.3f} ms (target ≤ {t['presend_p95_max_ms']}: "
        f"{ok[t['presend_met']]}), max {pre['from_due_ms']['max']:.3f} ms",
        f"  floor ({pre['floor']['what']}): P50 {pre['floor']['from_due_ms']['p50']:.3f} ms, "
        f"P95 {pre['floor']['from_due_ms']['p95']:.3f} ms; ours P95 over it "
        f"{pre['p95_over_floor_ms']:+.3f} ms",
        f"  unannounced: from the due instant P50 {un['from_due_ms']['p50']:.3f} ms, "
        f"P95 {un['from_due_ms']['p95']:.3f} ms; from each request's own start "
        f"P50 {un['from_own_start_ms']['p50']:.3f} ms, "
        f"P95 {un['from_own_start_ms']['p95']:.3f} ms; "
        f"CPU/request {pre['cpu_us_per_request']:.0f} µs",
    ]
    for prof in result["profile"]:
        lines.append(f"profile {prof['scenario']} (cProfile, share of busy time):")
        lines += [f"  {e['share']:6.1%}  {e['function']}" for e in prof["top"][:5]]
        lines.append(
            f"  added over bare (cProfile µs/request, total "
            f"{prof['added_over_bare_us_per_request']:.0f}):"
        )
        lines += [
            f"  {e['added_us_per_request']:7.1f}  {e['function']}"
            for e in prof["top_added_over_bare"][:5]
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("bench-results/overhead.json"))
    parser.add_argument("--quick", action="store_true", help="small N (smoke run)")
    parser.add_argument("--profile", action="store_true", help="profile even if targets are met")
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="run this process and the server under SCHED_RR (root): on a busy host the server "
        "woken by each request would otherwise preempt the client between its sends",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    rt_refused = realtime() if args.realtime else None  # before the server: it inherits it

    started = time.perf_counter()
    utc = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with LLMServer(tokens=TOKENS, decode=0.0).run_in_subprocess() as server:
        measured = asyncio.run(bench(server.url, plan, args.profile))
        connections = server.connections
    seconds = time.perf_counter() - started
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "library_version": la.__version__,
        "utc": utc,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "cpu_count": os.cpu_count(),
            "aiohttp": aiohttp.__version__,
        },
        "run": {
            "quick": args.quick,
            "seed": SEED,
            "seconds": round(seconds, 1),
            "server": "LLMServer subprocess on 127.0.0.1",
            "server_connections": connections,
            "realtime": args.realtime and rt_refused is None,
            "realtime_refused": rt_refused,
            "argv": sys.argv[1:],
        },
        **measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(summary(result, seconds))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
