"""``latency-analyzer demo``: loopback servers with known delays, probed and diagnosed."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_demo_parser", "cmd_demo"]


def add_demo_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` (``--json``: the waterfalls as JSON lines)."""
    d = subparsers.add_parser(
        "demo", help="start loopback servers with known delays and probe them"
    )
    d.add_argument("--json", action="store_true", help="print the waterfalls as JSON lines")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo; imported here, so the other verbs start without the test bed."""
    from ..demo import run_demo

    return run_demo(as_json=args.json, colour=sys.stdout.isatty())
