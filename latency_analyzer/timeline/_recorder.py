"""The mutable side: capture code marks instants on a Recorder, which hands out a Waterfall."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Final

from ..errors import UsageError
from ._clock import ClockAnchor, process_anchor
from ._span import _NO_ATTRIBUTES, AttrValue, Span, _OpenSpan, prechecked_span
from ._stages import CLIENT_STAGES, ROOT_NAME
from ._tcpinfo import TcpInfo
from ._tokens import (
    MAX_TOKEN_COUNT,
    MAX_TOKENS_PER_CHAR,
    claim_value,
    distribute_tokens,
    token_cap,
)
from ._unfrozen import unfrozen
from ._waterfall import ConnectionInfo, TlsInfo, Waterfall

__all__ = ["Recorder"]

_STAGE_NAMES = frozenset(CLIENT_STAGES)
_OpenWaterfall = unfrozen(Waterfall)
_NO_CONNECTION = ConnectionInfo()  # frozen: one shared instance until the connector sets one
_new = object.__new__


def _span(
    name: str, start_ns: int, end_ns: int, attributes: dict[str, AttrValue] | None = None
) -> Span:
    """A client span from instants given to the Recorder: the one check ``Span()`` makes of
    them, then built as is (``attributes``: a dict made for this span, wrapped, not copied)."""
    if end_ns < start_ns:
        raise UsageError(f"span {name!r} ends before it starts ({start_ns} > {end_ns})")
    attrs = MappingProxyType(attributes) if attributes else _NO_ATTRIBUTES
    return prechecked_span(name, start_ns, end_ns, "client", attrs)


def _in_start_order(spans: list[Span]) -> tuple[Span, ...]:
    """The spans as children of one parent: sorted by start as ``Span()`` would sort them."""
    previous = None
    for span in spans:
        if previous is not None and previous > span.start_ns:
            return tuple(sorted(spans, key=lambda s: (s.start_ns, s.end_ns)))
        previous = span.start_ns
    return tuple(spans)


#: One content chunk, a plain tuple (one is made per streamed token): (arrival ns; weight,
#: the characters of content + reasoning, which split a usage total over the chunks; its
#: known token count from continuous usage stats, else None; whether it is reasoning)
_Chunk = tuple[int, int, int | None, bool]
_TIME: Final = 0
_WEIGHT: Final = 1
_TOKENS: Final = 2
_REASONING: Final = 3


class Recorder:
    """Collects the instants of one request as they happen; ``finish()`` freezes them.

    Stages before the response (``pool_wait`` … ``send``) are marked with ``begin``/``end`` or
    ``add``. The response phase is derived from three kinds of marks, so every transport
    (HTTP/1.1, HTTP/2, non-streaming) builds it the same way: ``response_headers``, one
    ``chunk`` per content-carrying chunk, and the end given to ``finish``:
    ``wait`` = send end → headers, ``first_token`` = headers → first chunk,
    ``decode`` = first → last chunk, ``tail`` = last chunk (or headers) → end.

    Timestamps are ``perf_counter_ns`` values read by the caller; nothing here reads a clock
    except the process anchor.
    """

    # slotted: every request makes one, and thirty attributes fill an instance dict
    __slots__ = (
        "_chunks",
        "_closed",
        "_empty",
        "_finished",
        "_kernel_reads",
        "_lags",
        "_open",
        "_refused",
        "_shared",
        "_spans",
        "_user_reads",
        "anchor",
        "attributes",
        "connection",
        "error",
        "error_type",
        "headers_ns",
        "http_version",
        "intended_start_ns",
        "interrupted",
        "method",
        "multi_event_reads",
        "start_ns",
        "status",
        "tcp_connect",
        "tcp_end",
        "tls",
        "url",
        "usage_completion",
        "usage_prompt",
    )

    def __init__(
        self,
        method: str,
        url: str,
        *,
        start_ns: int,
        intended_start_ns: int | None = None,
        anchor: ClockAnchor | None = None,
    ) -> None:
        self.method = method
        self.url = url
        self.start_ns = start_ns
        self.intended_start_ns = intended_start_ns
        self.anchor = anchor if anchor is not None else process_anchor()
        self._spans: list[Span] = []
        self._closed: set[str] = set()  # the names in _spans
        self._open: dict[str, tuple[int, dict[str, AttrValue]]] = {}
        self._chunks: list[_Chunk] = []
        self._empty: tuple[int, int] | None = None  # first and last empty-text token chunk
        self.headers_ns: int | None = None
        self.status: int | None = None
        self.http_version: str | None = None
        self.tls: TlsInfo | None = None
        self.connection = _NO_CONNECTION
        self.tcp_connect: TcpInfo | None = None
        self.tcp_end: TcpInfo | None = None
        self.error: str | None = None
        self.error_type: str | None = None
        self.usage_prompt: int | None = None
        self.usage_completion: int | None = None
        self.attributes: dict[str, AttrValue] = {}
        self.interrupted = False
        self._finished = False
        self._lags: list[int] = []  # userspace - kernel instant of every read of the response
        self._kernel_reads = 0
        self._user_reads = 0
        self._refused: str | None = None
        self.multi_event_reads = 0
        self._shared: list[int] = []

    # -- stages --
    def begin(self, name: str, t_ns: int, **attrs: AttrValue) -> None:
        """Open stage ``name`` (one of ``CLIENT_STAGES``) at ``t_ns``."""
        if name not in _STAGE_NAMES:
            raise UsageError(f"{name!r} is not a client stage (one of {', '.join(CLIENT_STAGES)})")
        if name in self._open:
            raise UsageError(f"stage {name!r} is already open")
        self._open[name] = (t_ns, attrs)  # ``**attrs`` is a dict of this call's own

    def end(self, name: str, t_ns: int, **attrs: AttrValue) -> None:
        """Close the open stage ``name`` at ``t_ns``, adding ``attrs``.

        A ``t_ns`` before the stage's start closes it at its start (zero length), not an error:
        an end read from the kernel (a TCP round trip, a socket's last write) can precede the
        userspace instant that opened the stage.
        """
        try:
            start, opened = self._open.pop(name)
        except KeyError:
            raise UsageError(f"stage {name!r} was not begun") from None
        if attrs:
            opened.update(attrs)
        # what _span/prechecked_span build, inline (every stage of every request ends here):
        # the end is clamped to the start, so nothing is left to check; ``opened`` was made
        # for this stage (``begin``): the span wraps it, no copy
        span = _new(_OpenSpan)
        span.name = name
        span.start_ns = start
        span.end_ns = t_ns if t_ns > start else start
        span.source = "client"
        span.attributes = MappingProxyType(opened) if opened else _NO_ATTRIBUTES
        span.children = ()
        span.__class__ = Span
        self._spans.append(span)
        self._closed.add(name)

    def move_start(self, name: str, t_ns: int) -> None:
        """Start the open stage ``name`` at ``t_ns`` instead: a boundary known only later (the
        instant a query left, read once the lookup is done)."""
        try:
            _, opened = self._open[name]
        except KeyError:
            raise UsageError(f"stage {name!r} was not begun") from None
        self._open[name] = (t_ns, opened)

    def add(self, name: str, start_ns: int, end_ns: int, **attrs: AttrValue) -> None:
        """Record a closed stage."""
        self._spans.append(_span(name, start_ns, end_ns, attrs))
        self._closed.add(name)

    def is_open(self, name: str) -> bool:
        return name in self._open

    def has(self, name: str) -> bool:
        """True if a closed stage ``name`` was recorded."""
        return name in self._closed

    def span_end(self, name: str) -> int | None:
        """End of the last closed stage called ``name``."""
        end = None
        for span in self._spans:
            if span.name == name:
                end = span.end_ns
        return end

    def span_start(self, name: str) -> int | None:
        """Start of the first closed stage called ``name``."""
        return next((s.start_ns for s in self._spans if s.name == name), None)

    @property
    def response_reads(self) -> int:
        """Reads of response bytes recorded so far (``read``)."""
        return self._kernel_reads + self._user_reads

    # -- reads --
    def read(
        self, kernel_ns: int, user_ns: int, stamped: bool = True, refused: str | None = None
    ) -> None:
        """One read of response bytes: the kernel's arrival time and when we got the bytes.

        ``stamped`` False: the kernel gave no stamp (``refused`` says why, when known) and
        ``kernel_ns`` is the userspace instant; the waterfall's ``clock_source`` says so.
        """
        if stamped:
            self._kernel_reads += 1
            self._lags.append(user_ns - kernel_ns)
        else:
            self._user_reads += 1
            if refused is not None:
                self._refused = refused

    def multi_event_read(self, chunks: range = range(0)) -> None:
        """One read carried a content chunk and more events after it: they share the read's
        stamp, the arrival of its last bytes. ``chunks``: the indices of the chunks so
        stamped (not the read's last event)."""
        self.multi_event_reads += 1
        self._shared.extend(chunks)

    @property
    def chunk_count(self) -> int:
        return len(self._chunks)

    # -- response --
    def response_headers(self, t_ns: int, status: int | None = None) -> None:
        """The response headers were complete at ``t_ns``."""
        self.headers_ns = t_ns
        if status is not None:
            self.status = status

    def chunk(
        self, t_ns: int, weight: int, tokens: int | None = None, reasoning: bool = False
    ) -> None:
        """A content-carrying chunk arrived at ``t_ns`` (role-only or empty chunks are not)."""
        self._chunks.append((t_ns, weight, tokens, reasoning))

    def empty_chunk(self, t_ns: int) -> None:
        """A chunk carried a token whose text is empty (not content, but the server's token)."""
        first = t_ns if self._empty is None else self._empty[0]
        self._empty = (first, t_ns)

    def usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The server's own token counts (OpenAI ``usage``)."""
        if prompt_tokens is not None:
            if prompt_tokens > MAX_TOKEN_COUNT:
                self.attributes["usage_input_tokens_claimed"] = claim_value(prompt_tokens)
            self.usage_prompt = min(prompt_tokens, MAX_TOKEN_COUNT)
        if completion_tokens is not None:
            self.usage_completion = completion_tokens

    def fail(self, error_type: str, message: str, t_ns: int, *, terminal: bool = True) -> None:
        """Record a failure at ``t_ns``; the first failure wins, later ones are kept as notes.

        ``terminal`` failures cut the request short (reset, timeout): stages still open end at
        ``t_ns`` marked ``interrupted``. Non-terminal ones (a malformed chunk, an HTTP error
        status with a complete body) leave the timeline as it is.
        """
        self.interrupted = self.interrupted or terminal
        if self.error is None:
            self.error_type, self.error = error_type, message
        else:
            self.attributes.setdefault("later_error", f"{error_type}: {message}")
        for name in list(self._open):
            self.end(name, t_ns, interrupted=True)

    # -- freezing --
    def finish(self, t_ns: int) -> Waterfall:
        """Close what is open at ``t_ns`` (the stream end or the failure) and freeze."""
        if self._finished:
            raise UsageError("this recorder already finished")
        self._finished = True
        if self._open:
            for name in list(self._open):
                self.end(name, t_ns, interrupted=self.interrupted)
        headers_ns = self.headers_ns
        if headers_ns is not None:  # a send past the headers is rare: looked for inline
            for span in self._spans:
                if span.name == "send" and span.end_ns > headers_ns:
                    self._clip_send(headers_ns)
                    break
        end_ns = t_ns
        for span in self._spans:
            if span.end_ns > end_ns:
                end_ns = span.end_ns
        if self.intended_start_ns is None:  # no schedule: no schedule_lag (nearly always)
            spans = [*self._spans, *self._response_spans(end_ns)]
        else:
            spans = [*self._lag_span(), *self._spans, *self._response_spans(end_ns)]
        # a request a scheduler started early (clock conversion, a few µs) starts when it did
        intended = self.intended_start_ns
        root_start = self.start_ns if intended is None else min(self.start_ns, intended)
        if end_ns < root_start:
            raise UsageError(f"span {ROOT_NAME!r} ends before it starts ({root_start} > {end_ns})")
        # _in_start_order, inline: the spans nearly always are in start order already
        previous = spans[0].start_ns if spans else 0
        for span in spans:
            if previous > span.start_ns:
                children = _in_start_order(spans)
                break
            previous = span.start_ns
        else:
            children = tuple(spans)
        root = prechecked_span(ROOT_NAME, root_start, end_ns, "client", _NO_ATTRIBUTES, children)
        chunks = self._chunks
        if chunks or self.usage_completion is not None:
            times, tokens, n_out, source = self._token_counts()
        else:  # what _token_counts gives for no chunks and no usage, without the work
            times, tokens, n_out, source = (), (), None, None
        first_reasoning = first_answer = None
        for c in chunks:
            if c[_REASONING]:
                if first_reasoning is None:
                    first_reasoning = c[_TIME]
                    if first_answer is not None:
                        break
            elif first_answer is None:
                first_answer = c[_TIME]
                if first_reasoning is not None:
                    break
        # every field of the Waterfall is set here, defaults included (see ._unfrozen)
        wf = _new(_OpenWaterfall)
        wf.root = root
        wf.method = self.method
        wf.url = self.url
        wf.status = self.status
        wf.http_version = self.http_version
        wf.error = self.error
        wf.error_type = self.error_type
        wf.chunk_times_ns = times
        wf.chunk_tokens = tokens
        wf.first_reasoning_ns = first_reasoning
        wf.first_answer_ns = first_answer
        wf.output_tokens = n_out
        wf.output_tokens_source = source
        wf.input_tokens = self.usage_prompt
        wf.tls = self.tls
        wf.connection = self.connection
        wf.anchor = self.anchor
        wf.tcp_connect = self.tcp_connect
        wf.tcp_end = self.tcp_end
        self._set_read_fields(wf)
        if self._empty is None:  # no empty-text token chunk: what the two below give
            wf.first_chunk_ns = wf.last_chunk_ns = None
        else:
            wf.first_chunk_ns = self._empty_before(times[0] if times else None)
            wf.last_chunk_ns = self._empty_after(times[-1] if times else None)
        # after the read fields, which may add a note; copied: the Recorder's dict stays its own
        wf.attributes = MappingProxyType(dict(self.attributes))
        wf.__class__ = Waterfall
        frozen: Waterfall = wf
        return frozen

    def _empty_before(self, first_ns: int | None) -> int | None:
        if self._empty is None or (first_ns is not None and self._empty[0] >= first_ns):
            return None
        return self._empty[0]

    def _empty_after(self, last_ns: int | None) -> int | None:
        if self._empty is None or (last_ns is not None and self._empty[1] <= last_ns):
            return None
        return self._empty[1]

    def _set_read_fields(self, wf: Any) -> None:
        """clock_source, read lag and read counts of the Waterfall being built."""
        kernel, user = self._kernel_reads, self._user_reads
        if not kernel and not user:
            wf.clock_source = wf.read_lag_p50_ns = wf.read_lag_max_ns = None
            wf.reads = wf.multi_event_reads = 0
            wf.shared_read_chunks = ()
            return
        wf.clock_source = "kernel" if not user else "userspace" if not kernel else "mixed"
        if self._refused is not None:
            self.attributes.setdefault("clock_note", self._refused)
        wf.reads = kernel + user
        wf.multi_event_reads = self.multi_event_reads
        wf.shared_read_chunks = tuple(self._shared)
        lags = self._lags
        if len(lags) > 1:
            lags = sorted(lags)
        wf.read_lag_p50_ns = lags[(len(lags) - 1) // 2] if lags else None
        wf.read_lag_max_ns = lags[-1] if lags else None

    def _clip_send(self, headers: int) -> None:
        """A ``send`` whose last byte left after the response headers arrived (a server that
        answered before reading the whole body, or a drain noticed late) ends at the headers:
        the stages stay in path order and ``wait`` is zero."""
        for i, span in enumerate(self._spans):
            if span.name == "send" and span.end_ns > headers:
                attrs = {
                    **span.attributes,
                    "last_byte_after_headers_ms": (span.end_ns - headers) / 1e6,
                }
                end = max(span.start_ns, headers)
                self._spans[i] = _span("send", span.start_ns, end, attrs)

    def _lag_span(self) -> list[Span]:
        if self.intended_start_ns is None:
            return []
        lo = min(self.intended_start_ns, self.start_ns)
        return [_span("schedule_lag", lo, self.start_ns)]

    def _response_spans(self, end_ns: int) -> list[Span]:
        """wait / first_token / decode / tail from the response marks."""
        send_end = None  # span_end("send"), inline
        for span in self._spans:
            if span.name == "send":
                send_end = span.end_ns
        if send_end is None:
            return []
        failed: dict[str, AttrValue] | None = {"interrupted": True} if self.interrupted else None
        if self.headers_ns is None:
            return [_span("wait", send_end, max(send_end, end_ns), failed)]
        headers = max(self.headers_ns, self.start_ns)
        # wait and tail cannot run backwards (min/max below): built without the check
        out = [prechecked_span("wait", min(send_end, headers), headers)]
        last = headers
        if self._chunks:  # chunk instants came from outside: these two are checked
            first, last = self._chunks[0][_TIME], self._chunks[-1][_TIME]
            out.append(_span("first_token", headers, first))
            out.append(_span("decode", first, last))
        tail_attrs = _NO_ATTRIBUTES if failed is None else MappingProxyType(failed)
        out.append(prechecked_span("tail", last, max(last, end_ns), "client", tail_attrs))
        return out

    def _token_counts(self) -> tuple[tuple[int, ...], tuple[int, ...], int | None, str | None]:
        """Chunk times, tokens per chunk, output tokens and where that count came from."""
        chunks = self._chunks
        times = tuple([c[_TIME] for c in chunks])
        if chunks and all(c[_TOKENS] is not None for c in chunks):
            known = tuple(min(c[_TOKENS] or 0, token_cap(c[_WEIGHT])) for c in chunks)
            self._note_claim(sum(c[_TOKENS] or 0 for c in chunks), sum(known))
            return times, known, sum(known), "continuous_usage"
        total = self.usage_completion
        if total is not None:
            weights = [c[_WEIGHT] for c in chunks]
            # a server's count sizes lists (itl): at most what the received text can hold
            # (the sum of token_cap over the chunks)
            room = (
                MAX_TOKENS_PER_CHAR * sum([w for w in weights if w > 0]) + len(weights)
                if chunks
                else None
            )
            total = self._note_claim(total, min(total, MAX_TOKEN_COUNT if room is None else room))
            split = distribute_tokens(total, weights)
            if split is not None:
                return times, tuple(split), total, "usage"
            if not self._chunks:
                return times, (), total, "usage"
            self.attributes["usage_mismatch"] = f"usage says {total} tokens in {len(times)} chunks"
        n = len(times)
        return times, (1,) * n, (n if n else None), ("chunks" if n else None)

    def _note_claim(self, claimed: int, capped: int) -> int:
        """Keep a server's token count that exceeds what arrived, as a claim; return the cap."""
        if claimed > capped:
            self.attributes["usage_output_tokens_claimed"] = claim_value(claimed)
        return capped
