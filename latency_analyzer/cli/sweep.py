"""``latency-analyzer sweep``: one run per load level, all in one run file, the knee marked.

Levels come from ``--rate 5,10,20`` (an open loop), ``--concurrency 1,4,16`` (a closed loop) or
the scenario file's ``[sweep]`` table; the flags win over the table. Every point is a complete
run appended to ``--out`` (rows tagged ``step``); the summary has a line per point and the knee
(:func:`latency_analyzer.load.knee`: the point of maximum curvature of a latency percentile
against load), and the plot (``--plot``, a PNG by default beside ``--out``) shows the curves.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from ..capture import batching
from ..errors import UsageError
from ..load._knee import KNEE_METRICS, LoadPoint, knee
from ..load._search import sweep_points
from ._load_verbs import add_scenario_arguments, base_scenario, file_sweep_table

__all__ = ["add_sweep_parser", "cmd_sweep", "point_line"]

KNEE_RULE = "max. curvature"


def add_sweep_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``sweep``: the run options of ``run``, and the levels."""
    p = subparsers.add_parser(
        "sweep", help="run at several rates or concurrencies; latency against load, the knee"
    )
    add_scenario_arguments(p)
    p.add_argument(
        "--rate", type=_levels(float), metavar="R1,R2,...", help="open-loop rates (req/s)"
    )
    p.add_argument(
        "--concurrency", type=_levels(int), metavar="N1,N2,...", help="closed-loop users"
    )
    p.add_argument(
        "--knee-metric",
        choices=KNEE_METRICS,
        default="e2e_p95",
        help="the curve whose knee is marked. Default: %(default)r",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="the plot's file (default: --out with .png; none without matplotlib)",
    )
    p.set_defaults(func=cmd_sweep)


def _levels(kind: type[float] | type[int]) -> argparse._ActionType:
    def parse(text: str) -> list[float] | list[int]:
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected numbers separated by commas: {text!r}"
            ) from None
        if not values or any(not (math.isfinite(v) and v > 0) for v in values):
            raise argparse.ArgumentTypeError(
                f"expected finite numbers > 0 separated by commas: {text!r}"
            )
        return values

    return parse


def _key_levels(args: argparse.Namespace) -> tuple[str, Sequence[float]]:
    """The sweep's key and levels: the flags, else the file's ``[sweep]`` table.

    Raises:
        UsageError: both or neither of ``--rate`` and ``--concurrency`` (in the flags or in
            the table).
    """
    if args.rate and args.concurrency:
        raise UsageError("--rate and --concurrency: a sweep varies one of them, not both")
    if args.rate:
        return "rate", args.rate
    if args.concurrency:
        return "concurrency", args.concurrency
    table = file_sweep_table(args.scenario)
    if len(table) == 2:
        raise UsageError(f"{args.scenario}: [sweep] has rate and concurrency; keep one")
    if not table:
        raise UsageError(
            "nothing to sweep: give --rate R1,R2,... or --concurrency N1,N2,... (or a [sweep] "
            "table in the scenario file)"
        )
    key, levels = next(iter(table.items()))
    return key, levels


def point_line(p: LoadPoint) -> str:
    """One point of a sweep or search, for people."""
    unit = "req/s" if p.key == "rate" else "users"
    lat = p.latency_ns

    def three(metric: str) -> str:
        vals = [lat.get(f"{metric}_p{q}", math.nan) for q in (50, 95, 99)]
        if all(math.isnan(v) for v in vals):
            return f"{metric} -"
        return f"{metric} " + "/".join("-" if math.isnan(v) else f"{v / 1e6:.1f}" for v in vals)

    text = (
        f"step {p.step}: {p.level:.4g} {unit}: achieved {p.achieved_rps:.3g} req/s; P50/P95/P99 "
        f"ms: {three('ttft')}, {three('tpot')}, {three('e2e')}"
    )
    if p.slo is not None:
        goodput = p.slo.goodput_rps
        text += f"; {_unshown(p)}goodput {goodput:.3g} req/s, SLO {'met' if p.met else 'NOT met'}"
    if p.errors:
        text += f"; {p.errors} errors"
    if not p.follows:
        text += "; achieved < 90% of offered"
    if p.client_note is not None:
        text += f"; {p.client_note}"
    return text


