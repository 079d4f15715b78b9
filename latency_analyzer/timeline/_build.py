"""Freezing values that were checked already, without paying for the checks again.

A frozen dataclass's ``__init__`` sets its fields one ``object.__setattr__`` at a time and runs
``__post_init__``; for a builder that makes one per request from values it produced itself (the
Recorder's waterfall), :class:`Prechecked` sets the same slots directly.
The result is an ordinary instance, equal to the one the class's own constructor gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._waterfall import Waterfall

__all__ = ["Prechecked", "prechecked_waterfall"]

T = TypeVar("T")


class Prechecked(Generic[T]):
    """Builds instances of the slotted dataclass ``cls`` from a dict of field values.

    For builders that hold the class's invariants already (what its ``__post_init__`` would
    establish: a read-only ``attributes`` mapping, ...). Absent fields take their defaults;
    an unknown or missing required field raises ``TypeError`` as the constructor would.
    """

    __slots__ = ("_cls", "_names", "_plan", "_required")

    def __init__(self, cls: type[T]) -> None:
        plan = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # a dataclass, by contract
            factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
            default = None if f.default is dataclasses.MISSING else f.default
            plan.append((f.name, cls.__dict__[f.name].__set__, default, factory))
        self._cls = cls
        self._plan: tuple[tuple[str, Callable[[T, Any], None], Any, Any], ...] = tuple(plan)
        self._names = frozenset(name for name, *_ in plan)
        self._required = frozenset(
            f.name
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]  # as above
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )

    def __call__(self, values: dict[str, Any]) -> T:
        if not values.keys() >= self._required:
            missing = ", ".join(sorted(self._required - values.keys()))
            raise TypeError(f"{self._cls.__name__}: missing fields: {missing}")
        obj: T = object.__new__(self._cls)
        used = 0
        for name, setter, default, factory in self._plan:
            if name in values:
                setter(obj, values[name])
                used += 1
            else:
                setter(obj, default if factory is None else factory())
        if used != len(values):
            unknown = ", ".join(sorted(values.keys() - self._names))
            raise TypeError(f"{self._cls.__name__}: not its fields: {unknown}")
        return obj


prechecked_waterfall = Prechecked(Waterfall)
