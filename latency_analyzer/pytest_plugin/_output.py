"""What people and files see: the failure text, the terminal table and the JSON result form."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from .._budget_keys import SERVER_ONLY_STAGES
from .._redact import redact_text
from .._units import format_ns
from ..report.waterfall_text import render_waterfall
from ..timeline import Waterfall
from ._check import BudgetResult, Evaluation
from ._stats import samples, statistic

__all__ = ["TABLE_STATS", "failure_text", "no_waterfalls_text", "result_dict", "table_lines"]

#: The percentile table printed for a broken budget's stage or metric.
TABLE_STATS = ("min", "p50", "p90", "p95", "p99", "max", "mean")
_MAX_LISTED_ERRORS = 5


def _budget_text(r: BudgetResult, scale: float) -> str:
    text = format_ns(r.limit_ns)
    return text if scale == 1 else f"{text} ({format_ns(r.budget.limit_ns)} × {scale:g})"


def _why_unmeasured(name: str) -> str:
    if name in SERVER_ONLY_STAGES:
        return "no server spans"
    if name == "ttft":
        return "no content token"
    return "fewer than two tokens" if name in ("tpot", "itl") else "no value"


def _result_line(r: BudgetResult, ev: Evaluation) -> str:
    b = r.budget
    if r.measured_ns is None:
        why = _why_unmeasured(b.name)
        return f"  {b.key}: not measured ({why} in {r.unmeasured} of {len(ev.waterfalls)} requests)"
    mark = ">" if not r.passed else "<="
    skipped = f", {r.unmeasured} requests without a value" if r.unmeasured else ""
    return (
        f"  {b.key}: measured {format_ns(r.measured_ns)} {mark} budget "
        f"{_budget_text(r, ev.scale)} (n={r.n}{skipped}; {b.source})"
    )


def _error_lines(ev: Evaluation) -> list[str]:
    lines = [
        f"  errors: {len(ev.failed)} of {len(ev.waterfalls)} requests failed "
        "(latency_budget(allow_errors=True) accepts them)"
    ]
    for i in ev.failed[:_MAX_LISTED_ERRORS]:
        wf = ev.waterfalls[i]
        lines.append(f"    request #{i + 1}: {wf.error_type}: {redact_text(wf.error or '')}")
    if len(ev.failed) > _MAX_LISTED_ERRORS:
        lines.append(f"    ... and {len(ev.failed) - _MAX_LISTED_ERRORS} more")
    return lines


def _percentile_lines(name: str, ev: Evaluation) -> list[str]:
    attributions = [wf.attribution_ns() for wf in ev.waterfalls]
    values = samples(name, ev.waterfalls, attributions).values
    unit = "token gaps" if name == "itl" else "requests"
    cells = [format_ns(_stat_of(values, label)) for label in TABLE_STATS]
    head = f"{name} ({len(values)} {unit})"
    width = max(len(c) for c in cells) + 2
    return [
        head + "".join(label.rjust(width) for label in TABLE_STATS),
        " " * len(head) + "".join(c.rjust(width) for c in cells),
    ]


def _stat_of(values: tuple[float, ...], label: str) -> float:
    quantile = Fraction(label[1:]) if label.startswith("p") else None
    return statistic(values, label, quantile)


def _largest_stage(wf: Waterfall, name: str) -> str:
    attribution = wf.attribution_ns()
    if name == "ttft":  # the stages that can delay the first token
        attribution = {k: v for k, v in attribution.items() if k not in ("decode", "tail")}
    if name not in ("ttft", "e2e") or not attribution:
        return ""
    stage, ns = max(attribution.items(), key=lambda kv: kv[1])
    return f", largest stage {stage} {format_ns(ns)}"


def _worst_block(r: BudgetResult, ev: Evaluation) -> list[str]:
    if r.worst is None:
        return []
    wf = ev.waterfalls[r.worst]
    head = f"worst request for {r.budget.key}: #{r.worst + 1} of {len(ev.waterfalls)}"
    return [head + _largest_stage(wf, r.budget.name), render_waterfall(wf)]


def _headline(ev: Evaluation) -> str:
    """One line for pytest's short summary: what broke, both numbers."""
    parts = [
        f"{r.budget.key} not measured"
        if r.measured_ns is None
        else f"{r.budget.key} {format_ns(r.measured_ns)} > {format_ns(r.limit_ns)}"
        for r in ev.broken
    ]
    if ev.errors_break:
        parts.append(f"{len(ev.failed)} of {len(ev.waterfalls)} requests failed")
    return "; ".join(parts)


