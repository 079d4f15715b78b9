"""What a run asked for against what it got: the requested input and output lengths per
request (tags ``prompt_tokens``, ``max_tokens``, ``min_tokens``) beside the server's ``usage``,
overall and per template, as the summary's lines and the run file's ``lengths`` note.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..analysis import WaterfallSet
    from ._scenario import Scenario

__all__ = ["length_report"]


def length_report(ws: WaterfallSet, sc: Scenario) -> tuple[list[str], dict[str, Any]]:
    """Summary lines and the run file's ``lengths`` note: input lengths requested (measured
    with the tokenizer, or words) against the server's ``usage.prompt_tokens``, and output
    tokens requested (``max_tokens``) against received, over the successful requests; the
    note also per template (a dataset's class)."""
    ok = ws.ok
    columns = [
        ws.column(name)[ok].astype(np.int64)
        for name in ("prompt_tokens", "input_tokens", "max_tokens", "output_tokens")
    ]
    unit = "words" if sc.tokenizer is None else "tokens"
    note: dict[str, Any] = {"unit": unit, "tokenizer": sc.tokenizer}
    note.update(_figures(*columns))
    note["approximate"] = unit == "words" and "input" in note  # only when something was sized
    names = np.array([str(n) for n in ws.labels("template")], dtype=object)[ok]
    if len(set(names)) > 1:
        note["by_template"] = {
            str(n): _figures(*(c[names == n] for c in columns)) for n in sorted(set(names))
        }
    lines: list[str] = []
    if "input" in note:
        lines.append(_input_line(note["input"], sc.tokenizer))
    if "output" in note:
        lines.append(_output_line(note["output"]))
    return lines, note


def _figures(
    asked_in: np.ndarray[Any, Any],
    got_in: np.ndarray[Any, Any],
    asked_out: np.ndarray[Any, Any],
    got_out: np.ndarray[Any, Any],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    known = asked_in >= 0
    if known.any():
        out["input"] = _pair(asked_in[known], got_in[known])
    asked = asked_out >= 0
    if asked.any():
        out["output"] = _pair(asked_out[asked], got_out[asked])
        got, want = got_out[asked], asked_out[asked]
        out["output"]["fewer_than_requested"] = int(np.count_nonzero((got >= 0) & (got < want)))
    return out


def _pair(asked: np.ndarray[Any, Any], got: np.ndarray[Any, Any]) -> dict[str, Any]:
    has = got >= 0
    out: dict[str, Any] = {
        "requests": int(asked.size),
        "requested_mean": float(asked.mean()),
        "received_n": int(has.sum()),
    }
    if has.any():
        diff = got[has] - asked[has]
        out["received_mean"] = float(got[has].mean())
        out["difference"] = {
            "median": float(np.median(diff)),
            "min": int(diff.min()),
            "max": int(diff.max()),
        }
    return out


def _input_line(p: Mapping[str, Any], tokenizer: str | None) -> str:
    received = _received(p, "usage prompt_tokens")
    if tokenizer is None:
        return (
            f"input lengths were APPROXIMATE (words, not tokens: no tokenizer): requested "
            f"mean {p['requested_mean']:.1f} words; {received}; for token-true lengths give "
            "tokenizer = PATH (--tokenizer PATH)"
        )
    name = Path(tokenizer).name or tokenizer
    return f"input tokens ({name}): requested mean {p['requested_mean']:.1f}; {received}"


def _output_line(p: Mapping[str, Any]) -> str:
    line = f"output tokens: requested (max_tokens) mean {p['requested_mean']:.1f}; "
    line += _received(p, "completion tokens")
    if p["received_n"]:
        line += f"; {p['fewer_than_requested']} of {p['received_n']} got fewer than requested"
    return line


def _received(p: Mapping[str, Any], what: str) -> str:
    if not p["received_n"]:
        return f"received: no {what} from the server"
    d = p["difference"]
    return (
        f"received ({what}) mean {p['received_mean']:.1f}; received − requested median "
        f"{d['median']:+.0f}, range [{d['min']:+d}, {d['max']:+d}] over {p['received_n']} "
        "requests"
    )
