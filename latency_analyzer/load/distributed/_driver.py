"""The driver of a distributed run: start workers, start them together, merge their rows.

How a run goes, wherever its workers are (local processes or Ray actors):

1. The driver splits the scenario (:func:`split_scenario`): an open loop's rate R becomes R/N
   per worker with its own seed (independent Poisson streams add up to a Poisson stream of
   rate R), a closed loop's users and any request count are shared out as evenly as possible.
2. Each worker runs the ordinary asyncio runner (:class:`Worker`). It first reports who it is:
   host, node, pid, its monotonic→epoch clock anchor, its environment fingerprint with the
   base RTT to the target, and its wall clock as seen from the driver (Cristian: offset ± half
   the call's round trip).
3. The driver picks a start instant ``start_delay`` seconds ahead, as epoch ns; each worker
   maps it to its own ``perf_counter_ns`` through its anchor and uses it as the run's t0.
4. Workers stream their rows back in batches (one string of JSONL lines per batch, at most
   ``batch_interval`` seconds old), not one object per request; the driver adds them to one
   ``WaterfallSet`` (and its file) as they come. The rows keep their ``worker`` tag, and the
   header's ``meta["workers"]`` holds each worker's identity, so a slow worker shows as such.
5. A worker that dies keeps what it streamed: its rows are in the set, its status is
   ``died`` and the share it did not deliver is reported as ``lost`` (an estimate: its share
   of the schedule minus what arrived). A stop (:meth:`DistributedRun.request_stop`) stops
   issuing everywhere and lets in-flight requests finish; an interruption
   (:meth:`DistributedRun.interrupt`, Ctrl-C) stops issuing and stores the requests in flight
   as cancelled, as a run in one process does. Either way every row is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ...analysis import Tags, WaterfallSet, fingerprint
from ...errors import UsageError
from ...timeline import Waterfall
from .._checks import request_headers
from .._length_report import length_report
from .._lengths import lengths_for
from .._scenario import Scenario
from ._results import (
    DistributedResult,
    WorkerReport,
    cristian_offset,
    rates,
    rtt_note,
    worker_notes,
    worst_client,
)
from ._split import expected_requests, phase_ns, split_scenario

__all__ = [
    "Backend",
    "DistributedRun",
    "Handle",
    "WorkerFailed",
    "WorkerGone",
    "drive",
    "drive_sync",
]

_CLOCK_PROBES = 5  # round trips to a worker; the tightest bounds its clock offset best


class WorkerGone(Exception):
    """The worker's process is gone (killed, crashed, its node lost)."""


class WorkerFailed(Exception):
    """A call on the worker raised (its run failed)."""


class Handle(Protocol):
    """A started worker, as the driver sees it."""

    async def call(self, method: str, *args: Any) -> Any:
        """Call the worker's ``method`` (see :class:`Worker`); WorkerGone / WorkerFailed."""
        ...

    async def release(self) -> None:
        """End the worker now (its resources go back at once)."""
        ...


class Backend(Protocol):
    """Where workers run: starts one per scenario part."""

    name: str

    async def start(self, parts: list[Scenario], options: list[dict[str, Any]]) -> list[Handle]: ...


