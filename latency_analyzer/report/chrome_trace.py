"""Chrome trace event JSON: opens in Perfetto (ui.perfetto.dev) and chrome://tracing.

Each request is a process (``pid``), named after it; inside it one track (``tid``) per source:

* tid 1 ``client``: the request and its client stages, as nested ``B``/``E`` pairs, with the
  token arrivals as instant events (``ph: "i"``, thread scope) named ``token``;
* tid 2 ``server``: the server spans merge placed inside the client stages;
* tid 3, 4, ... ``profile: <thread>``: profile samples (``Span(source="profile")`` with a
  ``thread`` attribute), one track per profiled thread.

Timestamps are microseconds since the earliest request's start (``otherData.origin_epoch_ns``
is that instant), so several requests line up. On each track events are emitted in time order
and every ``B`` has its ``E``; a child that overlaps its previous sibling is clipped to start
where that sibling ended (the waterfall's own attribution rule), its true start kept in
``args.start_us``. A background stage (``h2_setup``, which runs under the request it opened
the connection for) ends where the next stage starts, its true end kept in ``args.end_us``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from ..timeline import BACKGROUND_STAGES, Span, Waterfall
from ._common import export_meta, scrub

__all__ = ["to_chrome_trace", "write_chrome_trace"]

_CLIENT_TID, _SERVER_TID, _PROFILE_TID0 = 1, 2, 3


def _us(ns: int) -> float:
    return round(ns / 1e3, 3)


def _args(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = dict(span.attributes)
    out["duration_ms"] = round(span.duration_ns / 1e6, 6)
    return out


def _pairs(span: Span, lo: int, hi: int, keep: Any) -> Iterator[tuple[str, int, Span, int]]:
    """(phase, time, span, clipped start) for ``span`` and its ``keep``-ed descendants, clipped
    to ``[lo, hi]`` and to the previous sibling, so B/E nest and time never goes back."""
    start, end = max(span.start_ns, lo), min(max(span.end_ns, lo), hi)
    start = min(start, end)
    if keep(span):
        yield "B", start, span, start
    cursor = start
    for i, child in enumerate(span.children):
        child_hi = end
        if child.source == "client" and child.name in BACKGROUND_STAGES:
            # runs under the stages after it: shown up to where the next one starts
            later = [c.start_ns for c in span.children[i + 1 :] if c.start_ns >= child.start_ns]
            child_hi = min([end, *later])
        for item in _pairs(child, cursor, child_hi, keep):
            yield item
            if item[0] == "E":  # later siblings start after everything already closed
                cursor = max(cursor, item[1])
    if keep(span):
        yield "E", end, span, start


def _track_events(root: Span, pid: int, tid: int, keep: Any, origin: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for phase, t, span, start in _pairs(root, root.start_ns, root.end_ns, keep):
        event: dict[str, Any] = {"ph": phase, "ts": _us(t - origin), "pid": pid, "tid": tid}
        if phase == "B":
            event.update(name=span.name, cat=span.source, args=_args(span))
            if start != span.start_ns:
                event["args"]["start_us"] = _us(span.start_ns - origin)
        elif phase == "E" and t < span.end_ns and span.name in BACKGROUND_STAGES:
            event["args"] = {"end_us": _us(span.end_ns - origin)}
        events.append(event)
    return events


def _meta_event(name: str, pid: int, tid: int, value: str) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {"name": value}}


def _token_events(wf: Waterfall, pid: int, origin: int) -> list[dict[str, Any]]:
    return [
        {
            "ph": "i",
            "s": "t",
            "name": "token",
            "cat": "token",
            "ts": _us(t - origin),
            "pid": pid,
            "tid": _CLIENT_TID,
            "args": {"index": i, "tokens": k},
        }
        for i, (t, k) in enumerate(zip(wf.chunk_times_ns, wf.chunk_tokens, strict=False))
    ]


def _profile_threads(root: Span) -> list[str]:
    names = [str(s.attributes.get("thread", "main")) for s in root.walk() if s.source == "profile"]
    return list(dict.fromkeys(names))


def _request_events(wf: Waterfall, pid: int, origin: int) -> list[dict[str, Any]]:
    label = f"{wf.method} {wf.url}" + (f" ({wf.error_type})" if wf.error else "")
    events = [
        _meta_event("process_name", pid, 0, f"request {pid}: {label}"),
        _meta_event("thread_name", pid, _CLIENT_TID, "client"),
    ]
    client = _track_events(wf.root, pid, _CLIENT_TID, lambda s: s.source == "client", origin)
    # tokens interleaved by time (a stable sort keeps each B/E pair's order at equal times)
    events += sorted(client + _token_events(wf, pid, origin), key=lambda e: float(e["ts"]))
    if any(s.source == "server" for s in wf.root.walk()):
        events.append(_meta_event("thread_name", pid, _SERVER_TID, "server"))
        events += _track_events(wf.root, pid, _SERVER_TID, lambda s: s.source == "server", origin)
    for i, thread in enumerate(_profile_threads(wf.root)):
        tid = _PROFILE_TID0 + i
        events.append(_meta_event("thread_name", pid, tid, f"profile: {thread}"))

        def keep(s: Span, thread: str = thread) -> bool:
            return s.source == "profile" and str(s.attributes.get("thread", "main")) == thread

        events += _track_events(wf.root, pid, tid, keep, origin)
    return events


def _epoch(wf: Waterfall) -> int:
    return wf.start_epoch_ns if wf.start_epoch_ns is not None else wf.start_ns


def to_chrome_trace(
    waterfalls: Iterable[Waterfall], *, created: datetime | None = None
) -> dict[str, Any]:
    """A Chrome trace-event document (JSON object form) of ``waterfalls`` (secrets scrubbed).

    Args:
        waterfalls: the requests; each becomes one process, in start order.
        created: the export time to stamp (default: now, UTC).
    """
    clean = sorted((scrub(wf) for wf in waterfalls), key=_epoch)
    origin_epoch = _epoch(clean[0]) if clean else 0
    events: list[dict[str, Any]] = []
    for pid, wf in enumerate(clean, start=1):
        # every request on one time axis: shift its perf clock by its own epoch offset
        origin = wf.start_ns - (_epoch(wf) - origin_epoch)
        events += _request_events(wf, pid, origin)
    other = {**export_meta("chrome-trace", created), "origin_epoch_ns": origin_epoch}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(
    waterfalls: Iterable[Waterfall], path: str | Path, *, created: datetime | None = None
) -> Path:
    """Write ``to_chrome_trace`` to ``path`` (``.json``); returns the path."""
    out = Path(path)
    doc = to_chrome_trace(waterfalls, created=created)
    out.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
    return out
