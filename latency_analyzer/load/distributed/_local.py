"""Workers as processes of this machine: one event loop per core, one merged run.

A load generator in one Python process uses one core; ``run(..., workers=N)`` and
``latency-analyzer run --workers N`` start N worker processes here (``_child``), each with its
own loop, and drive them like Ray actors: one shared schedule, a common start, one merged file.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import math
import os
import socket
import sys
import urllib.parse
from typing import Any

from .._scenario import Scenario
from ._driver import DistributedRun, Handle, WorkerFailed, WorkerGone, drive, drive_sync
from ._results import DistributedResult
from ._split import splittable

_EXIT_WAIT_S = 5.0  # a released worker has this long to exit on its own

__all__ = ["ProcessBackend", "auto_workers", "run_workers", "run_workers_sync", "usable_cores"]


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask; the CPU count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: What one worker process keeps up with, healthy, on a 2-core machine that also runs the
#: server under test (20 ms per token, 64 tokens; ``docs/load.md``): 128 closed-loop users
#: read with loop lag P99 3.5 ms (two processes: 8.0 ms), 150 arrivals per second with 1.4 ms
#: (1.7 ms). A second process there cost its start-up and half as much CPU again per token.
STREAMS_PER_WORKER = 128
RATE_PER_WORKER = 150.0


def auto_workers(sc: Scenario) -> int:
    """The default worker count: the usable cores, as far as the load needs them (one per
    :data:`STREAMS_PER_WORKER` closed-loop users, one per :data:`RATE_PER_WORKER` arrivals a
    second) and ``sc`` can be shared out. A target on this host (a loopback address, or
    ``localhost``) is a server that needs cores of its own: half of them are left to it.

    On a 2-core machine with the server under test beside it, 256 users streaming flat out
    (``docs/load.md``): one process spent 1.51 s of CPU from its first request, two 1.77 s,
    with loop lag P99 78-80 ms against 91-109 ms and no more tokens a second.
    """
    need = usable_cores()
    if _on_this_host(sc.url):
        need = max(1, need // 2)
    if sc.mode == "closed":
        need = min(need, math.ceil(sc.concurrency / STREAMS_PER_WORKER))
    elif sc.arrival == "burst":  # every request at once: as many users
        if sc.requests is not None:
            need = min(need, math.ceil(sc.requests / STREAMS_PER_WORKER))
    elif sc.rate is not None:
        need = min(need, math.ceil(sc.rate / RATE_PER_WORKER))
    return splittable(sc, max(1, need))


def _on_this_host(url: str) -> bool:
    """Whether ``url``'s host is this machine by its address or name alone (no lookup is
    made): a loopback or unspecified address, ``localhost``. A port forwarded from here to
    another machine looks the same; ``--workers N`` then says how many."""
    host = (urllib.parse.urlsplit(url).hostname or "").rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host)
    except ValueError:
        try:  # the short IPv4 forms a resolver also takes: 127.1
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:  # a name: where it leads is not known without a lookup
            return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return any(a.is_loopback or a.is_unspecified for a in (ip, mapped) if a is not None)


class _ProcessHandle:
    """One worker process and the calls in flight to it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader = asyncio.ensure_future(self._read())

    async def call(self, method: str, *args: Any) -> Any:
        if self.proc.returncode is not None or self._reader.done():
            raise WorkerGone(f"the worker process exited ({self.proc.returncode})")
        n = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[n] = fut
        assert self.proc.stdin is not None
        line = json.dumps({"id": n, "method": method, "args": list(args)})
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._pending.pop(n, None)
            raise WorkerGone("the worker process closed its input") from exc
        return await fut

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            reply = json.loads(line)
            fut = self._pending.pop(reply["id"], None)
            if fut is None or fut.done():
                continue
            if reply["ok"]:
                fut.set_result(reply["result"])
            else:
                fut.set_exception(WorkerFailed(reply["error"]))
        code = await self.proc.wait()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(WorkerGone(f"the worker process exited ({code})"))
        self._pending.clear()

    async def release(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()  # the worker finishes what is in flight and exits
        try:
            await asyncio.wait_for(self.proc.wait(), _EXIT_WAIT_S)
        except TimeoutError:  # one that does not exit by then is ended
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        await self._reader


class ProcessBackend:
    """Starts each worker as a process of this machine (``python -m ...distributed._child``)."""

    name = "processes"

    async def start(self, parts: list[Scenario], options: list[dict[str, Any]]) -> list[Handle]:
        handles: list[Handle] = []
        for i, (sc, opts) in enumerate(zip(parts, options, strict=True)):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "latency_analyzer.load.distributed._child",
                repr(float(sc.read_batching)),  # the loop is made before the scenario is read
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 24,  # a batch of rows is one line
            )
            assert proc.stdin is not None
            init = {"index": i, "scenario": sc.to_dict(), "options": opts}
            proc.stdin.write(json.dumps(init).encode() + b"\n")
            handles.append(_ProcessHandle(proc))
        return handles


async def run_workers(scenario: Scenario, *, workers: int, **options: Any) -> DistributedResult:
    """Run ``scenario`` over ``workers`` processes of this machine; ``options`` are
    :class:`DistributedRun`'s (``path``, ``headers``, ``rtt_samples``, ...).

    Raises:
        UsageError: the scenario cannot be split over ``workers``.
    """
    dr = DistributedRun(scenario, workers=workers, backend=ProcessBackend(), **options)
    return await drive(dr)


def run_workers_sync(scenario: Scenario, *, workers: int, **options: Any) -> DistributedResult:
    """:func:`run_workers` from synchronous code (the first Ctrl-C interrupts cleanly: the
    requests in flight are stored as cancelled and the result says it was interrupted)."""
    dr = DistributedRun(scenario, workers=workers, backend=ProcessBackend(), **options)
    return drive_sync(dr)
