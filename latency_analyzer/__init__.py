"""latency_analyzer: where every millisecond of an HTTP request went.

::

    import latency_analyzer as la

    wf = la.probe("http://127.0.0.1:8000/v1/chat/completions", json={...})
    wf.attribution()      # {stage: seconds}; the values add up to wf.e2e
    wf.ttft, wf.tpot, wf.itl, wf.output_tokens, wf.http_version, wf.error
"""

from ._version import __version__
from .capture.client import Client, aprobe, probe
from .errors import LatencyAnalyzerError, RequestError, UsageError
from .timeline import (
    CLIENT_STAGES,
    RESIDUALS,
    SERVER_STAGES,
    ClockAnchor,
    ConnectionInfo,
    Recorder,
    Span,
    TlsInfo,
    Waterfall,
)

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
    "TlsInfo",
    "UsageError",
    "Waterfall",
    "__version__",
    "aprobe",
    "probe",
]
