"""The former home of diagnosis, kept so that ``from latency_analyzer.diagnose import ...``
still works: it re-exports :mod:`latency_analyzer.analysis.diagnose`, where diagnosis lives.

``diagnose_set`` is :func:`~latency_analyzer.analysis.diagnose.diagnose` under its old name
(``diagnose`` now takes one waterfall, a list or a set), and ``probe_alpn`` / ``aprobe_alpn``
come from :mod:`latency_analyzer.capture.alpn`, the ALPN probe's home.
"""

from __future__ import annotations

from .analysis.diagnose import *  # noqa: F403  (a re-export: every public name of the package)
from .analysis.diagnose import __all__ as _PACKAGE_NAMES
from .analysis.diagnose import diagnose
from .capture.alpn import aprobe_alpn, probe_alpn

__all__ = [*_PACKAGE_NAMES, "aprobe_alpn", "diagnose_set", "probe_alpn"]

#: :func:`diagnose` under the name it had when it took only many requests.
diagnose_set = diagnose
