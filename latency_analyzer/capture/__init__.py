"""The capture layer: requests on the wire, every stage stamped as it happens.

::

    from latency_analyzer.capture import Client, inject, probe_alpn

    async with Client("https://llm.example") as client:
        wf = await client.request("/v1/chat/completions", json=body)

``Client``, ``probe`` and ``aprobe`` measure requests (also at the package root); ``probe_alpn``
asks a server which protocols it offers; ``inject`` writes a W3C ``traceparent``. The parsers
are sans-IO: ``SSEParser`` and ``OpenAIStreamParser`` take ``feed(bytes, time_ns)`` and
``close(time_ns)`` and return events. Each name loads its module (and aiohttp, for the client)
on first use.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:
    from ._state import TraceHook
    from .alpn import aprobe_alpn, probe_alpn
    from .client import Client, aprobe, probe
    from .openai import (
        ChunkReceived,
        ErrorReceived,
        Event,
        MalformedChunk,
        OpenAIStreamParser,
        StreamDone,
        StreamTruncated,
        TimingsReceived,
        UsageReceived,
    )
    from .propagation import TraceContext, inject
    from .sse import SSEEvent, SSEParser

_WHERE = {
    "Client": "client",
    "aprobe": "client",
    "probe": "client",
    "aprobe_alpn": "alpn",
    "probe_alpn": "alpn",
    "TraceContext": "propagation",
    "inject": "propagation",
    "TraceHook": "_state",
    "SSEEvent": "sse",
    "SSEParser": "sse",
    "ChunkReceived": "openai",
    "ErrorReceived": "openai",
    "Event": "openai",
    "MalformedChunk": "openai",
    "OpenAIStreamParser": "openai",
    "StreamDone": "openai",
    "StreamTruncated": "openai",
    "TimingsReceived": "openai",
    "UsageReceived": "openai",
}

__all__ = [
    "ChunkReceived",
    "Client",
    "ErrorReceived",
    "Event",
    "MalformedChunk",
    "OpenAIStreamParser",
    "SSEEvent",
    "SSEParser",
    "StreamDone",
    "StreamTruncated",
    "TimingsReceived",
    "TraceContext",
    "TraceHook",
    "UsageReceived",
    "aprobe",
    "aprobe_alpn",
    "inject",
    "probe",
    "probe_alpn",
]


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
