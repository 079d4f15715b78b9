"""Trace replay: a request log sent again at its own instants, an open loop.

A scenario's ``trace`` table::

    mode = "open"
    trace = {path = "trace.jsonl", speed = 4.0}

* ``path``: a ``.jsonl`` file (one object a line) or a ``.csv`` file (a header row).
* ``timestamp``: the key or column of each request's arrival (default ``"timestamp"``), a
  number in ``time_unit`` (``"s"``, the default, or ``"ms"``); any origin (epoch seconds or
  from 0), non-decreasing.
* ``prompt``: the key or column of the prompt text (default ``"prompt"``), or, where a row has
  none, ``input_tokens`` (default ``"input_tokens"``): that many filler words.
* ``output_tokens``: the key or column of the ``max_tokens`` asked for (default
  ``"output_tokens"``; optional).
* ``speed``: 2 replays twice as fast (every gap halved).

Row *i* is scheduled at ``t0 + (timestamp_i - timestamp_0) / speed``: that instant is its
intended start, so a late send shows as ``schedule_lag`` and latency counts from the schedule.
Each request's ``sample`` tag is its line (JSONL) or data row (CSV), from 1.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ._datasets import json_lines, table_path

__all__ = ["TraceRow", "load_trace"]

_KEYS = ("path", "speed", "timestamp", "time_unit", "prompt", "input_tokens", "output_tokens")
_UNITS = {"s": 1.0, "ms": 1e-3}


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace.

    Attributes:
        offset_ns: its instant after the first row's, divided by the speed.
        tag: its line or row number.
        prompt: its text (None: ``input_tokens`` filler words).
        input_tokens: prompt length for a row without text.
        output_tokens: ``max_tokens`` to ask for (None: not sent).
    """

    offset_ns: int
    tag: str
    prompt: str | None
    input_tokens: int | None
    output_tokens: int | None


def load_trace(spec: Mapping[str, Any]) -> list[TraceRow]:
    """Read the trace a scenario's ``trace`` table describes.

    Raises:
        UsageError: an unknown key, an unreadable file, a row without a timestamp or with one
            earlier than the row before, a row with neither prompt nor input length; the
            message names the file, the row and the key.
    """
    path = table_path(spec, _KEYS, "trace", "a .jsonl or a .csv file")
    speed = spec.get("speed", 1.0)
    bad_speed = isinstance(speed, bool) or not isinstance(speed, int | float)
    if bad_speed or not math.isfinite(speed) or speed <= 0:
        raise UsageError("trace key 'speed': expected a number > 0")
    unit = spec.get("time_unit", "s")
    if unit not in _UNITS:
        raise UsageError(f"trace key 'time_unit': expected one of {list(_UNITS)}, got {unit!r}")
    names = {k: spec.get(k, k) for k in ("timestamp", "prompt", "input_tokens", "output_tokens")}
    for key, value in names.items():
        if not isinstance(value, str):
            raise UsageError(f"trace key {key!r}: expected a key or column name")
    rows = _rows(Path(path))
    if not rows:
        raise UsageError(f"trace {path}: no rows")
    out: list[TraceRow] = []
    first = last = None
    for tag, where, row in rows:
        ts = _number(row.get(names["timestamp"]), where, names["timestamp"])
        if last is not None and ts < last:
            raise UsageError(f"{where}: {names['timestamp']!r} goes back in time")
        first = ts if first is None else first
        last = ts
        offset = round((ts - first) * _UNITS[unit] / speed * 1e9)
        prompt = row.get(names["prompt"])
        length = None
        if prompt in (None, ""):
            prompt = None
            raw = row.get(names["input_tokens"])
            if raw in (None, ""):
                raise UsageError(
                    f"{where}: neither {names['prompt']!r} nor {names['input_tokens']!r}"
                )
            length = _count(raw, where, names["input_tokens"])
        elif not isinstance(prompt, str):
            raise UsageError(f"{where}: {names['prompt']!r} must be text")
        raw_out = row.get(names["output_tokens"])
        output = None if raw_out in (None, "") else _count(raw_out, where, names["output_tokens"])
        out.append(TraceRow(offset, tag, prompt, length, output))
    return out


def _rows(p: Path) -> list[tuple[str, str, Mapping[str, Any]]]:
    try:
        text = p.read_text("utf-8")
    except OSError as exc:
        raise UsageError(f"trace {p}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"trace {p}: not UTF-8 text") from None
    if p.suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        return [(str(n), f"trace {p}, row {n}", row) for n, row in enumerate(reader, 1)]
    if p.suffix != ".jsonl":
        raise UsageError(f"trace {p}: expected a .jsonl or a .csv file")
    out: list[tuple[str, str, Mapping[str, Any]]] = []
    for n, where, row in json_lines(text, f"trace {p}"):
        if not isinstance(row, dict):
            raise UsageError(f"{where}: expected a JSON object")
        out.append((str(n), where, row))
    return out


def _number(value: Any, where: str, key: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise UsageError(f"{where}: {key!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"{where}: {key!r} missing or not a finite number")
    return float(value)


def _count(value: Any, where: str, key: str) -> int:
    number = _number(value, where, key)
    if number < 1 or number != int(number):
        raise UsageError(f"{where}: {key!r} must be a whole number >= 1")
    return int(number)
