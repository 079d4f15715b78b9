"""Read the waterfalls of a run file (``latency-analyzer run --out``) back, one at a time.

A :class:`~latency_analyzer.analysis.WaterfallSet` keeps columns; the CLI's ``diagnose``,
``export`` and ``report`` need the waterfalls themselves (TLS facts, token times, spans).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from .analysis import SET_SCHEMA, Tags
from .errors import UsageError
from .timeline import Waterfall

__all__ = ["check_run_file", "read_run"]


def check_run_file(path: str | Path) -> None:
    """Raise unless ``path`` is a readable run file (its header, and its first request).

    For what loads a run as columns (``WaterfallSet.load``), so that a wrong file is named as
    such rather than failing later with what its missing rows lead to.

    Raises:
        UsageError: as :func:`read_run` does, naming the file, the line and the reason.
    """
    for _ in read_run(path):
        return


def read_run(path: str | Path) -> Iterator[tuple[Waterfall, Tags]]:
    """Each request of the run file at ``path`` with its tags, in file order.

    A damaged line (a run that crashed mid-write) is skipped, as ``WaterfallSet.load`` does.

    Raises:
        UsageError: the file cannot be read, is not a run file, or a request does not parse;
            the message names the file, the line and the reason.
    """
    p = Path(path)
    try:
        f = p.open(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{p}: cannot read the run file ({exc.strerror})") from None
    with f:
        for number, line in enumerate(f, start=1):
            try:
                obj = json.loads(line)
            except ValueError:
                if number == 1:
                    raise UsageError(f"{p}: line 1 is not JSON; not a run file") from None
                continue
            if number == 1:
                if not isinstance(obj, dict) or obj.get("kind") != "run":
                    raise UsageError(f"{p}: line 1 is not a run header; not a run file")
                if obj.get("schema") != SET_SCHEMA:
                    raise UsageError(f"{p}: schema {obj.get('schema')!r}, expected {SET_SCHEMA}")
            if isinstance(obj, dict) and obj.get("kind") == "wf":
                try:
                    wf = Waterfall.from_dict(obj["wf"])
                    tags = Tags.from_dict(obj.get("tags", {}))
                except (KeyError, TypeError, ValueError) as exc:
                    raise UsageError(f"{p}: line {number}: not a waterfall ({exc})") from None
                yield wf, tags
