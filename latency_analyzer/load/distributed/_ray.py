"""Workers as Ray async actors: the same worker protocol, spread over a cluster.

::

    from latency_analyzer.load import Scenario, run_ray_sync

    sc = Scenario(url, mode="open", rate=400, arrival="poisson", duration=60)
    result = run_ray_sync(sc, workers=8, address="auto", path="run.jsonl")
    print(result.summary().to_text())       # one merged set; per-worker identity kept

Needs the ``[ray]`` extra; ray is imported only when a run starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ...errors import UsageError
from .._scenario import Scenario
from ._driver import DistributedRun, Handle, WorkerFailed, WorkerGone, drive, drive_sync
from ._results import DistributedResult
from ._worker import Worker

__all__ = ["RayBackend", "RayRun", "run_ray", "run_ray_sync"]


class _RayWorker(Worker):
    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())


class _ActorHandle:
    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def call(self, method: str, *args: Any) -> Any:
        ray = _import_ray()
        try:
            return await getattr(self.actor, method).remote(*args)
        except ray.exceptions.RayActorError as exc:  # the process is gone
            raise WorkerGone(_first_line(exc)) from exc
        except ray.exceptions.RayError as exc:  # RayTaskError: the call raised
            raise WorkerFailed(_first_line(exc)) from exc

    async def release(self) -> None:
        _import_ray().kill(self.actor)


class RayBackend:
    """Starts each worker as a Ray actor.

    Args:
        address: a Ray cluster (``"auto"``, ``"ray://head:10001"``); None starts a local
            one bound to loopback (``ray.init(num_cpus=workers)``). When Ray is already
            initialised in this process, that cluster is used and ``address`` ignored.
        worker_cpus: CPUs each actor reserves.
        runtime_env: passed to the actors (e.g. ``{"pip": ["latency-analyzer"]}``).
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        worker_cpus: float = 1.0,
        runtime_env: Mapping[str, Any] | None = None,
    ) -> None:
        self.address, self.worker_cpus, self.runtime_env = address, worker_cpus, runtime_env

    async def start(self, parts: list[Scenario], options: list[dict[str, Any]]) -> list[Handle]:
        ray = _import_ray()
        if not ray.is_initialized():
            await asyncio.to_thread(_init_ray, ray, self.address, len(parts))
        cls = ray.remote(_RayWorker).options(
            num_cpus=self.worker_cpus,
            scheduling_strategy="SPREAD",  # one per node while nodes last: the point of it
            runtime_env=dict(self.runtime_env) if self.runtime_env else None,
        )
        return [
            _ActorHandle(cls.remote(i, sc, opts))
            for i, (sc, opts) in enumerate(zip(parts, options, strict=True))
        ]


class RayRun(DistributedRun):
    """A :class:`DistributedRun` on Ray actors; ``address``, ``worker_cpus`` and
    ``runtime_env`` are :class:`RayBackend`'s, the rest :class:`DistributedRun`'s.

    Raises:
        UsageError: ray is not installed, or the scenario cannot be split.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        workers: int,
        address: str | None = None,
        worker_cpus: float = 1.0,
        runtime_env: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        backend = RayBackend(address, worker_cpus, runtime_env)
        super().__init__(scenario, workers=workers, backend=backend, **options)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("the ray backend needs Ray: pip install 'latency-analyzer[ray]'") from None
    return ray


def _init_ray(ray: Any, address: str | None, workers: int) -> None:
    """Connect to ``address``, or start a local Ray bound to loopback when it is None."""
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return
    ray.init(
        num_cpus=max(1, workers),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )


async def run_ray(scenario: Scenario, *, workers: int, **options: Any) -> DistributedResult:
    """Run ``scenario`` over ``workers`` Ray actors; ``options`` are :class:`RayRun`'s.

    Raises:
        UsageError: ray is missing or the scenario cannot be split.
    """
    _import_ray()
    return await drive(RayRun(scenario, workers=workers, **options))


def run_ray_sync(scenario: Scenario, *, workers: int, **options: Any) -> DistributedResult:
    """:func:`run_ray` from synchronous code (the first Ctrl-C interrupts cleanly)."""
    _import_ray()
    return drive_sync(RayRun(scenario, workers=workers, **options))
