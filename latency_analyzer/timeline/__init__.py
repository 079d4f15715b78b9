"""The timeline model: spans, waterfalls and the recorder that builds them. No I/O here."""

from ._clock import ClockAnchor, process_anchor, take_anchor
from ._recorder import Recorder
from ._span import AttrValue, Span, exclusive_ns
from ._stages import (
    BACKGROUND_STAGES,
    CLIENT_STAGES,
    METRICS,
    RESIDUALS,
    ROOT_NAME,
    SERVER_STAGES,
    Source,
)
from ._tcpinfo import TcpInfo
from ._tokens import distribute_tokens, per_token_gaps_ns
from ._waterfall import ConnectionInfo, TlsInfo, Waterfall

__all__ = [
    "BACKGROUND_STAGES",
    "CLIENT_STAGES",
    "METRICS",
    "RESIDUALS",
    "ROOT_NAME",
    "SERVER_STAGES",
    "AttrValue",
    "ClockAnchor",
    "ConnectionInfo",
    "Recorder",
    "Source",
    "Span",
    "TcpInfo",
    "TlsInfo",
    "Waterfall",
    "distribute_tokens",
    "exclusive_ns",
    "per_token_gaps_ns",
    "process_anchor",
    "take_anchor",
]
