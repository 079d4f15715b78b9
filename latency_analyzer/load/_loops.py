"""The two loops: open (arrivals on a schedule, latency from the intended start) and closed
(users who send, wait, think and send again; conversations turn by turn)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..capture.client import redact_url
from ..timeline import Recorder, Waterfall
from ._dists import arrival_gaps
from ._monitor import Pacer
from ._run_state import Claim, RunState

__all__ = ["PREPARE_AHEAD_NS", "closed_loop", "open_loop"]

#: How long before its instant a request is handed to the client, which prepares it then and
#: sends it at the instant (``Client.request`` with an ``intended_start_ns`` still to come):
#: requests due together leave together instead of one after another's Python work.
PREPARE_AHEAD_NS = 20_000_000


async def _send(
    run: RunState,
    body: dict[str, Any],
    intended: int | None,
    on_cancel: Callable[[Waterfall], None],
    answer: list[str] | None = None,
) -> Waterfall:
    return await run.client.request(
        run.sc.url, json=body, intended_start_ns=intended, on_cancel=on_cancel, answer=answer
    )


def _unsent(run: RunState, intended: int) -> Waterfall:
    """The row of a request cancelled before it was sent (waiting for a client slot)."""
    now = time.perf_counter_ns()
    rec = Recorder("POST", redact_url(run.sc.url), start_ns=now, intended_start_ns=intended)
    rec.fail("cancelled", "cancelled while waiting for a client slot", now)
    return rec.finish(now)


# -- open loop ---------------------------------------------------------------------------------
def _schedule(run: RunState) -> Iterator[int]:
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
    run: RunState,
    slots: asyncio.Semaphore | None,
    claim: Claim,
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


async def open_loop(run: RunState, pacer: Pacer) -> None:
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
                await pacer.wait_until(intended - PREPARE_AHEAD_NS)
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
async def _user(run: RunState, user: int) -> None:
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

        def cancelled(wf: Waterfall, c: Claim = claimed, i: int = index) -> None:
            run.store(wf, c, run.warm(i, wf.start_ns))

        wf = await _send(run, claimed.body, None, cancelled, answer)
        run.store(wf, claimed, run.warm(index, wf.start_ns))
        if turns and answer is not None and wf.ok:
            await _conversation(run, claimed, answer)
        if sc.think_time is not None:
            await asyncio.sleep(sc.think_time.sample(run.rng))


async def _conversation(run: RunState, first: Claim, answer: list[str]) -> None:
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

        def cancelled(wf: Waterfall, c: Claim = claim, i: int = index) -> None:
            run.store(wf, c, run.warm(i, wf.start_ns))

        wf = await _send(run, claim.body, None, cancelled, answer)
        run.store(wf, claim, run.warm(index, wf.start_ns))
        if not wf.ok:
            return


async def closed_loop(run: RunState) -> None:
    await asyncio.sleep(max(0, run.t0 - time.perf_counter_ns()) / 1e9)  # users start at t0
    await asyncio.gather(*(_user(run, u) for u in range(run.sc.concurrency)))
    run.issue_end_ns = time.perf_counter_ns()
