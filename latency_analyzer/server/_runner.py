"""The receivers' thread runner: one implementation, in ``latency_analyzer._threads``."""

from .._threads import AsyncService, ThreadRunner

__all__ = ["AsyncService", "ThreadRunner"]
