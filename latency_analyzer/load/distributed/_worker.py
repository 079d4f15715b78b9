"""One load-generating worker: the ordinary runner in its own process, driven by calls.

The same object serves every place a worker can run: a local process (``_child``) and a Ray
actor (``_ray``). Its methods are the worker protocol; the driver calls them in this order:
``identity`` (who, where, its clock), ``wall_ns`` (a few times: the clock offset), ``run`` (from
the common start), ``batch`` (repeatedly, concurrently with ``run``: rows as JSONL), and
``stop`` (issue nothing more, let the requests in flight finish) or ``interrupt`` (the run's
Ctrl-C: the requests in flight are stored as cancelled) at any time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from ...analysis import Tags, fingerprint
from ...timeline import Waterfall, process_anchor
from .._runner import run
from .._scenario import Scenario

__all__ = ["Worker"]


class Worker:
    """The worker protocol over one scenario part (see the module docstring)."""

    def __init__(self, index: int, scenario: Scenario, options: Mapping[str, Any]) -> None:
        self.index, self.sc, self.options = index, scenario, dict(options)
        self.lines: list[str] = []  # rows not yet fetched by the driver
        self.rows = 0
        self.done = False
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[Any] | None = None
        self.interrupted = False

    def node_id(self) -> str:
        """Which node of a cluster this is (a local process: the host name)."""
        return socket.gethostname()

    async def identity(self) -> dict[str, Any]:
        """Host, node, pid, clock anchor, fingerprint (with base RTT) and the wall clock now."""
        rtt = int(self.options.get("rtt_samples", 5))
        fp = await asyncio.to_thread(fingerprint, self.sc.url, rtt_samples=rtt)
        return {
            "worker": self.index,
            "host": socket.gethostname(),
            "node_id": self.node_id(),
            "pid": os.getpid(),
            "anchor": asdict(process_anchor()),
            "fingerprint": fp,
        }

    async def wall_ns(self) -> int:
        """This host's wall clock now (the driver brackets the call to estimate the offset)."""
        return time.time_ns()

    async def run(self, start_epoch_ns: int) -> dict[str, Any]:
        """Run the scenario from the common start; returns the run's report."""
        if self.options.get("switch_interval"):
            # other threads of the process (Ray's, the pipe reader's) hold the GIL for up to
            # the default 5 ms: measured +0.4-0.8 ms of client time at the first token in a
            # Ray actor. Handing it back sooner makes a worker measure like a plain process.
            sys.setswitchinterval(self.options["switch_interval"])
        self._ready, self._stop = asyncio.Event(), asyncio.Event()
        t0 = process_anchor().to_perf_ns(start_epoch_ns)
        late_ns = time.perf_counter_ns() - t0
        opts = self.options
        self._task = asyncio.ensure_future(
            run(
                self.sc,
                path=opts.get("path"),
                worker=self.index,
                headers=opts.get("headers"),
                rtt_samples=0,  # measured in identity(), before the common start
                start_ns=t0,
                on_row=self._on_row,
                stop=self._stop,
            )
        )
        try:
            result = await self._task
        except asyncio.CancelledError:
            if not self.interrupted:
                raise
            # the runner stored the requests in flight as cancelled rows and re-raised
            return {"result": None, "t0_perf_ns": t0, "late_at_start_ns": late_ns}
        finally:
            self.done = True
            self._ready.set()
        return {"result": result.to_dict(), "t0_perf_ns": t0, "late_at_start_ns": late_ns}

    def _on_row(self, wf: Waterfall, tags: Tags) -> None:
        line = {"kind": "wf", "tags": tags.to_dict(), "wf": wf.to_dict()}
        self.lines.append(json.dumps(line, separators=(",", ":")))
        self.rows += 1
        if self._ready is not None and len(self.lines) >= self.options["batch_rows"]:
            self._ready.set()

    async def batch(self, wait_s: float) -> tuple[str, bool]:
        """Rows stored since the last call, as JSONL (waits up to ``wait_s`` for a full batch),
        and whether the run is over (then this was the last batch)."""
        if self._ready is None:  # run() not started yet: nothing to send
            await asyncio.sleep(wait_s)
        elif not self.done:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), wait_s)
            self._ready.clear()
        lines, self.lines = self.lines, []
        return "\n".join(lines), self.done

    async def stop(self) -> None:
        """Issue nothing more; in-flight requests finish and are stored."""
        if self._stop is not None:
            self._stop.set()

    async def interrupt(self) -> None:
        """Issue nothing more and cancel the requests in flight (stored as cancelled)."""
        self.interrupted = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
