"""A worker process: ``python -m latency_analyzer.load.distributed._child [READ_BATCHING]``.

Speaks the worker protocol over its standard input and output, one JSON object per line. The
first line is ``{"index", "scenario", "options"}``; every later one a call ``{"id", "method",
"args"}``, answered (calls run concurrently: ``batch`` while ``run`` goes on) by ``{"id", "ok":
true, "result"}`` or ``{"id", "ok": false, "error"}``. Anything else the process prints goes to
its standard error, so the protocol stream carries nothing but answers. Ctrl-C at a terminal
reaches the whole process group; a worker ignores it and stops when the driver says so, which
lets the driver collect what every worker recorded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any, BinaryIO

from ...capture import batching
from .._scenario import Scenario
from ._worker import Worker

_METHODS = frozenset({"identity", "wall_ns", "run", "batch", "stop", "interrupt"})


async def _answer(worker: Worker, call: dict[str, Any], out: BinaryIO) -> None:
    try:
        if call["method"] not in _METHODS:
            raise ValueError(f"no method {call['method']!r}")
        result = await getattr(worker, call["method"])(*call.get("args", ()))
        reply: dict[str, Any] = {"id": call["id"], "ok": True, "result": result}
    except Exception as exc:  # the driver reports it as this worker's failure
        reply = {"id": call["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    out.write(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
    out.flush()


async def _serve(out: BinaryIO) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    init = json.loads(await reader.readline())
    worker = Worker(init["index"], Scenario.from_dict(init["scenario"]), init["options"])
    calls: set[asyncio.Task[None]] = set()
    while line := await reader.readline():
        task = asyncio.create_task(_answer(worker, json.loads(line), out))
        calls.add(task)
        task.add_done_callback(calls.discard)
    await worker.interrupt()  # the driver went away: stop, store what is in flight
    if calls:
        await asyncio.wait(calls)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")  # the protocol stream
    os.dup2(2, 1)  # everything else printed goes to stderr
    # the scenario's read_batching, given on the command line: the loop is made first
    window = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    batching.run(_serve(out), window)


if __name__ == "__main__":
    main()
