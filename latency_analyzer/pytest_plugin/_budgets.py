"""Budget keys (``ttft_p95="300ms"``): what they name, which statistic, and how they are read.

A key is a *name* with an optional *statistic* suffix:

* names: every client stage and residual (``dns``, ``tls``, ``first_token``, ``other``, ...),
  the server stages (``server_queue``, ``prefill``, ...) and the metrics ``ttft``, ``tpot``,
  ``itl`` and ``e2e``;
* statistics: none (every request must satisfy the budget: the maximum), ``_max``, ``_min``,
  ``_mean``, ``_median``/``_p50`` and ``_pNN`` percentiles (``_p90``, ``_p95``, ``_p99``;
  ``_p999`` is the 99.9th, ``_p9999`` the 99.99th).

Every budget is an upper bound on its statistic: ``dns_min="1ms"`` asks that at least one
request resolved within 1 ms.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from .._budget_keys import OPTIONS, parse_key
from .._units import parse_duration_ns
from ..errors import UsageError

__all__ = [
    "Budget",
    "BudgetSpec",
    "merge_specs",
    "parse_budget_lines",
    "parse_marker_kwargs",
]


@dataclass(frozen=True, slots=True)
class Budget:
    """One upper bound: ``stat`` of ``name`` over a test's requests must be ``<= limit_ns``.

    Attributes:
        key: as written by the user, e.g. ``"ttft_p95"``.
        name: the stage or metric, e.g. ``"ttft"``.
        stat: ``"max"``, ``"min"``, ``"mean"`` or ``"pNN"`` (``"p50"`` for the median).
        quantile: the percentile (0-100) for ``pNN``, as an exact fraction; None otherwise.
        limit_ns: the budget in nanoseconds, before ``--latency-budget-scale``.
        source: ``"marker"`` or ``"ini"``.
    """

    key: str
    name: str
    stat: str
    quantile: Fraction | None
    limit_ns: int
    source: str


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """All budgets of one test (keyed by ``key``) plus the marker's options."""

    budgets: Mapping[str, Budget]
    allow_errors: bool | None = None  # None: not said here (a merged spec reads it as False)


def _budget(key: str, value: object, source: str) -> Budget:
    name, stat, quantile = parse_key(key)
    try:
        limit = parse_duration_ns(value)
    except UsageError as exc:
        raise UsageError(f"budget {key}={value!r}: {exc}") from None
    return Budget(key, name, stat, quantile, limit, source)


def parse_marker_kwargs(args: tuple[object, ...], kwargs: Mapping[str, object]) -> BudgetSpec:
    """Budgets from ``@pytest.mark.latency_budget(**kwargs)``.

    Raises:
        UsageError: positional arguments, an unknown key, a bad duration or a non-bool option.
    """
    if args:
        raise UsageError(f"latency_budget takes keyword arguments only, got {args!r}")
    allow_errors = kwargs.get("allow_errors")
    if allow_errors is not None and not isinstance(allow_errors, bool):
        raise UsageError(f"allow_errors must be True or False, got {allow_errors!r}")
    budgets = {k: _budget(k, v, "marker") for k, v in kwargs.items() if k not in OPTIONS}
    return BudgetSpec(budgets, allow_errors)


def parse_budget_lines(lines: Iterable[str]) -> dict[str, Budget]:
    """Budgets from the ``latency_budgets`` ini option: ``key=value`` items, one or more a line.

    Items are separated by newlines, commas or whitespace (``"tls=20ms, ttft_p95=300ms"``).

    Raises:
        UsageError: an item without ``=``, an unknown key or a bad duration.
    """
    budgets: dict[str, Budget] = {}
    for line in lines:
        for item in re.split(r"[,\s]+(?=[^,\s=]+\s*=)", line.strip()):
            if not item:
                continue
            key, sep, value = item.partition("=")
            if not sep:
                raise UsageError(f"latency_budgets: expected key=value, got {item!r}")
            budgets[key.strip()] = _budget(key.strip(), value.strip().strip("'\""), "ini")
    return budgets


def merge_specs(defaults: Mapping[str, Budget], markers: Iterable[BudgetSpec]) -> BudgetSpec:
    """The ini defaults overridden by each marker in turn (farthest first, closest last)."""
    budgets = dict(defaults)
    allow_errors = False
    for spec in markers:
        budgets.update(spec.budgets)
        if spec.allow_errors is not None:
            allow_errors = spec.allow_errors
    return BudgetSpec(budgets, allow_errors)
