"""The clock offset arithmetic of ``timeline._clock``, checked against offsets it is given.

A true offset is drawn first and every bound is built around it, so each property says what
the estimate must do with bounds that really hold: contain the truth, and err by no more than
the uncertainty it reports.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from latency_analyzer.timeline._clock import bracket_of, combine, cristian_offset

OFFSETS = st.integers(-(10**12), 10**12)
SLACK = st.integers(0, 10**9)


@given(OFFSETS, SLACK, st.lists(SLACK, min_size=1, max_size=4))
def test_true_bounds_bracket_the_offset(offset: int, above: int, below: list[int]) -> None:
    """Bounds that hold (upper ≥ offset ≥ every lower) give a bracket holding the offset,
    with nothing contradicted, and a midpoint within the uncertainty it states."""
    lows = [(f"b{i}", offset - d) for i, d in enumerate(below)]
    b = bracket_of(offset + above, lows)
    assert b is not None and b.fits and b.contains(offset)
    assert (b.lo_ns, b.hi_ns) == (offset - min(below), offset + above)
    assert b.contradicted == () and b.lows == tuple(lows)
    est = b.offset()
    assert abs(est.offset_ns - offset) <= est.uncertainty_ns
    assert est.lo_ns <= est.offset_ns <= est.hi_ns


@given(OFFSETS, SLACK, SLACK, st.integers(1, 10**6))
def test_a_lower_bound_over_the_upper_is_left_out_and_named(
    offset: int, above: int, below: int, over: int
) -> None:
    hi = offset + above
    b = bracket_of(hi, [("good", offset - below), ("late", hi + over)])
    assert b is not None and b.fits and b.contains(offset)
    assert b.contradicted == (("late", over),)


def test_every_lower_bound_over_the_upper_gives_a_bracket_that_does_not_fit() -> None:
    b = bracket_of(100, [("a", 150), ("b", 130)])
    assert b is not None and not b.fits and (b.lo_ns, b.hi_ns) == (150, 100)
    assert combine([b]) is None
    assert bracket_of(100, []) is None


@given(OFFSETS, st.lists(st.tuples(SLACK, SLACK), min_size=1, max_size=8))
def test_many_true_brackets_intersect_around_the_offset(
    offset: int, widths: list[tuple[int, int]]
) -> None:
    """Brackets that all hold intersect; the joint estimate is within its uncertainty of the
    truth, and its bracket is the tightest upper bound against the tightest lower one."""
    brackets = [bracket_of(offset + up, [("x", offset - down)]) for up, down in widths]
    joint = combine([*brackets, None])
    assert joint is not None and joint.consistent and joint.requests == len(widths)
    assert joint.lo_ns <= offset <= joint.hi_ns
    assert abs(joint.offset_ns - offset) <= joint.uncertainty_ns
    assert (joint.lo_ns, joint.hi_ns) == (
        offset - min(down for _, down in widths),
        offset + min(up for up, _ in widths),
    )


def test_brackets_that_do_not_intersect_fall_back_to_the_tightest_and_say_so() -> None:
    a, b = bracket_of(100, [("x", 90)]), bracket_of(60, [("x", 20)])
    joint = combine([a, b])
    assert joint is not None and not joint.consistent and joint.requests == 1
    assert (joint.lo_ns, joint.hi_ns, joint.offset_ns) == (90, 100, 95)


@given(OFFSETS, st.lists(st.tuples(st.integers(0, 10**9), SLACK), min_size=1, max_size=6))
def test_cristian_offset_holds_the_truth_within_half_the_tightest_round_trip(
    offset: int, trips: list[tuple[int, int]]
) -> None:
    """The remote clock, ``offset`` ahead of ours, was read at some instant of each round
    trip: the estimate is off by at most half that round trip, the tightest one's."""
    t0 = 1_700_000_000 * 10**9
    samples = [(t0, t0 + at * rtt // 10**9 + offset, t0 + rtt) for rtt, at in trips]
    est, err = cristian_offset(samples)
    tightest = min(rtt for rtt, _ in trips)
    assert err == tightest / 2e9
    assert abs(est - offset / 1e9) <= err + 1e-9  # float seconds: a nanosecond of rounding
