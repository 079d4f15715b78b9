"""``latency-analyzer compare A B [C ...]``: speedups with CIs, claims checked and priced, and
whether several runs reproduce within a tolerance."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .._runfile import check_run_file
from ..analysis import WaterfallSet, compare
from ..analysis._reproduce import Reproduction, parse_tolerance, reproduce
from ..errors import UsageError
from ._verdict import add_claim_arguments, check_verdict_options, verdict

__all__ = ["add_compare_parser", "cmd_compare"]


def _tolerance(text: str) -> float:
    try:
        return parse_tolerance(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_compare_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``compare A B [C ...]``: two runs give speedups with CIs (``--claim X`` checks a
    claim, ``--cost-per-month C`` prices it); ``--within 5%`` says whether the runs reproduce."""
    p = subparsers.add_parser(
        "compare", help="compare two runs (baseline, candidate), or check that runs reproduce"
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN.jsonl",
        help="a baseline and a candidate; or two runs or more with --within",
    )
    p.add_argument(
        "--within",
        type=_tolerance,
        metavar="X",
        help="tolerance the runs must reproduce within: 5%% or 0.05 (needs two runs or more)",
    )
    add_claim_arguments(p)
    p.add_argument(
        "--pair-by",
        choices=("auto", "name", "position"),
        help="pair scenarios by name, by position, or by name when shared (Default: auto)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_compare)


def _names(paths: list[str]) -> list[str]:
    """Each run's file name without ``.jsonl``; the path as given when two stems clash."""
    stems = [Path(p).stem for p in paths]
    return stems if len(set(stems)) == len(stems) else list(paths)


def cmd_compare(args: argparse.Namespace) -> int:
    """Print the comparison and the verdicts.

    Exit status 1 when ``--claim`` is not supported or, with ``--within``, a statistic does
    not reproduce; 2 on a bad option or file.
    """
    n = len(args.runs)
    if n < 2:
        if args.within is not None:
            raise UsageError(f"--within needs two runs or more, got {n}")
        raise UsageError("compare needs two runs: a baseline and a candidate")
    if n > 2 and args.within is None:
        raise UsageError(
            f"{n} runs are compared for reproduction: give the tolerance, e.g. --within 5%"
        )
    if n > 2 and args.pair_by is not None:
        raise UsageError(f"--pair-by pairs the scenarios of two runs; it cannot apply to {n}")
    check_verdict_options(args, n)
    for path in args.runs:
        check_run_file(path)  # a wrong file is named, not left to fail in the statistics
    sets = [WaterfallSet.load(p) for p in args.runs]
    out: dict[str, Any] = {}
    text: list[str] = []
    failed = False
    if n == 2:
        pair_by = args.pair_by or "auto"
        comp = compare(sets[0], sets[1], pair_by=pair_by)
        v = verdict(args, sets[0], sets[1], pair_by)
        out = comp.to_dict()
        text.append(comp.to_text())
        if v.claim is not None:
            out["claim"] = {"text": str(v.claim), "verdict": v.claim.verdict}
            failed = v.claim.verdict == "not supported"
        if v.money is not None:
            out["money"] = {**v.money.to_dict(), "text": v.money.lines()}
        text += v.lines()
    if args.within is not None:
        rep: Reproduction = reproduce(sets, within=args.within, names=_names(args.runs))
        out["reproduction"] = rep.to_dict()
        text.append(rep.to_text())
        failed = failed or not rep.reproduces
    print(json.dumps(out) if args.json else "\n".join(text))
    return 1 if failed else 0
