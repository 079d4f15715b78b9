"""The options of a verdict, shared by ``compare`` and ``report``: a claim and its money.

``--claim X --metric M`` checks a claimed speedup; ``--cost-per-month C``, ``--migration-cost
M`` and ``--months N`` translate the claimed and the measured speedup of ``--metric`` into
money (:mod:`latency_analyzer.analysis._money`). Every number must be above 0: argparse exits
2 naming the option otherwise.
"""

from __future__ import annotations

import argparse
import math

from ..analysis import Estimate, WaterfallSet, check_claim
from ..analysis._compare import ClaimCheck, _split, compare
from ..analysis._money import MoneyCase, money_case
from ..errors import UsageError

__all__ = ["Verdict", "add_claim_arguments", "check_verdict_options", "positive", "verdict"]

MONEY_OPTIONS = ("cost_per_month", "migration_cost", "months")


def positive(text: str) -> float:
    """An argparse type: a finite number above 0 (``1.2e6`` and ``1200000`` alike)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
    return value


def add_claim_arguments(p: argparse.ArgumentParser) -> None:
    """``--metric``, ``--claim`` and the money options."""
    p.add_argument(
        "--metric", help="the statistic of --claim and the money, e.g. ttft_p95 (Default: ttft_p95)"
    )
    p.add_argument("--claim", type=positive, metavar="X", help="claimed speedup (e.g. 15)")
    p.add_argument(
        "--cost-per-month",
        type=positive,
        metavar="C",
        help="today's serving cost per month: the claimed and measured speedups become savings",
    )
    p.add_argument(
        "--migration-cost", type=positive, metavar="M", help="one-off cost of moving (money)"
    )
    p.add_argument(
        "--months", type=positive, metavar="N", help="horizon for the saving net of migration"
    )


def check_verdict_options(args: argparse.Namespace, runs: int) -> None:
    """Options that cannot apply are errors (exit 2), never ignored.

    Raises:
        UsageError: the money options without ``--cost-per-month``, a claim or money with a
            number of runs other than two, ``--metric`` with nothing to apply it to.
    """
    money = [o for o in MONEY_OPTIONS if getattr(args, o) is not None]
    if money and args.cost_per_month is None:
        given = ", ".join("--" + o.replace("_", "-") for o in money)
        verb = "needs" if len(money) == 1 else "need"
        raise UsageError(f"{given} {verb} --cost-per-month (today's cost, which the speedup cuts)")
    wanted = (["--claim"] if args.claim is not None else []) + (
        ["--cost-per-month"] if money else []
    )
    if wanted and runs != 2:
        verb = "compares" if len(wanted) == 1 else "compare"
        raise UsageError(
            f"{' and '.join(wanted)} {verb} a baseline with a candidate: give two runs, not {runs}"
        )
    if args.metric is not None and not wanted:
        raise UsageError("--metric names the statistic of --claim or --cost-per-month: give one")


class Verdict:
    """The claim check and the money case of two runs, as the options ask."""

    def __init__(self, claim: ClaimCheck | None, money: MoneyCase | None) -> None:
        self.claim, self.money = claim, money

    def lines(self) -> list[str]:
        return ([str(self.claim)] if self.claim else []) + (
            self.money.lines() if self.money else []
        )


def verdict(
    args: argparse.Namespace, base: WaterfallSet, cand: WaterfallSet, pair_by: str = "auto"
) -> Verdict:
    """Check the claim and price the speedups of ``args.metric`` (options already checked)."""
    metric = args.metric or "ttft_p95"
    claim = None
    if args.claim is not None:
        claim = check_claim(base, cand, claimed=args.claim, metric=metric, pair_by=pair_by)
    money = None
    if args.cost_per_month is not None:
        measured = claim.measured if claim else _measured(base, cand, metric, pair_by)
        money = money_case(
            metric=metric,
            cost_per_month=args.cost_per_month,
            claimed=args.claim,
            measured=measured,
            migration_cost=args.migration_cost,
            months=args.months,
        )
    return Verdict(claim, money)


def _measured(base: WaterfallSet, cand: WaterfallSet, metric: str, pair_by: str) -> Estimate:
    name, stat = _split(metric)
    return compare(base, cand, metrics=[name], stats=[stat], pair_by=pair_by).get(metric).ratio
