"""The immutable record of one request: its span tree plus the metrics users ask about."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._redact import redact_text, redact_url
from ..errors import RequestError, UsageError
from ._clock import ClockAnchor
from ._display import present
from ._info import ConnectionInfo, TlsInfo
from ._serial import waterfall_from_dict, waterfall_to_dict
from ._span import AttrValue, Span, exclusive_ns
from ._tcpinfo import TcpInfo
from ._tokens import per_token_gaps_ns

__all__ = ["ConnectionInfo", "TlsInfo", "Waterfall"]


def _s(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e9


@dataclass(frozen=True, slots=True)
class Waterfall:
    """Where the time of one request went. Built by a ``Recorder``; immutable.

    ``root`` spans from the request's start (its intended start, in an open-loop run) to its
    end; its children are the client stages. Token arrivals are kept per content-carrying chunk
    (``chunk_times_ns``) with the number of tokens each chunk carried (``chunk_tokens``).
    ``tcp_connect`` is the kernel's view of the connection (``TCP_INFO``) once it was set up,
    ``tcp_end`` the same at the end of this request (None: not TCP, or not Linux).

    Arrival instants are the kernel's receive timestamps of the reads that brought the bytes
    where ``clock_source`` is ``"kernel"`` (``"userspace"``: when our event loop read them;
    ``"mixed"``: some of each; None: nothing was read). The kernel stamps a read's last
    segment, so chunks that shared one read share its stamp; ``multi_event_reads`` counts
    the reads where a content chunk had more events after it, and ``shared_read_chunks``
    names those chunks (indices into ``chunk_times_ns``): each carries the arrival of bytes
    that came after it: its own arrival lies after the connection's previous read began, and
    no later than that stamp (the read lag does not bound it). The response headers' read
    is marked the same way: ``attributes["headers_read_with_body"]`` when it also brought
    body bytes, so the end of ``wait`` may be their arrival. ``read_lag_p50_ns`` /
    ``read_lag_max_ns``: how long after the kernel's stamp our event loop read the bytes
    (median and worst of the response's ``reads``).

    A server can stream a token whose text is empty (a byte-level tokenizer's partial UTF-8
    piece): a token to the server, nothing to read for the user. ``first_chunk_ns`` is the
    first such chunk when it came before the first content-carrying one, ``last_chunk_ns`` the
    last when it came after the last; None otherwise. ``ttft`` counts visible content,
    ``ttfc`` the first token chunk of either kind (what a server's own TTFT measures).
    """

    root: Span
    method: str
    url: str
    status: int | None = None
    http_version: str | None = None
    error: str | None = None
    error_type: str | None = None
    chunk_times_ns: tuple[int, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    first_reasoning_ns: int | None = None
    first_answer_ns: int | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None
    input_tokens: int | None = None
    tls: TlsInfo | None = None
    connection: ConnectionInfo = field(default_factory=ConnectionInfo)
    anchor: ClockAnchor | None = None
    attributes: Mapping[str, AttrValue] = field(default_factory=dict, hash=False)
    tcp_connect: TcpInfo | None = None
    tcp_end: TcpInfo | None = None
    clock_source: str | None = None
    read_lag_p50_ns: int | None = None
    read_lag_max_ns: int | None = None
    reads: int = 0
    multi_event_reads: int = 0
    first_chunk_ns: int | None = None
    last_chunk_ns: int | None = None
    shared_read_chunks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.attributes, MappingProxyType):
            object.__setattr__(self, "attributes", MappingProxyType(dict(self.attributes)))

    # -- whole request -------------------------------------------------------------------------
    @property
    def start_ns(self) -> int:
        return self.root.start_ns

    @property
    def end_ns(self) -> int:
        return self.root.end_ns

    @property
    def e2e_ns(self) -> int:
        """End-to-end nanoseconds: start (intended start in open loop) to stream end or failure."""
        return self.root.duration_ns

    @property
    def e2e(self) -> float:
        return self.e2e_ns / 1e9

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def start_epoch_ns(self) -> int | None:
        """The start as Unix epoch ns (through the process's clock anchor)."""
        return None if self.anchor is None else self.anchor.to_epoch_ns(self.start_ns)

    # -- stages --
    @property
    def stages(self) -> dict[str, Span]:
        """Client stages by name, in path order (the first span of each name)."""
        out: dict[str, Span] = {}
        for span in self.root.children:
            out.setdefault(span.name, span)
        return out

    def stage(self, name: str) -> Span | None:
        """The client stage called ``name``, or None if the request never had it."""
        return self.stages.get(name)

    def attribution_ns(self) -> dict[str, int]:
        """Exclusive nanoseconds per stage; the values sum to ``e2e_ns`` exactly."""
        return exclusive_ns(self.root)

    def attribution(self) -> dict[str, float]:
        """Exclusive seconds per stage (``network``/``other`` for what no stage explains).

        Computed from integer nanoseconds, so ``math.fsum`` of the values equals ``e2e``.
        """
        return {name: ns / 1e9 for name, ns in self.attribution_ns().items()}

    # -- tokens --
    @property
    def first_token_ns(self) -> int | None:
        return self.chunk_times_ns[0] if self.chunk_times_ns else None

    @property
    def last_token_ns(self) -> int | None:
        return self.chunk_times_ns[-1] if self.chunk_times_ns else None

    @property
    def ttft_ns(self) -> int | None:
        """Start to the first content-carrying chunk (reasoning or answer)."""
        first = self.first_token_ns
        return None if first is None else first - self.start_ns

    @property
    def ttft(self) -> float | None:
        return _s(self.ttft_ns)

    @property
    def ttft_wire_ns(self) -> int | None:
        """First request byte handed to the kernel (``send`` start) to the first token's
        arrival: what the network and the server cost, without our own work before sending."""
        first, send = self.first_token_ns, self.stage("send")
        return None if first is None or send is None else first - send.start_ns

    @property
    def ttft_wire(self) -> float | None:
        return _s(self.ttft_wire_ns)

    @property
    def read_lag_p50(self) -> float | None:
        """Median seconds between a read's kernel stamp and our event loop getting it."""
        return _s(self.read_lag_p50_ns)

    @property
    def read_lag_max(self) -> float | None:
        return _s(self.read_lag_max_ns)

    @property
    def first_token_chunk_ns(self) -> int | None:
        """The first chunk that carried a token, empty text included."""
        return self.first_token_ns if self.first_chunk_ns is None else self.first_chunk_ns

    @property
    def last_token_chunk_ns(self) -> int | None:
        """The last chunk that carried a token, empty text included."""
        return self.last_token_ns if self.last_chunk_ns is None else self.last_chunk_ns

    @property
    def ttfc_ns(self) -> int | None:
        """Time to first token chunk: start to the first chunk that carried a token, empty text
        included (the server's first token as the client received it); ``<= ttft_ns``."""
        first = self.first_token_chunk_ns
        return None if first is None else first - self.start_ns

    @property
    def ttfc(self) -> float | None:
        return _s(self.ttfc_ns)

    @property
    def ttfrt(self) -> float | None:
        """Time to first reasoning token (``reasoning_content``), None without reasoning."""
        t = self.first_reasoning_ns
        return None if t is None else (t - self.start_ns) / 1e9

    @property
    def ttfat(self) -> float | None:
        """Time to first answer token (``content``), excluding reasoning."""
        t = self.first_answer_ns
        return None if t is None else (t - self.start_ns) / 1e9

    @property
    def tpot(self) -> float | None:
        """(last token - first token) / (output tokens - 1); None below two tokens."""
        n = self.output_tokens
        first, last = self.first_token_ns, self.last_token_ns
        if n is None or n < 2 or first is None or last is None:
            return None
        return (last - first) / (n - 1) / 1e9

    @property
    def itl(self) -> tuple[float, ...]:
        """Per-token gaps in seconds (a chunk of k tokens gives k equal gaps); mean == tpot."""
        return tuple(g / 1e9 for g in per_token_gaps_ns(self.chunk_times_ns, self.chunk_tokens))

    @property
    def chunk_gaps(self) -> tuple[float, ...]:
        """Gaps in seconds between consecutive content-carrying chunks, as received."""
        t = self.chunk_times_ns
        return tuple((t[i] - t[i - 1]) / 1e9 for i in range(1, len(t)))

    # -- conveniences --
    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON-ready form (versioned); ``Waterfall.from_dict`` reads it back."""
        return waterfall_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Waterfall:
        """Rebuild a waterfall from ``to_dict`` output (exact: nanoseconds are integers)."""
        return waterfall_from_dict(data, cls)

    # -- presentation: registered by the layers that draw and diagnose (``_display``) --
    def plot(self, ax: Any = None) -> Any:
        """A waterfall/Gantt plot of this request (needs ``latency-analyzer[plots]``)."""
        return present("waterfall.plot", self, ax)

    def diagnose(self, **kwargs: Any) -> list[Any]:
        """Findings (evidence, likely cause, remedy), most time at stake first."""
        result: list[Any] = present("waterfall.diagnose", self, **kwargs)
        return result

    def _repr_html_(self) -> str:
        html: str = present("waterfall.html", self)
        return html

    def _repr_png_(self) -> bytes | None:
        try:
            png: bytes = present("waterfall.png", self)
        except UsageError:  # matplotlib not installed: the HTML form still shows
            return None
        return png

    def raise_for_error(self) -> Waterfall:
        """Raise ``RequestError`` if the request failed; return self otherwise."""
        if self.error is not None:
            raise RequestError(self.error_type or "error", self.error)
        return self

    def summary(self) -> dict[str, object]:
        """The CLI ``--json`` object: e2e_s, ttft_s, tpot_s, output_tokens, http_version, stages
        (the attribution, summing to e2e_s) and error, then a few more keys."""
        stages = self.attribution()
        return {
            "e2e_s": self.e2e,
            "ttft_s": self.ttft,
            "tpot_s": self.tpot,
            "output_tokens": self.output_tokens,
            "http_version": self.http_version,
            "stages": stages,
            "error": None if self.error is None else redact_text(self.error),
            "error_type": self.error_type,
            "status": self.status,
            "method": self.method,
            "url": redact_url(self.url),
            "input_tokens": self.input_tokens,
            "output_tokens_source": self.output_tokens_source,
            "ttfrt_s": self.ttfrt,
            "ttfat_s": self.ttfat,
            "itl_s": list(self.itl),
            "chunk_gaps_s": list(self.chunk_gaps),
            "connection_reused": self.connection.reused,
            "tls": None if self.tls is None else _tls_dict(self.tls),
            "start_epoch_ns": self.start_epoch_ns,
            **({} if self.tcp_end is None else {"tcp": _tcp_dict(self.tcp_end)}),
            "ttft_wire_s": self.ttft_wire,
            "clock_source": self.clock_source,
            "read_lag_p50_s": self.read_lag_p50,
            "read_lag_max_s": self.read_lag_max,
            "multi_event_reads": self.multi_event_reads,
            "ttfc_s": self.ttfc,
        }

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v * 1e3:.2f}ms" for k, v in self.attribution().items() if v)
        status = f"error={self.error_type!r}" if self.error else f"status={self.status}"
        url = redact_url(self.url)
        return f"<Waterfall {self.method} {url} {status} e2e={self.e2e * 1e3:.2f}ms {parts}>"


def _tcp_dict(tcp: TcpInfo) -> dict[str, object]:
    """The CLI's view: seconds, and the counters that tell loss."""
    return {
        "rtt_s": tcp.rtt,
        "min_rtt_s": None if tcp.min_rtt_us is None else tcp.min_rtt_us / 1e6,
        "total_retrans": tcp.total_retrans,
        "lost": tcp.lost,
    }


def _tls_dict(tls: TlsInfo) -> dict[str, object]:
    return {
        "version": tls.version,
        "cipher": tls.cipher,
        "alpn": tls.alpn,
        "session_reused": tls.session_reused,
        "server_hostname": tls.server_hostname,
    }
