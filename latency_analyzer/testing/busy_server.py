"""A streamed OpenAI-style server whose stages burn KNOWN CPU time in NAMED functions.

The profile tests need a server where the answer is known in advance: each request waits
``queue`` seconds on the event loop (``await asyncio.sleep``: idle), then spins in
``tokenize``, ``prefill`` and ``decode_step`` (× ``steps``) for the given CPU time, streaming
one token after prefill and one after every decode step. The server records each request's
stage windows as ``time.perf_counter_ns()`` instants (CLOCK_MONOTONIC on Linux, shared by
every process on the host) and serves them at ``GET /stages``.

With ``engine="process"`` the prefill runs in a separate engine process (as vLLM v1 runs the
model in EngineCore), so a profiler must follow subprocesses to see it.

Run it as ``python -m latency_analyzer.testing.busy_server --port-file PATH [...]``: it binds
127.0.0.1 on a free port, writes ``{"port": ..., "pid": ..., "engine_pid": ...}`` to
``PATH`` once serving, and exits on SIGTERM or SIGINT. It imports nothing from the rest of the
package (the test bed is standalone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, fields
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from aiohttp import web

from ._priority import realtime
from .llm.wire import DONE, OpenAIEncoder, sse

__all__ = [
    "BusyConfig",
    "decode_step",
    "main",
    "mark_clock",
    "prefill",
    "serve",
    "spin",
    "tokenize",
]


@dataclass(frozen=True)
class BusyConfig:
    """Per-request work, in seconds of CPU spin (``queue``: idle wait on the loop)."""

    queue: float = 0.020
    tokenize: float = 0.030
    prefill: float = 0.060
    decode_step: float = 0.004
    steps: int = 20
    engine: str = "inline"  # "inline" or "process"
    marker: float = 0.015  # a clock marker spun once per request, after its stream (0: none)


def spin(seconds: float) -> None:
    """Burn CPU in the caller's frame until ``seconds`` have passed on the monotonic clock."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


# The three stage functions keep their own loop (not a call to ``spin``) so the profiler's
# leaf frame, the one self time is charged to, is the stage function itself.
def tokenize(seconds: float) -> None:
    """The tokenizer stand-in: spins ``seconds``."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def prefill(seconds: float) -> None:
    """The prefill stand-in: spins ``seconds``."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def decode_step(seconds: float) -> None:
    """One decode step: spins ``seconds``."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def mark_clock(seconds: float) -> None:
    """A clock marker: spins ``seconds`` at instants the server records, so a profiler can
    align its samples with this process's clock (``refine_anchor(..., "mark_clock", ...)``)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def _engine_main(conn: Connection) -> None:
    """The engine process: run ``prefill`` for each duration received, answer with its window."""
    while True:
        try:
            seconds = conn.recv()
        except EOFError:  # the server went away: so do we
            return
        if seconds is None:
            return
        start = time.perf_counter_ns()
        prefill(seconds)
        conn.send((start, time.perf_counter_ns()))


class _Engine:
    """Prefill in this process, or in a child process reached through a pipe."""

    def __init__(self, mode: str) -> None:
        self._conn: Connection | None = None
        self._proc: Any = None
        if mode == "process":
            ctx = multiprocessing.get_context("spawn")
            parent, child = ctx.Pipe()
            self._proc = ctx.Process(target=_engine_main, args=(child,), daemon=True)
            self._proc.start()
            child.close()
            self._conn = parent
        elif mode != "inline":
            raise ValueError(f"engine must be 'inline' or 'process', not {mode!r}")

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    async def prefill(self, seconds: float) -> tuple[int, int]:
        if self._conn is None:
            start = time.perf_counter_ns()
            prefill(seconds)
            return start, time.perf_counter_ns()
        return await self._remote(self._conn, seconds)

    @staticmethod
    async def _remote(conn: Connection, seconds: float) -> tuple[int, int]:
        # Wait on the pipe through the event loop (epoll), not a thread: the server's only
        # thread stays idle in the selector while the engine works, as a real server's would.
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int, int]] = loop.create_future()

        def ready() -> None:
            loop.remove_reader(conn.fileno())
            if not done.done():
                done.set_result(conn.recv())

        loop.add_reader(conn.fileno(), ready)
        conn.send(seconds)
        return await done

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._conn.close()
        if self._proc is not None:
            self._proc.join(5)


