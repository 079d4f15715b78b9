"""Every code block of README.md and docs/ marked ``<!-- runnable -->`` runs as written.

The marker is an HTML comment on the line right before the fence (invisible in any renderer).
Python blocks run in a fresh interpreter each (they start their own test-bed servers on
loopback); ``bash`` blocks run line by line with this environment's scripts on PATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w+)\s*$")


def _blocks() -> list[tuple[str, str, str]]:
    """(id, language, code) of every marked block."""
    out = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() != MARKER:
                continue
            opening = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
            if opening is None:
                raise AssertionError(f"{page.name}:{i + 1}: {MARKER} not followed by a fence")
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            code = "\n".join(lines[i + 2 : end]) + "\n"
            out.append((f"{page.name}:{i + 2}", opening.group(1), code))
    return out


BLOCKS = _blocks()


def test_blocks_are_marked() -> None:
    assert len(BLOCKS) >= 3, BLOCKS
    assert {lang for _, lang, _ in BLOCKS} <= {"python", "bash"}


@pytest.mark.parametrize(("where", "lang", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_marked_block_runs(where: str, lang: str, code: str, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if lang == "python":
        args = [sys.executable, "-c", code]
    else:
        args = ["bash", "-euo", "pipefail", "-c", code]
    done = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{where}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
