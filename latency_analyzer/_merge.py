"""The merge of server stages into client waterfalls: see :mod:`latency_analyzer.merge`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence

from .capture.propagation import TraceContext
from .errors import UsageError
from .server.align import Bracket, ClockOffset, bracket, combine
from .server.llamacpp import timings_from_attributes, timings_stages
from .server.schemas import ServerStages, map_request
from .server.server_timing import server_timing_stages, tgi_header_stages
from .server.spans import ServerSpan
from .server.store import SpanStore
from .timeline import AttrValue, Span, Waterfall

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

MERGED = "merged"
NO_SERVER_DATA = "no server data"
NO_OFFSET_FITS = "no offset fits"
#: ``server.placement`` of durations placed in the client's bracket (no clock offset).
PLACED_BY_CLIENT = "durations placed in the client's bracket"


def _with(wf: Waterfall, root: Span | None = None, **attrs: AttrValue) -> Waterfall:
    merged = {**wf.attributes, **{k.replace("__", "."): v for k, v in attrs.items()}}
    return dataclasses.replace(wf, root=root or wf.root, attributes=merged)


def no_server_data(wf: Waterfall, source: str = "otlp") -> Waterfall:
    """``wf`` marked as having no server data (not as zero server time)."""
    return _with(wf, server__status=NO_SERVER_DATA, server__source=source)


def place(root: Span, stages: Sequence[Span]) -> tuple[Span, int]:
    """Put ``stages`` (client clock) under the client stages they overlap, split at their
    boundaries. Returns the new root and the nanoseconds that fell in no client stage."""
    pieces: dict[int, list[Span]] = {}
    unplaced = 0
    for stage in stages:
        covered = 0
        for index, client in enumerate(root.children):
            lo, hi = max(stage.start_ns, client.start_ns), min(stage.end_ns, client.end_ns)
            if hi > lo:
                split = (lo, hi) != (stage.start_ns, stage.end_ns)
                attrs = {**stage.attributes, "split": True} if split else stage.attributes
                pieces.setdefault(index, []).append(Span(stage.name, lo, hi, "server", attrs))
                covered += hi - lo
        unplaced += stage.duration_ns - covered
    children = tuple(
        dataclasses.replace(c, children=(*c.children, *pieces[i])) if i in pieces else c
        for i, c in enumerate(root.children)
    )
    return dataclasses.replace(root, children=children), unplaced


def _kept(stages: ServerStages) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {f"server.{k}": v for k, v in stages.attributes.items()}
    out["server.schema"] = stages.schema
    if stages.span_id is not None:
        out["server.span_id"] = stages.span_id
    return out


def _why_no_fit(own: Bracket | None) -> str:
    if own is None:
        return "the request gives no bound (not sent, no clock anchor or no server instants)"
    against = ", ".join(f"{name} by {(value - own.hi_ns) / 1e6:.3f} ms" for name, value in own.lows)
    return f"the arrival bound contradicts every later bound: {against}"


def _contradictions(own: Bracket, chosen: ClockOffset) -> dict[str, int]:
    """How far after the client's observation each contradicted server instant lands."""
    lows = dict(own.lows)
    return {name: lows[name] - chosen.offset_ns for name, _ in own.contradicted}


def _instants(stages: ServerStages) -> dict[str, int | None]:
    return {
        "first_token": stages.first_token_ns,
        "last_token": stages.last_token_ns,
        "done": stages.done_ns,
    }


def _mark(span: Span, stages: ServerStages, against: Mapping[str, int]) -> Span:
    """``span`` with the contradicted bounds its end is the instant of, if any."""
    instants = _instants(stages)
    names = [name for name in against if instants[name] == span.end_ns]
    if not names:
        return span
    attrs = {
        **span.attributes,
        "server.contradicts": ",".join(names),
        "server.contradicted_ns": max(against[name] for name in names),
    }
    return dataclasses.replace(span, attributes=attrs)


def _choose(own: Bracket, offset: ClockOffset | None) -> tuple[ClockOffset, bool]:
    """The offset to use for one request: the shared one if its bracket allows it, else the
    nearest value inside its own bracket (reported as clamped)."""
    if offset is None:
        return own.offset(), False
    if own.contains(offset.offset_ns):
        return offset, False
    clamped = min(max(offset.offset_ns, own.lo_ns), own.hi_ns)
    return dataclasses.replace(offset, offset_ns=clamped, uncertainty_ns=own.width_ns), True


