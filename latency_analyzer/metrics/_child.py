"""The parser child process: ``python -m latency_analyzer.metrics._child``.

Reads length-prefixed pickles ``(text, content_type)`` on stdin and answers each, in order, with
``("ok", [(family, type, name, labels, value), ...])`` or ``("err", reason)`` on stdout. Not
imported by the package, so running it as ``__main__`` imports it exactly once.
"""

from __future__ import annotations

import pickle
import signal
import sys
from typing import Any, BinaryIO

from ._parse import MetricsParseError, parse

HEAD = 8  # bytes of the big-endian length prefix


def _answer(text: str, ctype: str | None) -> tuple[str, Any]:
    try:
        samples = parse(text, ctype)
    except MetricsParseError as exc:
        return "err", exc.message
    return "ok", [(s.family, s.type, s.name, s.labels, s.value) for s in samples]


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """The child's loop: one answer per request until EOF."""
    while True:
        head = inp.read(HEAD)
        if len(head) < HEAD:
            return
        text, ctype = pickle.loads(inp.read(int.from_bytes(head, "big")))
        blob = pickle.dumps(_answer(text, ctype), protocol=pickle.HIGHEST_PROTOCOL)
        out.write(len(blob).to_bytes(HEAD, "big") + blob)
        out.flush()


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group: the parent finishes its run (a last scrape
    # included) and then closes our stdin, which is when we end
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout.buffer)
