"""``latency-analyzer compare A B``: speedups with confidence intervals, and claims checked."""

from __future__ import annotations

import argparse
import json

from ..analysis import WaterfallSet, check_claim, compare

__all__ = ["add_compare_parser", "cmd_compare"]


def add_compare_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``compare A B``: speedups with CIs; ``--claim X --metric ttft_p95`` checks a claim."""
    p = subparsers.add_parser("compare", help="compare two runs (baseline, candidate)")
    p.add_argument("baseline", metavar="A.jsonl")
    p.add_argument("candidate", metavar="B.jsonl")
    p.add_argument("--metric", default="ttft_p95", help="for --claim. Default: %(default)r")
    p.add_argument("--claim", type=float, metavar="X", help="claimed speedup (e.g. 15)")
    p.add_argument(
        "--pair-by",
        choices=("auto", "name", "position"),
        default="auto",
        help="pair scenarios by name, by position, or by name when shared (Default: auto)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    """Print the comparison; with ``--claim``, exit 1 when the claim is not supported."""
    base, cand = WaterfallSet.load(args.baseline), WaterfallSet.load(args.candidate)
    comp = compare(base, cand, pair_by=args.pair_by)
    claim = None
    if args.claim is not None:
        claim = check_claim(
            base, cand, claimed=args.claim, metric=args.metric, pair_by=args.pair_by
        )
    if args.json:
        out = comp.to_dict()
        if claim is not None:
            out["claim"] = {"text": str(claim), "verdict": claim.verdict}
        print(json.dumps(out))
    else:
        print(comp.to_text())
        if claim is not None:
            print(claim)
    return 1 if claim is not None and claim.verdict == "not supported" else 0
