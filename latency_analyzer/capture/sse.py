"""Sans-IO server-sent events parser (WHATWG "event stream interpretation").

The transport hands in each received network chunk together with its arrival time::

    parser = SSEParser()
    for chunk, t in chunks:
        for event in parser.feed(chunk, t):
            ...
    parser.close(t_end)
    if parser.truncated:
        ...  # the stream ended inside an event or inside a line

Lines are split with bytes methods (no per-byte Python loop) and decoded one complete line at a
time, so a multi-byte UTF-8 character split across two feeds is never decoded in halves.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEParser"]

_BOM = b"\xef\xbb\xbf"
_COLON = 0x3A
_LF = 0x0A
_CR = 0x0D
_SPACE = 0x20
#: Below this many bytes a chunk rarely holds whole events between two cut ones (a streamed
#: chunk is ~150-250 bytes), and looking for them costs more than the general parse saves.
_BURST_MIN = 512


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event.

    Attributes:
        data: the data lines joined with "\\n".
        event: the event type; "message" when the stream named none.
        id: the last event ID seen so far in the stream (it persists across events, as in the
            spec); None while the stream has not sent any ``id`` field.
        retry: the ``retry`` value (ms) sent within this event's lines, else None.
        time_ns: the time of the ``feed()`` call that delivered the blank line completing it.
    """

    data: str
    event: str
    id: str | None
    retry: int | None
    time_ns: int


def _is_single_data_event(data: bytes) -> bool:
    """``data:`` + one line + a blank line, with LF endings only (anything else: slow path)."""
    return (
        data[:5] == b"data:"
        and data[-2:] == b"\n\n"
        and data.count(b"\n", 0, -2) == 0
        and _CR not in data
    )


def _whole_data_events(data: bytes) -> list[bytes | str] | None:
    """The data of each event when ``data`` is nothing but whole ``data:`` + one line + blank
    line events with LF endings (a read of one or more streamed tokens), else None.

    The values are the raw bytes after ``data:`` and its optional space, not yet decoded.
    """
    if data[-2:] != b"\n\n" or data[:5] != b"data:" or _CR in data:
        return None
    if data.find(_LF) == len(data) - 2:  # one event: the usual read of a streamed token
        return [data[6:-2] if data[5] == _SPACE else data[5:-2]]
    parts = data.split(b"\n\n")
    if parts.pop():  # not the empty remainder after the last blank line: LFs in a row
        return None
    values: list[bytes | str] = []
    for part in parts:  # each one line (so no blank line in a row either) of a data field
        if part[:5] != b"data:" or _LF in part:
            return None
        values.append(part[6:] if part[5:6] == b" " else part[5:])
    return values


