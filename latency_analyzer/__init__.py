"""latency_analyzer: where every millisecond of an HTTP request went.

::

    import latency_analyzer as la

    wf = la.probe("http://127.0.0.1:8000/v1/chat/completions", json={...})
    wf.attribution()      # {stage: seconds}; the values add up to wf.e2e
    wf.ttft, wf.tpot, wf.itl, wf.output_tokens, wf.http_version, wf.error
"""

import typing

from . import _presenters  # noqa: F401  (registers plot/diagnose/repr behind the model)
from ._version import __version__
from .errors import LatencyAnalyzerError, RequestError, UsageError
from .timeline import (
    CLIENT_STAGES,
    RESIDUALS,
    SERVER_STAGES,
    ClockAnchor,
    ConnectionInfo,
    Recorder,
    Span,
    TcpInfo,
    TlsInfo,
    Waterfall,
)

if typing.TYPE_CHECKING:
    from .capture.client import Client, aprobe, probe

_CLIENT_NAMES = frozenset({"Client", "aprobe", "probe"})


def __getattr__(name: str) -> object:
    """The client (and aiohttp under it) loads on first use: the pytest plugin imports this
    package in every pytest run of an environment that has it installed."""
    if name in _CLIENT_NAMES:
        from .capture import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CLIENT_STAGES",
    "RESIDUALS",
    "SERVER_STAGES",
    "Client",
    "ClockAnchor",
    "ConnectionInfo",
    "LatencyAnalyzerError",
    "Recorder",
    "RequestError",
    "Span",
    "TcpInfo",
    "TlsInfo",
    "UsageError",
    "Waterfall",
    "__version__",
    "aprobe",
    "probe",
]
