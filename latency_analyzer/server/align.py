"""Clock alignment: the bounds one request gives on a server clock's offset (NTP-style).

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

Here the bounds are read from a waterfall and the server's stages; the arithmetic
(:class:`Bracket`, :class:`ClockOffset`, :func:`combine`) is the timeline's, where every
offset estimate of the package lives (``timeline._clock``).
"""

from __future__ import annotations

from ..timeline import Waterfall
from ..timeline._clock import Bracket, ClockOffset, bracket_of, combine
from ._stages import ServerStages

__all__ = ["BOUNDS", "Bracket", "ClockOffset", "bracket", "combine"]

#: The bounds one request can give, by name: ``arrival`` is the upper bound, the rest lower.
BOUNDS = ("arrival", "first_token", "last_token", "done")


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
    return bracket_of(hi, lows)
