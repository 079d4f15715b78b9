"""Token-true lengths: a tiny BPE tokenizer trained here is the ruler.

The truth for every check is the ``tokenizers`` library itself, reading the file the run was
given, counting the prompts the test-bed server logged as received; the targets are the
seeded draws, drawn again here in the documented order (template, prompt length, output
length) from ``random.Random(seed)``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from latency_analyzer.cli import main as cli_main
from latency_analyzer.errors import UsageError
from latency_analyzer.load import Scenario, Template, dist, load_scenario, run_sync
from latency_analyzer.load._lengths import Lengths, fit_prompt
from latency_analyzer.load._tokenizer import load_tokenizer
from latency_analyzer.testing import LLMServer

if importlib.util.find_spec("tokenizers") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI must install the [tokenizer] extra (it is in [test])")
    pytest.skip(
        "needs tokenizers: pip install 'latency-analyzer[tokenizer]'", allow_module_level=True
    )

from tokenizers import Tokenizer as Truth

from latency_analyzer.testing.tokenizer import build_tokenizer

CHAT = "/v1/chat/completions"
URL = "http://127.0.0.1:9" + CHAT  # never contacted: the error cases fail before a request
SEED = 7

# one template per length distribution; output lengths asked for in each way a template can
DISTS: dict[str, dict[str, Any]] = {
    "fixed": {"fixed": 40},
    "uniform": {"uniform": [5, 300]},
    "normal": {"normal": [120, 40]},
    "lognormal": {"lognormal": [80, 0.8]},
}


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def truth(tok_path: Path) -> Truth:
    return Truth.from_file(str(tok_path))


def _count(truth: Truth, text: str) -> int:
    return len(truth.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset of prompts of spread lengths: the empirical distribution's source."""
    rng = random.Random(3)
    words = ["the", "server", "queue", "token", "prefill", "decode", "w123", "w045", "latency"]
    rows = [{"prompt": " ".join(rng.choices(words, k=rng.randint(3, 200)))} for _ in range(25)]
    path = tmp_path_factory.mktemp("data") / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _tags(path: Path) -> list[dict[str, Any]]:
    return [x["tags"] for x in _jsonl(path) if x["kind"] == "wf"]


def _notes(path: Path) -> dict[str, Any]:
    return {x["name"]: x["data"] for x in _jsonl(path) if x["kind"] == "note"}


@pytest.mark.parametrize("split_words", [True, False], ids=["byte-level", "tokens-span-spaces"])
def test_prompts_are_within_one_token_of_every_draw(
    tmp_path: Path, tok_path: Path, split_words: bool
) -> None:
    """fit_prompt over 5 distributions × 120 seeded draws, each prompt counted by the
    tokenizers library: within ±1 token of the draw (printed: the largest error seen), with a
    tokenizer that splits at spaces and with one whose tokens span them."""
    if not split_words:
        tok_path = build_tokenizer(tmp_path / "spanning.json", split_words=False)
    tok, truth = load_tokenizer(str(tok_path)), Truth.from_file(str(tok_path))
    rng = random.Random(SEED)
    values = tuple(float(n) for n in range(1, 2000, 37))
    kinds = [dist(d) for d in DISTS.values()] + [dist({"empirical": list(values)})]
    worst, n = 0, 0
    for d in kinds:
        for i in range(120):
            target = max(1, round(d.sample(rng)))
            text, measured = fit_prompt(tok, target, offset=i)
            real = _count(truth, text)
            assert measured == real  # what the run records is what the tokenizer says
            worst = max(worst, abs(real - target))
            n += 1
    print(f"max |tokens - target| over {n} draws (split_words={split_words}): {worst}")
    assert worst <= 1


