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
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import Summary, Tags, WaterfallSet, fingerprint
from ..capture.client import Client, redact_url
from ..errors import UsageError
from ..metrics import MetricSeries, Scraper
from ..server.store import SpanStore
from ..timeline import Recorder, Waterfall
from ._checks import request_headers
from ._datasets import Dataset, Sample, check_fits, load_dataset, sample_body
from ._dists import arrival_gaps
from ._lengths import Lengths, filter_dataset, length_report, lengths_for, resolve_lengths
from ._monitor import ClientHealth, LoopMonitor, Pacer
from ._scenario import Scenario, Template
from ._trace import TraceRow, load_trace

__all__ = ["Hook", "RowSink", "RunResult", "run", "sweep"]

#: Called with the run's t0 (``perf_counter_ns``) and run alongside it (fault injection).
Hook = Callable[[int], Coroutine[Any, Any, None]]
Progress = Callable[[int, int | None], None]
#: Called with each stored row as it is stored (e.g. to stream it to another process).
RowSink = Callable[[Waterfall, Tags], None]

_LEAD_NS = 20_000_000  # t0 is this far in the future, so the first arrival is not born late
_SATURATION_RATIO = 0.9
_WORKER_SHIFT = 1021  # filler words between workers' starting points (a prime: rarely aligned)


@dataclass
class RunResult:
    """A finished run.

    Attributes:
        set: every request as a row (warm-up rows marked).
        scenario: what was run.
        issued: requests started; equals ``len(set)`` (none lost).
        client: the client's self-check (loop lag, pacer lag, CPU, peak RSS).
        offered_rps: the open loop's rate (None in a closed loop).
        completed_in_window_rps: requests completed while arrivals were still being issued,
            per second of that window (the target keeps up when this ≈ ``offered_rps``).
        target_saturated: the target could not keep up with an open loop's rate.
        notes: sentences for the summary.
    """

    set: WaterfallSet
    scenario: Scenario
    issued: int
    client: ClientHealth
    wall_s: float
    offered_rps: float | None = None
    completed_in_window_rps: float | None = None
    latency_growth: float | None = None
    target_saturated: bool = False
    notes: list[str] = field(default_factory=list)
    metrics: MetricSeries | None = None  # server metrics scraped during the run, if any
    interrupted: bool = False  # cancelled (Ctrl-C): in-flight requests stored as cancelled
    spans_dropped: int | None = None  # server spans the run's span store evicted or refused

    def summary(self, **kwargs: Any) -> Summary:
        """The set's summary with this run's notes (saturation, client health) added."""
        base = self.set.summary(**kwargs)
        base.notes[:0] = self.notes
        return base

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name,
            "issued": self.issued,
            "stored": len(self.set),
            "wall_s": self.wall_s,
            "offered_rps": self.offered_rps,
            "completed_in_window_rps": self.completed_in_window_rps,
            "latency_growth": self.latency_growth,
            "target_saturated": self.target_saturated,
            "client": self.client.to_dict(),
            "notes": self.notes,
            "interrupted": self.interrupted,
            "spans_dropped": self.spans_dropped,
        }


@dataclass
class _Claim:
    """One request to send: its template, body and what it was built from."""

    template: Template
    body: dict[str, Any]
    length: int = -1  # the prompt's measured length (-1: a bare one-word prompt)
    sample: Sample | None = None  # the dataset row, if any
    tag: str | None = None  # the row (and turn) as stored in the ``sample`` tag


