"""The example scenarios on the example datasets, run as a user runs them (only the URL given).

docs/load.md shows each of these files verbatim; this test runs every one of them.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.cli import main as cli_main
from latency_analyzer.testing import LLMServer

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "examples" / "scenarios"
DATASETS = ROOT / "examples" / "datasets"
CHAT = "/v1/chat/completions"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _run(name: str, url: str, out: Path, *flags: str) -> int:
    argv = ["run", str(SCENARIOS / name), "--url", url, "--out", str(out), "--workers", "1"]
    return cli_main([*argv, *flags])


def test_every_example_scenario_with_its_own_data_is_shown_in_the_docs() -> None:
    docs = (ROOT / "docs" / "load.md").read_text()
    # the field scenarios beside them are run by tests/test_example_scenarios.py
    names = ("conversation.toml", "dataset.toml", "trace.toml", "token_lengths.toml")
    files = [SCENARIOS / name for name in names]
    for f in files:
        assert f.read_text() in docs, f.name


def test_dataset_toml_sends_the_mix_from_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-example-key")
    rows = {r["prompt"]: r for r in _jsonl(DATASETS / "prompts.jsonl")}
    out = tmp_path / "run.jsonl"
    with LLMServer(tokens=2, record_requests=True).run_in_subprocess() as s:
        assert _run("dataset.toml", s.url + CHAT, out, "--slo", "ttft_p99=2s") == 0
        records = s.records
    assert len(records) == 40
    for r in records:
        body, headers = r.body or {}, r.headers or {}
        row = rows[body["messages"][0]["content"]]  # every prompt is a row of the file
        assert body["max_tokens"] == row["max_tokens"] and body["temperature"] == 0
        assert body["model"] == "my-model"
        assert headers["Authorization"] == "Bearer sk-example-key"
    assert "sk-example-key" not in out.read_text()
    ws = WaterfallSet.load(out)
    assert set(ws.labels("template")) <= {"chat", "code", "long"}
    assert list(ws.labels("template")).count("chat") > 40 // 2  # 70% of the draws, seeded
    assert "goodput:" in capsys.readouterr().out


def test_conversation_toml_sends_each_turn_with_the_conversation_so_far(tmp_path: Path) -> None:
    conversations = [c["turns"] for c in _jsonl(DATASETS / "conversations.jsonl")]
    with LLMServer(tokens=2, record_requests=True).run_in_subprocess() as s:
        assert _run("conversation.toml", s.url + CHAT, tmp_path / "run.jsonl") == 0
        records = s.records
    assert len(records) == sum(len(c) for c in conversations) == 9
    seen = []
    for r in records:
        messages = (r.body or {})["messages"]
        asked = [m["content"] for m in messages if m["role"] == "user"]
        conversation = next(c for c in conversations if c[0] == asked[0])
        assert asked == conversation[: len(asked)]  # the turns so far, in order
        assert [m["role"] for m in messages] == ["user", "assistant"] * (len(asked) - 1) + ["user"]
        seen.append((conversation[0], len(asked)))
    # a turn k is only ever sent after turn k - 1 of the same conversation was answered
    for c in conversations:
        sent = [seen.count((c[0], k)) for k in range(1, len(c) + 1)]
        assert sent == sorted(sent, reverse=True), (c[0], sent)
    assert max(k for _, k in seen) >= 2


def test_trace_toml_replays_the_trace_twice_as_fast(tmp_path: Path) -> None:
    stamps = np.array([r["timestamp"] for r in _jsonl(DATASETS / "trace.jsonl")])
    out = tmp_path / "run.jsonl"
    with LLMServer(tokens=2).run_in_subprocess() as s:
        assert _run("trace.toml", s.url + CHAT, out) == 0
    starts = np.sort(WaterfallSet.load(out).column("start_ns"))
    assert len(starts) == len(stamps) == 30
    assert np.max(np.abs(np.diff(starts) - np.diff(stamps) / 2 * 1e9)) <= 2  # the schedule


def test_token_lengths_toml_sizes_prompts_in_tokens_and_asks_for_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec("tokenizers") is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI must install the [tokenizer] extra (it is in [test])")
        pytest.skip("needs tokenizers: pip install 'latency-analyzer[tokenizer]'")
    from tokenizers import Tokenizer

    truth = Tokenizer.from_file(str(DATASETS / "tokenizer.json"))

    def count(text: str) -> int:
        return len(truth.encode(text, add_special_tokens=False).ids)

    documents = {count(r["prompt"]) for r in _jsonl(DATASETS / "prompts.jsonl")}
    out = tmp_path / "run.jsonl"
    with LLMServer(record_requests=True).run_in_subprocess() as s:
        assert _run("token_lengths.toml", s.url + CHAT, out) == 0
        records = {(r.body or {})["messages"][0]["content"]: r.body or {} for r in s.records}
    rows = [x for x in _jsonl(out) if x["kind"] == "wf"]
    assert len(rows) == len(records) == 30
    for row in rows:
        tags = row["tags"]
        # the row's request, found by its prompt (two users: the log's order is theirs)
        body = next(b for p, b in records.items() if count(p) == tags["prompt_tokens"])
        if tags["template"] == "chat":
            assert 16 <= body["max_tokens"] == tags["max_tokens"] <= 64
            assert body["min_tokens"] == 16 and "ignore_eos" not in body
        else:
            assert tags["template"] == "document"
            assert min(abs(tags["prompt_tokens"] - n) for n in documents) <= 1
            assert body["max_tokens"] == 32 and body["ignore_eos"] is True
    printed = capsys.readouterr().out
    assert "note: input tokens (tokenizer.json): requested mean" in printed
    assert "note: output tokens: requested (max_tokens) mean" in printed
