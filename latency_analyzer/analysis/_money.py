"""A speedup in money: what a claimed and a measured speedup save per month, and net of a
migration.

The model is :func:`~latency_analyzer.analysis.gpu_cost`'s: the monthly cost of serving a
demand is proportional to ``demand / throughput``. A candidate ``S``× faster serves the same
demand on ``1/S`` of the GPUs, so today's cost ``C`` becomes ``C / S`` and the saving is
``C · (1 − 1/S)`` per month (negative for ``S < 1``: the candidate costs more). This holds
when a GPU's capacity scales with the speedup of the metric compared (a throughput-bound
service, a latency statistic that bounds capacity); a speedup of a latency that does not bound
capacity saves time, not GPUs.

The saving rises with the speedup, so the CI of the saving is the saving at each end of the
speedup's CI. Over ``N`` months, net of a one-off migration cost ``M``: ``N · saving − M``;
the migration pays back after ``M / saving`` months.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ._compare import gpu_cost
from ._stats import Estimate

__all__ = ["MoneyCase", "money_case", "monthly_saving"]

_HOURS = 730.0  # gpu_cost's month; it cancels out of the saving


def monthly_saving(cost_per_month: float, speedup: float) -> float:
    """``cost_per_month · (1 − 1/speedup)``: today's cost minus :func:`gpu_cost` at the new
    throughput (NaN for a speedup that is NaN or not above 0)."""
    if not (math.isfinite(speedup) and speedup > 0):
        return math.nan
    price = cost_per_month / _HOURS  # one replica at throughput 1 costs cost_per_month
    after = gpu_cost(
        demand_rps=1.0, throughput_rps=speedup, price_per_gpu_hour=price, hours_per_month=_HOURS
    )["cost_per_month"]
    return cost_per_month - after


def _saving(cost: float, speedup: Estimate) -> Estimate:
    return Estimate(
        monthly_saving(cost, speedup.value),
        monthly_saving(cost, speedup.low),
        monthly_saving(cost, speedup.high),
        speedup.n,
        speedup.confidence,
    )


def _net(saving: Estimate, months: float, migration: float) -> Estimate:
    return Estimate(
        saving.value * months - migration,
        saving.low * months - migration,
        saving.high * months - migration,
        saving.n,
        saving.confidence,
    )


def _payback(saving: float, migration: float) -> float:
    if math.isnan(saving):
        return math.nan
    return migration / saving if saving > 0 else math.inf


@dataclass(frozen=True)
class MoneyCase:
    """A claimed and/or a measured speedup of ``metric`` in money.

    Attributes:
        metric: the statistic the speedups are of (``ttft_p95`` ...).
        cost_per_month: today's cost (any currency; the outputs are in the same).
        claimed: the claimed speedup, or None; ``measured``: the measured one with its CI,
            or None.
        migration_cost: a one-off cost of moving, or None; ``months``: the horizon, or None.
    """

    metric: str
    cost_per_month: float
    claimed: float | None
    measured: Estimate | None
    migration_cost: float | None = None
    months: float | None = None

    def saving(self, which: str) -> Estimate | None:
        """``"claimed"`` or ``"measured"``: the saving per month (the claim's has no CI)."""
        s = self._speedup(which)
        return None if s is None else _saving(self.cost_per_month, s)

    def net(self, which: str) -> Estimate | None:
        """Saving over ``months`` minus the migration cost (None without ``months``)."""
        s = self.saving(which)
        if s is None or self.months is None:
            return None
        return _net(s, self.months, self.migration_cost or 0.0)

    def payback_months(self, which: str) -> Estimate | None:
        """Months until the saving has paid the migration (inf: it never does)."""
        s = self.saving(which)
        if s is None or self.migration_cost is None:
            return None
        m = self.migration_cost
        return Estimate(
            _payback(s.value, m), _payback(s.high, m), _payback(s.low, m), s.n, s.confidence
        )

    def _speedup(self, which: str) -> Estimate | None:
        if which == "claimed":
            c = self.claimed
            return None if c is None else Estimate(c, c, c, 0)
        if which == "measured":
            return self.measured
        raise ValueError(f"which must be 'claimed' or 'measured', not {which!r}")

    def present(self) -> list[str]:
        """``"claimed"`` and/or ``"measured"``: the speedups this case holds."""
        return [w for w in ("claimed", "measured") if self._speedup(w) is not None]

    def money(self, x: float) -> str:
        """An amount in the case's unit (k, M or G, chosen from today's cost)."""
        return _Unit(self.cost_per_month)(x)

    def model(self) -> str:
        return (
            f"money on {self.metric}, today {self.money(self.cost_per_month)}/month; saving = "
            "cost × (1 − 1/speedup): the same demand on 1/speedup of the GPUs"
        )

    def cells(self, which: str) -> dict[str, str]:
        """``which``'s figures as text: ``speedup``, ``saving`` (per month) and, when the
        case has them, ``net`` (over ``months``) and ``payback`` (months)."""
        unit = _Unit(self.cost_per_month)
        speed, saving = self._speedup(which), self.saving(which)
        if speed is None or saving is None:
            raise KeyError(which)
        out = {"speedup": _speed(speed, which), "saving": unit.est(saving, which)}
        net, back = self.net(which), self.payback_months(which)
        if net is not None:
            out["net"] = unit.est(net, which)
        if back is not None:
            out["payback"] = _months(back, which)
        return out

    def horizon(self) -> str | None:
        """What ``net`` is, e.g. "net of migration (2.00 M) over 12 months"."""
        if self.months is None:
            return None
        if self.migration_cost:
            return (
                f"net of migration ({self.money(self.migration_cost)}) over {self.months:g} months"
            )
        return f"saved over {self.months:g} months"

    def lines(self) -> list[str]:
        """The money, one line per figure, e.g. "claimed 15× saves 1.12 M/month"."""
        cells = {w: self.cells(w) for w in self.present()}
        out = [self.model()]
        out += [f"{w} {c['speedup']} saves {c['saving']}/month" for w, c in cells.items()]
        horizon = self.horizon()
        if horizon is not None:
            out.append(f"{horizon}: " + "; ".join(f"{w} {c['net']}" for w, c in cells.items()))
        if self.migration_cost is not None:
            back = "; ".join(f"{w} {c['payback']}" for w, c in cells.items())
            out.append(f"migration ({self.money(self.migration_cost)}) pays back in: {back}")
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "metric": self.metric,
            "cost_per_month": self.cost_per_month,
            "migration_cost": self.migration_cost,
            "months": self.months,
            "model": "saving = cost_per_month * (1 - 1/speedup)",
        }
        for w in self.present():
            speed = self._speedup(w)
            assert speed is not None
            entry: dict[str, Any] = {"speedup": _json(speed, w)}
            for key, fn in (
                ("saving_per_month", self.saving),
                ("net", self.net),
                ("payback_months", self.payback_months),
            ):
                est = fn(w)
                if est is not None:
                    entry[key] = _json(est, w)
            out[w] = entry
        return out


