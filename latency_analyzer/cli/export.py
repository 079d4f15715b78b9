"""``latency-analyzer export RUN.jsonl --har OUT [--perfetto OUT] [--otlp OUT] [--csv OUT] ...``.

Reads the waterfalls of a run file and writes each format asked for (several at once), through
the same exporters as :mod:`latency_analyzer.report`: secrets scrubbed, every file stamped with
the export schema and time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._runfile import read_run
from ..errors import UsageError
from ..timeline import Waterfall

__all__ = ["add_export_parser", "cmd_export"]

Writer = Callable[..., Any]


def _writers() -> dict[str, Writer]:
    """Format flag → writer; imported here, so the CLI starts without the exporters."""
    from ..report.chrome_trace import write_chrome_trace
    from ..report.har import write_har
    from ..report.otlp import write_otlp_json
    from ..report.row_exports import write_csv, write_parquet

    return {
        "har": write_har,
        "perfetto": write_chrome_trace,
        "otlp": write_otlp_json,
        "csv": write_csv,
        "parquet": write_parquet,
    }


_FORMATS = {
    "har": "HAR 1.2 (Chrome DevTools → Network → import)",
    "perfetto": "Chrome trace JSON for ui.perfetto.dev",
    "otlp": "OTLP JSON, one line (Jaeger, Tempo, an OTel collector)",
    "csv": "CSV, one row per request",
    "parquet": "Parquet (needs pandas and pyarrow)",
}


def _created(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def add_export_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``export RUN.jsonl --FORMAT OUT ...``."""
    p = subparsers.add_parser("export", help="write a run file as HAR, Perfetto, OTLP, CSV ...")
    p.add_argument("run", metavar="RUN.jsonl", help="written by `latency-analyzer run --out`")
    for flag, what in _FORMATS.items():
        p.add_argument(f"--{flag}", metavar="OUT", help=what)
    p.add_argument("--no-warmup", action="store_true", help="leave the run's warm-up requests out")
    p.add_argument(
        "--created",
        type=_created,
        metavar="ISO8601",
        help="the export time to stamp (default: now; fixed, files are reproducible)",
    )
    p.set_defaults(func=cmd_export)


def _waterfalls(path: str, no_warmup: bool) -> list[Waterfall]:
    return [wf for wf, tags in read_run(path) if not (no_warmup and tags.warmup)]


def cmd_export(args: argparse.Namespace) -> int:
    """Write every format asked for; exit 0 (2: no format, or a bad run file)."""
    wanted = [(flag, getattr(args, flag)) for flag in _FORMATS if getattr(args, flag)]
    if not wanted:
        raise UsageError("export: name at least one of " + ", ".join(f"--{f}" for f in _FORMATS))
    wfs = _waterfalls(args.run, args.no_warmup)
    writers = _writers()
    for flag, out in wanted:
        written = writers[flag](wfs, Path(out), created=args.created)
        print(f"{flag}: {len(wfs)} requests → {written}", file=sys.stderr)
    return 0