def failure_text(ev: Evaluation) -> str:
    """Why ``ev`` broke its budget: every budget line, then percentiles and worst waterfalls."""
    scale = "" if ev.scale == 1 else f", budgets scaled × {ev.scale:g}"
    lines = [
        f"latency budget broken: {_headline(ev)}",
        f"{len(ev.waterfalls)} requests recorded{scale}:",
    ]
    lines += [_result_line(r, ev) for r in ev.broken]
    if ev.errors_break:
        lines += _error_lines(ev)
    lines += [_result_line(r, ev) for r in ev.results if r.passed]
    shown: set[int] = set()
    for name in dict.fromkeys(r.budget.name for r in ev.broken if r.measured_ns is not None):
        lines += ["", *_percentile_lines(name, ev)]
    for r in ev.broken:
        if r.worst is not None and r.worst not in shown:
            shown.add(r.worst)
            lines += ["", *_worst_block(r, ev)]
    if ev.errors_break and ev.failed[0] not in shown:
        lines += ["", f"first failed request: #{ev.failed[0] + 1}"]
        lines.append(render_waterfall(ev.waterfalls[ev.failed[0]]))
    return "\n".join(lines)


def no_waterfalls_text(nodeid: str, budgets: list[str]) -> str:
    """The failure of a budgeted test that recorded nothing through the ``latency`` fixture."""
    listed = ", ".join(budgets) or "(none besides failed requests)"
    return (
        f"latency_budget: {nodeid} recorded no waterfalls, so its budgets cannot be checked.\n"
        "Send the requests through the `latency` fixture: latency.probe(...), "
        "await latency.aprobe(...), latency.client(...), latency.record(wf) or latency.run(...).\n"
        f"Budgets: {listed}"
    )


def _budget_dict(r: BudgetResult) -> dict[str, Any]:
    b = r.budget
    return {
        "key": b.key,
        "name": b.name,
        "stat": b.stat,
        "source": b.source,
        "budget_s": b.limit_ns / 1e9,
        "limit_s": r.limit_ns / 1e9,
        "measured_s": None if r.measured_ns is None else r.measured_ns / 1e9,
        "n": r.n,
        "unmeasured": r.unmeasured,
        "worst_request": r.worst,
        "passed": r.passed,
    }


def result_dict(ev: Evaluation) -> dict[str, Any]:
    """One test's results, JSON-ready (the summary file and xdist's worker output carry it)."""
    return {
        "test": ev.nodeid,
        "passed": ev.passed,
        "requests": len(ev.waterfalls),
        "failed_requests": len(ev.failed),
        "allow_errors": ev.allow_errors,
        "budgets": [_budget_dict(r) for r in ev.results],
    }


def _row(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    if not result["requests"]:
        rows.append([result["test"], "(no waterfalls)", "-", "-", "0", "FAIL"])
    elif result["failed_requests"]:
        allowed = result["allow_errors"]
        errors = f"{result['failed_requests']} failed"
        limit = "allowed" if allowed else "0 failed"
        n = str(result["requests"])
        rows.append([result["test"], "(errors)", errors, limit, n, "PASS" if allowed else "FAIL"])
    for b in result["budgets"]:
        measured = "-" if b["measured_s"] is None else format_ns(b["measured_s"] * 1e9)
        budget = format_ns(b["limit_s"] * 1e9)
        verdict = "PASS" if b["passed"] else "FAIL"
        rows.append([result["test"], b["key"], measured, budget, str(b["n"]), verdict])
    return rows


def table_lines(results: list[dict[str, Any]]) -> list[str]:
    """The terminal summary: one row per budget checked (test, budget, measured, budget, n)."""
    head = ["test", "budget", "measured", "limit", "n", "result"]
    rows = [head] + [row for result in results for row in _row(result)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return [
        "  ".join(_cell(i, c, w) for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
        for r in rows
    ]


def _cell(column: int, text: str, width: int) -> str:
    return text.rjust(width) if column in (2, 3, 4) else text.ljust(width)  # numbers right