class DistributedRun:
    """One distributed run: ``await start()``, then ``await wait()`` for the merged result.

    Args:
        scenario: what to run, as on one machine; :func:`split_scenario` shares it out.
        workers: how many workers.
        backend: where they run (``ProcessBackend``: this machine; ``RayBackend``: a cluster).
        path: the merged set's JSONL file, written as batches arrive.
        worker_dir: each worker also writes its own JSONL here (``worker<i>.jsonl``).
        headers: sent with every request (never stored).
        rtt_samples: TCP connects per worker for its base RTT to the target.
        start_delay: seconds between the driver's choice of the start and the start: enough
            for the start call to reach every worker.
        batch_rows, batch_interval: a worker sends its rows when it has ``batch_rows`` of
            them or ``batch_interval`` seconds have passed, whichever comes first.
        switch_interval: ``sys.setswitchinterval`` in each worker (None: Python's 5 ms);
            short, so the worker's other threads do not delay the event loop's reads.

    Raises:
        UsageError: the scenario cannot be split.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        workers: int,
        backend: Backend,
        path: str | os.PathLike[str] | None = None,
        worker_dir: str | None = None,
        headers: Mapping[str, str] | None = None,
        rtt_samples: int = 5,
        start_delay: float = 1.0,
        batch_rows: int = 256,
        batch_interval: float = 0.2,
        switch_interval: float | None = 0.0002,
    ) -> None:
        # a scenario's headers reach the workers as this option: its to_dict() omits values
        sent = {**request_headers(scenario), **(headers or {})}
        lengths_for(scenario)  # a tokenizer that cannot be read fails here, not in each worker
        parts = split_scenario(scenario, workers)
        self.scenario, self.parts = scenario, [p.replace(headers={}, header_env={}) for p in parts]
        self.backend, self.path = backend, path
        self.worker_dir, self.headers, self.rtt_samples = worker_dir, sent, rtt_samples
        self.start_delay = start_delay
        self.batch_rows, self.batch_interval = batch_rows, batch_interval
        self.switch_interval = switch_interval
        self.handles: list[Handle] = []
        self.reports = [WorkerReport(i) for i in range(workers)]
        self.start_epoch_ns = 0
        self.set: WaterfallSet | None = None
        self._stop_requested = False
        self._t_start = 0.0
        self._runs: list[asyncio.Future[Any]] = []
        self._stops: list[asyncio.Future[None]] = []
        self._interrupted = False

    # -- starting --
    async def start(self) -> None:
        """Start the workers, learn who they are, and start them together."""
        opts = [self._options(i) for i in range(len(self.parts))]
        self.handles = await self.backend.start(self.parts, opts)
        await asyncio.gather(*(self._identify(i) for i in range(len(self.handles))))
        self.set = WaterfallSet(self.path, meta=self._meta())
        self._t_start = time.perf_counter()
        self.start_epoch_ns = time.time_ns() + round(self.start_delay * 1e9)
        n = len(self.handles)
        self._runs = [
            asyncio.ensure_future(
                h.call("run", self.start_epoch_ns + phase_ns(self.scenario, n, i))
            )
            for i, h in enumerate(self.handles)
        ]

    def _options(self, i: int) -> dict[str, Any]:
        path = None if self.worker_dir is None else str(Path(self.worker_dir, f"worker{i}.jsonl"))
        return {
            "path": path,
            "headers": dict(self.headers or {}),
            "rtt_samples": self.rtt_samples,
            "batch_rows": self.batch_rows,
            "switch_interval": self.switch_interval,
        }

    async def _identify(self, i: int) -> None:
        ident = await self.handles[i].call("identity")
        r = self.reports[i]
        r.host, r.node_id, r.pid = ident["host"], ident["node_id"], ident["pid"]
        r.anchor, r.fingerprint = ident["anchor"], ident["fingerprint"]
        r.expected = expected_requests(self.parts[i])
        samples = []
        for _ in range(_CLOCK_PROBES):  # Cristian: the worker read its clock in [sent, back]
            sent = time.time_ns()
            wall = await self.handles[i].call("wall_ns")
            samples.append((sent, wall, time.time_ns()))
        r.clock_offset_s, r.clock_error_s = cristian_offset(samples)

    def _meta(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.to_dict(),
            "fingerprint": fingerprint(self.scenario.url, rtt_samples=0),  # the driver's
            "backend": self.backend.name,
            "workers": [r.to_dict() for r in self.reports],
        }

    # -- running --
    def request_stop(self) -> None:
        """Stop issuing on every worker; in-flight requests finish; ``wait()`` returns."""
        self._stop_requested = True
        self._stops = [asyncio.ensure_future(_quietly(h.call("stop"))) for h in self.handles]

    def interrupt(self) -> None:
        """Stop issuing and cancel the requests in flight on every worker (they are stored as
        cancelled rows); ``wait()`` returns the result, marked interrupted."""
        self._stop_requested = self._interrupted = True
        self._stops = [asyncio.ensure_future(_quietly(h.call("interrupt"))) for h in self.handles]

    async def wait(self) -> DistributedResult:
        """Collect every worker's rows until all have finished or died; the merged result."""
        if self.set is None:
            raise UsageError("call start() first")
        # not closed on cancellation: a second wait() after request_stop() adds the rest
        outs = await asyncio.gather(*(self._collect(i) for i in range(len(self.handles))))
        result = self._result([o for o in outs if o is not None])
        self.set.close()
        await self.release()
        return result

    async def release(self) -> None:
        """End the workers now rather than when their handles are collected: their CPUs are
        reserved until then, and the next run may need them."""
        await asyncio.gather(*(h.release() for h in self.handles))

    async def _collect(self, i: int) -> dict[str, Any] | None:
        """Fetch worker i's batches until its run ends; its run report (None if it died)."""
        handle, report = self.handles[i], self.reports[i]
        try:
            done = False
            while not done:
                text, done = await handle.call("batch", self.batch_interval)
                self._add(text, report)
            out: dict[str, Any] = await self._runs[i]
        except (WorkerGone, WorkerFailed) as exc:  # keep what arrived, say what is missing
            self._runs[i].add_done_callback(_retrieved)  # its run failed the same way
            report.status = "died" if isinstance(exc, WorkerGone) else "failed"
            report.error = f"{type(exc).__name__}: {exc}"
            report.lost = max(0, round((report.expected or report.rows) - report.rows))
            return None
        report.status = "stopped" if self._stop_requested else "finished"
        if out["result"] is None:  # interrupted: its rows are all in, its self-check is not
            return None
        report.client = out["result"]["client"]
        report.start_late_s = max(0.0, out["late_at_start_ns"] / 1e9)
        return out

    def _add(self, text: str, report: WorkerReport) -> None:
        assert self.set is not None
        for line in text.splitlines():
            obj = json.loads(line)
            self.set.add(Waterfall.from_dict(obj["wf"]), Tags.from_dict(obj["tags"]))
            report.rows += 1

    # -- the merged result --
    def _result(self, outs: list[dict[str, Any]]) -> DistributedResult:
        assert self.set is not None
        ws, sc = self.set, self.scenario
        res = DistributedResult(
            set=ws,
            scenario=sc,
            issued=sum(r.rows for r in self.reports),
            client=worst_client(outs),
            wall_s=time.perf_counter() - self._t_start,
            workers=self.reports,
            lost=sum(r.lost for r in self.reports),
            start_epoch_ns=self.start_epoch_ns,
            interrupted=self._stop_requested,
            backend=self.backend.name,
        )
        rates(res)
        lines, lengths = length_report(ws, sc)
        res.notes.extend(lines)
        ws.note("lengths", lengths)
        res.notes.extend(worker_notes(self.reports))
        note = rtt_note(self.reports)
        if note:
            res.notes.append(note)
        if self._interrupted:
            n = ws.labels("error_type").count("cancelled")
            res.notes.append(f"the run was INTERRUPTED: {n} requests in flight stored as cancelled")
        elif self._stop_requested:
            res.notes.append(f"stopped on request after {res.wall_s:.1f} s: {len(ws)} kept")
        # the header's meta["workers"] is who they were at the start; this is how they ended
        ws.note("worker_reports", {"workers": [r.to_dict() for r in self.reports]})
        ws.note("result", res.to_dict())
        return res


