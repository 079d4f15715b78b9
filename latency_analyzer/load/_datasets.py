"""Prompts from the user's own files: JSONL, CSV or a folder of ``.txt`` files.

A scenario's ``dataset`` table::

    dataset = {path = "prompts.jsonl", field = "prompt", sample = "random"}

* ``path``: a ``.jsonl`` file (one JSON object a line), a ``.csv`` file (a header row, then one
  row a prompt) or a folder whose ``.txt`` files are one prompt each (in name order). A
  relative path in a scenario file is relative to that file.
* ``field``: the JSONL key or CSV column holding the request (default ``"prompt"``). In JSONL
  its value is a string (the prompt), a list of ``{"role", "content"}`` objects (an OpenAI
  ``messages`` list, sent as it is) or a list of strings (a multi-turn conversation: the user's
  turns, each sent after the previous answer and the scenario's ``think_time``, with the
  conversation so far, answers included, as a chat client sends it).
* ``sample``: ``"random"`` (seeded by the scenario's ``seed``) or ``"sequential"`` (file order,
  then again from the start).
* ``class_field`` and ``weights``: a mixed load. Each row's class is read from that key or
  column; ``weights = {chat = 0.7, code = 0.2, long = 0.1}`` picks a class by weight, then a
  row of it (without ``weights``: each class by its share of rows). The class is the request's
  ``template`` tag; a template of that name supplies ``max_tokens`` and ``body``.
* ``max_tokens_field``: a key or column holding the ``max_tokens`` to ask for.
* ``min_input_tokens``, ``max_input_tokens``: keep only the rows whose prompt (the first
  request's messages) has that many tokens, counted with the scenario's ``tokenizer``
  (see :mod:`latency_analyzer.load._lengths`; without a tokenizer they are errors).

Each request's row is kept in the run file as its ``sample`` tag: the JSONL line number or CSV
data row (from 1), or the ``.txt`` file's name; a conversation's turn *k* adds ``#k``.
"""

from __future__ import annotations

import csv
import io
import json
import random
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from ._scenario import Scenario, Template

__all__ = [
    "Dataset",
    "Sample",
    "check_fits",
    "json_lines",
    "load_dataset",
    "resolve_paths",
    "sample_body",
    "table_path",
]

_KEYS = (
    *("path", "field", "sample", "class_field", "weights", "max_tokens_field"),
    *("min_input_tokens", "max_input_tokens"),
)
_SAMPLING = ("random", "sequential")
_ROLES = ("system", "user", "assistant", "tool", "developer")


@dataclass(frozen=True)
class Sample:
    """One row of a dataset.

    Attributes:
        tag: which row (see the module docstring).
        klass: its class (None without ``class_field``).
        messages: the messages of its first request.
        turns: the user turns that follow, one request each (a conversation).
        max_tokens: from ``max_tokens_field`` (None: not given).
    """

    tag: str
    klass: str | None
    messages: tuple[Mapping[str, Any], ...]
    turns: tuple[str, ...] = ()
    max_tokens: int | None = None


