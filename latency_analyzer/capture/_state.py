"""Per-request capture state and the ``capture.<stage>.started/complete`` trace hooks.

Stages are marked through a ``RequestState`` rather than on the Recorder directly so that an
optional trace callback sees every step (httpcore's ``_trace`` idea) and costs one ``is None``
test when nobody listens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

from ..timeline import AttrValue, Recorder

__all__ = ["CURRENT", "RequestState", "TraceHook", "now_ns"]

#: Called as ``hook(event, info)`` with events like ``capture.dns.started``.
TraceHook = Callable[[str, Mapping[str, AttrValue]], None]

now_ns = time.perf_counter_ns

#: The request whose connector work is running in this task. Connector methods run inside the
#: requesting task, so they see it; protocol callbacks do not (the loop calls them with the
#: context of whichever task created the connection) and use the state pinned on the protocol.
CURRENT: ContextVar[RequestState | None] = ContextVar("latency_analyzer_request", default=None)


class RequestState:
    """The recorder of one request plus the trace hook, as the capture code sees them."""

    __slots__ = (
        "alpn_settled",
        "answer",
        "body_end_ns",
        "h2_mode",
        "protocol",
        "recorder",
        "trace",
    )

    def __init__(self, recorder: Recorder, trace: TraceHook | None = None) -> None:
        self.recorder = recorder
        self.trace = trace
        self.protocol: Any = None  # the TimedProtocol carrying this request, once connected
        # When the last response byte arrived. Kept here, not on the protocol: the connection
        # may carry the next request before this one is frozen.
        self.body_end_ns: int | None = None
        # None: HTTP/1.1 only; "prefer": hand over if ALPN picks h2; "require": h2 or fail
        self.h2_mode: str | None = None
        # called once the TLS handshake chose HTTP/1.1 for a dial others may be waiting on
        self.alpn_settled: Callable[[], None] | None = None
        # the answer's text pieces, collected when the caller asked for them (a chat turn)
        self.answer: list[str] | None = None

    def begin(self, stage: str, t_ns: int, **attrs: AttrValue) -> None:
        self.recorder.begin(stage, t_ns, **attrs)
        if self.trace is not None:
            self.trace(f"capture.{stage}.started", {"t_ns": t_ns, **attrs})

    def end(self, stage: str, t_ns: int, **attrs: AttrValue) -> None:
        self.recorder.end(stage, t_ns, **attrs)
        if self.trace is not None:
            self.trace(f"capture.{stage}.complete", {"t_ns": t_ns, **attrs})

    def fail(self, kind: str, message: str, t_ns: int, *, terminal: bool = True) -> None:
        stages = ("pool_wait", "dns", "connect", "tls", "send")
        open_stages = [s for s in stages if self.recorder.is_open(s)]
        self.recorder.fail(kind, message, t_ns, terminal=terminal)
        if self.trace is not None:
            for stage in open_stages:
                self.trace(f"capture.{stage}.failed", {"t_ns": t_ns, "error": message})
            self.trace("capture.request.failed", {"t_ns": t_ns, "kind": kind, "error": message})
