"""Synthetic waterfalls with exactly known stages, for tests, docs and examples.

A public test helper, like the servers beside it, but the one module of ``testing`` that
imports the model (``latency_analyzer.testing`` itself does not import it)::

    from latency_analyzer.testing.waterfalls import ANCHOR, synthetic

``synthetic(dns=12, connect=3, tls=8, send=0.2, wait=30, first_token=45, gaps=[10] * 15)``
lays the named stages end to end (milliseconds, path order) and places one token at the end of
``first_token`` plus one after each of ``gaps``; ``server`` puts server spans inside client
stages as merge would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..timeline import CLIENT_STAGES, ClockAnchor, ConnectionInfo, Span, TlsInfo, Waterfall

__all__ = ["ANCHOR", "synthetic"]

#: A fixed anchor: perf 0 ns ↔ 2025-01-01T00:00:00Z, so exports are reproducible.
ANCHOR = ClockAnchor(perf_ns=0, epoch_ns=1_735_689_600_000_000_000, uncertainty_ns=50)
_T0 = 1_000_000_000  # the first request starts 1 s after the anchor


def _ns(ms: float) -> int:
    return round(ms * 1e6)


def synthetic(
    *,
    start_ms: float = 0.0,
    gaps: Sequence[float] = (),
    server: Sequence[tuple[str, str, float, float]] = (),
    reused: bool = False,
    http_version: str = "1.1",
    tls_info: TlsInfo | None = None,
    url: str = "https://llm.test/v1/chat/completions",
    status: int | None = 200,
    error_type: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    profile: Sequence[tuple[str, str, float, float]] = (),
    connection_id: int = 1,
    **stages_ms: float,
) -> Waterfall:
    """A waterfall whose stages are ``stages_ms`` end to end, starting ``start_ms`` in.

    Args:
        start_ms: offset of the request's start after the first synthetic start.
        gaps: ms between consecutive tokens after the first; ``decode`` is their sum.
        server: ``(client_stage, name, offset_ms, duration_ms)``: a server span inside a
            client stage, ``offset_ms`` from that stage's start.
        profile: ``(thread, function, start_ms, duration_ms)`` samples from the request start.
        stages_ms: client stages by name (CLIENT_STAGES order), in milliseconds.
    """
    t = _T0 + _ns(start_ms)
    start = t
    spans: list[Span] = []
    names = [n for n in CLIENT_STAGES if n in stages_ms or (n == "decode" and gaps)]
    first_token_ns = None
    for name in names:
        length = _ns(sum(gaps)) if name == "decode" else _ns(stages_ms[name])
        kids = [
            Span(sname, t + _ns(off), t + _ns(off + dur), "server")
            for parent, sname, off, dur in server
            if parent == name
        ]
        kids += [  # profile samples sit in the stage they fall in, as merge would place them
            Span(fn, start + _ns(a), start + _ns(a + d), "profile", {"thread": th})
            for th, fn, a, d in profile
            if t <= start + _ns(a) < t + length
        ]
        spans.append(Span(name, t, t + length, "client", {}, tuple(kids)))
        t += length
        if name == "first_token":
            first_token_ns = t
    chunks: list[int] = []
    if first_token_ns is not None:
        chunks = [first_token_ns]
        for g in gaps:
            chunks.append(chunks[-1] + _ns(g))
    error = None if error_type is None else f"synthetic {error_type}"
    return Waterfall(
        root=Span("request", start, t, "client", {}, tuple(spans)),
        method="POST",
        url=url,
        status=status,
        http_version=http_version,
        error=error,
        error_type=error_type,
        chunk_times_ns=tuple(chunks),
        chunk_tokens=(1,) * len(chunks),
        output_tokens=len(chunks) or None,
        output_tokens_source="chunks" if chunks else None,
        input_tokens=12 if chunks else None,
        tls=tls_info,
        connection=ConnectionInfo(reused=reused, connection_id=connection_id, peer="127.0.0.1:443"),
        anchor=ANCHOR,
        attributes=dict(attributes or {}),
    )
