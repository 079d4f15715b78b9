"""Datasets: the test bed keeps every body it received; each must be the row sampled for it.

Rows go out exactly as sampled (JSONL field, CSV column, a folder of .txt, OpenAI messages),
the run file names each request's row, weighted classes follow the seeded draw, and a
conversation's turns carry the growing history in order, the answers' streamed text included.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.cli import main as cli_main
from latency_analyzer.errors import UsageError
from latency_analyzer.load import Scenario, Template, dist, run_sync
from latency_analyzer.load._datasets import load_dataset
from latency_analyzer.load.distributed._split import split_scenario, splittable
from latency_analyzer.testing import LLMServer, token_text

CHAT = "/v1/chat/completions"


def _tags(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [x["tags"] for x in lines if x["kind"] == "wf"]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_prompts_are_sent_exactly_as_sampled_in_order(tmp_path: Path) -> None:
    prompts = [f"question {i}: " + "word " * (3 * i) for i in range(6)]
    data = _write_jsonl(tmp_path / "p.jsonl", [{"id": i, "text": p} for i, p in enumerate(prompts)])
    out = tmp_path / "run.jsonl"
    with LLMServer(tokens=2, record_requests=True).run_in_subprocess() as s:
        spec = {"path": str(data), "field": "text", "sample": "sequential"}
        sc = Scenario(s.url + CHAT, requests=9, dataset=spec, body_extra={"temperature": 0})
        result = run_sync(sc, path=out, rtt_samples=0)
        records = s.records
    assert result.issued == len(records) == 9
    expected = [prompts[i % 6] for i in range(9)]  # in file order, then from the start again
    sent = [r.body["messages"] for r in records if r.body is not None]
    assert sent == [[{"role": "user", "content": p}] for p in expected]
    assert all(r.body is not None and r.body["temperature"] == 0 for r in records)
    assert [t["sample"] for t in _tags(out)] == [str(i % 6 + 1) for i in range(9)]  # line numbers


def test_random_sampling_with_weighted_classes_follows_the_seeded_draw(tmp_path: Path) -> None:
    kinds = ("chat", "code", "long")
    rows = [{"prompt": f"{kind} prompt {j}", "kind": kind} for kind in kinds for j in range(4)]
    data = _write_jsonl(tmp_path / "mix.jsonl", rows)
    spec = {"path": str(data), "class_field": "kind", "weights": {"chat": 7, "code": 2, "long": 1}}
    out = tmp_path / "run.jsonl"
    code = Template("code", max_tokens=3)
    with LLMServer(tokens=1, record_requests=True).run_in_subprocess() as s:
        sc = Scenario(s.url + CHAT, requests=60, dataset=spec, seed=11, templates=(code,))
        run_sync(sc, path=out, rtt_samples=0)
        records = s.records
    ds, rng = load_dataset(spec), random.Random(11)
    drawn = [ds.draw(rng) for _ in range(60)]  # what the seed draws, row by row
    tags = _tags(out)
    assert [t["sample"] for t in tags] == [d.tag for d in drawn]
    assert [t["template"] for t in tags] == [d.klass for d in drawn]  # the class is the template
    assert [r.body["messages"][0]["content"] for r in records if r.body] == [
        d.messages[0]["content"] for d in drawn
    ]
    # the class named like a template takes its max_tokens; the others ask for none
    assert all(
        (r.body or {}).get("max_tokens") == (3 if d.klass == "code" else None)
        for r, d in zip(records, drawn, strict=True)
    )
    counts = Counter(d.klass for d in drawn)
    assert counts["chat"] > counts["code"] > 0 and counts["long"] > 0


def test_csv_column_folder_of_txt_and_messages_lists(tmp_path: Path) -> None:
    csv_path = tmp_path / "p.csv"
    csv_path.write_text('id,question,max\n1,"first, with a comma",2\n2,second,3\n')
    folder = tmp_path / "texts"
    folder.mkdir()
    for name, text in (("b.txt", "text b\nline two"), ("a.txt", "text a"), ("skip.md", "no")):
        (folder / name).write_text(text)
    messages = [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "1"},
            {"role": "user", "content": "two"},
        ],
    ]
    msg_path = _write_jsonl(tmp_path / "m.jsonl", [{"messages": m} for m in messages])
    cases: list[tuple[dict[str, Any], list[Any], list[int | None]]] = [
        (
            {"path": str(csv_path), "field": "question", "max_tokens_field": "max"},
            [
                [{"role": "user", "content": "first, with a comma"}],
                [{"role": "user", "content": "second"}],
            ],
            [2, 3],
        ),
        (
            {"path": str(folder)},
            [
                [{"role": "user", "content": "text a"}],
                [{"role": "user", "content": "text b\nline two"}],
            ],
            [None, None],
        ),
        ({"path": str(msg_path), "field": "messages"}, messages, [None, None]),
    ]
    for spec, expected, max_tokens in cases:
        with LLMServer(tokens=1, record_requests=True).run_in_subprocess() as s:
            sc = Scenario(s.url + CHAT, requests=2, dataset={**spec, "sample": "sequential"})
            run_sync(sc, rtt_samples=0)
            bodies = [r.body or {} for r in s.records]
        assert [b["messages"] for b in bodies] == expected, spec
        assert [b.get("max_tokens") for b in bodies] == max_tokens, spec


def test_a_conversation_sends_the_growing_history_in_order(tmp_path: Path) -> None:
    turns = [["hello", "and then?", "thanks"], ["other one", "second"]]
    data = _write_jsonl(tmp_path / "conv.jsonl", [{"turns": t} for t in turns])
    out = tmp_path / "run.jsonl"
    answer = "".join(token_text(i) for i in range(3))  # what the test bed streams, 3 tokens
    with LLMServer(tokens=3, record_requests=True).run_in_subprocess() as s:
        spec = {"path": str(data), "field": "turns", "sample": "sequential"}
        sc = Scenario(s.url + CHAT, requests=5, dataset=spec, think_time=dist(0.03))
        result = run_sync(sc, path=out, rtt_samples=0)
        records = s.records
    assert result.issued == len(records) == 5
    sent = [(r.body or {})["messages"] for r in records]
    user = [{"role": "user", "content": t} for t in turns[0]]
    bot = {"role": "assistant", "content": answer}
    assert sent[0] == user[:1]
    assert sent[1] == [user[0], bot, user[1]]
    assert sent[2] == [user[0], bot, user[1], bot, user[2]]
    assert sent[3] == [{"role": "user", "content": "other one"}]
    assert sent[4] == [
        {"role": "user", "content": "other one"},
        bot,
        {"role": "user", "content": "second"},
    ]
    # each turn left after the previous answer ended and the 30 ms think time (server clock)
    for prev, nxt in itertools.pairwise(records[:3]):
        assert nxt.received_ns - prev.end_ns >= 30_000_000
    assert [t["sample"] for t in _tags(out)] == ["1", "1#1", "1#2", "2", "2#1"]
    assert WaterfallSet.load(out).counts()["errors"] == 0


@pytest.mark.parametrize(
    ("spec", "scenario", "match"),
    [
        ({"path": "missing.jsonl"}, {}, "cannot read"),
        ({"path": "p.jsonl", "field": "nope"}, {}, "line 1: no field 'nope'"),
        ({"path": "p.jsonl", "sample": "shuffled"}, {}, "'sample'"),
        ({"path": "p.jsonl", "weights": {"a": 1}}, {}, "class_field"),
        ({"path": "p.jsonl", "bogus": 1}, {}, "'bogus'"),
        ({"path": "conv.jsonl", "field": "turns"}, {"mode": "open", "rate": 5}, "closed loop"),
        ({"path": "conv.jsonl", "field": "turns"}, {"api": "completions"}, "api"),
    ],
)
def test_bad_datasets_exit_2_naming_file_row_and_key(
    tmp_path: Path,
    spec: dict[str, Any],
    scenario: dict[str, Any],
    match: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}])
    _write_jsonl(tmp_path / "conv.jsonl", [{"turns": ["a", "b"]}])
    toml = tmp_path / "s.toml"
    lines = ['url = "http://127.0.0.1:9/v1/chat/completions"', "requests = 1"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in scenario.items()]
    table = ", ".join(
        f"{k} = {json.dumps(v) if not isinstance(v, dict) else _inline(v)}" for k, v in spec.items()
    )
    lines.append(f"dataset = {{{table}}}")
    toml.write_text("\n".join(lines) + "\n")
    assert cli_main(["run", str(toml), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def _inline(table: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + "}"


def test_dataset_flag_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write_jsonl(tmp_path / "p.jsonl", [{"q": "from the flag"}])
    with LLMServer(tokens=1, record_requests=True).run_in_subprocess() as s:
        argv = ["run", "--url", s.url + CHAT, "--requests", "2", "--dataset", "p.jsonl"]
        argv += ["--dataset-field", "q", "--workers", "1", "--out", "o.jsonl"]
        assert cli_main(argv) == 0
        bodies = [r.body or {} for r in s.records]
    assert [b["messages"] for b in bodies] == [[{"role": "user", "content": "from the flag"}]] * 2


def test_a_dataset_in_order_is_not_split_over_workers() -> None:
    spec = {"path": "p.jsonl", "sample": "sequential"}
    sc = Scenario("http://x/", requests=4, concurrency=2, dataset=spec)
    assert splittable(sc, 4) == 1
    with pytest.raises(UsageError, match="in order"):
        split_scenario(sc, 2)
    assert splittable(sc.replace(dataset={**spec, "sample": "random"}), 4) == 2


def test_a_random_dataset_over_worker_processes_keeps_each_rows_tag(tmp_path: Path) -> None:
    prompts = [f"prompt number {i}" for i in range(5)]
    data = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in prompts])
    out = tmp_path / "run.jsonl"
    with LLMServer(tokens=1, record_requests=True).run_in_subprocess() as s:
        sc = Scenario(s.url + CHAT, requests=10, concurrency=2, dataset={"path": str(data)})
        result = run_sync(sc, workers=2, path=out, rtt_samples=0)
        sent = sorted((r.body or {})["messages"][0]["content"] for r in s.records)
    assert result.issued == 10
    tags = _tags(out)
    assert {t["worker"] for t in tags} == {0, 1}
    assert sorted(prompts[int(t["sample"]) - 1] for t in tags) == sent  # tag = the row sent


def test_synthetic_lengths_cannot_apply_with_a_dataset() -> None:
    synthetic = Template("t", prompt_tokens=dist(10))
    with pytest.raises(UsageError, match="'prompt_tokens' cannot apply with a dataset"):
        Scenario("http://x/", requests=1, dataset={"path": "p.jsonl"}, templates=(synthetic,))
    with pytest.raises(UsageError, match="with a trace"):
        Scenario("http://x/", mode="open", trace={"path": "t.jsonl"}, templates=(synthetic,))
