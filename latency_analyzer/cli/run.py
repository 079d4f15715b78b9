"""``latency-analyzer run SCENARIO.toml``: a load run, its summary and its run file.

``add_run_parser`` adds the verb to the top-level parser of ``latency_analyzer.cli`` and sets
``func`` on it, which ``main`` calls. On a terminal, a run draws a progress line on stderr
(count, elapsed time, ETA and, for an open loop, the achieved rate).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..capture import batching
from ..errors import UsageError
from ..load._files import load_scenario, scenario_preset
from ..load._presets import PRESETS, length_buckets, preset_scenario, run_fault_injection
from ..load._progress import ProgressLine
from ..load._runner import Progress, RunResult, run
from ..load._scenario import Scenario
from ..load._slo import slo_report
from ..load.distributed import auto_workers, run_ray_sync, run_workers_sync
from ..metrics import Scraper, Target, summary_text
from ._run_options import add_request_arguments, finish_scenario, request_overrides

__all__ = ["ARRIVAL_HELP", "MODE_HELP", "add_run_parser", "cmd_run"]

_OUTAGE_AT, _OUTAGE_S = 3.0, 1.0  # the fault_injection run's outage: start, length (s)

MODE_HELP = "closed: users send again once answered; open: arrivals on a schedule (--rate)"
ARRIVAL_HELP = (
    "open loop: how arrivals are spaced (gamma: burstier than poisson; burst: all at t=0)"
)


def add_run_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``run``: a scenario file or a preset, flags override; writes the set as JSONL."""
    p = subparsers.add_parser(
        "run",
        help="run a load scenario and summarise it",
        description="Run a load scenario (a file, a --preset, or flags alone with --url) and "
        "print its summary; flags override the file's keys.",
    )
    p.add_argument("scenario", nargs="?", metavar="SCENARIO.toml", help="scenario file")
    p.add_argument("--preset", choices=sorted(PRESETS), help="start from a field scenario")
    p.add_argument("--url", help="endpoint, e.g. http://host:8000/v1/chat/completions")
    p.add_argument("--mode", choices=("closed", "open"), help=MODE_HELP)
    p.add_argument("--concurrency", type=int, metavar="N", help="closed loop: users")
    p.add_argument("--rate", type=float, metavar="REQ_PER_S", help="open loop: arrivals per second")
    p.add_argument(
        "--arrival", choices=("constant", "poisson", "gamma", "burst"), help=ARRIVAL_HELP
    )
    p.add_argument(
        "--duration", type=float, metavar="SECONDS", help="seconds during which requests start"
    )
    p.add_argument("--requests", type=int, metavar="N", help="requests to send")
    p.add_argument(
        "--warmup-seconds",
        type=float,
        metavar="SECONDS",
        help="requests starting in the first SECONDS are left out of the statistics",
    )
    p.add_argument(
        "--warmup-requests",
        type=int,
        metavar="N",
        help="the first N requests are left out of the statistics",
    )
    add_request_arguments(p)
    p.add_argument(
        "--out",
        default="run.jsonl",
        metavar="FILE",
        help="the run file (JSONL) for compare, diagnose, export, report. Default: %(default)r",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--outage-at",
        type=float,
        metavar="SECONDS",
        help=f"--preset fault_injection: when the target goes down (default: {_OUTAGE_AT:g})",
    )
    p.add_argument(
        "--outage",
        type=float,
        metavar="SECONDS",
        help=f"--preset fault_injection: how long it stays down (default: {_OUTAGE_S:g})",
    )
    p.add_argument(
        "--scrape",
        action="append",
        default=[],
        metavar="URL",
        help="a Prometheus /metrics endpoint to scrape during the run (repeatable)",
    )
    p.add_argument(
        "--scrape-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between scrapes. Default: %(default)r",
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on Ray workers: 'local' (start one here), 'auto' or 'ray://host:10001'",
    )
    p.add_argument(
        "--workers",
        type=_workers,
        default="auto",
        metavar="N",
        help="processes sharing the load (Ray workers with --ray); 'auto': the usable cores "
        "(half of them for a server on this host, as a loopback address or localhost says; a "
        "port forwarded to another machine looks the same), as far as the load needs them "
        "(one per 128 users, per 150 arrivals/s) and the scenario can be split. "
        "Default: %(default)r",
    )
    p.set_defaults(func=cmd_run)


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of workers: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("--workers must be >= 1")
    return n


def _local_workers(args: argparse.Namespace, sc: Scenario) -> int:
    """Worker processes for a run here: a given count, or 'auto' (the usable cores, as far as
    the load needs them and the scenario splits); a scrape or a fault-injection hook keeps
    the run in one process."""
    if args.scrape:
        return 1
    return auto_workers(sc) if args.workers == "auto" else int(args.workers)


