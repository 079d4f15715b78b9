"""``latency-analyzer search --slo KEY=DURATION,... --rate-max R``: the highest open-loop rate
that meets every SLO.

Probes ``--rate-max``, halves the rate until a probe passes, then bisects the bracket until it
is within ``--resolution`` (see :func:`latency_analyzer.load.search`). Every probe is a
complete run appended to ``--out`` (rows tagged ``step``); the output is the rate found, the
last passing and the first failing probe with the goodput of each. A failing probe during
which the client lagged is run again (``--repeat-lagged``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from ..capture import batching
from ..errors import UsageError
from ..load._search import parse_resolution, search
from ._load_verbs import add_scenario_arguments, base_scenario
from .sweep import point_line

__all__ = ["add_search_parser", "cmd_search"]


def add_search_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``search``: the run options of ``run``, the SLO and the rates."""
    p = subparsers.add_parser("search", help="find the highest open-loop rate that meets an SLO")
    add_scenario_arguments(p)
    p.add_argument(
        "--rate-max", type=float, metavar="REQ_PER_S", help="the first and highest rate probed"
    )
    p.add_argument(
        "--rate-min",
        type=float,
        metavar="REQ_PER_S",
        help="the lowest rate probed (default: --rate-max / 16)",
    )
    p.add_argument(
        "--resolution",
        type=_resolution,
        default=0.05,
        metavar="SHARE",
        help="stop once the first failing rate is within this share above the last passing "
        "one, e.g. 5%% or 0.05. Default: 5%%",
    )
    p.add_argument(
        "--repeat-lagged",
        type=_count,
        default=1,
        metavar="N",
        help="run a failing probe again, up to N times, when the client itself lagged during "
        "it (its latencies then include client delay). Default: 1",
    )
    # flags of `run` that cannot apply to a search: given, they are an error that says why
    p.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_search)


def _resolution(text: str) -> float:
    try:
        return parse_resolution(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def _check(args: argparse.Namespace) -> None:
    """Raises UsageError for what a search cannot take, naming the option."""
    if not args.slo:
        raise UsageError("--slo is required: the search looks for the highest rate meeting it")
    if args.rate_max is None:
        raise UsageError("--rate-max is required: the first and highest rate probed")
    if args.concurrency is not None or args.mode == "closed":
        flag = "--concurrency" if args.concurrency is not None else "--mode closed"
        raise UsageError(
            f"{flag}: a search varies the rate of an open loop; a closed loop's load is its "
            "concurrency (use sweep --concurrency)"
        )
    if args.rate is not None:
        raise UsageError("--rate: the search chooses the rates; give --rate-max (and --rate-min)")
    if not (math.isfinite(args.rate_max) and args.rate_max > 0):
        raise UsageError(f"--rate-max must be a finite number > 0, got {args.rate_max:g}")
    if args.rate_min is not None and not 0 < args.rate_min < args.rate_max:
        raise UsageError(f"--rate-min must lie between 0 and --rate-max, got {args.rate_min:g}")


def cmd_search(args: argparse.Namespace) -> int:
    """Search, print each probe and the verdict (exit 0 when a rate meets the SLO, else 1)."""
    _check(args)
    sc = base_scenario(args, "rate", args.rate_max)
    echo = None if args.json else (lambda p: print(point_line(p), flush=True))
    found = batching.run(
        search(
            sc,
            args.slo,
            rate_max=args.rate_max,
            rate_min=args.rate_min,
            resolution=args.resolution,
            path=args.out,
            on_point=echo,
            repeat_lagged=args.repeat_lagged,
        ),
        sc.read_batching,
    )
    if args.json:
        print(json.dumps(found.to_dict()))
    else:
        print("\n".join(found.lines()))
    print(f"run file written to {args.out}", file=sys.stderr)
    return 0 if found.rate is not None else 1
