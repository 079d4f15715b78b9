"""Per-request capture state and the ``capture.<stage>.started/complete`` trace hooks.

Stages are marked through a ``RequestState`` rather than on the Recorder directly so that an
optional trace callback sees every step (httpcore's ``_trace`` idea) and costs one ``is None``
test when nobody listens.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from .._redact import redact_text
from ..timeline import AttrValue, Recorder
from ._hold import Hold

__all__ = ["CURRENT", "RequestState", "TraceHook", "now_ns", "open_stage"]

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
        "client_closed",
        "dialled",
        "h2_mode",
        "h2_open",
        "h2_prepare",
        "handoff",
        "hold",
        "inline_body",
        "location",
        "protocol",
        "ready",
        "recorder",
        "sockets",
        "trace",
    )

    def __init__(self, recorder: Recorder, trace: TraceHook | None = None) -> None:
        self.recorder = recorder
        self.trace = trace
        self.protocol: Any = None  # the TimedProtocol carrying this request, once connected
        # an HTTP/1.1 body that leaves in the write of the request's headers (._transport)
        self.inline_body = b""
        # When the last response byte arrived. Kept here, not on the protocol: the connection
        # may carry the next request before this one is frozen.
        self.body_end_ns: int | None = None
        # sockets whose handshake was still pending when connect returned (happy eyeballs may
        # dial several): the one that won gives the connect stage its kernel end
        self.dialled: list[Any] | None = None
        # every socket made for this request's dials: what closing the Client shuts down
        # while a handshake (TCP or TLS) is still under way, before any pool holds it
        self.sockets: list[Any] | None = None
        # set when the Client was closed with this request in flight: what ends it is named so
        self.client_closed = False
        # None: HTTP/1.1 only; "prefer": hand over if ALPN picks h2; "require": h2 or fail
        self.h2_mode: str | None = None
        # called once the TLS handshake chose HTTP/1.1 for a dial others may be waiting on
        self.alpn_settled: Callable[[], None] | None = None
        # called with the HandoffToHTTP2 inside the handshake's last callback: opens the
        # connection and sends this request on it at once
        self.h2_open: Callable[[Any], None] | None = None
        # called once the dial is under way: builds what h2_open will send (idle time) and
        # returns it (a PreparedStart, or None)
        self.h2_prepare: Callable[[], Any] | None = None
        # the dial's outcome when ALPN chose h2 (a HandoffToHTTP2), for the dialer to return
        self.handoff: Any = None
        # the HTTP/1.1 connection the dialer opened (or took from the pool) for this request:
        # aiohttp's connect hands it to the exchange instead of finding one of its own
        self.ready: Any = None
        # the response's Location header as sent (it may carry a signed query): followed by
        # the client when asked, never recorded unredacted
        self.location: str | None = None
        # the answer's text pieces, collected when the caller asked for them (a chat turn)
        self.answer: list[str] | None = None
        # a request prepared before its instant (._hold): its writes wait for it, and no stage
        # starts before it (the waterfall starts there; the preparation is not on its clock)
        self.hold: Hold | None = None

    def begin(self, stage: str, t_ns: int, **attrs: AttrValue) -> None:
        if self.hold is not None and t_ns < self.hold.at_ns:
            t_ns = self.hold.at_ns
        self.recorder.begin(stage, t_ns, **attrs)
        if self.trace is not None:
            self.trace(f"capture.{stage}.started", {"t_ns": t_ns, **attrs})

    def end(self, stage: str, t_ns: int, **attrs: AttrValue) -> None:
        self.recorder.end(stage, t_ns, **attrs)
        if self.trace is not None:
            self.trace(f"capture.{stage}.complete", {"t_ns": t_ns, **attrs})

    @contextlib.contextmanager
    def stage(
        self, name: str, start_ns: int | None = None, **attrs: AttrValue
    ) -> Iterator[dict[str, AttrValue]]:
        """Own stage ``name`` for a ``with`` block: ``.started`` on entry, ``.complete`` on exit.

        The block may fill the yielded dict with attributes for the end, and ``end_ns`` in
        it ends the stage at that instant (a kernel stamp read inside the block) instead of
        at the exit. An exception ends the stage there, ``interrupted``, emits ``.failed``
        with the exception's type (never its text, which may carry a URL) and propagates.
        """
        self.begin(name, now_ns() if start_ns is None else start_ns, **attrs)
        end: dict[str, AttrValue] = {}
        try:
            yield end
        except BaseException as exc:
            if self.recorder.is_open(name):
                t = now_ns()
                self.recorder.end(name, t, interrupted=True)
                if self.trace is not None:
                    self.trace(f"capture.{name}.failed", {"t_ns": t, "error": type(exc).__name__})
            raise
        if self.recorder.is_open(name):
            t_end = end.pop("end_ns", None)
            self.end(name, t_end if isinstance(t_end, int) else now_ns(), **end)

    def fail_closed(self, t_ns: int) -> None:
        """The request's Client was closed while it was in flight: where it was, as data."""
        where = open_stage(self.recorder)
        self.fail(
            "closed",
            f"the Client was closed while the request was in flight (during {where})",
            t_ns,
        )

    def fail(self, kind: str, message: str, t_ns: int, *, terminal: bool = True) -> None:
        if self.hold is not None and t_ns < self.hold.at_ns:
            t_ns = self.hold.at_ns
        stages = ("pool_wait", "dns", "connect", "tls", "send")
        open_stages = [s for s in stages if self.recorder.is_open(s)]
        message = redact_text(message)  # aiohttp quotes the URL; servers echo what they got
        self.recorder.fail(kind, message, t_ns, terminal=terminal)
        if self.trace is not None:
            for stage in open_stages:
                self.trace(f"capture.{stage}.failed", {"t_ns": t_ns, "error": message})
            self.trace("capture.request.failed", {"t_ns": t_ns, "kind": kind, "error": message})


def open_stage(recorder: Recorder) -> str:
    """The stage a request that stopped now was in, in words."""
    for stage in ("dns", "connect", "tls", "send", "pool_wait"):
        if recorder.is_open(stage):
            return stage
    if recorder.headers_ns is None:
        return "wait" if recorder.has("send") else "connection setup"
    return "the response body"
