"""The test-bed LLM server in a child process (the child's side).

``python -m latency_analyzer.testing llm-server CONFIG_JSON`` runs :func:`serve_in_child`:
it serves the configuration :meth:`LLMServer.run_in_subprocess` built, prints
``{"port": ..., "pid": ...}`` and answers ``records`` and ``stats`` until stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any

from .._child import serve_commands
from ..tls import server_context_from_pem
from .app import LLMServer

__all__ = ["serve_in_child"]


def serve_in_child(config_json: str) -> None:
    """Child side of :class:`SubprocessLLMServer` (``python -m latency_analyzer.testing``)."""
    asyncio.run(_child_main(json.loads(config_json)))


async def _child_main(config: Mapping[str, Any]) -> None:
    tls_pem = config.get("tls_pem")
    context = server_context_from_pem(tls_pem) if tls_pem else None
    async with LLMServer(
        ssl=context,
        host=config["host"],
        slots=int(config.get("slots", 0)),
        record_requests=bool(config.get("record_requests", False)),
        **config["knobs"],
        **config.get("otel", {}),
    ) as server:
        commands = {
            "records": lambda: [record.to_json() for record in server.records],
            "stats": lambda: {"connections": server.connections, "requests": server.requests},
        }
        await serve_commands({"port": server.port, "pid": os.getpid()}, commands)
