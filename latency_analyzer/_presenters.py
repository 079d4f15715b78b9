"""The project's presenters behind the model's ``plot``, ``diagnose`` and notebook reprs.

Each loads its layer on first call (matplotlib and the diagnosis rules stay unimported until a
plot or a finding is asked for). The package root imports this module, which is what keeps the
model (``timeline``) and the set (``analysis._set``) free of imports from ``report`` and from
``analysis.diagnose`` (which reads the set: importing it back would be a cycle).
"""

from __future__ import annotations

from typing import Any

from .timeline._display import register_presenter

__all__: list[str] = []


def _waterfall_plot(wf: Any, ax: Any = None) -> Any:
    from .report.plot import plot_waterfall

    return plot_waterfall(wf, ax)


def _waterfall_html(wf: Any) -> str:
    from .report.html import waterfall_html

    return waterfall_html(wf)


def _waterfall_png(wf: Any) -> bytes:
    from .report.html import waterfall_png

    return waterfall_png(wf)


def _waterfall_diagnose(wf: Any, **kwargs: Any) -> list[Any]:
    from .analysis.diagnose import diagnose

    return diagnose(wf, **kwargs)


def _set_plot(ws: Any, **kwargs: Any) -> Any:
    from .report.plot import plot_set

    return plot_set(ws, **kwargs)


def _set_html(ws: Any) -> str:
    from .report.html import set_html

    return set_html(ws)


def _set_diagnose(ws: Any, **kwargs: Any) -> list[Any]:
    from .analysis.diagnose import diagnose

    return diagnose(ws, **kwargs)


register_presenter("waterfall.plot", _waterfall_plot)
register_presenter("waterfall.html", _waterfall_html)
register_presenter("waterfall.png", _waterfall_png)
register_presenter("waterfall.diagnose", _waterfall_diagnose)
register_presenter("set.plot", _set_plot)
register_presenter("set.html", _set_html)
register_presenter("set.diagnose", _set_diagnose)
