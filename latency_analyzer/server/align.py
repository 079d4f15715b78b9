"""Clock alignment: the offset of a server's clock, bounded by causality (NTP-style).

``offset = server clock − client epoch clock``. A request gives a bracket for it:

* the server saw the request after the client began sending it:
  ``arrival_server − send_start_client ≥ offset``  (upper bound);
* the client saw the first token, the last token and the last byte after the server produced
  them: ``first_token_server − first_chunk_client ≤ offset`` (likewise for the last token
  and for ``done_server − stream_end_client``)  (lower bounds).

The midpoint is the estimate and half the width its uncertainty. Across requests to one server
the brackets intersect (the tightest bounds win); an empty intersection means the clocks
drifted, or a span was matched to the wrong request, and is reported, never papered over.

A lower bound above the upper bound contradicts the client's observations (a server instant
stamped late, in another process than the one that sent the bytes). Such a bound is left out
of the bracket and kept in ``Bracket.contradicted`` with the amount by which it overshoots the
upper bound; the others still bound the offset. Only when every lower bound contradicts the
upper one does the request give no bracket that fits (``Bracket.fits`` is False).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..timeline import Waterfall
from .schemas import ServerStages

__all__ = ["BOUNDS", "Bracket", "ClockOffset", "bracket", "combine"]

#: The bounds one request can give, by name: ``arrival`` is the upper bound, the rest lower.
BOUNDS = ("arrival", "first_token", "last_token", "done")


@dataclass(frozen=True, slots=True)
class Bracket:
    """Bounds on ``offset_ns`` (server − client, ns) from one request: ``lo ≤ offset ≤ hi``.

    Attributes:
        lo_ns, hi_ns: the bracket of the bounds that agree.
        contradicted: ``(bound name, ns above hi_ns)`` of each lower bound left out because
            it lies above the upper bound; when every lower bound does, none is left out and
            the bracket does not fit.
        lows: ``(bound name, value ns)`` of every lower bound, contradicted ones included.
    """

    lo_ns: int
    hi_ns: int
    contradicted: tuple[tuple[str, int], ...] = ()
    lows: tuple[tuple[str, int], ...] = ()

    @property
    def fits(self) -> bool:
        """False when no offset satisfies both bounds (the server took longer than the
        client saw: a mismatched span, or clocks running at different rates)."""
        return self.lo_ns <= self.hi_ns

    @property
    def width_ns(self) -> int:
        return self.hi_ns - self.lo_ns

    def offset(self, requests: int = 1) -> ClockOffset:
        """The midpoint estimate of this bracket."""
        mid = self.lo_ns + self.width_ns // 2
        return ClockOffset(
            mid, max(0, self.width_ns - self.width_ns // 2), self.lo_ns, self.hi_ns, requests
        )

    def contains(self, offset_ns: int) -> bool:
        return self.lo_ns <= offset_ns <= self.hi_ns


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """An estimated server clock offset.

    Attributes:
        offset_ns: server clock minus the client's epoch clock.
        uncertainty_ns: half the width of the bracket it came from.
        lo_ns, hi_ns: that bracket.
        requests: how many requests' brackets were intersected.
        consistent: False when the brackets did not intersect and the tightest single one
            was used instead.
    """

    offset_ns: int
    uncertainty_ns: int
    lo_ns: int
    hi_ns: int
    requests: int = 1
    consistent: bool = True


def bracket(wf: Waterfall, stages: ServerStages) -> Bracket | None:
    """The causal bracket of one request; None when the request cannot bound the offset
    (never sent, no client anchor, or the server gave no usable instants)."""
    send = wf.stage("send")
    if wf.anchor is None or send is None or stages.arrival_ns is None:
        return None
    to_epoch = wf.anchor.to_epoch_ns
    hi = stages.arrival_ns - to_epoch(send.start_ns)
    lows: list[tuple[str, int]] = []
    # the server's first and last tokens are chunks of either kind: one whose text is empty
    # is still a token to the server, and the last visible one can precede the last token
    first, last = wf.first_token_chunk_ns, wf.last_token_chunk_ns
    if stages.first_token_ns is not None and first is not None:
        lows.append(("first_token", stages.first_token_ns - to_epoch(first)))
    if stages.last_token_ns is not None and last is not None:
        lows.append(("last_token", stages.last_token_ns - to_epoch(last)))
    if stages.done_ns is not None:
        lows.append(("done", stages.done_ns - to_epoch(wf.end_ns)))
    if not lows:
        return None
    agreeing = [value for _, value in lows if value <= hi]
    if not agreeing:  # the upper bound against every lower one: nothing to trust over it
        return Bracket(max(value for _, value in lows), hi, (), tuple(lows))
    against = tuple((name, value - hi) for name, value in lows if value > hi)
    return Bracket(max(agreeing), hi, against, tuple(lows))


def combine(brackets: Iterable[Bracket | None]) -> ClockOffset | None:
    """One offset from many requests: the intersection of their brackets.

    Returns None without any bracket that fits. When the fitting brackets do not intersect,
    the narrowest one is used and the result is marked ``consistent=False``.
    """
    fitting = [b for b in brackets if b is not None and b.fits]
    if not fitting:
        return None
    joint = Bracket(max(b.lo_ns for b in fitting), min(b.hi_ns for b in fitting))
    if joint.fits:
        return joint.offset(len(fitting))
    tightest = min(fitting, key=lambda b: b.width_ns).offset(1)
    return ClockOffset(
        tightest.offset_ns, tightest.uncertainty_ns, tightest.lo_ns, tightest.hi_ns, 1, False
    )
