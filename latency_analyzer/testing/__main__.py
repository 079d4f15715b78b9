"""Run the test bed from the command line.

``python -m latency_analyzer.testing [--decode S] [--prefill S] ...`` serves an
:class:`~latency_analyzer.testing.LLMServer` and a :class:`~latency_analyzer.testing.DNSServer`
on loopback until interrupted, printing their addresses. ``llm-server CONFIG_JSON`` is the
child side of :meth:`LLMServer.run_in_subprocess`, ``h2-server CONFIG_JSON`` that of
:meth:`H2LLMServer.run_in_subprocess` and ``bed CONFIG_JSON`` that of
:class:`~latency_analyzer.testing.TestBed` (none is meant for humans).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable

from ._priority import realtime
from .bed import serve_bed
from .dns_server import DNSServer
from .h2_server import serve_h2_in_child
from .llm import LLMServer
from .llm.child import serve_in_child

#: The child processes' verbs: each takes its configuration as one JSON argument.
_CHILDREN: dict[str, Callable[[str], None]] = {
    "llm-server": serve_in_child,
    "h2-server": serve_h2_in_child,
    "bed": serve_bed,
}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m latency_analyzer.testing",
        description="Serve the loopback LLM and DNS test servers until interrupted.",
    )
    for knob in ("header_delay", "queue", "prefill", "decode"):
        parser.add_argument(f"--{knob.replace('_', '-')}", type=float, default=0.0, metavar="S")
    parser.add_argument("--tokens", type=int, default=16, metavar="N")
    parser.add_argument("--dns-delay", type=float, default=0.0, metavar="S")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    knobs = {k: getattr(args, k) for k in ("header_delay", "queue", "prefill", "decode", "tokens")}
    async with LLMServer(**knobs) as llm, DNSServer(delay=args.dns_delay) as dns:
        print(f"LLM server: {llm.url}/v1   DNS server: {dns.nameserver}", flush=True)
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m latency_analyzer.testing``."""
    argv = sys.argv[1:] if argv is None else argv
    child = _CHILDREN.get(argv[0]) if argv else None
    if child is not None:
        realtime()  # ground truth that host load cannot delay, where the OS allows it
        child(argv[1])
        return
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(_parse(argv)))


if __name__ == "__main__":
    main()
