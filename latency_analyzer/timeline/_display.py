"""Presentation the model offers without importing it: ``wf.plot()``, ``wf.diagnose()``,
notebook reprs.

The model names what it wants (``"waterfall.plot"``); the layers that draw and diagnose register
a function under that name, the way pandas registers its plotting backend and IPython its
formatters. The package root registers the project's own (``latency_analyzer._presenters``), and
importing any part of the package runs the root first, so the hooks are always there; the model
itself imports no presentation code, lazily or not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UsageError

__all__ = ["present", "register_presenter"]

_PRESENTERS: dict[str, Callable[..., Any]] = {}


def register_presenter(name: str, fn: Callable[..., Any]) -> None:
    """Make ``fn`` the function behind ``name`` (a later registration replaces an earlier)."""
    _PRESENTERS[name] = fn


def present(name: str, *args: Any, **kwargs: Any) -> Any:
    """Call the function registered for ``name``.

    Raises:
        UsageError: nothing is registered under ``name``.
    """
    fn = _PRESENTERS.get(name)
    if fn is None:
        raise UsageError(f"no presenter is registered for {name!r}")
    return fn(*args, **kwargs)
