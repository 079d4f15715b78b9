"""Run the test bed from the command line.

``python -m latency_analyzer.testing [--decode S] [--prefill S] [--slots N] ...`` serves an
:class:`~latency_analyzer.testing.LLMServer` and a :class:`~latency_analyzer.testing.DNSServer`
on loopback until interrupted, printing the chat completions URL and the DNS server's address.
``llm-server CONFIG_JSON`` is the child side of :meth:`LLMServer.run_in_subprocess`,
``h2-server CONFIG_JSON`` that of :meth:`H2LLMServer.run_in_subprocess` and ``bed CONFIG_JSON``
that of :class:`~latency_analyzer.testing.TestBed` (none is meant for humans).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
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


_KNOBS = {  # option → what it injects (seconds)
    "header_delay": "from the request read to the response headers",
    "queue": "after the headers, a scheduler queue before prefill",
    "prefill": "from the end of the queue to the first token",
    "decode": "between consecutive tokens",
}


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m latency_analyzer.testing",
        description=(
            "Serve the loopback LLM and DNS test servers until interrupted (Ctrl-C). The first "
            "line printed is the URL to give latency-analyzer (probe URL, run --url URL)."
        ),
    )
    for knob, what in _KNOBS.items():
        parser.add_argument(
            f"--{knob.replace('_', '-')}",
            type=float,
            default=0.0,
            metavar="S",
            help=f"seconds {what} (default: 0)",
        )
    parser.add_argument(
        "--tokens",
        type=int,
        default=16,
        metavar="N",
        help="output tokens per response (default: 16)",
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=0,
        metavar="N",
        help="requests served at once, the others queued in arrival order (default: 0, no limit; "
        "1 with a fixed --prefill makes an M/D/1 queue, whose knee a sweep shows)",
    )
    parser.add_argument(
        "--dns-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds the DNS server waits before each answer (default: 0)",
    )
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    knobs = {k: getattr(args, k) for k in ("header_delay", "queue", "prefill", "decode", "tokens")}
    llm_server = LLMServer(**knobs, slots=args.slots)
    async with llm_server as llm, DNSServer(delay=args.dns_delay) as dns:
        print(f"LLM server: {llm.url}/v1/chat/completions   DNS server: {dns.nameserver}")
        body = '{"messages": [{"role": "user", "content": "hi"}], "stream": true}'
        print(f"  e.g. latency-analyzer probe {llm.url}/v1/chat/completions -d '{body}'")
        print(f"       latency-analyzer run --url {llm.url}/v1/chat/completions", flush=True)
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m latency_analyzer.testing``."""
    argv = sys.argv[1:] if argv is None else argv
    child = _CHILDREN.get(argv[0]) if argv else None
    if child is not None:
        realtime()  # ground truth that host load cannot delay, where the OS allows it
        # what the imports made is never scanned again: a full collection over it stopped the
        # server's loop for tens of ms (requests then sat unread in its socket)
        gc.collect()
        gc.freeze()
        child(argv[1])
        return
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(_parse(argv)))


if __name__ == "__main__":
    main()