@dataclass
class Dataset:
    """Rows and the way they are drawn."""

    samples: list[Sample]
    sampling: str = "random"
    weights: dict[str, float] = field(default_factory=dict)
    _by_class: dict[str | None, list[int]] = field(default_factory=dict)
    _cursor: dict[str | None, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, s in enumerate(self.samples):
            self._by_class.setdefault(s.klass, []).append(i)
        if self.weights:
            missing = sorted(set(self.weights) - {str(k) for k in self._by_class})
            if missing:
                raise UsageError(f"dataset key 'weights': no row has class {missing[0]!r}")

    def draw(self, rng: random.Random) -> Sample:
        """The next sample: a class by weight (if classes), then a row of it."""
        klass: str | None
        if self.weights:
            names = list(self.weights)
            klass = rng.choices(names, [self.weights[n] for n in names])[0]
        elif len(self._by_class) > 1:
            keys = list(self._by_class)
            klass = rng.choices(keys, [len(self._by_class[k]) for k in keys])[0]
        else:
            klass = next(iter(self._by_class))
        rows = self._by_class[klass]
        if self.sampling == "random":
            return self.samples[rng.choice(rows)]
        at = self._cursor.get(klass, 0)
        self._cursor[klass] = at + 1
        return self.samples[rows[at % len(rows)]]


def resolve_paths(data: MutableMapping[str, Any], base: Path) -> None:
    """Make a scenario file's ``dataset.path`` and ``trace.path`` relative to the file."""
    for key in ("dataset", "trace"):
        table = data.get(key)
        if isinstance(table, Mapping) and isinstance(table.get("path"), str):
            p = Path(table["path"]).expanduser()
            data[key] = {**table, "path": str(p if p.is_absolute() else base / p)}


def table_path(spec: Mapping[str, Any], keys: Sequence[str], table: str, kinds: str) -> str:
    """The ``path`` of a scenario's ``table`` (``dataset``, ``trace``), its keys checked.

    Raises:
        UsageError: a key not in ``keys``, or no ``path`` (``kinds``: what it may name).
    """
    unknown = sorted(set(spec) - set(keys))
    if unknown:
        raise UsageError(f"unknown {table} key {unknown[0]!r}; expected some of {list(keys)}")
    path = spec.get("path")
    if not isinstance(path, str):
        raise UsageError(f"{table} key 'path' is required ({kinds})")
    return path


def load_dataset(spec: Mapping[str, Any]) -> Dataset:
    """Read the dataset a scenario's ``dataset`` table describes.

    Raises:
        UsageError: an unknown key, a missing file, a row without the field, a value of the
            wrong kind; the message names the file, the row and the key.
    """
    path = table_path(spec, _KEYS, "dataset", "a .jsonl, a .csv or a folder")
    sampling = spec.get("sample", "random")
    if sampling not in _SAMPLING:
        raise UsageError(f"dataset key 'sample': expected one of {_SAMPLING}, got {sampling!r}")
    opts = {k: spec.get(k) for k in ("field", "class_field", "max_tokens_field")}
    for key, value in opts.items():
        if value is not None and not isinstance(value, str):
            raise UsageError(f"dataset key {key!r}: expected a string")
    weights = spec.get("weights") or {}
    if not isinstance(weights, Mapping) or not all(
        isinstance(w, int | float) and not isinstance(w, bool) and w >= 0 for w in weights.values()
    ):
        raise UsageError("dataset key 'weights': expected a table of class = weight >= 0")
    if weights and opts["class_field"] is None:
        raise UsageError("dataset key 'weights' needs 'class_field' (where a row's class is)")
    if weights and sum(weights.values()) <= 0:
        raise UsageError("dataset key 'weights': at least one weight must be > 0")
    lo, hi = spec.get("min_input_tokens"), spec.get("max_input_tokens")
    for key, value in (("min_input_tokens", lo), ("max_input_tokens", hi)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 0
        ):
            raise UsageError(f"dataset key {key!r}: expected a whole number of tokens >= 0")
    if lo is not None and hi is not None and lo > hi:
        raise UsageError("dataset keys 'min_input_tokens' > 'max_input_tokens': no row can fit")
    p = Path(path)
    try:
        samples = _read(p, opts)
    except OSError as exc:
        raise UsageError(f"dataset {path}: cannot read it ({exc.strerror or exc})") from None
    if not samples:
        raise UsageError(f"dataset {path}: no rows")
    w = {str(k): float(v) for k, v in weights.items()}
    return Dataset(samples, sampling, w)


def _read(p: Path, opts: Mapping[str, str | None]) -> list[Sample]:
    if p.is_dir():
        if opts["class_field"] or opts["max_tokens_field"] or opts["field"]:
            raise UsageError(f"dataset {p}: a folder of .txt files has no fields or columns")
        files = sorted(f for f in p.iterdir() if f.suffix == ".txt" and f.is_file())
        return [_sample(f.name, None, _text(f), None) for f in files]
    if p.suffix == ".jsonl":
        return _read_jsonl(p, opts)
    if p.suffix == ".csv":
        return _read_csv(p, opts)
    raise UsageError(f"dataset {p}: expected a .jsonl or .csv file or a folder of .txt files")


def _text(f: Path) -> str:
    try:
        return f.read_text("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"dataset {f}: not UTF-8 text") from None


def json_lines(text: str, label: str) -> Iterator[tuple[int, str, Any]]:
    """``(line number, "<label>, line N", value)`` of each non-blank line of a JSON-lines text.

    Raises:
        UsageError: a line that is not JSON, named by ``label`` and its number.
    """
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{label}, line {n}"
        try:
            yield n, where, json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{where}: not JSON ({exc})") from None


def _read_jsonl(p: Path, opts: Mapping[str, str | None]) -> list[Sample]:
    key = opts["field"] or "prompt"
    out = []
    for n, where, row in json_lines(_text(p), f"dataset {p}"):
        if not isinstance(row, dict) or key not in row:
            raise UsageError(f"{where}: no field {key!r}")
        klass = _class(row, opts["class_field"], where)
        out.append(_sample(str(n), klass, row[key], _max_tokens(row, opts, where), where, key))
    return out


def _read_csv(p: Path, opts: Mapping[str, str | None]) -> list[Sample]:
    key = opts["field"] or "prompt"
    reader = csv.DictReader(io.StringIO(_text(p), newline=""))
    columns = reader.fieldnames or []
    for name in (key, opts["class_field"], opts["max_tokens_field"]):
        if name is not None and name not in columns:
            raise UsageError(f"dataset {p}: no column {name!r}; the columns are {columns}")
    out = []
    for n, row in enumerate(reader, 1):
        where = f"dataset {p}, row {n}"
        klass = _class(row, opts["class_field"], where)
        out.append(_sample(str(n), klass, row[key], _max_tokens(row, opts, where), where, key))
    return out


def _class(row: Mapping[str, Any], key: str | None, where: str) -> str | None:
    if key is None:
        return None
    value = row.get(key)
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise UsageError(f"{where}: class field {key!r} missing or not a string")
    return str(value)


def _max_tokens(row: Mapping[str, Any], opts: Mapping[str, str | None], where: str) -> int | None:
    key = opts["max_tokens_field"]
    if key is None:
        return None
    value = row.get(key)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{where}: {key!r} must be a whole number of tokens >= 1")
    return value


def _sample(
    tag: str,
    klass: str | None,
    value: Any,
    max_tokens: int | None,
    where: str = "",
    key: str = "",
) -> Sample:
    if isinstance(value, str):
        return Sample(tag, klass, ({"role": "user", "content": value},), (), max_tokens)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        first = {"role": "user", "content": value[0]}
        return Sample(tag, klass, (first,), tuple(value[1:]), max_tokens)
    if isinstance(value, list) and value and all(_is_message(m) for m in value):
        return Sample(tag, klass, tuple(dict(m) for m in value), (), max_tokens)
    raise UsageError(
        f"{where}: field {key!r} must be a string (a prompt), a list of strings (a "
        "conversation's user turns) or a list of {role, content} messages"
    )


def _is_message(m: Any) -> bool:
    return (
        isinstance(m, dict) and m.get("role") in _ROLES and isinstance(m.get("content"), str | list)
    )


def check_fits(ds: Dataset, sc: Scenario) -> None:
    """Raise when the scenario cannot send the dataset's rows as they are.

    Raises:
        UsageError: messages or conversations with the ``completions`` API (it takes one
            prompt), or conversations in an open loop (each turn waits for the last answer).
    """
    if sc.api == "completions" and any(len(s.messages) > 1 or s.turns for s in ds.samples):
        raise UsageError(
            'dataset: messages lists and conversations need api = "chat" (the completions '
            "API takes one prompt)"
        )
    if sc.mode == "open" and any(s.turns for s in ds.samples):
        raise UsageError(
            "dataset: a conversation's turns each wait for the previous answer, which is a "
            'closed loop (mode = "closed")'
        )


def sample_body(
    sc: Scenario,
    template: Template,
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int | None,
    rng: random.Random,
) -> dict[str, Any]:
    """The JSON body that sends ``messages`` (the last one's text as a completions prompt);
    ``max_tokens`` is the row's own (None: the template's, see
    :meth:`~latency_analyzer.load._scenario.Template.output_fields`, drawn from ``rng``)."""
    body: dict[str, Any] = {"model": sc.model, "stream": sc.stream}
    if sc.api == "chat":
        body["messages"] = [dict(m) for m in messages]
    else:
        body["prompt"] = str(messages[-1]["content"])
    if sc.stream:
        body["stream_options"] = {"include_usage": True}
    body.update(template.output_fields(rng, max_tokens))
    body.update(sc.body_extra)
    body.update(template.body)
    return body
