"""``latency-analyzer report RUN.jsonl [RUN2.jsonl] -o report.html``: one self-contained page.

The page (:mod:`latency_analyzer.report.page`) needs no network when it is opened: CSS inline,
plots as ``data:`` PNGs, waterfalls as inline SVG. With two runs, the second is compared with
the first (speedup = first / second); ``--claim`` and ``--cost-per-month`` add the verdict:
the claim checked, and the claimed and the measured speedup in money.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._runfile import read_run
from ..analysis import WaterfallSet
from ..errors import UsageError
from ._verdict import add_claim_arguments, check_verdict_options, verdict

__all__ = ["add_report_parser", "cmd_report"]


def add_report_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``report RUN.jsonl [RUN2.jsonl] -o OUT.html``."""
    p = subparsers.add_parser(
        "report", help="write one self-contained HTML page for a run (or two)"
    )
    p.add_argument(
        "runs", nargs="+", metavar="RUN.jsonl", help="one run, or a baseline and a candidate"
    )
    p.add_argument(
        "-o",
        "--out",
        default="report.html",
        metavar="OUT.html",
        help="the page to write. Default: %(default)r",
    )
    p.add_argument("--title", help="the page's title (default: the run files' names)")
    p.add_argument(
        "--slowest", type=int, default=3, metavar="N", help="waterfalls shown per run (Default: 3)"
    )
    add_claim_arguments(p)
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    """Write the page; exit 0 (2: a bad run file, more than two runs, matplotlib missing)."""
    if len(args.runs) > 2:
        raise UsageError(f"report takes one run or two, got {len(args.runs)}")
    check_verdict_options(args, len(args.runs))
    from ..report.page import Run, report_page

    runs = []
    for path in args.runs:
        rows = list(read_run(path))
        if not rows:
            raise UsageError(f"{path}: the run file holds no requests")
        runs.append(
            Run(
                Path(path).stem,
                [wf for wf, _ in rows],
                WaterfallSet.load(path),
                [tags.warmup for _, tags in rows],
            )
        )
    sections = []
    if len(runs) == 2 and (args.claim is not None or args.cost_per_month is not None):
        from ..report._verdict import verdict_html

        v = verdict(args, runs[0].set, runs[1].set)
        sections.append(("Verdict", verdict_html(v.claim, v.money)))
    page = report_page(runs, title=args.title, slowest=args.slowest, sections=sections)
    out = Path(args.out)
    out.write_text(page, encoding="utf-8")
    print(f"report written to {out}", file=sys.stderr)
    return 0