class _Run:
    """State shared by the tasks of one run."""

    def __init__(
        self,
        sc: Scenario,
        ws: WaterfallSet,
        client: Client,
        worker: int,
        step: int,
        progress: Progress | None,
        on_row: RowSink | None = None,
        stop: asyncio.Event | None = None,
        dataset: Dataset | None = None,
        trace: list[TraceRow] | None = None,
        lengths: Lengths | None = None,
    ) -> None:
        self.sc, self.ws, self.client = sc, ws, client
        self.dataset, self.trace = dataset, trace
        self.lengths = lengths or Lengths()
        self.by_name = {t.name: t for t in sc.templates}
        self.on_row, self.stop = on_row, stop
        self.rng = random.Random(sc.seed)
        self.worker, self.step = worker, step
        self.progress = progress
        self.issued = 0
        self.stored = 0
        self.tls_versions: set[str] = set()
        self.t0 = 0
        self.issue_end_ns = 0

    def full(self) -> bool:
        """The count bound is reached."""
        return self.sc.requests is not None and self.issued >= self.sc.requests

    def next_request(self) -> _Claim | None:
        """Claim the next request (None once the count bound is reached)."""
        if self.full() or (self.trace is not None and self.issued >= len(self.trace)):
            return None
        self.issued += 1
        if self.trace is not None:
            return self._trace_claim(self.trace[self.issued - 1])
        if self.dataset is None:
            template = self.sc.pick(self.rng)
            if template.prompt_tokens is None:
                text, length = "hi", -1
            else:  # the length drawn, then filler of that many tokens (or words)
                target = max(1, round(template.prompt_tokens.sample(self.rng)))
                text, length = self.lengths.prompt(target, self._offset())
            messages = [{"role": "user", "content": text}]
            body = sample_body(self.sc, template, messages, None, self.rng)
            return _Claim(template, body, length)
        s = self.dataset.draw(self.rng)
        if s.klass is None:  # one template: the draw alone consumes the seeded stream
            one = len(self.sc.templates) == 1
            template = self.sc.templates[0] if one else self.sc.pick(self.rng)
        else:  # a class is its template's name; a class without a template gets a bare one
            template = self.by_name.get(s.klass) or Template(name=s.klass)
        body = sample_body(self.sc, template, s.messages, s.max_tokens, self.rng)
        return _Claim(template, body, self.lengths.measure(s.messages), s, s.tag)

    def _offset(self) -> int:
        """Where this request's filler starts: its index, and another place per worker, so
        equal lengths from two workers are different texts (no shared prefix to cache)."""
        return self.issued - 1 + self.worker * _WORKER_SHIFT

    def _trace_claim(self, row: TraceRow) -> _Claim:
        template = self.sc.templates[0] if len(self.sc.templates) == 1 else self.sc.pick(self.rng)
        text = row.prompt
        if text is None:  # a length only: filler, rotated so prompts differ
            text, length = self.lengths.prompt(row.input_tokens or 1, self._offset())
        else:
            length = self.lengths.count(text)
        messages = [{"role": "user", "content": text}]
        body = sample_body(self.sc, template, messages, row.output_tokens, self.rng)
        return _Claim(template, body, length, None, row.tag)

    def next_turn(self, claim: _Claim, turn: int, history: list[dict[str, Any]]) -> _Claim | None:
        """Claim turn ``turn`` (from 1) of a conversation sent with ``history`` (None once a
        bound is reached)."""
        if self.full() or self.past_deadline(time.perf_counter_ns()):
            return None
        self.issued += 1
        assert claim.sample is not None
        body = sample_body(self.sc, claim.template, history, claim.sample.max_tokens, self.rng)
        length = self.lengths.measure(history)
        return _Claim(claim.template, body, length, claim.sample, f"{claim.tag}#{turn}")

    def warm(self, index: int, start_ns: int) -> bool:
        sc = self.sc
        return index < sc.warmup_requests or start_ns < self.t0 + round(sc.warmup_seconds * 1e9)

    def store(self, wf: Waterfall, claim: _Claim, warmup: bool) -> None:
        name, length, body = claim.template.name, claim.length, claim.body
        out = body.get("max_tokens", body.get("max_completion_tokens"))
        least = body.get("min_tokens")
        tags = Tags(
            *(self.sc.name, name, length, self.worker, self.step, warmup, claim.tag),
            max_tokens=_count(out),
            min_tokens=_count(least),
        )
        self.ws.add(wf, tags)
        self.stored += 1
        if wf.tls is not None and wf.tls.version:
            self.tls_versions.add(wf.tls.version)
        if self.on_row is not None:
            self.on_row(wf, tags)
        if self.progress is not None:
            self.progress(self.stored, self.sc.requests)

    def past_deadline(self, t_ns: int) -> bool:
        if self.stop is not None and self.stop.is_set():
            return True  # a graceful stop: issue nothing more, let in-flight requests finish
        d = self.sc.duration
        return d is not None and t_ns >= self.t0 + round(d * 1e9)