def _retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # reported by the worker's status; retrieved so asyncio does not log it


async def _quietly(call: Any) -> None:
    """A fire-and-forget call whose failure the run's collection reports instead."""
    with contextlib.suppress(WorkerGone, WorkerFailed):
        await call


async def drive(dr: DistributedRun) -> DistributedResult:
    """Start ``dr`` and wait for its merged result.

    Cancelled (Ctrl-C under ``asyncio.run``), it stops the workers, collects what they
    recorded into the run's file and re-raises.
    """
    await dr.start()
    try:
        result = await dr.wait()
    except asyncio.CancelledError:
        dr.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.shield(dr.wait())
        raise
    finally:
        if dr.set is not None:
            dr.set.close()
    return result


def drive_sync(dr: DistributedRun) -> DistributedResult:
    """:func:`drive` from synchronous code. The first Ctrl-C interrupts the run (no request
    is issued any more, those in flight are stored as cancelled, everything recorded is kept
    and returned, marked interrupted); a second one aborts."""

    async def main() -> DistributedResult:
        await dr.start()
        task = asyncio.ensure_future(dr.wait())
        loop = asyncio.get_running_loop()

        def on_sigint() -> None:
            if dr._interrupted:
                task.cancel()
            else:
                dr.interrupt()

        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await task
        except asyncio.CancelledError:  # the second Ctrl-C
            raise KeyboardInterrupt from None
        finally:
            if dr.set is not None:
                dr.set.close()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    return asyncio.run(main())