def _chunk(request_id: str, index: int, last: bool) -> bytes:
    finish = "length" if last else None
    return sse(OpenAIEncoder(request_id, "busy").token_chunk(f"t{index} ", finish=finish))


class _App:
    def __init__(self, config: BusyConfig) -> None:
        self.config = config
        self.engine = _Engine(config.engine)
        self.records: list[dict[str, Any]] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter_ns()
        await request.read()
        cfg = self.config
        request_id = f"busy-{len(self.records)}"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.headers["x-request-id"] = request_id
        await resp.prepare(request)
        stages: dict[str, list[int]] = {}
        t0 = time.perf_counter_ns()
        await asyncio.sleep(cfg.queue)
        t1 = time.perf_counter_ns()
        tokenize(cfg.tokenize)
        t2 = time.perf_counter_ns()
        p0, p1 = await self.engine.prefill(cfg.prefill)
        t3 = time.perf_counter_ns()
        stages.update(server_queue=[t0, t1], preprocess=[t1, t2], prefill=[t2, t3])
        stages["prefill_engine"] = [p0, p1]
        await resp.write(_chunk(request_id, 0, cfg.steps == 0))
        for step in range(cfg.steps):
            decode_step(cfg.decode_step)
            await resp.write(_chunk(request_id, step + 1, step + 1 == cfg.steps))
        stages["decode"] = [t3, time.perf_counter_ns()]
        await resp.write(DONE)
        await resp.write_eof()
        # The marker runs after the response is complete, while the client reads its last
        # bytes: never right before a stage (CPU there would shade the queue's idle start),
        # and one per request, so no two marker calls lie closer than a request's length
        # (py-spy would see two calls a millisecond apart as one run).
        m0 = time.perf_counter_ns()
        if cfg.marker > 0:
            mark_clock(cfg.marker)
        m1 = time.perf_counter_ns()
        self.records.append(
            {
                "id": request_id,
                "arrived_ns": arrived,
                "pid": os.getpid(),
                "tid": threading.get_native_id(),
                "engine_pid": self.engine.pid,
                "stages": stages,
                "markers": [[m0, m1]] if cfg.marker > 0 else [],
            }
        )
        return resp

    async def stages(self, request: web.Request) -> web.Response:
        return web.json_response(self.records)


async def serve(config: BusyConfig, port_file: Path, host: str = "127.0.0.1") -> None:
    """Serve until SIGTERM/SIGINT; write the bound port and pids to ``port_file`` first."""
    app = _App(config)
    web_app = web.Application()
    web_app.router.add_post("/v1/chat/completions", app.completions)
    web_app.router.add_get("/stages", app.stages)
    runner = web.AppRunner(web_app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    info = {"port": port, "pid": os.getpid(), "engine_pid": app.engine.pid, **asdict(config)}
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(port_file)  # atomic: a reader never sees half a file
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        app.engine.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m latency_analyzer.testing.busy_server --port-file PATH [--engine process]``."""
    parser = argparse.ArgumentParser(prog="python -m latency_analyzer.testing.busy_server")
    parser.add_argument("--port-file", type=Path, required=True, metavar="PATH")
    for knob in ("queue", "tokenize", "prefill", "decode_step", "marker"):
        default = getattr(BusyConfig, knob)
        parser.add_argument(f"--{knob.replace('_', '-')}", type=float, default=default)
    parser.add_argument("--steps", type=int, default=BusyConfig.steps)
    parser.add_argument("--engine", choices=("inline", "process"), default="inline")
    args = parser.parse_args(argv)
    config = BusyConfig(**{f.name: getattr(args, f.name) for f in fields(BusyConfig)})
    realtime()  # its stages run on time however busy the host is, where the OS allows it
    asyncio.run(serve(config, args.port_file))


if __name__ == "__main__":
    # Import by name so the engine process (spawned) finds _engine_main in this module, not
    # in a __main__ it would have to re-run.
    from latency_analyzer.testing.busy_server import main as _main

    _main()