def merge(
    wf: Waterfall,
    stages: ServerStages | None,
    offset: ClockOffset | None = None,
    *,
    source: str = "otlp",
) -> Waterfall:
    """A new waterfall with ``stages`` placed inside ``wf``'s client stages.

    Args:
        wf: the client's waterfall.
        stages: the request's server stages (None: no server data).
        offset: a clock offset shared by many requests (``combine``); None: this request's
            own bracket. An offset outside this request's bracket is clamped into it.
        source: recorded as ``server.source``.
    """
    if stages is None or not stages.stages:
        return no_server_data(wf, source)
    if not stages.timed:
        if stages.token_anchored:
            return _merge_token_anchored(wf, stages, source)
        return _merge_untimed(wf, stages, source)
    own = bracket(wf, stages)
    info = {"server.source": source, **_kept(stages)}
    if own is None or not own.fits:
        bounds = (
            {}
            if own is None
            else {"server.bracket_lo_ns": own.lo_ns, "server.bracket_hi_ns": own.hi_ns}
        )
        info.update({**bounds, "server.status": NO_OFFSET_FITS, "server.reason": _why_no_fit(own)})
        return dataclasses.replace(wf, attributes={**wf.attributes, **info})
    chosen, clamped = _choose(own, offset)
    against = _contradictions(own, chosen)
    if against:  # the offset may be off by as much as the bound it disregards says
        widened = max(chosen.uncertainty_ns, *against.values())
        chosen = dataclasses.replace(chosen, uncertainty_ns=widened)
    assert wf.anchor is not None  # bracket() needs it
    to_perf = wf.anchor.to_perf_ns
    moved = [
        dataclasses.replace(
            marked,
            start_ns=to_perf(s.start_ns - chosen.offset_ns),
            end_ns=to_perf(s.end_ns - chosen.offset_ns),
        )
        for s in stages.stages
        for marked in (_mark(s, stages, against),)
    ]
    root, unplaced = place(wf.root, moved)
    info.update(
        {
            "server.status": MERGED,
            "server.offset_ns": chosen.offset_ns,
            "server.offset_uncertainty_ns": chosen.uncertainty_ns,
            "server.offset_requests": chosen.requests,
            "server.bracket_lo_ns": own.lo_ns,
            "server.bracket_hi_ns": own.hi_ns,
        }
    )
    if against:
        info["server.contradicted"] = ",".join(against)
        info.update({f"server.contradicted.{name}_ns": ns for name, ns in against.items()})
    if clamped:
        info["server.offset_clamped"] = True
    if not chosen.consistent:
        info["server.offset_consistent"] = False
    if unplaced:
        info["server.unplaced_ns"] = unplaced
    return dataclasses.replace(wf, root=root, attributes={**wf.attributes, **info})


def _merge_untimed(wf: Waterfall, stages: ServerStages, source: str) -> Waterfall:
    """Durations without instants (Server-Timing): the work happened between the client's
    first request byte and the response headers; the block is centred in that window (the
    symmetric-transit assumption) and half the slack is its placement uncertainty."""
    send, wait = wf.stage("send"), wf.stage("wait")
    info = {"server.source": source, **_kept(stages)}
    total = sum(s.duration_ns for s in stages.stages)
    if send is None or wait is None or total > wait.end_ns - send.start_ns:
        reason = (
            "no send or wait stage to place the durations in"
            if send is None or wait is None
            else f"the server's durations ({total / 1e6:.3f} ms) exceed the client's "
            f"send-to-headers window ({(wait.end_ns - send.start_ns) / 1e6:.3f} ms)"
        )
        info.update({"server.status": NO_OFFSET_FITS, "server.reason": reason})
        return dataclasses.replace(wf, attributes={**wf.attributes, **info})
    slack = wait.end_ns - send.start_ns - total
    t = send.start_ns + slack // 2
    moved = []
    for s in stages.stages:
        moved.append(dataclasses.replace(s, start_ns=t, end_ns=t + s.duration_ns))
        t += s.duration_ns
    root, unplaced = place(wf.root, moved)
    info.update(
        {
            "server.status": MERGED,
            "server.placement": PLACED_BY_CLIENT,
            "server.placement_uncertainty_ns": slack - slack // 2,
        }
    )
    if unplaced:
        info["server.unplaced_ns"] = unplaced
    return dataclasses.replace(wf, root=root, attributes={**wf.attributes, **info})


def _merge_token_anchored(wf: Waterfall, stages: ServerStages, source: str) -> Waterfall:
    """Prefill-then-decode durations (llama.cpp ``timings``): the server's first token lies
    after the client began sending plus the prefill, before the client's first token chunk,
    and early enough for the decode to end by the client's last byte. It is placed at the
    middle of that window; half the window is the placement uncertainty."""
    info = {"server.source": source, **_kept(stages)}
    send, first = wf.stage("send"), wf.first_token_chunk_ns
    prefill = sum(s.duration_ns for s in stages.stages if s.name == "prefill")
    decode = sum(s.duration_ns for s in stages.stages if s.name != "prefill")
    if send is None:
        reason = "no send stage to place the durations after"
        return _with_info(wf, info, NO_OFFSET_FITS, reason)
    lo = send.start_ns + prefill
    hi = min(wf.end_ns - decode, wf.end_ns if first is None else first)
    if lo > hi:
        reason = (
            f"the server's prefill ({prefill / 1e6:.3f} ms) and decode ({decode / 1e6:.3f} ms) "
            f"do not fit the client's send-to-first-token and send-to-end intervals "
            f"(by {(lo - hi) / 1e6:.3f} ms)"
        )
        return _with_info(wf, info, NO_OFFSET_FITS, reason)
    t = lo + (hi - lo) // 2  # the server's first token, on the client's clock
    moved = [
        dataclasses.replace(s, start_ns=t - prefill + s.start_ns, end_ns=t - prefill + s.end_ns)
        for s in stages.stages
    ]
    root, unplaced = place(wf.root, moved)
    info.update(
        {
            "server.status": MERGED,
            "server.placement": PLACED_BY_CLIENT,
            "server.placement_uncertainty_ns": hi - t,
        }
    )
    if unplaced:
        info["server.unplaced_ns"] = unplaced
    return dataclasses.replace(wf, root=root, attributes={**wf.attributes, **info})


