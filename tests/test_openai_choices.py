"""Several choices in one chunk read as each choice alone would: one rule for both paths."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from latency_analyzer.capture.openai import ChunkReceived, OpenAIStreamParser

CHOICES: list[Any] = [
    {"delta": {"content": "a"}},
    {"delta": {"reasoning_content": "think"}},
    {"delta": {"reasoning": "more", "content": None}},
    {"delta": {"reasoning_content": 5, "reasoning": "r"}},  # a number where text belongs
    {"delta": {"reasoning_content": "", "reasoning": "x"}},
    {"message": {"content": "whole", "reasoning_content": "why"}, "finish_reason": "stop"},
    {"text": "completion", "finish_reason": "length"},
    {"delta": "not an object", "text": 7},
    {"finish_reason": 3},
    "not a choice",
    None,
]


def _read(*choices: Any) -> tuple[str, str, str | None]:
    parser = OpenAIStreamParser()
    events = parser.feed(f"data: {json.dumps({'choices': list(choices)})}\n\n".encode(), 1)
    chunks = [e for e in events if isinstance(e, ChunkReceived)]
    assert len(chunks) == 1, events
    return chunks[0].content, chunks[0].reasoning, chunks[0].finish_reason


def test_known_readings() -> None:
    assert _read(CHOICES[0], CHOICES[6]) == ("acompletion", "", "length")
    assert _read(CHOICES[3]) == ("", "", None)  # 5 is not text, and is not passed over
    assert _read(CHOICES[4], CHOICES[5]) == ("whole", "xwhy", "stop")
    assert _read(CHOICES[9], CHOICES[7], CHOICES[8]) == ("", "", None)


PAIRS = [
    pytest.param(a, b, id=f"{i}+{j}")
    for (i, a), (j, b) in itertools.product(enumerate(CHOICES), repeat=2)
]


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_two_choices_read_as_each_alone(first: Any, second: Any) -> None:
    c1, r1, f1 = _read(first)
    c2, r2, f2 = _read(second)
    assert _read(first, second) == (c1 + c2, r1 + r2, f1 if f1 is not None else f2)
