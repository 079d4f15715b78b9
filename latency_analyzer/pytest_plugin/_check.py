"""Checking one test's waterfalls against its budgets: pure data in, an ``Evaluation`` out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..timeline import Waterfall
from ._budgets import Budget, BudgetSpec
from ._stats import Samples, samples, statistic

__all__ = ["BudgetResult", "Evaluation", "evaluate"]


@dataclass(frozen=True, slots=True)
class BudgetResult:
    """One budget checked.

    Attributes:
        budget: the budget as configured.
        limit_ns: the budget after ``--latency-budget-scale``.
        measured_ns: the statistic over the samples; None when no request measured the name.
        n: samples (requests; tokens gaps for ``itl``).
        unmeasured: requests without a value (see ``Samples.unmeasured``).
        worst: index of the request to show (the largest value; the smallest for ``min``).
    """

    budget: Budget
    limit_ns: float
    measured_ns: float | None
    n: int
    unmeasured: int
    worst: int | None

    @property
    def passed(self) -> bool:
        """Measured and within the (scaled) budget; equal to the budget passes."""
        return self.measured_ns is not None and self.measured_ns <= self.limit_ns


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A test's budgets checked against every waterfall it recorded.

    Attributes:
        nodeid: the test.
        results: one per budget, in key order (ini defaults first, then the marker's).
        waterfalls: what the test recorded, in order (``worst`` and ``failed`` index into it).
        failed: indices of failed requests (``wf.error`` set).
        allow_errors: failed requests do not break the budget (their values still count).
        scale: the ``--latency-budget-scale`` factor applied.
    """

    nodeid: str
    results: tuple[BudgetResult, ...]
    waterfalls: tuple[Waterfall, ...]
    failed: tuple[int, ...]
    allow_errors: bool
    scale: float

    @property
    def errors_break(self) -> bool:
        return bool(self.failed) and not self.allow_errors

    @property
    def broken(self) -> tuple[BudgetResult, ...]:
        return tuple(r for r in self.results if not r.passed)

    @property
    def passed(self) -> bool:
        """Something was recorded, no failed request broke it, and every budget held."""
        return bool(self.waterfalls) and not self.errors_break and not self.broken


def _check(budget: Budget, found: Samples, scale: float) -> BudgetResult:
    limit = budget.limit_ns * scale
    if not found.values:
        return BudgetResult(budget, limit, None, 0, found.unmeasured, None)
    measured = statistic(found.values, budget.stat, budget.quantile)
    pick = min if budget.stat == "min" else max
    at = pick(range(len(found.values)), key=found.values.__getitem__)
    n = len(found.values)
    return BudgetResult(budget, limit, measured, n, found.unmeasured, found.owners[at])


def evaluate(
    nodeid: str, spec: BudgetSpec, waterfalls: Sequence[Waterfall], scale: float = 1.0
) -> Evaluation:
    """Check every budget of ``spec`` over ``waterfalls``."""
    recorded = tuple(waterfalls)
    attributions = [wf.attribution_ns() for wf in recorded]
    by_name: dict[str, Samples] = {}
    results = []
    for budget in spec.budgets.values():
        if budget.name not in by_name:
            by_name[budget.name] = samples(budget.name, recorded, attributions)
        results.append(_check(budget, by_name[budget.name], scale))
    failed = tuple(i for i, wf in enumerate(recorded) if wf.error is not None)
    return Evaluation(nodeid, tuple(results), recorded, failed, bool(spec.allow_errors), scale)