def _unshown(p: LoadPoint) -> str:
    """The SLO statistics the line does not already show (``e2e_mean 15.2 ms, ``), so a
    verdict can be read against its figure; the P50/P95/P99 of TTFT, TPOT and e2e are there."""
    assert p.slo is not None
    shown = {f"{m}_p{q}" for m in ("ttft", "tpot", "e2e") for q in (50, 95, 99)}
    out = ""
    for slo, value in zip(p.slo.slos, p.slo.measured_ns, strict=True):
        if slo.key not in shown:
            out += f"{slo.key} {'-' if math.isnan(value) else f'{value / 1e6:.1f}'} ms, "
    return out


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run every level, print a line per point and the knee, write the plot (exit 1 if any
    request failed)."""
    key, levels = _key_levels(args)
    plot = _plot_path(args)
    sc = base_scenario(args, key, levels[0])
    echo = None if args.json else (lambda p: print(point_line(p), flush=True))
    rates, users = (levels, ()) if key == "rate" else ((), [int(v) for v in levels])
    points = batching.run(
        sweep_points(
            sc, rate=rates, concurrency=users, path=args.out, slos=args.slo or (), on_point=echo
        ),
        sc.read_batching,
    )
    bend = knee(points, args.knee_metric)
    if plot is not None:
        _write_plot(points, bend, args, plot)
    if args.json:
        out = {
            "points": [p.to_dict() for p in points],
            "knee": _knee_dict(bend, args.knee_metric),
            "plot": None if plot is None else str(plot),
        }
        print(json.dumps(out))
    else:
        print(_knee_text(bend, args.knee_metric))
        saturated = [p for p in points if not p.follows]
        if saturated:
            print(
                f"achieved rate stops following the offered rate at {saturated[0].level:g} req/s "
                "(under 90% of it)"
            )
    print(
        f"run file written to {args.out}" + ("" if plot is None else f", plot to {plot}"),
        file=sys.stderr,
    )
    return 0 if all(p.errors == 0 for p in points) else 1


def _knee_text(bend: LoadPoint | None, metric: str) -> str:
    rule = (
        f"the point of maximum curvature of {metric} against load: furthest below the line "
        "from the lightest to the heaviest load, both scaled to [0, 1]"
    )
    if bend is None:
        return f"knee: none found ({rule}; needs 3 points and a latency that grows)"
    unit = "req/s" if bend.key == "rate" else "users"
    value = bend.latency_ns[metric] / 1e6
    return f"knee: {bend.level:g} {unit}, {metric} {value:.1f} ms ({rule})"


def _knee_dict(bend: LoadPoint | None, metric: str) -> dict[str, object] | None:
    if bend is None:
        return None
    return {"step": bend.step, bend.key: bend.level, "metric": metric, "rule": "max_curvature"}


def _plot_path(args: argparse.Namespace) -> Path | None:
    """Where the plot goes: ``--plot``, else ``--out`` with ``.png`` when matplotlib is there.

    Raises:
        UsageError: ``--plot`` given without matplotlib (before anything runs).
    """
    have = importlib.util.find_spec("matplotlib") is not None
    if args.plot is not None:
        if not have:
            raise UsageError("--plot needs matplotlib: pip install 'latency-analyzer[plots]'")
        return Path(args.plot)
    if not have:
        print("latency-analyzer: no plot (matplotlib is not installed)", file=sys.stderr)
        return None
    return Path(args.out).with_suffix(".png")


def _write_plot(
    points: list[LoadPoint], bend: LoadPoint | None, args: argparse.Namespace, path: Path
) -> None:
    from ..report.load_plot import LoadCurve, plot_load_curve

    metrics = ("e2e_p50", "e2e_p95", "e2e_p99", "ttft_p95")
    curve = LoadCurve(
        key=points[0].key,
        levels=[p.level for p in points],
        latency_ns={m: [p.latency_ns[m] for p in points] for m in metrics},
        achieved_rps=[p.achieved_rps for p in points],
        knee=None if bend is None else bend.level,
        knee_rule=f"{KNEE_RULE} of {args.knee_metric}",
        title=f"sweep of {points[0].key}: {Path(args.out).name}",
        passed=[p.met for p in points],
        knee_metric=args.knee_metric,
    )
    plot_load_curve(curve).savefig(path, dpi=110)