def _json(e: Estimate, which: str) -> float | list[float | None] | None:
    """A claim's figure as a number; a measured one as [value, low, high] (null: never)."""
    vals = [None if math.isinf(x) or math.isnan(x) else x for x in (e.value, e.low, e.high)]
    return vals[0] if which == "claimed" else vals


def _speed(e: Estimate, which: str) -> str:
    if which == "claimed":
        return f"{e.value:g}×"
    return e.format(".2g", "×")


def _months(e: Estimate, which: str) -> str:
    def one(x: float) -> str:
        return "never" if math.isinf(x) else "n/a" if math.isnan(x) else f"{x:.3g}"

    shown = (e.value,) if which == "claimed" else (e.value, e.low, e.high)
    if all(math.isinf(x) for x in shown):
        return "never"  # not "never [never, never] months"
    if which == "claimed":
        return f"{one(e.value)} months"
    return f"{one(e.value)} [{one(e.low)}, {one(e.high)}] months"


class _Unit:
    """Money in one unit chosen from today's cost (k, M, G), two decimals."""

    def __init__(self, reference: float) -> None:
        size = abs(reference)
        self.div, self.suffix = next(
            ((d, s) for d, s in ((1e9, " G"), (1e6, " M"), (1e3, " k")) if size >= d), (1.0, "")
        )

    def __call__(self, x: float) -> str:
        return f"{x / self.div:.2f}{self.suffix}"

    def est(self, e: Estimate, which: str) -> str:
        if which == "claimed":
            return self(e.value)

        def num(x: float) -> str:
            return f"{x / self.div:.2f}" if math.isfinite(x) else "n/a"

        return f"{num(e.value)}{self.suffix} [{num(e.low)}, {num(e.high)}]"


def money_case(
    *,
    metric: str,
    cost_per_month: float,
    claimed: float | None = None,
    measured: Estimate | None = None,
    migration_cost: float | None = None,
    months: float | None = None,
) -> MoneyCase:
    """A :class:`MoneyCase`, its inputs checked.

    Raises:
        UsageError: a cost, migration cost, months or claim that is not above 0, neither a
            claimed nor a measured speedup, or a measured one that is not a number above 0.
    """
    for name, value in (
        ("cost_per_month", cost_per_month),
        ("migration_cost", migration_cost),
        ("months", months),
        ("claimed", claimed),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{name} must be above 0, got {value!r}")
    if claimed is None and measured is None:
        raise UsageError("money needs a claimed or a measured speedup")
    if measured is not None and not (math.isfinite(measured.value) and measured.value > 0):
        raise UsageError(
            f"no measured speedup of {metric} to put in money: a run has no value, or 0, for it"
        )
    return MoneyCase(metric, cost_per_month, claimed, measured, migration_cost, months)
