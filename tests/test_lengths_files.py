"""Empirical length files: each row's value read (text measured in words here, numbers as
they are), and a file that cannot be used refused with its path, row and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from latency_analyzer.cli import main as cli_main
from latency_analyzer.errors import UsageError
from latency_analyzer.load import Scenario, Template, dist
from latency_analyzer.load._datasets import load_dataset
from latency_analyzer.load._lengths import Lengths, resolve_lengths

URL = "http://127.0.0.1:9/v1/chat/completions"  # never contacted


def _values(path: Path, field: str = "prompt") -> tuple[float, ...]:
    spec = dist({"empirical": {"path": str(path), "field": field}})
    sc = Scenario(url=URL, requests=1, templates=(Template("t", 1.0, spec),))
    d = resolve_lengths(sc, Lengths()).templates[0].prompt_tokens
    assert d is not None
    return d.params


def test_rows_are_measured_and_empty_cells_left_out(tmp_path: Path) -> None:
    csv = tmp_path / "p.csv"
    csv.write_text("prompt,other\none two three,x\n,y\n7,z\nfour five\n")
    assert _values(csv) == (3.0, 7.0, 2.0)  # the empty cell is no row, not a 0-word prompt
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("a b c d")
    (folder / "b.txt").write_text("e")
    (folder / "c.md").write_text("not read")
    assert _values(folder) == (4.0, 1.0)
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "a b"}\n\n{"prompt": [{"role": "user", "content": "c d e"}]}\n')
    assert _values(jl) == (2.0, 3.0)


@pytest.mark.parametrize(
    ("name", "content", "named"),
    [
        ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": {"x": 1}}\n', r"bad\.jsonl, line 2: 'prompt'"),
        ("neg.jsonl", '{"prompt": -3}\n', r"neg\.jsonl, line 1: 'prompt': .*>= 0"),
        ("nofield.jsonl", '{"text": "a"}\n', r"nofield\.jsonl, line 1: no field 'prompt'"),
        ("good.csv", "prompt\nok\n", None),
        ("p.txt", "a b", r"expected a \.jsonl or \.csv"),
        ("latin.csv", b"prompt\n\xe9t\xe9\n", r"latin\.csv: not UTF-8"),
        ("none.csv", "other\nx\n", r"none\.csv: no column 'prompt'"),
    ],
)
def test_a_bad_file_names_its_path_row_and_reason(
    tmp_path: Path, name: str, content: str | bytes, named: str | None
) -> None:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    if named is None:  # the one good file among them: read, no error
        assert _values(path) == (1.0,)
        return
    with pytest.raises(UsageError, match=rf"template 't', 'prompt_tokens': empirical .*{named}"):
        _values(path)


def test_a_folder_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("fine")
    (folder / "b.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(UsageError, match=r"empirical .*b\.txt: not UTF-8 text"):
        _values(folder)
    (folder / "b.txt").unlink()
    (folder / "a.txt").unlink()
    with pytest.raises(UsageError, match="no values in 'prompt'"):
        _values(folder)


@pytest.mark.parametrize(
    ("bounds", "named"),
    [
        ({"min_input_tokens": -1}, "'min_input_tokens': expected a whole number of tokens >= 0"),
        ({"max_input_tokens": 2.5}, "'max_input_tokens': expected a whole number"),
        ({"min_input_tokens": 9, "max_input_tokens": 3}, "no row can fit"),
    ],
)
def test_dataset_token_bounds_are_checked_when_read(
    tmp_path: Path, bounds: dict[str, object], named: str
) -> None:
    rows = tmp_path / "d.jsonl"
    rows.write_text('{"prompt": "a b c"}\n')
    with pytest.raises(UsageError, match=named):
        load_dataset({"path": str(rows), **bounds})


def test_an_empty_tokenizer_path_is_refused_not_read_as_the_files_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'url = "{URL}"\nrequests = 1\ntokenizer = ""\n')
    assert cli_main(["run", str(scenario), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "'tokenizer' (--tokenizer): an empty path" in capsys.readouterr().err
    assert cli_main(["run", "--url", URL, "--requests", "1", "--tokenizer", " "]) == 2
    assert "an empty path" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]  # refused before a run


def test_an_empty_empirical_path_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("a folder's text is not a length file")
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f'url = "{URL}"\nrequests = 1\n[[templates]]\nname = "a"\nweight = 1\n'
        'prompt_tokens = {empirical = {path = ""}}\n'
    )
    assert cli_main(["run", str(scenario), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "empirical: 'path'" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()
