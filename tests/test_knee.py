"""The knee of a latency-against-load curve, and the search's bracketing and bisection, on
points whose answer is known by construction."""

from __future__ import annotations

import math

import pytest

from latency_analyzer.errors import UsageError
from latency_analyzer.load import LoadPoint, Scenario, knee, search
from latency_analyzer.load import _search as search_module
from latency_analyzer.load._slo import SloReport, parse_slos


def _point(level: float, e2e_ms: float, step: int = 0) -> LoadPoint:
    return LoadPoint(step, "rate", level, 100, 0, level, {"e2e_p95": e2e_ms * 1e6})


def test_the_knee_is_the_last_point_before_the_climb() -> None:
    # scaled to [0, 1]: x = 0, .25, .5, .75, 1 and y = 0, 0, 0, 0, 1; the distances under the
    # chord y = x are 0, .25, .5, .75, 0: the largest is at level 4
    points = [_point(x, y) for x, y in zip((1, 2, 3, 4, 5), (10, 10, 10, 10, 50), strict=True)]
    bend = knee(points)
    assert bend is not None and bend.level == 4


def test_the_knee_follows_the_bend_not_the_order_given() -> None:
    # y = 10, 11, 20, 60 at 10, 20, 30, 40: scaled y = 0, .02, .2, 1; distances under the chord
    # 0, .313, .467, 0: the knee is 30
    levels, e2e = (30, 10, 40, 20), (20, 10, 60, 11)
    bend = knee([_point(x, y) for x, y in zip(levels, e2e, strict=True)])
    assert bend is not None and bend.level == 30


@pytest.mark.parametrize(
    "e2e",
    [(10, 20, 30, 40), (40, 30, 20, 10), (10, 40, 45, 50)],
    ids=["linear", "falling", "concave"],
)
def test_no_knee_without_a_convex_bend(e2e: tuple[float, ...]) -> None:
    assert knee([_point(x, y) for x, y in zip((1, 2, 3, 4), e2e, strict=True)]) is None


def test_no_knee_from_two_points_or_missing_values() -> None:
    assert knee([_point(1, 10), _point(2, 50)]) is None
    missing = [_point(1, 10), _point(2, math.nan), _point(3, 50)]
    assert knee(missing) is None


def test_an_unknown_knee_metric_names_the_valid_ones() -> None:
    with pytest.raises(UsageError, match="e2e_p95"):
        knee([_point(1, 1)], "e2e_p42")


class _Threshold:
    """Stands in for the runs: a probe meets the SLO at rates up to ``limit``."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.rates: list[float] = []

    async def __call__(self, sc: Scenario, file: object, **kw: object) -> LoadPoint:
        rate = float(kw["level"])  # type: ignore[arg-type]  # the search passes a float
        self.rates.append(rate)
        slo = parse_slos("e2e_mean=10ms")
        measured = 5e6 if rate <= self.limit else 20e6
        report = SloReport(slo, [measured], 90, 100, 1.0)
        return LoadPoint(int(kw["step"]), "rate", rate, 100, 0, rate, {}, report)  # type: ignore[call-overload]  # the search passes an int


SC = Scenario("http://127.0.0.1:9/v1/chat/completions", mode="open", rate=1, requests=1)


@pytest.mark.parametrize("limit", [37.0, 99.0, 150.0, 799.0])
async def test_the_search_brackets_then_bisects_to_the_resolution(
    monkeypatch: pytest.MonkeyPatch, limit: float
) -> None:
    fake = _Threshold(limit)
    monkeypatch.setattr(search_module, "_point", fake)
    slo = parse_slos("e2e_mean=10ms")
    found = await search(SC, slo, rate_max=800, rate_min=10, resolution=0.05)
    assert found.rate is not None and found.failing is not None and found.passing is not None
    assert found.rate <= limit < found.failing.level  # passing below, failing above the limit
    assert found.failing.level / found.rate - 1 <= 0.05
    assert fake.rates[0] == 800 and [p.level for p in found.points] == fake.rates
    assert [p.step for p in found.points] == list(range(len(fake.rates)))  # one step each


async def test_the_search_says_when_rate_max_already_meets_the_slo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(search_module, "_point", _Threshold(1000.0))
    found = await search(SC, parse_slos("e2e_mean=10ms"), rate_max=800)
    assert found.rate == 800 and found.failing is None and len(found.points) == 1
    assert "highest rate allowed" in found.lines()[0]


async def test_the_search_stops_at_rate_min(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Threshold(1.0)
    monkeypatch.setattr(search_module, "_point", fake)
    found = await search(SC, parse_slos("e2e_mean=10ms"), rate_max=800, rate_min=100)
    assert found.rate is None and fake.rates == [800, 400, 200, 100]
    assert found.lines()[0] == "no rate probed met the SLO"
