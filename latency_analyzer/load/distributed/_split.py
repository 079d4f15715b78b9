"""Sharing one scenario out over N workers so that together they offer its load."""

from __future__ import annotations

from typing import Any

from ...errors import UsageError
from .._scenario import Scenario

__all__ = ["expected_requests", "phase_ns", "split_scenario", "splittable"]


def _share(total: int, n: int, i: int) -> int:
    """Worker i's part of ``total`` split as evenly as possible (the first ones get one more)."""
    return total // n + (1 if i < total % n else 0)


def splittable(sc: Scenario, workers: int) -> int:
    """The most workers, up to ``workers``, that ``sc`` can be shared out to (a closed loop
    needs a user per worker, a request count a request per worker)."""
    n = workers
    if _in_order(sc):
        return 1
    if sc.mode == "closed":
        n = min(n, sc.concurrency)
    if sc.requests is not None:
        n = min(n, sc.requests)
    return max(1, n)


def split_scenario(sc: Scenario, workers: int) -> list[Scenario]:
    """The scenario each of ``workers`` runs; together they offer ``sc``'s load.

    Open loop: rate / N each, seeds ``seed·1000 + i`` (independent streams). Closed loop:
    ``concurrency`` users shared out. ``requests``, ``warmup_requests`` and ``max_in_flight``
    are shared out too; ``duration``, ``warmup_seconds`` and ``ramp_up`` are the same for all.

    Raises:
        UsageError: fewer than one worker, or fewer users / requests than workers.
    """
    if workers < 1:
        raise UsageError("workers must be >= 1")
    if workers > 1 and _in_order(sc):
        raise UsageError(
            "a trace, or a dataset sampled in order, runs in one process (workers would "
            'each send it from the start); a dataset with sample = "random" can be shared'
        )
    if sc.mode == "closed" and sc.concurrency < workers:
        raise UsageError(f"{sc.concurrency} users cannot be shared by {workers} workers")
    if sc.requests is not None and sc.requests < workers:
        raise UsageError(f"{sc.requests} requests cannot be shared by {workers} workers")
    return [_part(sc, workers, i) for i in range(workers)]


def _in_order(sc: Scenario) -> bool:
    """The scenario sends rows of a file in their order: one sequence, one process."""
    in_order = sc.dataset is not None and sc.dataset.get("sample") == "sequential"
    return in_order or sc.trace is not None


def _part(sc: Scenario, n: int, i: int) -> Scenario:
    changes: dict[str, Any] = {
        "seed": sc.seed * 1000 + i,  # same seeds would make N copies of one stream: bursts
        "warmup_requests": _share(sc.warmup_requests, n, i),
    }
    if sc.mode == "open" and sc.rate is not None:
        changes["rate"] = sc.rate / n
    if sc.mode == "closed":
        changes["concurrency"] = _share(sc.concurrency, n, i)
    if sc.requests is not None:
        changes["requests"] = _share(sc.requests, n, i)
    if sc.max_in_flight is not None:
        changes["max_in_flight"] = max(1, _share(sc.max_in_flight, n, i))
    return sc.replace(**changes)


def phase_ns(sc: Scenario, workers: int, i: int) -> int:
    """Worker i's offset from the common start: ``i / rate`` for constant arrivals, so the
    merged schedule is the one-process schedule (every 1/R), not N requests at once every
    N/R; 0 otherwise (independent random streams need no phase)."""
    if sc.mode == "open" and sc.arrival == "constant" and sc.rate:
        return round(i / sc.rate * 1e9)
    return 0


def expected_requests(sc: Scenario) -> float | None:
    """Requests a (worker's) scenario is expected to issue, if the scenario fixes it."""
    if sc.mode == "open" and sc.arrival == "burst":
        return sc.requests
    by_time = None
    if sc.mode == "open" and sc.duration is not None and sc.rate and sc.ramp_up == 0:
        by_time = sc.rate * sc.duration
    counts = [c for c in (by_time, sc.requests) if c is not None]
    return float(min(counts)) if counts else None
