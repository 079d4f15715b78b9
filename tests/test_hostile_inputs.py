"""Inputs a user or a server controls, outside the receivers: OTLP JSON-lines fed in small
pieces, bad scenario files, a scrape target's charset, and Ctrl-C during a run."""

from __future__ import annotations

import json
import time

from latency_analyzer.server import OTLPJsonLinesParser


def _feed_cpu(text: bytes, piece: int) -> float:
    best = float("inf")
    for _ in range(3):
        parser = OTLPJsonLinesParser()
        t = time.process_time()
        for i in range(0, len(text), piece):
            parser.feed(text[i : i + piece])
        parser.close()
        best = min(best, time.process_time() - t)
        assert parser.errors == []
    return best


def test_json_lines_fed_in_small_pieces_take_linear_time() -> None:
    """A long line fed 16 bytes at a time: 4× the line costs at most 6× the CPU time
    (min of 3 runs). Each feed used to search the whole pending line again."""

    def line(size: int) -> bytes:
        return json.dumps({"resourceSpans": [], "pad": "x" * size}).encode() + b"\n"

    t1, t4 = _feed_cpu(line(128 * 1024), 16), _feed_cpu(line(512 * 1024), 16)
    assert t4 <= 6 * max(t1, 1e-3), (t1, t4)
