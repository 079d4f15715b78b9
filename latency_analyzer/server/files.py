"""OTLP JSON-lines files, as the OpenTelemetry file exporter writes them.

One ``TracesData`` JSON object per line, hex ids, 64-bit integers (timestamps) as strings.
``OTLPJsonLinesParser`` is sans-IO (``feed(bytes)`` → spans, ``close()``); a bad line is
counted in ``errors`` and skipped, so one torn line does not lose the file.
"""

from __future__ import annotations

from pathlib import Path

from .spans import PayloadError, ServerSpan, decode_otlp_json

__all__ = ["OTLPJsonLinesParser", "read_otlp_jsonl"]

_MAX_LINE = 64 * 1024 * 1024


class OTLPJsonLinesParser:
    """Incremental reader of OTLP JSON lines.

    Args:
        max_line: longest line kept, in bytes; a longer one is dropped and counted.

    Attributes:
        errors: lines that were not OTLP JSON (or too long), with their 1-based numbers.
    """

    def __init__(self, max_line: int = _MAX_LINE) -> None:
        self.max_line = max_line
        self.errors: list[tuple[int, str]] = []
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline
        self._line = 0
        self._skipping = False

    def feed(self, data: bytes) -> list[ServerSpan]:
        """Spans from every line that ``data`` completes.

        Each byte is searched for a newline once, however small the pieces: feeding a long
        line a few bytes at a time costs time linear in its length.
        """
        out: list[ServerSpan] = []
        buffer = self._buffer
        buffer += data
        start = 0
        while (end := buffer.find(b"\n", max(start, self._scanned))) >= 0:
            line = bytes(buffer[start:end])
            start = end + 1
            out += self._line_done(line)
        del buffer[:start]
        if self._skipping or len(buffer) > self.max_line:
            self._skipping = True
            buffer.clear()
        self._scanned = len(buffer)
        return out

    def close(self) -> list[ServerSpan]:
        """Spans of a last line without a newline."""
        line, self._buffer, self._scanned = bytes(self._buffer), bytearray(), 0
        return self._line_done(line) if line.strip() or self._skipping else []

    def _line_done(self, line: bytes) -> list[ServerSpan]:
        self._line += 1
        if self._skipping:
            self._skipping = False
            self.errors.append((self._line, f"line over {self.max_line} bytes"))
            return []
        if not line.strip():
            return []
        try:
            return decode_otlp_json(line)
        except PayloadError as exc:
            self.errors.append((self._line, exc.message))
            return []


def read_otlp_jsonl(path: str | Path) -> tuple[list[ServerSpan], list[tuple[int, str]]]:
    """All spans of an OTLP JSON-lines file, and the (line, reason) of lines skipped."""
    parser = OTLPJsonLinesParser()
    spans: list[ServerSpan] = []
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            spans += parser.feed(chunk)
    spans += parser.close()
    return spans, parser.errors
