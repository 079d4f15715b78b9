"""Building frozen, slotted dataclasses at the speed of plain attribute stores.

A frozen dataclass's ``__init__`` sets its fields one ``object.__setattr__`` call at a time and
runs ``__post_init__``; for a builder that makes several per request from values it produced
and checked itself (the Recorder's spans and waterfall, a ``TCP_INFO`` reading), that is most
of the cost of building them.

:func:`unfrozen` gives such a builder a subclass of the frozen, slotted class with the same
layout (no slot or ``__dict__`` of its own) and plain attribute stores, which the interpreter
runs as direct slot writes. The builder sets every field on an instance of it, then hands the
instance its real class (``obj.__class__ = cls``): from then on it is an ordinary instance,
frozen, equal to the one the class's own constructor gives, ``type(obj) is cls``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["unfrozen"]


def unfrozen(cls: type) -> type[Any]:
    """A writable twin of the frozen slotted dataclass ``cls``, to build its instances in.

    The twin overrides both halves of the frozen ``__setattr__``/``__delattr__`` pair with
    ``object``'s own, so its type keeps the generic attribute store the interpreter
    specialises for slots. An instance is built as ``obj = object.__new__(twin)``, every field
    stored, then ``obj.__class__ = cls``; a field left unset would raise ``AttributeError``
    when read, so builders set them all, defaults included.
    """
    if "__slots__" not in cls.__dict__ or "__dict__" in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted class")
    namespace = {
        "__slots__": (),
        "__setattr__": object.__setattr__,
        "__delattr__": object.__delattr__,
        "__doc__": f"{cls.__name__} while it is being built (becomes one before anyone sees it).",
    }
    return type(f"_Unfrozen{cls.__name__}", (cls,), namespace)
