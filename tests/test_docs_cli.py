"""The guide's command line reference names every verb the CLI has, as ``--help`` lists them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from latency_analyzer.cli import main

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"


def test_the_guides_reference_lists_every_verb(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    choices = re.search(r"\{([a-z,]+)\}", capsys.readouterr().out)
    assert choices is not None
    verbs = choices.group(1).split(",")
    text = GUIDE.read_text()
    assert f"latency-analyzer [--version] {{{','.join(verbs)}}} ..." in text
    table = text.split("## 5. Command line reference", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `([a-z]+)", table, flags=re.MULTILINE)
    assert rows == verbs
