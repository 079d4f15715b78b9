"""Prometheus text and OpenMetrics expositions to flat samples, through prometheus_client.

Sans-IO: text in, samples out. The parser is prometheus_client's (the reference Python one),
never a hand-written one; its ``ValueError`` becomes a :class:`MetricsParseError`.

A counter family ``x`` has the sample ``x_total`` (the parser strips ``_total`` from the family
name, not from the sample); a histogram ``h`` has ``h_bucket{le=...}``, ``h_count``, ``h_sum``
and maybe ``h_created``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from ..errors import RequestError

__all__ = ["OPENMETRICS", "MetricsParseError", "ParsedSample", "is_openmetrics", "parse"]

OPENMETRICS = "application/openmetrics-text"

#: The ``Accept`` header a Prometheus server sends, preferring the classic text format.
ACCEPT = "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"


class MetricsParseError(RequestError):
    """The endpoint answered, but not with a Prometheus or OpenMetrics exposition."""

    def __init__(self, message: str) -> None:
        super().__init__("malformed", message)


@dataclass(frozen=True, slots=True)
class ParsedSample:
    """One sample line.

    Attributes:
        family: the family name (a counter's without ``_total``).
        type: the family's type: ``counter``, ``gauge``, ``histogram``, ``summary``,
            ``gaugehistogram``, ``info``, ``stateset`` or ``unknown``.
        name: the sample's own name (``x_total``, ``h_bucket``, ...).
        labels: label name → value, sorted by name.
        value: the sample's value.
    """

    family: str
    type: str
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def is_openmetrics(text: str, content_type: str | None = None) -> bool:
    """True when the exposition is OpenMetrics (by its content type, or its ``# EOF`` line)."""
    if content_type is not None and content_type.lower().startswith(OPENMETRICS):
        return True
    return text.rstrip().endswith("# EOF")


def parse(text: str, content_type: str | None = None) -> list[ParsedSample]:
    """Every sample of an exposition, in order.

    Args:
        text: the body of a ``GET /metrics``.
        content_type: its ``Content-Type`` (picks the OpenMetrics parser when it says so).

    Raises:
        MetricsParseError: the text is not a valid exposition (HTML, garbage, cut short).
    """
    families = openmetrics_families if is_openmetrics(text, content_type) else text_families
    out: list[ParsedSample] = []
    try:
        for fam in families(text):
            for s in fam.samples:
                labels = _sorted_labels(s.labels)
                out.append(ParsedSample(fam.name, fam.type, s.name, labels, float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # the parser's many failures
        raise MetricsParseError(f"not a metrics exposition: {str(exc)[:160]}") from None
    return out


def _sorted_labels(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))
