"""Pooled HTTP/1.1 connections the server has closed: found at checkout, or retried once.

A server may close a connection right after a response that announced keep-alive (llama.cpp's
``llama-server`` does so after every stream). Our event loop sees the FIN only when it next
reads that socket, so a request sent at once can be handed the dead connection. Two defences:
the first as urllib3, httpcore and Go's net/http have it, the second as curl has it.

* at checkout, a pooled connection whose socket is readable while idle (the peer's FIN or
  RST, or bytes no request asked for) is closed unused and the next one is taken; the
  waterfall's ``stale.discarded`` counts them. Over our own TLS transport the readable
  bytes are read first: TLS's own records (a session ticket) keep the connection;
* a request that still fails on a reused connection with a connection error (a FIN or RST,
  not a timeout) before any response byte arrived is sent once more, whatever its method, as
  curl does, on the connection the pool then hands over: another idle one that passes the
  checkout test above, or a new one when none is idle (the pool's other connections are not
  closed to force a dial: later requests would lose them). The FIN can cross the request on
  the wire (llama-server's comes a fraction of a millisecond after its last byte, so a
  request sent at once loses the race now and then), and a server closing an idle
  keep-alive connection has not read a request arriving on it. A server that did read it
  and then died without a byte of answer gets it twice: RFC 9112 §9.3.1 allows that only
  for idempotent methods, so the waterfall says whether request bytes had left
  (``stale.retry_sent``). Never once a response byte arrived, never twice.

A retry is not hidden. The failed attempt's time stays in ``pool_wait`` (the request was
still getting a connection it could use): the stage is reopened at the failed attempt's start
and ends, as always, when the new connection is dialled or a pooled one handed over, with
``retried`` among its attributes. The waterfall's ``stale.retry_*`` attributes say what failed:
``error_type``, ``error`` (redacted), ``connection_id``, ``sent`` (request bytes had left) and
``ms`` (from the failed attempt's checkout to its failure). The failed attempt's other stages
are dropped, so the stages still sum to e2e exactly.
"""

from __future__ import annotations

import select
from typing import Any

import aiohttp

from .._redact import redact_text
from ..timeline import Recorder
from ._state import RequestState

__all__ = ["note_discarded", "peer_closed", "restart", "retry_allowed"]

# the connection broke: not a dial that failed, not a timeout, not a certificate mismatch
_BROKEN = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError)
_NOT_BROKEN = (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError)


def peer_closed(proto: Any) -> bool:
    """True when an idle pooled connection's socket has something to read: the peer's FIN or
    RST, or bytes no request asked for. Either way it cannot carry another request.

    Asked at every checkout of a reused connection: the poll object registered for the
    socket is made once and kept on the protocol (``idle_poll``) with the descriptor it
    watches, which is checked again each time."""
    transport = proto.transport
    if transport is None:
        return False
    sock = proto.sock
    if sock is None:  # a socket not of ours: the transport's view of it
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
    try:
        fd = sock.fileno()
    except OSError:
        return True
    if fd < 0:
        return True
    if not hasattr(select, "poll"):
        readable, _, _ = select.select([fd], [], [], 0)
    else:
        kept = proto.idle_poll
        if kept is None or kept[0] != fd:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            proto.idle_poll = kept = (fd, poller)
        readable = kept[1].poll(0)
    if not readable:
        return False
    # our TLS transport (._tlstransport) reads it now: a session ticket is no reason to go
    read_idle = getattr(transport, "read_idle", None)
    return True if read_idle is None else bool(read_idle())


def note_discarded(state: RequestState, count: int) -> None:
    """``count`` pooled connections were found closed at this request's checkout."""
    attrs = state.recorder.attributes
    before = attrs.get("stale.discarded", 0)
    attrs["stale.discarded"] = (before if isinstance(before, int) else 0) + count


def _sent(proto: Any) -> bool:
    """Whether request bytes were handed to the kernel (unknown counts as sent)."""
    wire = getattr(proto, "wire", None)
    return wire is None or wire.first_send_ns is not None


def retry_allowed(state: RequestState, exc: BaseException) -> bool:
    """The request broke on a reused connection before any response byte arrived."""
    if not isinstance(exc, _BROKEN) or isinstance(exc, _NOT_BROKEN):
        return False
    rec, proto = state.recorder, state.protocol
    if proto is None or not rec.connection.reused or state.h2_open is not None:
        return False
    return not (rec.response_reads or rec.headers_ns is not None or rec.status is not None)


def restart(state: RequestState, exc: BaseException, failed_ns: int) -> None:
    """Forget the failed attempt's stages, keep what it was, and reopen ``pool_wait``."""
    old, proto = state.recorder, state.protocol
    began = old.span_start("pool_wait")
    began = old.start_ns if began is None else began
    new = Recorder(
        old.method,
        old.url,
        start_ns=old.start_ns,
        intended_start_ns=old.intended_start_ns,
        anchor=old.anchor,
    )
    new.attributes.update(old.attributes)
    new.attributes.update(
        {
            "stale.retry_error_type": type(exc).__name__,
            "stale.retry_error": redact_text(str(exc)),
            "stale.retry_connection_id": old.connection.connection_id or 0,
            "stale.retry_sent": _sent(proto),
            "stale.retry_ms": (failed_ns - began) / 1e6,
        }
    )
    if proto is not None and proto.state is state:
        proto.detach()
    state.protocol = None
    state.recorder = new
    if state.trace is not None:
        info = {k[6:]: v for k, v in new.attributes.items() if k.startswith("stale.retry_")}
        state.trace("capture.request.retried", {"t_ns": failed_ns, **info})
    state.begin("pool_wait", began, retried=True)