def test_the_server_receives_the_sampled_prompts_and_output_fields(
    tmp_path: Path, tok_path: Path, truth: Truth, documents: Path
) -> None:
    doc_lengths = [float(_count(truth, r["prompt"])) for r in _jsonl(documents)]
    templates = [
        Template(name, 1.0, dist(spec), max_tokens=12, min_tokens=4) for name, spec in DISTS.items()
    ]
    templates.append(
        Template(
            "empirical",
            1.0,
            dist({"empirical": {"path": str(documents), "field": "prompt"}}),
            output_tokens=dist({"uniform": [2, 30]}),
            ignore_eos=True,
        )
    )
    out = tmp_path / "run.jsonl"
    sc = Scenario("", requests=50, seed=SEED, templates=tuple(templates), tokenizer=str(tok_path))
    with LLMServer(record_requests=True).run_in_subprocess() as s:
        result = run_sync(sc.replace(url=s.url + CHAT), path=out, rtt_samples=0)
        records = s.records
    assert result.issued == len(records) == 50
    by_name = {t.name: t for t in templates}
    rng = random.Random(SEED)  # the run's draws, again: template, prompt length, output length
    tags = _tags(out)
    worst = 0
    for record, tag in zip(records, tags, strict=True):
        t = rng.choices(templates, [1.0] * len(templates))[0]
        assert tag["template"] == t.name
        if t.name == "empirical":
            target = max(1, round(rng.choice(doc_lengths)))
        else:
            target = max(1, round(dist(DISTS[t.name]).sample(rng)))
        body = record.body or {}
        prompt = body["messages"][0]["content"]
        real = _count(truth, prompt)
        worst = max(worst, abs(real - target))
        assert tag["prompt_tokens"] == real  # the run file says what the tokenizer says
        if t.name == "empirical":
            wanted = max(1, round(rng.uniform(2, 30)))
            assert body["max_tokens"] == wanted == tag["max_tokens"]
            assert body["ignore_eos"] is True and "min_tokens" not in body
        else:
            assert body["max_tokens"] == 12 == tag["max_tokens"]
            assert body["min_tokens"] == 4 == tag["min_tokens"]
            assert "ignore_eos" not in body
        assert by_name[t.name] is t
    assert worst <= 1
    lengths = _notes(out)["lengths"]
    assert lengths["unit"] == "tokens" and lengths["approximate"] is False
    assert lengths["tokenizer"] == str(tok_path)
    # the test bed's usage counts words: received differs from requested, and says so
    assert lengths["input"]["requests"] == 50 and lengths["input"]["received_n"] == 50
    assert lengths["output"]["fewer_than_requested"] == 0  # the test bed honours max_tokens
    per = lengths["by_template"]
    assert set(per) == set(by_name) and sum(p["input"]["requests"] for p in per.values()) == 50
    assert per["fixed"]["output"]["requested_mean"] == 12.0
    fixed = [tag["prompt_tokens"] for tag in tags if tag["template"] == "fixed"]
    assert per["fixed"]["input"]["requested_mean"] == sum(fixed) / len(fixed)
    line = next(n for n in result.notes if n.startswith("input tokens (tokenizer.json)"))
    assert "received (usage prompt_tokens)" in line


