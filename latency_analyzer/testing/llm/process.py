"""The test-bed LLM server in a child process (the caller's side)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._child import ChildServer
from .records import RequestRecord

__all__ = ["SubprocessLLMServer"]


class SubprocessLLMServer(ChildServer):
    """An :class:`LLMServer` in a child process, free of the caller's GIL and event loop.

    Started by ``python -m latency_analyzer.testing llm-server CONFIG_JSON``; the child
    prints ``{"port": ..., "pid": ...}`` on stdout once bound, answers ``records`` and
    ``stats`` commands on stdin, and exits when stdin closes. Use as ``with``.

    Attributes:
        config: what the child serves (:meth:`LLMServer.run_in_subprocess` builds it).
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__("llm-server", config, "the subprocess server")

    @property
    def host(self) -> str:
        """The bound address."""
        return str(self.config["host"])

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:PORT``."""
        scheme = "https" if self.config.get("tls_pem") else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    @property
    def records(self) -> list[RequestRecord]:
        """Ground truth fetched from the child (perf_counter_ns is host-wide on Linux)."""
        return [RequestRecord.from_json(r) for r in self._ask("records")]

    @property
    def connections(self) -> int:
        """TCP connections the child accepted."""
        return int(self._ask("stats")["connections"])

    @property
    def requests(self) -> int:
        """Completion requests the child received."""
        return int(self._ask("stats")["requests"])