def _count(value: Any) -> int:
    """A token count a body carries (an int, not a bool), or -1."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return int(value) if ok else -1


async def _send(
    run: _Run,
    body: dict[str, Any],
    intended: int | None,
    on_cancel: Callable[[Waterfall], None],
    answer: list[str] | None = None,
) -> Waterfall:
    return await run.client.request(
        run.sc.url, json=body, intended_start_ns=intended, on_cancel=on_cancel, answer=answer
    )


def _unsent(run: _Run, intended: int) -> Waterfall:
    """The row of a request cancelled before it was sent (waiting for a client slot)."""
    now = time.perf_counter_ns()
    rec = Recorder("POST", redact_url(run.sc.url), start_ns=now, intended_start_ns=intended)
    rec.fail("cancelled", "cancelled while waiting for a client slot", now)
    return rec.finish(now)


# -- open loop ---------------------------------------------------------------------------------
def _schedule(run: _Run) -> Iterator[int]:
    """Intended start instants (perf ns), with a linear rate ramp over ``ramp_up``; a trace's
    own instants (already divided by its speed) from t0."""
    if run.trace is not None:
        yield from (run.t0 + row.offset_ns for row in run.trace)
        return
    sc = run.sc
    gaps = arrival_gaps(sc.arrival, sc.rate or 1.0, run.rng, sc.burstiness)
    t = float(run.t0)
    ramp = sc.ramp_up * 1e9
    while True:
        yield round(t)
        gap = next(gaps) * 1e9
        if ramp > 0 and t - run.t0 < ramp:
            # rate(t) = rate · (t - t0) / ramp: at least 1% of it, so the first gap is finite
            gap /= max(0.01, (t - run.t0) / ramp)
        t += gap


async def _open_request(
    run: _Run,
    slots: asyncio.Semaphore | None,
    claim: _Claim,
    intended: int,
    index: int,
) -> None:
    stored: list[bool] = []

    def cancelled(wf: Waterfall) -> None:
        stored.append(True)
        run.store(wf, claim, run.warm(index, intended))

    try:
        if slots is None:
            wf = await _send(run, claim.body, intended, cancelled)
        else:
            async with slots:  # the wait for a slot stays inside schedule_lag: never hidden
                wf = await _send(run, claim.body, intended, cancelled)
    except asyncio.CancelledError:
        if not stored:
            cancelled(_unsent(run, intended))
        raise
    run.store(wf, claim, run.warm(index, intended))


async def _open_loop(run: _Run, pacer: Pacer) -> None:
    cap = run.sc.max_in_flight
    slots = asyncio.Semaphore(cap) if cap else None
    tasks: set[asyncio.Task[None]] = set()
    try:
        for intended in _schedule(run):
            if run.past_deadline(intended):
                break
            index = run.issued
            claimed = run.next_request()  # body built before the wait, not on its clock
            if claimed is None:
                break
            try:
                await pacer.wait_until(intended)
            except asyncio.CancelledError:
                run.issued -= 1  # claimed, never started: not issued
                raise
            task = asyncio.create_task(_open_request(run, slots, claimed, intended, index))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            run.issue_end_ns = intended
        await _gather(tasks)
    except asyncio.CancelledError:
        for task in tasks:  # each stores its cancelled row
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _gather(tasks: set[asyncio.Task[None]]) -> None:
    while tasks:
        await asyncio.gather(*list(tasks))


# -- closed loop -------------------------------------------------------------------------------
async def _user(run: _Run, user: int) -> None:
    sc = run.sc
    if sc.ramp_up > 0:
        await asyncio.sleep(sc.ramp_up * user / sc.concurrency)
    while not run.past_deadline(time.perf_counter_ns()):
        index = run.issued
        claimed = run.next_request()
        if claimed is None:
            return
        turns = () if claimed.sample is None else claimed.sample.turns
        answer: list[str] | None = [] if turns else None

        def cancelled(wf: Waterfall, c: _Claim = claimed, i: int = index) -> None:
            run.store(wf, c, run.warm(i, wf.start_ns))

        wf = await _send(run, claimed.body, None, cancelled, answer)
        run.store(wf, claimed, run.warm(index, wf.start_ns))
        if turns and answer is not None and wf.ok:
            await _conversation(run, claimed, answer)
        if sc.think_time is not None:
            await asyncio.sleep(sc.think_time.sample(run.rng))


async def _conversation(run: _Run, first: _Claim, answer: list[str]) -> None:
    """The turns after a conversation's first: each after the previous answer and a think
    time, with the conversation so far (the answers' streamed text included), as a chat
    client sends it. A failed turn ends the conversation (a user has no answer to go on)."""
    assert first.sample is not None
    history: list[dict[str, Any]] = [dict(m) for m in first.sample.messages]
    for k, text in enumerate(first.sample.turns, 1):
        if run.sc.think_time is not None:
            await asyncio.sleep(run.sc.think_time.sample(run.rng))
        history.append({"role": "assistant", "content": "".join(answer)})
        history.append({"role": "user", "content": text})
        index = run.issued
        claim = run.next_turn(first, k, history)
        if claim is None:
            return
        answer = []

        def cancelled(wf: Waterfall, c: _Claim = claim, i: int = index) -> None:
            run.store(wf, c, run.warm(i, wf.start_ns))

        wf = await _send(run, claim.body, None, cancelled, answer)
        run.store(wf, claim, run.warm(index, wf.start_ns))
        if not wf.ok:
            return


async def _closed_loop(run: _Run) -> None:
    await asyncio.sleep(max(0, run.t0 - time.perf_counter_ns()) / 1e9)  # users start at t0
    await asyncio.gather(*(_user(run, u) for u in range(run.sc.concurrency)))
    run.issue_end_ns = time.perf_counter_ns()


# -- the run -----------------------------------------------------------------------------------
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
    r = _Run(sized, ws, client, worker, step, progress, on_row, stop, dataset, trace, lengths)
    started = scraper is not None and not scraper.running
    if scraper is not None and started:
        await scraper.start()
    cancelled: asyncio.CancelledError | None = None
    dropped_before = None if spans is None else spans.dropped
    try:
        async with client, LoopMonitor() as mon:
            r.t0 = time.perf_counter_ns() + _LEAD_NS if start_ns is None else start_ns
            extra = [asyncio.create_task(h(r.t0)) for h in hooks]
            try:
                await (_open_loop(r, pacer) if pacer is not None else _closed_loop(r))
            except asyncio.CancelledError as exc:  # rows are stored; finish the file, re-raise
                cancelled = exc
            finally:
                await _finish_hooks(extra)
        # before close: the result is noted in the file too
        result = _result(r, mon, pacer, interrupted=cancelled is not None)
        if spans is not None and dropped_before is not None:
            _spans_dropped(result, spans, spans.dropped - dropped_before)
        r.ws.note("result", result.to_dict())
    finally:
        if scraper is not None:
            await _stop_scraper(scraper, ws, started)
        ws.close()
    if cancelled is not None:
        raise cancelled
    result.metrics = None if scraper is None else scraper.series
    return result


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


def _result(r: _Run, mon: LoopMonitor, pacer: Pacer | None, *, interrupted: bool) -> RunResult:
    if r.issued != r.stored:  # the invariant every report rests on
        raise UsageError(f"{r.issued} requests issued but {r.stored} stored")
    lags = (list(r.ws.values("read_lag")), list(r.ws.values("read_lag_max")))
    health = mon.health(pacer, lags)
    res = RunResult(r.ws, r.sc, r.issued, health, mon.wall_s, interrupted=interrupted)
    lines, lengths = length_report(r.ws, r.sc)
    res.notes.extend(lines)
    r.ws.note("lengths", lengths)
    if interrupted:
        n = r.ws.labels("error_type").count("cancelled")
        res.notes.append(f"the run was INTERRUPTED: {n} requests in flight stored as cancelled")
    _http_tls(r.ws, r.tls_versions)
    if r.sc.mode == "open" and r.sc.arrival != "burst":
        _target_check(r, res)
    note = health.note()
    if note:
        res.notes.append(note)
    return res


def _spans_dropped(res: RunResult, store: SpanStore, dropped: int) -> None:
    res.spans_dropped = dropped
    if dropped:
        res.notes.append(
            f"the span store dropped {dropped} server spans (over its caps: {store.max_spans} "
            f"spans, {store.max_bytes} bytes, {store.max_traces} traces); requests whose "
            "spans were dropped merge as 'no server data'"
        )


def _http_tls(ws: WaterfallSet, tls_versions: set[str]) -> None:
    versions = sorted({v for v in ws.labels("http_version") if v})
    ws.meta.setdefault("fingerprint", {})["http_versions"] = versions
    ws.meta["fingerprint"]["tls_versions"] = sorted(tls_versions)
    ws.note("fingerprint", ws.meta["fingerprint"])  # the file's header was written before


def _target_check(r: _Run, res: RunResult) -> None:
    """Did the target keep up with the offered rate? Completions while arrivals were still
    coming (per second of that window) against the rate, and latency's growth over the run."""
    ws = r.ws
    start = ws.column("start_ns")
    end = start + ws.column("e2e_ns")
    window = (r.issue_end_ns - r.t0) / 1e9
    if window <= 0 or len(ws) < 20:
        return
    offered = len(ws) / window
    done = float(np.count_nonzero(end <= r.issue_end_ns)) / window
    order = np.argsort(start)
    e2e = ws.column("e2e_ns")[order]
    quarter = max(1, len(e2e) // 4)
    growth = float(np.median(e2e[-quarter:]) / max(1.0, float(np.median(e2e[:quarter]))))
    res.offered_rps, res.completed_in_window_rps, res.latency_growth = offered, done, growth
    if done < _SATURATION_RATIO * offered:
        res.target_saturated = True
        res.notes.append(
            f"the TARGET is saturated: {done:.1f} req/s completed while {offered:.1f} req/s "
            f"arrived; latency (median, last vs first quarter of the run) grew {growth:.1f}×"
        )


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
