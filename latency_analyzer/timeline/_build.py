"""Freezing checked values held in a dict, without paying for the checks again.

:class:`Prechecked` builds a slotted dataclass from a dict of field values that a builder
checked already, through the class's writable twin (:mod:`._unfrozen`). The Recorder, which
makes one waterfall per request, stores its fields on the twin directly, without the dict.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

from ._unfrozen import unfrozen
from ._waterfall import Waterfall

__all__ = ["Prechecked", "prechecked_waterfall"]

T = TypeVar("T")


class Prechecked(Generic[T]):
    """Builds instances of the slotted dataclass ``cls`` from a dict of field values.

    For builders that hold the class's invariants already (what its ``__post_init__`` would
    establish: a read-only ``attributes`` mapping, ...). Absent fields take their defaults;
    an unknown or missing required field raises ``TypeError`` as the constructor would.
    """

    __slots__ = ("_cls", "_names", "_plan", "_required", "_twin")

    def __init__(self, cls: type[T]) -> None:
        plan = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # a dataclass, by contract
            factory = None if f.default_factory is dataclasses.MISSING else f.default_factory
            default = None if f.default is dataclasses.MISSING else f.default
            plan.append((f.name, default, factory))
        self._cls = cls
        self._twin = unfrozen(cls)
        self._plan: tuple[tuple[str, Any, Any], ...] = tuple(plan)
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
        if not values.keys() <= self._names:
            unknown = ", ".join(sorted(values.keys() - self._names))
            raise TypeError(f"{self._cls.__name__}: not its fields: {unknown}")
        obj = object.__new__(self._twin)
        for name, default, factory in self._plan:
            if name in values:
                setattr(obj, name, values[name])
            else:
                setattr(obj, name, default if factory is None else factory())
        obj.__class__ = self._cls
        built: T = obj
        return built


prechecked_waterfall = Prechecked(Waterfall)
