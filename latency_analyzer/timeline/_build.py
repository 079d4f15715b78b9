"""Freezing a Recorder's marks without paying for checks they already passed.

``Waterfall()`` (a frozen dataclass) sets its fields one ``object.__setattr__`` at a time and
copies its attributes; for the Recorder, which builds one per request from values it produced
itself, :func:`prechecked_waterfall` sets the same slots directly. The result is an ordinary
``Waterfall``, equal to the one ``Waterfall(**values)`` gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ._waterfall import Waterfall

__all__ = ["prechecked_waterfall"]

_Setter = Callable[[Waterfall, Any], None]


def _plan() -> tuple[tuple[str, _Setter, Any, Callable[[], Any] | None], ...]:
    """(name, slot setter, default, default factory) of every field, in declaration order."""
    plan = []
    for f in dataclasses.fields(Waterfall):
        factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
        default = None if f.default is dataclasses.MISSING else f.default
        plan.append((f.name, Waterfall.__dict__[f.name].__set__, default, factory))
    return tuple(plan)


_PLAN = _plan()
_REQUIRED = frozenset(
    f.name
    for f in dataclasses.fields(Waterfall)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)
_new = object.__new__


def prechecked_waterfall(values: dict[str, Any]) -> Waterfall:
    """A ``Waterfall`` of ``values`` (field name → value; absent fields take their defaults).

    For builders that hold its invariants already: ``attributes`` is a read-only mapping no one
    else can change, every span was checked when it was made. Unknown names raise ``TypeError``
    as ``Waterfall()`` would; a missing required field too.
    """
    if not values.keys() >= _REQUIRED:
        raise TypeError(f"missing fields: {', '.join(sorted(_REQUIRED - values.keys()))}")
    wf: Waterfall = _new(Waterfall)
    used = 0
    for name, setter, default, factory in _PLAN:
        if name in values:
            setter(wf, values[name])
            used += 1
        else:
            setter(wf, default if factory is None else factory())
    if used != len(values):
        unknown = values.keys() - {name for name, *_ in _PLAN}
        raise TypeError(f"not Waterfall fields: {', '.join(sorted(unknown))}")
    return wf
