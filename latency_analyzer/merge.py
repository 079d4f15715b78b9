"""Merge what the server says into the client's waterfall, on the client's clock.

::

    merged = merge(wf, stages)                   # one request, its own clock bracket
    merged = merge_all(waterfalls, stage_list)   # many: one offset from all their brackets
    merged = await amerge(waterfalls, store, grace=2.0)   # wait for spans, map, align, merge
    merged = merge_timings(wf)                   # llama.cpp's ``timings`` from the body

Server stages become children (``source="server"``) of the client stages they fall in, split
at client stage boundaries; a client stage's uncovered time becomes ``network``; attribution
still sums to e2e exactly. The merged waterfall is a new one; its ``attributes`` say how:

* ``server.status``: ``merged``, ``no server data`` or ``no offset fits`` (with
  ``server.reason`` saying why);
* ``server.contradicted``: the bounds left out of a merged request's bracket because they
  contradict what the client saw (comma-separated names), each with
  ``server.contradicted.<name>_ns``: how far after the client's own observation that server
  instant lands at the offset used. The uncertainty is widened to reach it, and the server
  stage ending at that instant carries ``server.contradicts`` / ``server.contradicted_ns``;
* ``server.source`` (``otlp``, ``server-timing``, ...), ``server.schema``;
* ``server.placement`` / ``server.placement_uncertainty_ns``: durations without instants
  (llama.cpp ``timings``, Server-Timing) placed in the client's bracket, no offset estimated;
* ``server.offset_ns`` / ``server.offset_uncertainty_ns`` (server clock − client epoch),
  ``server.offset_requests``; ``server.bracket_lo_ns`` / ``server.bracket_hi_ns``.
"""

from __future__ import annotations

from ._merge import (
    MERGED,
    NO_OFFSET_FITS,
    NO_SERVER_DATA,
    PLACED_BY_CLIENT,
    amerge,
    merge,
    merge_all,
    merge_headers,
    merge_timings,
    no_server_data,
    place,
)

__all__ = [
    "MERGED",
    "NO_OFFSET_FITS",
    "NO_SERVER_DATA",
    "PLACED_BY_CLIENT",
    "amerge",
    "merge",
    "merge_all",
    "merge_headers",
    "merge_timings",
    "no_server_data",
    "place",
]
