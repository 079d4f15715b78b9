"""What ``sweep`` and ``search`` share: ``run``'s scenario and request flags, and the base
scenario they build, into which each point's rate or concurrency is put."""

from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..load._files import load_scenario
from ..load._presets import PRESETS
from ..load._scenario import Scenario, kind_of
from ._run_options import add_request_arguments
from .run import ARRIVAL_HELP, MODE_HELP
from .run import _scenario as run_scenario

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI
    import tomli as tomllib

__all__ = ["add_scenario_arguments", "base_scenario", "file_sweep_table"]

_TRACE = (
    "--trace / trace = {...}: a trace replays its own instants, so its load cannot be set; "
    "run it at several --speed values instead"
)


def add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    """``run``'s flags but the load level's (``--rate`` / ``--concurrency`` are the verb's)."""
    p.add_argument("scenario", nargs="?", metavar="SCENARIO.toml", help="scenario file")
    p.add_argument("--preset", choices=sorted(PRESETS), help="start from a field scenario")
    p.add_argument("--url", help="endpoint, e.g. http://host:8000/v1/chat/completions")
    p.add_argument("--mode", choices=("closed", "open"), help=MODE_HELP)
    p.add_argument(
        "--arrival", choices=("constant", "poisson", "gamma", "burst"), help=ARRIVAL_HELP
    )
    p.add_argument("--duration", type=float, metavar="SECONDS", help="of each point")
    p.add_argument("--requests", type=int, metavar="N", help="of each point")
    p.add_argument("--warmup-seconds", type=float, metavar="SECONDS", help="of each point")
    p.add_argument("--warmup-requests", type=int, metavar="N", help="of each point")
    add_request_arguments(p)
    p.add_argument(
        "--out",
        default="run.jsonl",
        metavar="FILE",
        help="the one run file every point is appended to. Default: %(default)r",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    for flag in _RUN_ONLY:  # `run`'s, refused with the reason rather than as unknown
        p.add_argument(flag, help=argparse.SUPPRESS)


#: ``run`` flags a sweep or search cannot take: each point runs on this process's loop.
_RUN_ONLY = ("--workers", "--ray", "--scrape", "--scrape-interval", "--outage-at", "--outage")


def check_run_only(args: argparse.Namespace) -> None:
    """Raises UsageError naming a ``run``-only flag that was given, and why it cannot apply."""
    for flag in _RUN_ONLY:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            raise UsageError(
                f"{flag} applies to `run` only: sweep and search run each point as one run in "
                "this process (worker processes, Ray, scraping and the outage of fault "
                "injection are not part of a point)"
            )


def base_scenario(args: argparse.Namespace, key: str, first: float) -> Scenario:
    """The scenario of ``args`` with ``key`` (``rate`` or ``concurrency``) at ``first`` and
    the loop that level belongs to (a rate: open; a concurrency: closed).

    Raises:
        UsageError: ``--mode`` names the other loop, or the scenario replays a trace (a
            trace is its own schedule: its load is ``--speed``).
    """
    check_run_only(args)
    want = "open" if key == "rate" else "closed"
    if args.mode is not None and args.mode != want:
        flag = "--rate" if key == "rate" else "--concurrency"
        raise UsageError(
            f"--mode {args.mode}: a load in {flag} is {'an open' if want == 'open' else 'a closed'}"
            f" loop's (mode {want!r})"
        )
    if args.trace is not None:
        raise UsageError(_TRACE)
    ns = copy.copy(args)
    ns.mode = want
    ns.rate = first if key == "rate" else None
    ns.concurrency = int(first) if key == "concurrency" else None
    sc = run_scenario(ns)
    if sc.trace is not None:
        raise UsageError(_TRACE)
    return sc


def file_sweep_table(path: str | None) -> dict[str, Any]:
    """The scenario file's ``[sweep]`` table (empty without a file).

    Raises:
        UsageError: a key other than ``rate`` or ``concurrency``, or levels that are not a
            list of positive numbers; the message names the file and the key.
    """
    if not path:
        return {}
    table = _sweep_table(path)
    out: dict[str, Any] = {}
    for key, levels in table.items():
        if key not in ("rate", "concurrency"):
            raise UsageError(f"{path}: [sweep] key {key!r}: expected 'rate' or 'concurrency'")
        ok = isinstance(levels, list) and levels and all(_positive(v, key) for v in levels)
        if not ok:
            what = "whole numbers" if key == "concurrency" else "finite numbers"
            raise UsageError(f"{path}: [sweep] {key}: expected a list of {what} > 0")
        out[key] = [float(v) if key == "rate" else int(v) for v in levels]
    return out


def _sweep_table(path: str) -> dict[str, Any]:
    """The file's ``[sweep]`` table, read before the scenario is built (the scenario needs the
    level that the table gives). A file that does not read is :func:`load_scenario`'s to
    report, with its own words."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        load_scenario(path)  # raises the file's error
        raise
    table = data.get("sweep", {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: key 'sweep': expected a table, got {kind_of(table)}")
    return table


def _positive(v: Any, key: str) -> bool:
    kinds = (int,) if key == "concurrency" else (int, float)
    return isinstance(v, kinds) and not isinstance(v, bool) and math.isfinite(v) and v > 0