class SSEParser:
    """Incremental event-stream parser: ``feed(bytes, time_ns)`` then ``close(time_ns)``."""

    def __init__(self) -> None:
        self._tail = bytearray()  # the current partial line (never holds CR or LF)
        self._bom_checked = False
        self._skip_lf = False  # the last feed ended with CR: a leading LF completes a CRLF
        self._closed = False
        self._truncated = False
        self._data: list[str] = []
        self._event = ""
        self._event_retry: int | None = None
        self._in_event = False  # a field line was seen since the last blank line
        self._last_id: str | None = None
        self.comments = 0
        """Comment lines seen (``:`` lines: keep-alive pings and the like)."""
        self.retry: int | None = None
        """The stream's latest valid ``retry`` value in ms (the spec's reconnection time)."""

    @property
    def truncated(self) -> bool:
        """True when ``close()`` found an undispatched event or a partial line pending."""
        return self._truncated

    @property
    def closed(self) -> bool:
        """True once ``close()`` has been called."""
        return self._closed

    def feed(self, data: bytes, time_ns: int) -> list[SSEEvent]:
        """Parse one received chunk.

        Args:
            data: the bytes as received, any split (even inside a UTF-8 character or a CRLF).
            time_ns: when they arrived (``time.perf_counter_ns()``); stamped on every event this
                chunk completes.

        Returns:
            The events completed by this chunk, in order.

        Raises:
            RuntimeError: ``feed()`` after ``close()``.
        """
        return [
            SSEEvent(data, event or "message", last_id, retry, time_ns)
            for data, event, last_id, retry in self.feed_fields(data)
        ]

    def feed_data(self, data: bytes) -> list[str]:
        """Like :meth:`feed`, for a reader that wants only each event's ``data`` (an OpenAI
        stream): the same parse, without building an ``SSEEvent`` per event."""
        if self._closed:
            raise RuntimeError("SSEParser.feed() called after close()")
        if self._idle_between_events() and _is_single_data_event(data):
            value = data[6:-2] if data[5] == _SPACE else data[5:-2]
            return [value.decode("utf-8", "replace")]
        return [fields[0] for fields in self.feed_fields(data)]

    @property
    def idle(self) -> bool:
        """Nothing pending, the stream's start read (its BOM settled) and not closed: a read
        that is one whole event now is read alone."""
        return self._bom_checked and not (
            self._tail or self._in_event or self._skip_lf or self._closed
        )

    def take_single(self, data: bytes) -> bytes | None:
        """The raw data of ``data`` when it is one whole ``data:`` event (one line, then the
        blank line, LF endings) and nothing is pending: the usual read of a streamed token,
        taken as :meth:`feed_raw` takes it. Else None, and ``data`` is left unread."""
        if (
            self.idle
            and data.find(_LF) == len(data) - 2
            and data[-2:] == b"\n\n"
            and data[:5] == b"data:"
            and _CR not in data
        ):
            return data[6:-2] if data[5] == _SPACE else data[5:-2]
        return None

    def feed_raw(self, data: bytes) -> list[bytes | str]:
        """Like :meth:`feed_data`, leaving the decoding to the reader when it can: the data of
        a whole ``data:`` event that arrived in one chunk, the usual read of a stream, is the
        bytes received (UTF-8, not checked); any other event's is a decoded string."""
        if self._closed:
            raise RuntimeError("SSEParser.feed() called after close()")
        if self._bom_checked and not (self._tail or self._in_event or self._skip_lf):
            if (
                data.find(_LF) == len(data) - 2  # one line, then the blank line (or no LF)
                and data[-2:] == b"\n\n"
                and data[:5] == b"data:"
                and _CR not in data
            ):  # one whole event, the usual read of a streamed token: _whole_data_events inlined
                return [data[6:-2] if data[5] == _SPACE else data[5:-2]]
            values = _whole_data_events(data)
            if values is not None:
                return values
        if len(data) >= _BURST_MIN and _CR not in data:
            # Whole events between the end of one cut at the start and the start of one cut at
            # the end, as a read in a burst brings them: the general parse for the two cut
            # ones only (the state machine gives the same events however a chunk is split).
            first = data.find(b"\n\n") + 2
            last = data.rfind(b"\n\n") + 2
            if 1 < first < last:
                values = [fields[0] for fields in self.feed_fields(data[:first])]
                whole = None
                if not (self._tail or self._in_event or self._skip_lf):
                    whole = _whole_data_events(data[first:last])
                if whole is None:
                    values += [fields[0] for fields in self.feed_fields(data[first:last])]
                else:
                    values += whole
                values += [fields[0] for fields in self.feed_fields(data[last:])]
                return values
        return [fields[0] for fields in self.feed_fields(data)]

    def feed_fields(self, data: bytes) -> list[tuple[str, str, str | None, int | None]]:
        """The events one chunk completes as ``(data, event or "", id, retry)`` tuples."""
        if self._closed:
            raise RuntimeError("SSEParser.feed() called after close()")
        if self._idle_between_events() and _is_single_data_event(data):
            # the usual shape of a streamed token: one "data: ...\n\n" per read
            value = data[6:-2] if data[5] == _SPACE else data[5:-2]
            return [(value.decode("utf-8", "replace"), "", self._last_id, None)]
        if self._skip_lf and data:
            self._skip_lf = False
            if data[0] == _LF:
                data = data[1:]
        if not self._bom_checked:
            data = self._strip_bom(data)
        if not data:
            return []
        if _LF not in data and _CR not in data:
            self._tail += data
            return []
        if self._tail:
            data = bytes(self._tail) + data
            self._tail.clear()
        # A CR ends its line now; remember it so a LF opening the next feed is not a new line.
        self._skip_lf = data[-1] == _CR
        if _CR in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        self._tail += lines.pop()
        return self._process(lines)

    def close(self, time_ns: int) -> list[SSEEvent]:
        """End of stream. Per the spec an incomplete event is discarded, never dispatched.

        Args:
            time_ns: when the stream ended (kept for symmetry with ``feed``).

        Returns:
            Always an empty list; see ``truncated`` for whether anything was dropped.
        """
        del time_ns
        if not self._closed:
            self._closed = True
            self._truncated = bool(self._tail) or self._in_event
        return []

    def _idle_between_events(self) -> bool:
        """Nothing pending: no partial line, no field of an undispatched event, BOM settled."""
        return self._bom_checked and not (self._tail or self._in_event or self._skip_lf)

    def _strip_bom(self, data: bytes) -> bytes:
        """Drop one leading UTF-8 BOM, which may itself arrive split across feeds."""
        if self._tail:
            data = bytes(self._tail) + data
            self._tail.clear()
        if len(data) < len(_BOM) and _BOM.startswith(data):
            self._tail += data  # could still become a BOM: decide on the next feed
            return b""
        self._bom_checked = True
        return data[len(_BOM) :] if data.startswith(_BOM) else data

    def _process(self, lines: list[bytes]) -> list[tuple[str, str, str | None, int | None]]:
        events: list[tuple[str, str, str | None, int | None]] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(self._dispatch())
                else:  # a blank line with no data dispatches nothing, but ends the event
                    self._event, self._event_retry, self._in_event = "", None, False
            elif line[:5] == b"data:":  # nearly every line: the field, without the partition
                self._in_event = True
                self._data.append(
                    (line[6:] if line[5:6] == b" " else line[5:]).decode("utf-8", "replace")
                )
            elif line[0] == _COLON:
                self.comments += 1
            else:
                self._field(line.decode("utf-8", "replace"))
        return events

    def _field(self, line: str) -> None:
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        self._in_event = True
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._event_retry = self.retry = int(value)
        # any other field name is ignored, as the spec requires

    def _dispatch(self) -> tuple[str, str, str | None, int | None]:
        """The pending event (it has data) as ``(data, event, id, retry)``; state reset."""
        data, event, retry = self._data, self._event, self._event_retry
        self._data, self._event, self._event_retry = [], "", None
        self._in_event = False
        return ("\n".join(data) if len(data) > 1 else data[0]), event, self._last_id, retry