def test_without_a_tokenizer_the_run_says_lengths_were_approximate(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    sc = Scenario("", requests=5, templates=(Template(prompt_tokens=dist(30), max_tokens=3),))
    with LLMServer(record_requests=True).run_in_subprocess() as s:
        result = run_sync(sc.replace(url=s.url + CHAT), path=out, rtt_samples=0)
        records = s.records
    assert all(len((r.body or {})["messages"][0]["content"].split()) == 30 for r in records)
    lengths = _notes(out)["lengths"]
    assert lengths == {**lengths, "unit": "words", "approximate": True, "tokenizer": None}
    assert lengths["input"]["requested_mean"] == 30.0
    assert lengths["input"]["received_mean"] == 30.0  # the test bed's usage counts words too
    text = result.summary().to_text()
    assert "note: input lengths were APPROXIMATE (words, not tokens: no tokenizer)" in text
    assert [t["prompt_tokens"] for t in _tags(out)] == [30] * 5


def test_dataset_rows_are_measured_and_filtered_in_tokens(
    tmp_path: Path, tok_path: Path, truth: Truth, documents: Path
) -> None:
    rows = _jsonl(documents)
    sizes = {r["prompt"]: _count(truth, r["prompt"]) for r in rows}
    lo, hi = 100, 400
    inside = {p for p, n in sizes.items() if lo <= n <= hi}
    assert 0 < len(inside) < len(rows)  # the filter keeps some rows and drops others
    spec = {"path": str(documents), "min_input_tokens": lo, "max_input_tokens": hi}
    out = tmp_path / "run.jsonl"
    sc = Scenario("", requests=20, dataset=spec, tokenizer=str(tok_path))
    with LLMServer(tokens=2, record_requests=True).run_in_subprocess() as s:
        run_sync(sc.replace(url=s.url + CHAT), path=out, rtt_samples=0)
        records = s.records
    sent = [(r.body or {})["messages"][0]["content"] for r in records]
    assert len(sent) == 20 and set(sent) <= inside
    assert [t["prompt_tokens"] for t in _tags(out)] == [sizes[p] for p in sent]


def test_cli_flags_send_min_tokens_and_ignore_eos_to_every_template(
    tmp_path: Path, tok_path: Path, truth: Truth, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.toml"
    f.write_text(
        'url = "http://127.0.0.1:9/v1/chat/completions"\nrequests = 6\n'
        '[[templates]]\nname = "a"\nprompt_tokens = {uniform = [10, 60]}\nmax_tokens = 8\n'
    )
    out = tmp_path / "run.jsonl"
    with LLMServer(record_requests=True).run_in_subprocess() as s:
        argv = ["run", str(f), "--url", s.url + CHAT, "--out", str(out), "--workers", "1"]
        flags = ["--tokenizer", str(tok_path), "--min-tokens", "5", "--ignore-eos"]
        assert cli_main([*argv, *flags]) == 0
        records = s.records
    for r, tag in zip(records, _tags(out), strict=True):
        body = r.body or {}
        assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (8, 5, True)
        assert _count(truth, body["messages"][0]["content"]) == tag["prompt_tokens"]
        assert 9 <= tag["prompt_tokens"] <= 61
    printed = capsys.readouterr().out
    assert "note: input tokens (tokenizer.json): requested mean" in printed
    assert "note: output tokens: requested (max_tokens) mean 8.0" in printed
    with LLMServer().run_in_subprocess() as s:
        argv = ["run", str(f), "--url", s.url + CHAT, "--out", str(out), "--workers", "1"]
        assert cli_main([*argv, "--json"]) == 0  # without a tokenizer: words, approximate
    lengths = json.loads(capsys.readouterr().out)["lengths"]
    assert lengths["unit"] == "words" and lengths["approximate"] is True
    assert lengths["output"]["requested_mean"] == 8.0 and lengths["input"]["requests"] == 6


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "never downloaded"),
        ("missing/tokenizer.json", "not a file or folder on this machine"),
    ],
)
def test_a_tokenizer_that_is_not_a_local_path_exits_2_naming_the_option(
    value: str,
    why: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--url", URL, "--requests", "1", "--tokenizer", value]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "'tokenizer' (--tokenizer)" in err and why in err and value in err
    assert list(tmp_path.iterdir()) == []  # refused before anything ran: no run file


def test_scenario_file_errors_name_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    cases = {
        'tokenizer = "org/model"\n': "'tokenizer' (--tokenizer)",
        f'tokenizer = "{junk}"\n': "not a tokenizer.json",
        'dataset = {path = "d.jsonl", max_input_tokens = 10}\n': "needs a tokenizer",
    }
    (tmp_path / "d.jsonl").write_text('{"prompt": "hello there"}\n')
    for text, named in cases.items():
        f = tmp_path / "s.toml"
        f.write_text(f'url = "{URL}"\nrequests = 1\n{text}')
        assert cli_main(["run", str(f), "--out", str(tmp_path / "r.jsonl")]) == 2
        assert named in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(
    ("template", "named"),
    [
        ({"max_tokens": 8, "output_tokens": {"uniform": [1, 9]}}, "not both"),
        ({"max_tokens": 8, "min_tokens": 9}, "min_tokens (9) is above max_tokens (8)"),
        ({"min_tokens": -1}, "min_tokens must be >= 0"),
        ({"ignore_eos": "yes"}, "'ignore_eos'"),
        ({"prompt_tokens": {"normal": [10]}}, "'prompt_tokens'"),
        ({"prompt_tokens": {"empirical": {"file": "x"}}}, "unknown key 'file'"),
    ],
)
def test_bad_length_keys_are_errors(tmp_path: Path, template: dict[str, Any], named: str) -> None:
    with pytest.raises(UsageError, match=named.replace("(", r"\(").replace(")", r"\)")):
        Scenario.from_dict({"url": URL, "requests": 1, "templates": [template]})


def test_a_scenario_file_resolves_tokenizer_and_empirical_paths_beside_it(
    tmp_path: Path, tok_path: Path, documents: Path
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(tok_path.read_bytes())  # a model folder
    (tmp_path / "docs.jsonl").write_bytes(documents.read_bytes())
    f = tmp_path / "s.toml"
    f.write_text(
        f'url = "{URL}"\nrequests = 1\ntokenizer = "model"\n[[templates]]\n'
        'prompt_tokens = {empirical = {path = "docs.jsonl", field = "prompt"}}\n'
    )
    sc, _ = load_scenario(f)
    assert sc.tokenizer == str(folder)
    assert sc.templates[0].prompt_tokens is not None
    assert sc.templates[0].prompt_tokens.to_spec() == {
        "empirical": {"path": str(tmp_path / "docs.jsonl"), "field": "prompt"}
    }
    assert load_tokenizer(str(folder)).count("w123 the server") == Lengths(
        load_tokenizer(str(tok_path))
    ).count("w123 the server")


def test_a_trace_is_sized_and_measured_in_tokens(
    tmp_path: Path, tok_path: Path, truth: Truth
) -> None:
    rows = [
        {"timestamp": 0.0, "input_tokens": 37, "output_tokens": 3},
        {"timestamp": 0.01, "prompt": "the server w123 answers", "output_tokens": 4},
        {"timestamp": 0.02, "input_tokens": 500, "output_tokens": 5},
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run.jsonl"
    sc = Scenario("", mode="open", trace={"path": str(trace)}, tokenizer=str(tok_path))
    with LLMServer(record_requests=True).run_in_subprocess() as s:
        run_sync(sc.replace(url=s.url + CHAT), path=out, rtt_samples=0)
        records = {(r.body or {})["max_tokens"]: r.body or {} for r in s.records}
    tags = {t["max_tokens"]: t for t in _tags(out)}
    for row in rows:
        body, tag = records[row["output_tokens"]], tags[row["output_tokens"]]
        real = _count(truth, body["messages"][0]["content"])
        assert tag["prompt_tokens"] == real == row.get("input_tokens", real)
        if "prompt" in row:
            assert body["messages"][0]["content"] == row["prompt"]


def test_conversation_turns_are_measured_with_their_history(
    tmp_path: Path, tok_path: Path, truth: Truth
) -> None:
    data = tmp_path / "c.jsonl"
    data.write_text(json.dumps({"turns": ["hello w123 there", "and the server?"]}) + "\n")
    out = tmp_path / "run.jsonl"
    spec = {"path": str(data), "field": "turns", "sample": "sequential"}
    sc = Scenario("", requests=2, dataset=spec, tokenizer=str(tok_path))
    with LLMServer(tokens=3, record_requests=True).run_in_subprocess() as s:
        run_sync(sc.replace(url=s.url + CHAT), path=out, rtt_samples=0)
        records = s.records
    for r, tag in zip(records, _tags(out), strict=True):
        messages = (r.body or {})["messages"]
        assert tag["prompt_tokens"] == sum(_count(truth, m["content"]) for m in messages)
    assert len((records[1].body or {})["messages"]) == 3  # turn 2 went with the history


def test_worker_processes_size_prompts_with_the_tokenizer_and_the_run_says_so(
    tmp_path: Path, tok_path: Path, truth: Truth, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.jsonl"
    with LLMServer(tokens=2, record_requests=True).run_in_subprocess() as s:
        argv = ["run", "--url", s.url + CHAT, "--requests", "8", "--concurrency", "2"]
        argv += ["--workers", "2", "--out", str(out), "--tokenizer", str(tok_path)]
        argv += ["--max-tokens", "2"]
        f = tmp_path / "s.toml"
        f.write_text('url = "x"\n[[templates]]\nprompt_tokens = {uniform = [20, 90]}\n')
        assert cli_main([*argv[:1], str(f), *argv[1:]]) == 0
        records = s.records
    prompts = [(r.body or {})["messages"][0]["content"] for r in records]
    tags = _tags(out)
    assert len(tags) == len(records) == 8 and {t["worker"] for t in tags} == {0, 1}
    assert len(set(prompts)) == 8  # each worker's filler starts elsewhere: no shared prompt
    counts = sorted(_count(truth, p) for p in prompts)
    assert sorted(t["prompt_tokens"] for t in tags) == counts
    assert all(20 <= n <= 90 for n in counts)
    assert _notes(out)["lengths"]["unit"] == "tokens"
    assert "note: input tokens (tokenizer.json)" in capsys.readouterr().out


def test_a_transformers_tokenizer_folder_counts_as_tokenizers_does(
    tmp_path: Path, tok_path: Path, truth: Truth
) -> None:
    if importlib.util.find_spec("transformers") is None:  # in the test extra: CI has it
        if os.environ.get("CI") == "true":
            pytest.fail("transformers is missing: pip install -e '.[test]'")
        pytest.skip("needs transformers (in the test extra): pip install transformers")
    folder = tmp_path / "slow"
    folder.mkdir()
    truth.model.save(str(folder))  # vocab.json + merges.txt: a GPT-2 style folder
    config = {"tokenizer_class": "GPT2Tokenizer", "unk_token": "<unk>", "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(str(folder))
    assert tok.kind == "transformers"
    for n in (1, 17, 300):
        text, measured = fit_prompt(tok, n, offset=n)
        assert measured == _count(truth, text) == n


def test_the_scenario_record_round_trips_its_length_keys(documents: Path) -> None:
    t = Template(
        "a",
        prompt_tokens=dist({"empirical": {"path": str(documents), "field": "prompt"}}),
        output_tokens=dist({"normal": [50, 10]}),
        min_tokens=5,
        ignore_eos=True,
    )
    sc = Scenario(URL, requests=1, templates=(t,), tokenizer="x/tokenizer.json")
    again = Scenario.from_dict(json.loads(json.dumps(sc.to_dict())))  # as a worker gets it
    assert again.templates == sc.templates and again.tokenizer == "x/tokenizer.json"


def test_min_tokens_above_max_tokens_on_the_command_line_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["run", "--url", URL, "--requests", "1", "--max-tokens", "4", "--min-tokens", "9"]
    assert cli_main(argv) == 2
    assert "--min-tokens" in capsys.readouterr().err


def test_a_prompt_longer_than_any_context_is_refused_not_built() -> None:
    """A length distribution that asks for 10**12 words stops with the reason before a byte of
    it is allocated (it would be ~5 TB of filler)."""
    sc = Scenario(URL, requests=1, templates=(Template("huge", prompt_tokens=dist(1e12)),))
    with pytest.raises(UsageError, match=r"1000000000000 tokens .* 10000000"):
        run_sync(sc, rtt_samples=0)
