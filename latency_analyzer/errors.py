"""The library's exceptions: one root, local misuse apart from remote and data problems.

::

    LatencyAnalyzerError
    ├── UsageError (ValueError)      the caller asked for something impossible: a bad URL,
    │                                conflicting arguments, a malformed timeline
    └── RequestError                 the remote side or its data failed: DNS, connect, TLS,
        │                            timeout, HTTP status, a broken stream
        └── (kind in ``.kind``)      the same strings as ``Waterfall.error_type``

A failed request is not raised by default: ``probe`` returns a Waterfall whose ``error`` is set and
which keeps every stage that did happen. ``RequestError`` is what ``Waterfall.raise_for_error()``
raises for callers who prefer exceptions.
"""

from __future__ import annotations

from . import _redact

__all__ = ["LatencyAnalyzerError", "RequestError", "UsageError"]


class LatencyAnalyzerError(Exception):
    """Root of every exception this library raises on purpose."""


class UsageError(LatencyAnalyzerError, ValueError):
    """Local misuse: arguments, URLs or timeline data that cannot be right."""


class RequestError(LatencyAnalyzerError):
    """A request failed on the remote side or in its data.

    Attributes:
        kind: short machine-readable reason, e.g. ``"dns"``, ``"tls"``, ``"timeout"``.
        message: what happened, with credentials removed (``latency_analyzer._redact``).
    """

    def __init__(self, kind: str, message: str) -> None:
        message = _redact.redact_text(message)
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