def _with_info(wf: Waterfall, info: dict[str, AttrValue], status: str, reason: str) -> Waterfall:
    info = {**info, "server.status": status, "server.reason": reason}
    return dataclasses.replace(wf, attributes={**wf.attributes, **info})


def merge_timings(wf: Waterfall) -> Waterfall:
    """Merge llama.cpp server's ``timings`` (``prompt_ms`` → ``prefill``, ``predicted_ms`` →
    ``decode``), as recorded on ``wf.attributes["timings.<field>"]`` by the client.

    They are durations: placed in the client's bracket, not aligned by a clock offset
    (``server.placement``, ``server.placement_uncertainty_ns``).
    """
    timings = timings_from_attributes(wf.attributes)
    return merge(wf, timings_stages(timings) if timings else None, source="timings")


def merge_headers(wf: Waterfall) -> Waterfall:
    """Merge the durations the response headers gave (``Server-Timing``, else TGI's
    ``x-*-time``), as recorded on ``wf.attributes["http.<header>"]`` by the client."""
    timing = wf.attributes.get("http.server-timing")
    if isinstance(timing, str):
        return merge(wf, server_timing_stages(timing), source="server-timing")
    tgi = {k[5:]: str(v) for k, v in wf.attributes.items() if k.startswith("http.x-")}
    return merge(wf, tgi_header_stages(tgi) if tgi else None, source="tgi-headers")


def merge_all(
    waterfalls: Sequence[Waterfall],
    stages: Sequence[ServerStages | None],
    *,
    source: str = "otlp",
) -> list[Waterfall]:
    """Merge many requests to one server with one clock offset from all their brackets.

    Raises:
        UsageError: ``stages`` does not hold one entry per waterfall.
    """
    if len(stages) != len(waterfalls):
        raise UsageError(f"{len(waterfalls)} waterfalls but {len(stages)} stage entries")
    pairs = list(zip(waterfalls, stages, strict=True))
    offset = combine(bracket(wf, st) for wf, st in pairs if st is not None and st.timed)
    return [merge(wf, st, offset, source=source) for wf, st in pairs]


def _ids(wf: Waterfall, context: TraceContext | None) -> tuple[str | None, str | None]:
    if context is not None:
        return context.trace_id, context.span_id
    trace_id, span_id = wf.attributes.get("trace_id"), wf.attributes.get("span_id")
    return (
        trace_id if isinstance(trace_id, str) else None,
        span_id if isinstance(span_id, str) else None,
    )


async def amerge(
    waterfalls: Sequence[Waterfall],
    store: SpanStore,
    *,
    contexts: Sequence[TraceContext] | None = None,
    grace: float = 2.0,
    schema: str = "auto",
    names: Mapping[str, str] | None = None,
) -> list[Waterfall]:
    """Wait up to ``grace`` seconds (in all) for each request's server spans, map, align and
    merge them. Requests whose spans never came are marked ``no server data``.

    Args:
        waterfalls: client waterfalls; their ``attributes["trace_id"]``/``["span_id"]`` name
            their traces unless ``contexts`` (from ``inject``) are given, one per waterfall.
        store: where receivers put spans.
        grace: seconds to wait, in all, for spans still in flight (exporters batch them).
        schema, names: see ``map_request``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    found: list[ServerStages | None] = []
    for index, wf in enumerate(waterfalls):
        trace_id, span_id = _ids(wf, None if contexts is None else contexts[index])
        if trace_id is None:
            found.append(None)
            continue

        def ready(spans: list[ServerSpan], span_id: str | None = span_id) -> bool:
            return _map(store, spans, span_id, schema, names) is not None

        spans = await store.await_trace(trace_id, max(0.0, deadline - loop.time()), ready)
        found.append(_map(store, spans, span_id, schema, names))
    return merge_all(waterfalls, found)


def _map(
    store: SpanStore,
    spans: list[ServerSpan],
    span_id: str | None,
    schema: str,
    names: Mapping[str, str] | None,
) -> ServerStages | None:
    return map_request(spans, span_id, schema=schema, names=names, lookup=store.span)