def _scenario(args: argparse.Namespace) -> Scenario:
    flags = {
        k: getattr(args, k)
        for k in ("url", "mode", "concurrency", "rate", "arrival", "duration", "requests")
    }
    flags["warmup_seconds"] = args.warmup_seconds
    flags["warmup_requests"] = args.warmup_requests
    given = {k: v for k, v in flags.items() if v is not None} | request_overrides(args)
    if not args.scenario and args.url is None:
        raise UsageError(
            "no target: give --url URL (e.g. http://host:8000/v1/chat/completions), or a "
            "SCENARIO.toml whose url names it"
        )
    if args.scenario:
        return finish_scenario(load_scenario(args.scenario, **given)[0], args)
    if args.preset:
        return finish_scenario(preset_scenario(args.preset, **given), args)
    return finish_scenario(Scenario.from_dict(given), args)


def _progress(sc: Scenario) -> tuple[Progress | None, Callable[[], None]]:
    """A progress line on a terminal's stderr: count, elapsed, ETA (and rate, open loop)."""
    line = ProgressLine(sc)
    return (line if line.enabled else None), line.close


def cmd_run(args: argparse.Namespace) -> int:
    """Run, write the set to ``--out``, print the summary (exit 1 if any request failed;
    130 on Ctrl-C, after the requests in flight are stored as cancelled)."""
    sc = _scenario(args)
    preset = args.preset or _file_preset(args.scenario)
    if preset != "fault_injection" and (args.outage_at is not None or args.outage is not None):
        raise UsageError(
            "--outage-at / --outage apply only to the fault_injection scenario (--preset "
            'fault_injection, or preset = "fault_injection" in the file): no other run takes '
            "its target down"
        )
    update, stop = _progress(sc)
    extra: dict[str, Any] = {}
    try:
        if preset == "fault_injection":
            fr = batching.run(
                run_fault_injection(
                    sc,
                    outage_at=_OUTAGE_AT if args.outage_at is None else args.outage_at,
                    outage_s=_OUTAGE_S if args.outage is None else args.outage,
                    path=args.out,
                    progress=update,
                ),
                sc.read_batching,
            )
            result, extra["outage"] = fr.run, fr.outage.to_dict()
        elif args.ray:
            address = None if args.ray == "local" else args.ray
            workers = 2 if args.workers == "auto" else args.workers
            result = run_ray_sync(sc, workers=workers, path=args.out, address=address)
        elif _local_workers(args, sc) > 1:
            result = run_workers_sync(sc, workers=_local_workers(args, sc), path=args.out)
            if getattr(result, "interrupted", False):
                raise KeyboardInterrupt  # reported below, as a run in one process is
        else:
            running = run(sc, path=args.out, progress=update, scraper=_scraper(args))
            result = batching.run(running, sc.read_batching)
    except KeyboardInterrupt:  # asyncio.run cancelled the run, which stored and noted it
        stop()
        print(
            f"latency-analyzer: interrupted; requests in flight were recorded as cancelled "
            f"and the run file {args.out} says so",
            file=sys.stderr,
        )
        return 130
    finally:
        stop()
    if preset == "long_tail":
        extra["length_buckets"] = {
            k: {**v, "ttft_p99": v["ttft_p99"].value, "e2e_p99": v["e2e_p99"].value}
            for k, v in length_buckets(result.set).items()
        }
    if args.json and result.set.meta.get("lengths"):  # requested against received lengths
        extra["lengths"] = result.set.meta["lengths"]
    if args.slo:  # the SLO lines join the summary's notes; --json gets them as a table
        report = slo_report(result.set, args.slo)
        result.notes.extend(report.lines())
        if args.json:
            extra["slo"] = report.to_dict()
    _print_run(result, args, extra)
    return 0 if result.set.counts()["errors"] == 0 else 1


def _file_preset(path: str | None) -> str | None:
    """The ``preset = "NAME"`` of a scenario file (it decides how the run is driven)."""
    return None if not path else scenario_preset(path)


def _scraper(args: argparse.Namespace) -> Scraper | None:
    if not args.scrape:
        return None
    path = Path(args.out).with_suffix(".metrics.jsonl")
    return Scraper([Target(url) for url in args.scrape], interval=args.scrape_interval, path=path)


def _print_run(result: RunResult, args: argparse.Namespace, extra: dict[str, Any]) -> None:
    summary = result.summary()
    if args.json:
        print(json.dumps({**summary.to_dict(), "run": result.to_dict(), **extra}))
        return
    print(summary.to_text())
    if result.metrics is not None:
        print(summary_text(result.metrics))
    for key, value in extra.items():
        print(f"{key}: {json.dumps(value)}")
    print(f"run file written to {args.out}", file=sys.stderr)
