"""The page's verdict section: a claim checked and, with a cost, the claimed and the measured
speedup in money, each measured figure with its confidence interval."""

from __future__ import annotations

import html

from ..analysis._compare import ClaimCheck
from ..analysis._money import MoneyCase

__all__ = ["verdict_html"]

_COLUMNS = (
    ("speedup", "speedup"),
    ("saving", "saving / month"),
    ("net", ""),
    ("payback", "migration pays back in"),
)


def _esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def verdict_html(claim: ClaimCheck | None, money: MoneyCase | None) -> str:
    """HTML for the claim line and the money table (empty when there is neither)."""
    parts = []
    if claim is not None:
        parts.append(
            f'<p class="verdict">{_esc(claim.metric)}: claimed {claim.claimed:g}×, measured '
            f"{_esc(claim.measured.format('.2g', '×'))}: <b>{_esc(claim.verdict)}</b> "
            '<span class="muted">(supported: the whole CI at or above the claim; consistent: '
            "the claim inside the CI; not supported: the claim above the CI)</span></p>"
        )
    if money is not None:
        rows = {w: money.cells(w) for w in money.present()}
        keys = [k for k, _ in _COLUMNS if any(k in c for c in rows.values())]
        titles = dict(_COLUMNS)
        titles["net"] = money.horizon() or ""
        head = "<th></th>" + "".join(f"<th>{_esc(titles[k])}</th>" for k in keys)
        body = "".join(
            f"<tr><td>{_esc(w)}</td>"
            + "".join(f"<td>{_esc(c.get(k, ''))}</td>" for k in keys)
            + "</tr>"
            for w, c in rows.items()
        )
        parts.append(
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f'<p class="muted">{_esc(money.model())}. Measured figures: value [low, high], '
            f"the {_conf(money)} bootstrap confidence interval of the speedup carried "
            "through (the saving rises with the speedup).</p>"
        )
    return "".join(parts)


def _conf(money: MoneyCase) -> str:
    m = money.measured
    return f"{m.confidence:.0%}" if m is not None else "95%"
