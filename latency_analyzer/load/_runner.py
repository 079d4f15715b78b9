"""The load runner: closed and open loops on one asyncio loop, every request a stored row.

Open loop: arrival ``i`` is scheduled at an absolute instant ``t_i`` (constant, Poisson, gamma
or burst gaps from ``t_0``); the pacer wakes at ``t_i`` and starts the request with
``intended_start_ns = t_i``, so everything between the schedule and the actual start (pacer
lateness, waiting for a ``max_in_flight`` slot) is ``schedule_lag`` and latency is measured from
the intended start: coordinated omission shows instead of hiding.

Closed loop: ``concurrency`` users, each sends, waits for its response, thinks, sends again.

Every issued request ends as exactly one row (``issued == stored``): the client turns every
failure into a waterfall.

A cancelled run (Ctrl-C under ``asyncio.run``, or a cancelled task) still keeps that promise:
requests in flight are stored as waterfalls with ``error_type="cancelled"`` and the stages they
had reached, the file's ``result`` note says ``"interrupted": true``, and the cancellation then
propagates.

The cyclic garbage collector is kept off what was alive before the run (``gc.freeze``, undone
when the last concurrent run ends, unless the caller had frozen objects itself): a full
collection scans every object the process holds,
and in a process that has imported numpy and aiohttp and kept earlier runs' results that took
20-70 ms, with the loop stopped, in the middle of a run (measured in a search's fifth probe:
pacer lag P99 23-42 ms, one request 100 ms late). Collections during the run then scan only
what the run made. A run that picks its own start collects first, before its first request is
due; one given a common start (a worker) does not, so as not to be late to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..analysis import WaterfallSet, fingerprint
from ..capture.client import Client
from ..errors import UsageError
from ..metrics import Scraper
from ..server.store import SpanStore
from ._checks import request_headers
from ._datasets import check_fits, load_dataset
from ._lengths import filter_dataset, lengths_for, resolve_lengths
from ._loops import closed_loop, open_loop
from ._monitor import LoopMonitor, Pacer
from ._result import RunResult, result_of, spans_dropped
from ._run_state import Progress, RowSink, RunState
from ._scenario import Scenario
from ._trace import load_trace

__all__ = ["Hook", "Progress", "RowSink", "RunResult", "run", "sweep"]

#: Called with the run's t0 (``perf_counter_ns``) and run alongside it (fault injection).
Hook = Callable[[int], Coroutine[Any, Any, None]]

_LEAD_NS = 20_000_000  # t0 is this far in the future, so the first arrival is not born late


async def run(
    scenario: Scenario,
    *,
    path: str | Path | None = None,
    worker: int = 0,
    step: int = 0,
    hooks: Sequence[Hook] = (),
    headers: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    rtt_samples: int = 5,
    scraper: Scraper | None = None,
    start_ns: int | None = None,
    on_row: RowSink | None = None,
    stop: asyncio.Event | None = None,
    spans: SpanStore | None = None,
) -> RunResult:
    """Run ``scenario`` in this process and return its set and self-check.

    Args:
        scenario: what to run.
        path: stream the set to this JSONL file as the run goes (None: memory only).
        worker, step: tags for merged multi-process sets and sweep steps.
        hooks: coroutines started with the run's t0 (``perf_counter_ns``), e.g. an outage.
        headers: sent with every request (e.g. Authorization), on top of the scenario's
            ``headers`` and ``header_env``; never stored.
        progress: called as ``progress(stored, total_or_None)`` after each request.
        rtt_samples: TCP connects for the fingerprint's base RTT (0: skip).
        scraper: Prometheus endpoints scraped during the run; started (first scrape done)
            before t0 unless already running, and stopped after. Its series is on the result.
        start_ns: the run's t0 (``perf_counter_ns``), e.g. a start common to several
            processes (None: 20 ms from now). Arrivals due before the run gets there are
            issued late, and their lateness is ``schedule_lag``.
        on_row: called with every stored row (waterfall and tags) as it is stored.
        stop: once set, no further request is issued; in-flight ones finish and are stored.
        spans: the span store the run's receivers feed: what it evicts or refuses during the
            run (over its caps) is the result's ``spans_dropped`` and a summary note.
    """
    sent = {**request_headers(scenario), **(headers or {})}  # an unset variable: before any file
    lengths = lengths_for(scenario)
    dataset = None if scenario.dataset is None else load_dataset(scenario.dataset)
    if dataset is not None and scenario.dataset is not None:
        dataset = filter_dataset(dataset, scenario.dataset, lengths)
        check_fits(dataset, scenario)
    trace = None if scenario.trace is None else load_trace(scenario.trace)
    sized = resolve_lengths(scenario, lengths)  # empirical length files read
    meta = {
        "scenario": scenario.to_dict(),
        "fingerprint": fingerprint(scenario.url, scenario=None, rtt_samples=rtt_samples),
    }
    ws = WaterfallSet(path, meta=meta)
    limit = scenario.max_in_flight or 0 if scenario.mode == "open" else scenario.concurrency
    client = Client(
        limit=limit,
        keepalive=not scenario.new_connections,
        timeout=scenario.timeout,
        headers=sent,
    )
    pacer = Pacer() if scenario.mode == "open" else None
    r = RunState(sized, ws, client, worker, step, progress, on_row, stop, dataset, trace, lengths)
    started = scraper is not None and not scraper.running
    if scraper is not None and started:
        await scraper.start()
    cancelled: asyncio.CancelledError | None = None
    dropped_before = None if spans is None else spans.dropped
    _hold_collector(collect=start_ns is None)
    try:
        async with client, LoopMonitor() as mon:
            r.t0 = time.perf_counter_ns() + _LEAD_NS if start_ns is None else start_ns
            extra = [asyncio.create_task(h(r.t0)) for h in hooks]
            try:
                await (open_loop(r, pacer) if pacer is not None else closed_loop(r))
            except asyncio.CancelledError as exc:  # rows are stored; finish the file, re-raise
                cancelled = exc
            finally:
                await _finish_hooks(extra)
        # before close: the result is noted in the file too
        result = result_of(r, mon, pacer, interrupted=cancelled is not None)
        if spans is not None and dropped_before is not None:
            spans_dropped(result, spans, spans.dropped - dropped_before)
        r.ws.note("result", result.to_dict())
    finally:
        _release_collector()
        if scraper is not None:
            await _stop_scraper(scraper, ws, started)
        ws.close()
    if cancelled is not None:
        raise cancelled
    result.metrics = None if scraper is None else scraper.series
    return result


#: Runs of this process under way (the objects alive before the first are frozen until the last
#: ends).
_runs_holding = 0
_frozen_by_caller = False  # objects were frozen before the first run: the caller's to undo


def _hold_collector(*, collect: bool) -> None:
    """Keep the collector off the objects alive now (see the module's text)."""
    global _runs_holding, _frozen_by_caller
    if _runs_holding == 0:
        _frozen_by_caller = gc.get_freeze_count() > 0
        if collect:
            gc.collect()
        gc.freeze()
    _runs_holding += 1


def _release_collector() -> None:
    """Undo the freeze once the last concurrent run ends, unless the caller had frozen
    objects itself (``gc.unfreeze`` cannot tell whose they are: they all stay frozen)."""
    global _runs_holding
    _runs_holding -= 1
    if _runs_holding == 0 and not _frozen_by_caller:
        gc.unfreeze()


async def _stop_scraper(scraper: Scraper, ws: WaterfallSet, started: bool) -> None:
    if started:
        await scraper.stop()
    ms = scraper.series
    path = None if ms.path is None else str(ms.path)
    ws.note("metrics", {"file": path, "targets": list(ms.targets), "gaps": len(ms.gaps)})


async def _finish_hooks(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        if not t.done():
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t


async def sweep(
    scenario: Scenario,
    *,
    concurrency: Sequence[int] = (),
    rate: Sequence[float] = (),
    path: str | Path | None = None,
    **kwargs: Any,
) -> list[RunResult]:
    """One run per concurrency (closed loop) or rate (open loop) level, tagged ``step`` 0, 1 …

    A coroutine: ``results = await sweep(sc, rate=[5, 10, 20])``, or
    ``asyncio.run(sweep(...))`` from synchronous code.

    With ``path``, step i streams to ``<stem>.step<i><suffix>``; ``WaterfallSet.merge`` of the
    results' sets gives one set, and ``group_by("step")`` splits it again.

    Raises:
        UsageError: neither or both of ``concurrency`` and ``rate`` given.
    """
    if bool(concurrency) == bool(rate):
        raise UsageError("sweep over concurrency= or rate=, exactly one")
    key, levels = ("concurrency", concurrency) if concurrency else ("rate", rate)
    out = []
    for i, level in enumerate(levels):
        step_path = None
        if path is not None:
            p = Path(path)
            step_path = p.with_name(f"{p.stem}.step{i}{p.suffix}")
        sc = scenario.replace(**{key: level, "name": f"{scenario.name}@{key}={level:g}"})
        out.append(await run(sc, path=step_path, step=i, **kwargs))
    return out
