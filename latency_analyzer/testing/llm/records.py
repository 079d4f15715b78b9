"""Ground truth of the test-bed LLM server: one frozen record per request, built as it is served."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .behavior import Behavior

__all__ = ["RecordBuilder", "RequestRecord"]


@dataclass(frozen=True)
class RequestRecord:
    """Ground truth for one request; instants are ``time.perf_counter_ns()`` values.

    ``perf_counter_ns`` is CLOCK_MONOTONIC on Linux, shared by every process on the host, so
    records from :meth:`LLMServer.run_in_subprocess` compare directly with the caller's clock.

    Attributes:
        path: request path.
        stream: whether the response was streamed.
        status: HTTP status sent (0 if no response was sent).
        peer: client (host, port); equal ports mean the same TCP connection.
        behavior: the effective knobs after per-request overrides.
        received_ns: request body fully read (``t0``).
        arrived_ns: when the read that completed the request reached this host: the kernel's
            receive stamp (on loopback, the instant a packet capture shows it), which a
            server busy with other requests does not move as it moves ``received_ns``. None
            where the kernel gives no stamp, and for a request that had a later one read
            whole behind it on its connection (pipelined), whose read that would be.
        headers_ns: just before the response headers were written (None if never).
        chunk_ns: just before each token chunk was written (valid token chunks only).
        chunk_tokens: tokens carried by each of those chunks.
        end_ns: response finished, connection aborted, or handler stopped.
        prompt_tokens: whitespace-separated words in the prompt (at least 1).
        slot_wait_ns: time spent waiting for a free slot (``LLMServer(slots=N)``) before
            ``received_ns``, which then marks the start of service.
        server_timing: the ``Server-Timing`` header sent (``LLMServer(server_timing=True)``).
        body: the JSON body received (``LLMServer(record_requests=True)``; else None).
        headers: the request headers received (``record_requests=True``; else None).
    """

    path: str
    stream: bool
    status: int
    peer: tuple[str, int]
    behavior: Behavior
    received_ns: int
    headers_ns: int | None
    chunk_ns: tuple[int, ...]
    chunk_tokens: tuple[int, ...]
    end_ns: int
    prompt_tokens: int
    slot_wait_ns: int = 0
    server_timing: str | None = None
    body: dict[str, Any] | None = field(default=None, hash=False)
    headers: dict[str, str] | None = field(default=None, hash=False)
    arrived_ns: int | None = None

    @property
    def first_token_ns(self) -> int | None:
        """When the first token chunk was written, if any."""
        return self.chunk_ns[0] if self.chunk_ns else None

    @property
    def output_tokens(self) -> int:
        """Tokens sent in valid chunks (or in the non-streamed body)."""
        return sum(self.chunk_tokens)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict (inverse of :meth:`from_json`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRecord:
        """Rebuild a record from :meth:`to_json` output."""
        fields = dict(data)
        fields["peer"] = tuple(fields["peer"])
        fields["behavior"] = Behavior(**fields["behavior"])
        fields["chunk_ns"] = tuple(fields["chunk_ns"])
        fields["chunk_tokens"] = tuple(fields["chunk_tokens"])
        return cls(**fields)


@dataclass
class RecordBuilder:
    """The mutable ground truth of a request being served; :meth:`publish` freezes it once.

    The server's handlers stamp it as they write (``headers_ns``, ``chunk_ns``, ...); the
    frozen :class:`RequestRecord` goes to ``sink`` (the server's ``records``) and to
    ``on_publish`` (the span emitter), with ``end_ns`` read at that moment.
    """

    path: str
    peer: tuple[str, int]
    received_ns: int
    behavior: Behavior = field(default_factory=Behavior)
    stream: bool = False
    status: int = 0
    prompt_tokens: int = 1
    headers_ns: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    sink: list[RequestRecord] = field(default_factory=list)
    published: bool = False
    slot_wait_ns: int = 0
    server_timing: str | None = None
    on_publish: Callable[[RequestRecord], None] | None = None
    body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    arrived_ns: int | None = None

    def publish(self) -> None:
        """Freeze the record (``end_ns`` = now) into ``sink``, once.

        Called just before the response's final write, so a client that has seen the end
        of its response always finds the record.
        """
        if not self.published:
            self.published = True
            record = self.freeze()
            self.sink.append(record)
            if self.on_publish is not None:
                self.on_publish(record)

    def freeze(self) -> RequestRecord:
        """The record as it stands, ending now."""
        values = {name: getattr(self, name) for name in _COPIED}
        return RequestRecord(
            **values,
            chunk_ns=tuple(self.chunk_ns),
            chunk_tokens=tuple(self.chunk_tokens),
            end_ns=time.perf_counter_ns(),
        )


#: The :class:`RequestRecord` fields a :class:`RecordBuilder` holds as they are.
_COPIED = tuple(
    f.name
    for f in dataclasses.fields(RequestRecord)
    if f.name not in ("chunk_ns", "chunk_tokens", "end_ns")
)
