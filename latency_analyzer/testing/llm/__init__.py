"""The test-bed LLM server: OpenAI-compatible, with injected, precisely timed delays.

One concern per module:

* :mod:`.behavior`: the knobs (:class:`Behavior`, :data:`FAULTS`) and the request body;
* :mod:`.records`: ground truth (:class:`RequestRecord`, built by ``RecordBuilder``);
* :mod:`.wire`: the OpenAI payloads and SSE framing, shared by every test-bed server;
* :mod:`.telemetry`: vLLM's OTel spans, ``Server-Timing`` and Prometheus metrics;
* :mod:`.exchange`: one request's timeline, written at its deadlines;
* :mod:`.app`: :class:`LLMServer` itself;
* :mod:`.process` and :mod:`.child`: the server in a child process, both sides.
"""

from .app import LLMServer
from .behavior import FAULTS, Behavior
from .process import SubprocessLLMServer
from .records import RequestRecord
from .wire import token_text

__all__ = [
    "FAULTS",
    "Behavior",
    "LLMServer",
    "RequestRecord",
    "SubprocessLLMServer",
    "token_text",
]
