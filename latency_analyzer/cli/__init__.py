"""``latency-analyzer``: probe and diagnose a URL, run, sweep and search load, compare and
export runs, or demo.

One module per verb; each adds its parser and sets ``func``, which ``main`` calls.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing

if "numpy" not in sys.modules:
    # numpy's OpenBLAS starts a thread per core at import, and they spin after every call:
    # 0.13 s of CPU at each start on a 2-core machine, on the cores a run's traffic needs. The
    # CLI makes no call that a BLAS thread pool would speed up; its worker processes inherit
    # this. A value the user set is kept.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .. import __version__, _redact, errors
from . import compare, demo, diagnose, export, probe, report, run, search, sweep

if typing.TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latency-analyzer",
        description="Say where every millisecond of a request went: probe and diagnose a URL, "
        "run load, compare, diagnose, export and report runs, or watch the demo.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    probe.add_probe_parser(sub)
    demo.add_demo_parser(sub)
    run.add_run_parser(sub)
    sweep.add_sweep_parser(sub)
    search.add_search_parser(sub)
    compare.add_compare_parser(sub)
    diagnose.add_diagnose_parser(sub)
    export.add_export_parser(sub)
    report.add_report_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status (1: a request failed, 2: a
    usage error, 130: interrupted by Ctrl-C)."""
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: the shell's convention, 128 + SIGINT, no traceback
        print("latency-analyzer: interrupted", file=sys.stderr)
        return 130
    except (errors.UsageError, errors.RequestError, OSError) as exc:
        print(f"latency-analyzer: {_redact.redact_text(str(exc))}", file=sys.stderr)
        return 2
