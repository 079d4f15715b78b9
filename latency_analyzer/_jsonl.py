"""A buffered JSON-lines file: what a long run streams to disk as it goes.

Lines are buffered and written in batches, so a crash loses at most the last unflushed batch
and a run's memory does not grow with its length. Used by ``WaterfallSet`` (rows) and
``MetricSeries`` (scrapes), whose file handling is :class:`Streamed`'s; a leaf module that
imports nothing else of the package.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

__all__ = ["JsonlWriter", "Streamed"]

#: One encoder for every line (``json.dumps`` with separators builds a new one per call).
_encode = json.JSONEncoder(separators=(",", ":")).encode


def _fastest_dumps() -> Callable[[Any], bytes] | None:
    """orjson's ``dumps`` when installed, handing what the standard library encodes its own
    way (a str or int subclass) or refuses (a dataclass, a datetime) back to it."""
    try:
        import orjson
    except ImportError:
        return None
    option = (
        orjson.OPT_PASSTHROUGH_DATACLASS
        | orjson.OPT_PASSTHROUGH_DATETIME
        | orjson.OPT_PASSTHROUGH_SUBCLASS
    )

    def refuse(obj: Any) -> Any:
        raise TypeError(f"{type(obj).__name__} is left to the standard library")

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj, default=refuse, option=option)

    return dumps


_orjson_dumps = _fastest_dumps()

S = TypeVar("S", bound="Streamed")


class JsonlWriter:
    """Appends JSON objects as lines to ``path`` (created anew).

    Args:
        path: the file.
        flush_every: buffered lines that trigger a write + flush (at counted appends).
        fsync: also ``os.fsync`` on every flush (survives a machine crash, costs a disk sync).
    """

    def __init__(self, path: Path, *, flush_every: int, fsync: bool = False) -> None:
        self._file: IO[str] | None = path.open("w", encoding="utf-8")
        self._lines: list[str] = []
        self._flush_every = max(1, flush_every)
        self._fsync = fsync

    def append(self, obj: Mapping[str, Any], *, counts: bool = True) -> None:
        """Buffer one line; flush when ``counts`` and the buffer holds ``flush_every`` lines."""
        self._lines.append(_encode(obj))
        if counts and len(self._lines) >= self._flush_every:
            self.flush()

    def append_row(self, obj: Mapping[str, Any]) -> None:
        """:meth:`append` for the lines a run writes one per request: encoded by orjson when
        it is installed (a third of the standard library's time). It writes a non-finite
        float as ``null`` (JSON has no NaN), an Enum as its value and a UUID as its text; a
        row it would encode otherwise than the standard library (a str or int subclass), or
        cannot encode (an integer beyond 64 bits, a key that is not a string, a numpy
        scalar), goes the standard library's way whole, NaN written as ``NaN``."""
        if _orjson_dumps is None:
            self._lines.append(_encode(obj))
        else:
            try:
                self._lines.append(_orjson_dumps(obj).decode())
            except TypeError:  # orjson's JSONEncodeError
                self._lines.append(_encode(obj))
        if len(self._lines) >= self._flush_every:
            self.flush()

    def write_now(self, obj: Mapping[str, Any]) -> None:
        """Write one line at once, after what is buffered (headers, notes)."""
        self.append(obj, counts=False)
        self.flush()

    def flush(self) -> None:
        """Write the buffered lines and flush them to the OS."""
        if self._file is None:
            return
        if self._lines:
            self._file.write("\n".join(self._lines) + "\n")
            self._lines.clear()
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Flush and close; later calls do nothing."""
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None


class Streamed:
    """Data held in memory and, when it has a file, streamed to it: ``flush``, ``close`` and
    ``with`` for a class whose ``_out`` is its :class:`JsonlWriter` (None: memory only)."""

    _out: JsonlWriter | None = None

    def flush(self) -> None:
        """Write buffered lines to the file now."""
        if self._out is not None:
            self._out.flush()

    def close(self) -> None:
        """Flush and close the file (what is in memory stays usable)."""
        if self._out is not None:
            self._out.close()
            self._out = None

    def __enter__(self: S) -> S:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
