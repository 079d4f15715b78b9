"""``run``: one scenario in this process, over worker processes, or over Ray actors."""

from __future__ import annotations

from typing import Any

from ..capture import batching
from ..errors import UsageError
from . import _runner
from ._runner import RunResult
from ._scenario import Scenario
from .distributed import run_ray, run_workers

__all__ = ["run", "run_sync"]

#: Options only a run in this process can honour: callables and objects of this process.
_IN_PROCESS_ONLY = (
    "hooks",
    "progress",
    "scraper",
    "spans",
    "worker",
    "step",
    "start_ns",
    "on_row",
    "stop",
)


async def run(
    scenario: Scenario,
    *,
    workers: int = 1,
    backend: str = "local",
    address: str | None = None,
    **options: Any,
) -> RunResult:
    """Run ``scenario`` and return its set and self-check.

    Args:
        scenario: what to run.
        workers: processes that share the load. 1 runs it on this event loop (every option
            of :func:`latency_analyzer.load._runner.run` applies: ``path``, ``headers``,
            ``hooks``, ``progress``, ``scraper``, ...). More split the scenario over that
            many worker processes of this machine (``backend="local"``) or Ray actors
            (``backend="ray"``, ``address``: None starts a local Ray, or ``"auto"`` /
            ``"ray://host:port"``), started together and merged into one set; they take
            ``path``, ``headers`` and ``rtt_samples`` (and the distributed run's own options).
        backend: ``"local"`` or ``"ray"``.

    Raises:
        UsageError: an unknown backend, an option a distributed run cannot honour, or a
            scenario that cannot be split over ``workers``.
    """
    if backend not in ("local", "ray"):
        raise UsageError(f"backend must be 'local' or 'ray', not {backend!r}")
    if workers == 1 and backend == "local":
        return await _runner.run(scenario, **options)
    given = [k for k in _IN_PROCESS_ONLY if options.get(k)]
    if given:
        raise UsageError(f"a run over {workers} workers cannot take {', '.join(given)}")
    if backend == "ray":
        return await run_ray(scenario, workers=workers, address=address, **options)
    return await run_workers(scenario, workers=workers, **options)


def run_sync(scenario: Scenario, **kwargs: Any) -> RunResult:
    """``run`` from synchronous code, on an event loop of its own that batches reads over
    the scenario's ``read_batching`` (see :mod:`latency_analyzer.capture.batching`)."""
    return batching.run(run(scenario, **kwargs), scenario.read_batching)
