"""Every verb's --help says what each of its options does: a newcomer's first reference."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from latency_analyzer.cli import _parser


def _verbs() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("verb", sorted(_verbs()))
def test_every_option_has_help_that_is_more_than_its_default(verb: str) -> None:
    bare = []
    for action in _verbs()[verb]._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        text = (action.help or "").strip().lstrip("(")
        if not text or text.lower().startswith("default"):
            bare.append("/".join(action.option_strings) or action.dest)
    assert not bare, f"{verb}: options whose help does not say what they do: {bare}"


def test_the_guide_lists_every_verb() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "guide.md").read_text(encoding="utf-8")
    usage = re.search(r"^latency-analyzer \[--version\] \{([a-z,]+)\} \.\.\.$", guide, re.M)
    assert usage is not None, "the guide's command line reference has no usage line"
    assert usage.group(1).split(",") == list(_verbs())
    table = set(re.findall(r"^\| `([a-z]+)[ `]", guide, re.M))
    assert set(_verbs()) <= table, f"verbs missing from the guide's table: {set(_verbs()) - table}"
