"""One scenario over several workers: processes of this machine, or Ray actors on a cluster.

Both run the same worker protocol (:mod:`._worker`) under the same driver (:mod:`._driver`):
the scenario is split (:func:`split_scenario`), the workers start together and their rows are
merged into one set with every worker's identity, clock offset and fate.
"""

from ._driver import DistributedRun, WorkerFailed, WorkerGone, drive, drive_sync
from ._local import ProcessBackend, auto_workers, run_workers, run_workers_sync, usable_cores
from ._ray import RayBackend, RayRun, run_ray, run_ray_sync
from ._results import RTT_WARN_RATIO, RTT_WARN_S, DistributedResult, WorkerReport, rtt_note
from ._split import expected_requests, phase_ns, split_scenario, splittable
from ._worker import Worker

__all__ = [
    "RTT_WARN_RATIO",
    "RTT_WARN_S",
    "DistributedResult",
    "DistributedRun",
    "ProcessBackend",
    "RayBackend",
    "RayRun",
    "Worker",
    "WorkerFailed",
    "WorkerGone",
    "WorkerReport",
    "auto_workers",
    "drive",
    "drive_sync",
    "expected_requests",
    "phase_ns",
    "rtt_note",
    "run_ray",
    "run_ray_sync",
    "run_workers",
    "run_workers_sync",
    "split_scenario",
    "splittable",
    "usable_cores",
]
