"""Request lengths: prompts built and measured in tokens (or words), and what the run asked
for against what the server says it got.

With a tokenizer (:mod:`._tokenizer`), a synthetic prompt of N tokens is whole filler words
and a cut into the next, summed from each word's own tokens, then counted; when the count is
off (a tokenizer whose tokens span spaces), filler text is cut at the N-th token's end and
counted again, neighbouring cuts tried (a cut inside a word may encode differently). Every
request's prompt, from a template, a dataset row or a trace row, is measured with it (the
messages' text, without a chat template). Without one, lengths are whitespace-separated
words, an approximation that the run's summary and run file say they are; the server's
``usage`` is then the only token count.

The run file's tags hold, per request, ``prompt_tokens`` (the prompt's measured length) and
``max_tokens`` / ``min_tokens`` (the output asked for); its ``lengths`` note holds the unit,
the tokenizer and requested-against-received figures that the summary prints.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ._datasets import Dataset, json_lines
from ._dists import FILLER_CYCLE, FILLER_WORDS, Dist, filler_word, synthetic_prompt
from ._tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from ._scenario import Scenario

__all__ = [
    "Lengths",
    "filter_dataset",
    "fit_prompt",
    "lengths_for",
    "resolve_length_paths",
    "resolve_lengths",
]

#: The longest synthetic prompt built (tokens or words): beyond any model's context window, so
#: a draw above it is a mistake in the scenario, not a request to send (and not ~5 bytes of
#: memory per unit to allocate).
MAX_PROMPT_TOKENS = 10_000_000
_TRIES = 4  # cuts tried on each side of the target when a cut re-encodes to another count
_SAMPLE_WORDS = 512  # filler words encoded once per tokenizer to learn its tokens per word
_tokens_per_word: dict[str, float] = {}


def fit_prompt(tok: Tokenizer, target: int, offset: int = 0) -> tuple[str, int]:
    """Filler text of ``target`` tokens by ``tok`` (or the nearest count a cut gives), and
    its count as ``tok`` measures it.

    ``offset`` rotates the filler as :func:`~._dists.synthetic_prompt` does, so prompts of
    one length differ.

    Raises:
        UsageError: the tokenizer produces no tokens from the filler text.
    """
    if target <= 0:
        return "", 0
    fast = _fit_by_words(tok, target, offset)
    if fast is not None:
        return fast
    ratio = _ratio(tok)
    words = math.ceil(target / ratio) + 2
    for _ in range(16):
        text = synthetic_prompt(words, offset)
        ids, ends = tok.token_ends(text)
        if len(ids) >= target:
            break
        words = max(words + 1, math.ceil(words * target / max(1, len(ids))) + 2)
    else:
        raise UsageError(f"tokenizer {tok.path}: too few tokens from filler text")

    def cut(k: int) -> str:
        return text[: ends[k - 1]] if ends is not None else tok.decode(ids[:k])

    best = ("", 0)
    for step in range(2 * _TRIES + 1):  # target, target - 1, target + 1, target - 2, ...
        k = target + (step + 1) // 2 * (1 if step % 2 == 0 else -1)
        if not 1 <= k <= len(ids):
            continue
        candidate = cut(k)
        n = tok.count(candidate)
        if n == target:
            return candidate, n
        if step == 0 or abs(n - target) < abs(best[1] - target):
            best = (candidate, n)
    return best


@dataclasses.dataclass(frozen=True)
class _WordTokens:
    """Each filler word's tokens, as the first word of a prompt and after a space: how many,
    and where each ends (characters into the word, its space included after the first)."""

    first: list[list[int]]
    later: list[list[int]]


_word_tokens: dict[str, _WordTokens | None] = {}


def _table(tok: Tokenizer) -> _WordTokens | None:
    """The filler words' tokens, learnt once per tokenizer (None: it gives no offsets)."""
    key = f"{tok.kind}:{tok.path}"
    if key not in _word_tokens:
        words = [filler_word(i) for i in range(FILLER_WORDS)]
        text = "".join(f" {w}" for w in words)
        ends = tok.token_ends(words[0] + text)[1]
        table = None
        if ends is not None:
            later: list[list[int]] = [[] for _ in words]
            base = len(words[0])
            for end in ends:  # a token belongs to the piece (space + word) it ends in
                i = (end - base - 1) // (len(words[0]) + 1)
                if 0 <= i < len(words):
                    later[i].append(end - base - i * (len(words[0]) + 1))
            first = [tok.token_ends(w)[1] or [] for w in words]
            if all(first) and all(later):  # every word has tokens: the sum below can end
                table = _WordTokens(first, later)
        _word_tokens[key] = table
    return _word_tokens[key]


def _fit_by_words(tok: Tokenizer, target: int, offset: int) -> tuple[str, int] | None:
    """Whole filler words and a cut into the next, summed from each word's own tokens, then
    counted once: exact whenever the tokenizer splits at spaces (most do); None otherwise,
    or when the count disagrees (the caller then cuts and counts around the target)."""
    table = _table(tok)
    if table is None:
        return None
    start = offset % FILLER_CYCLE
    pieces = table.first[start % FILLER_WORDS]
    words, total = 0, 0
    while total + len(pieces) <= target:
        total += len(pieces)
        words += 1
        if total == target:
            break
        pieces = table.later[(start + words) % FILLER_CYCLE % FILLER_WORDS]
    text = synthetic_prompt(words, offset)
    rest = target - total
    if rest > 0:  # the first `rest` tokens of the next word
        word = filler_word((start + words) % FILLER_CYCLE)
        text += (word if words == 0 else f" {word}")[: pieces[rest - 1]]
    n = tok.count(text)
    return (text, n) if n == target else None


def _ratio(tok: Tokenizer) -> float:
    """Tokens per filler word (learnt once per tokenizer), to size the text to encode."""
    key = f"{tok.kind}:{tok.path}"
    if key not in _tokens_per_word:
        n = tok.count(synthetic_prompt(_SAMPLE_WORDS))
        _tokens_per_word[key] = max(0.05, n / _SAMPLE_WORDS)
    return _tokens_per_word[key]


def _words(text: str) -> int:
    return len(text.split())


@dataclasses.dataclass(frozen=True)
class Lengths:
    """How one run builds and measures prompts: in tokens with ``tokenizer``, else in words."""

    tokenizer: Tokenizer | None = None

    @property
    def unit(self) -> str:
        return "words" if self.tokenizer is None else "tokens"

    def count(self, text: str) -> int:
        return _words(text) if self.tokenizer is None else self.tokenizer.count(text)

    def prompt(self, target: int, offset: int) -> tuple[str, int]:
        """A synthetic prompt of ``target`` units and its measured length.

        Raises:
            UsageError: ``target`` is over ``MAX_PROMPT_TOKENS`` (a length distribution or a
                trace row that asks for more than any model's context).
        """
        if target > MAX_PROMPT_TOKENS:
            raise UsageError(
                f"a prompt of {target} tokens was asked for (prompt_tokens or a trace's "
                f"input_tokens); the most a request is built with is {MAX_PROMPT_TOKENS}"
            )
        if self.tokenizer is None:
            return synthetic_prompt(target, offset), target
        return fit_prompt(self.tokenizer, target, offset)

    def measure(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """The length of the messages' text (text parts of a content list included)."""
        total = 0
        for m in messages:
            content = m.get("content")
            if isinstance(content, str):
                total += self.count(content)
            elif isinstance(content, list):
                texts = [p.get("text") for p in content if isinstance(p, Mapping)]
                total += sum(self.count(t) for t in texts if isinstance(t, str))
        return total


def lengths_for(sc: Scenario) -> Lengths:
    """The scenario's way of measuring (its tokenizer loaded).

    Raises:
        UsageError: see :func:`~._tokenizer.load_tokenizer`.
    """
    return Lengths(None if sc.tokenizer is None else load_tokenizer(sc.tokenizer))


def resolve_lengths(sc: Scenario, lengths: Lengths) -> Scenario:
    """The scenario with each template's empirical length files read into values.

    A row's value is used as it is when it is a number (e.g. a ``max_tokens`` column) and
    measured (tokens, or words) when it is text or a messages list.

    Raises:
        UsageError: a file that cannot be read, a row without the field, no values.
    """
    templates = []
    for t in sc.templates:
        changes: dict[str, Any] = {}
        for key in ("prompt_tokens", "output_tokens"):
            d: Dist | None = getattr(t, key)
            if d is not None and d.source is not None:
                try:
                    values = _empirical(dict(d.source), lengths)
                except UsageError as exc:
                    raise UsageError(f"template {t.name!r}, {key!r}: {exc}") from None
                changes[key] = Dist(d.kind, values, d.source)
        templates.append(dataclasses.replace(t, **changes) if changes else t)
    return sc.replace(templates=tuple(templates))


def filter_dataset(ds: Dataset, spec: Mapping[str, Any], lengths: Lengths) -> Dataset:
    """The rows whose prompt (first request) has ``min_input_tokens`` to ``max_input_tokens``
    tokens (both optional).

    Raises:
        UsageError: a bound without a tokenizer (words are not tokens), no row left, or a
            weighted class left without rows.
    """
    lo, hi = spec.get("min_input_tokens"), spec.get("max_input_tokens")
    if lo is None and hi is None:
        return ds
    if lengths.tokenizer is None:
        key = "min_input_tokens" if lo is not None else "max_input_tokens"
        raise UsageError(
            f"dataset key {key!r} counts tokens: it needs a tokenizer (tokenizer = PATH, "
            "--tokenizer PATH)"
        )
    sizes = [lengths.measure(s.messages) for s in ds.samples]
    keep = [
        s
        for s, n in zip(ds.samples, sizes, strict=True)
        if (lo is None or n >= lo) and (hi is None or n <= hi)
    ]
    if not keep:
        bounds = f"{lo if lo is not None else 0} to {hi if hi is not None else 'any'}"
        raise UsageError(
            f"dataset: no row has {bounds} tokens (its rows have {min(sizes)} to {max(sizes)}, "
            f"by {lengths.tokenizer.name})"
        )
    try:
        return Dataset(keep, ds.sampling, ds.weights)
    except UsageError as exc:
        raise UsageError(f"{exc}, within min_input_tokens/max_input_tokens") from None


def _empirical(source: Mapping[str, str], lengths: Lengths) -> tuple[float, ...]:
    path = Path(source["path"])
    key = source.get("field", "prompt")
    values = []
    for where, x in _field_values(path, key):
        try:
            v = _value(x, lengths)
        except UsageError as exc:
            raise UsageError(f"{where}: {key!r}: {exc}") from None
        if v is not None:
            values.append(v)
    if not values:
        raise UsageError(f"empirical {path}: no values in {key!r}")
    return tuple(values)


def _read(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except OSError as exc:
        raise UsageError(f"empirical {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"empirical {path}: not UTF-8 text") from None


def _field_values(path: Path, key: str) -> list[tuple[str, Any]]:
    """``(where, value)`` of each row: a folder's ``.txt`` files, a CSV column, a JSON-lines
    field."""
    if path.is_dir():
        files = [f for f in sorted(path.glob("*.txt")) if f.is_file()]
        return [(f"empirical {f}", _read(f)) for f in files]
    text = _read(path)
    if path.suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if key not in (reader.fieldnames or []):
            raise UsageError(f"empirical {path}: no column {key!r}")
        return [(f"empirical {path}, line {reader.line_num}", row[key]) for row in reader]
    if path.suffix != ".jsonl":
        raise UsageError(f"empirical {path}: expected a .jsonl or .csv file or a folder of .txt")
    out = []
    for _, where, row in json_lines(text, f"empirical {path}"):
        if not isinstance(row, dict) or key not in row:
            raise UsageError(f"{where}: no field {key!r}")
        out.append((where, row[key]))
    return out


def _value(x: Any, lengths: Lengths) -> float | None:
    """A number as it is (a numeric CSV cell too), text measured; None for an empty cell (a
    CSV row shorter than its header, nothing between its commas, a JSON null or "")."""
    if isinstance(x, bool):
        raise UsageError("expected a number or text, got true/false")
    if isinstance(x, int | float):
        if not math.isfinite(x) or x < 0:
            raise UsageError(f"expected a number >= 0, got {x!r}")
        return float(x)
    if x is None or x == "":
        return None
    if isinstance(x, str):
        try:
            number = float(x)
        except ValueError:
            return float(lengths.count(x))
        return number if math.isfinite(number) and number >= 0 else float(lengths.count(x))
    if isinstance(x, list):  # a messages list, or a conversation's turns (its first turn)
        if all(isinstance(m, Mapping) for m in x):
            return float(lengths.measure(x))
        if x and isinstance(x[0], str):
            return float(lengths.count(x[0]))
    raise UsageError("expected a number, text or a messages list")


def resolve_length_paths(data: MutableMapping[str, Any], base: Path) -> None:
    """Make a scenario file's ``tokenizer`` and its templates' empirical ``path``s relative to
    the file (as its dataset's and trace's are)."""
    tok = data.get("tokenizer")
    if isinstance(tok, str) and tok.strip():  # "" stays "", for load_tokenizer to refuse
        p = Path(tok).expanduser()
        data["tokenizer"] = str(p if p.is_absolute() else base / p)
    templates = data.get("templates")
    if not isinstance(templates, list):
        return
    for t in templates:
        if not isinstance(t, MutableMapping):
            continue
        for key in ("prompt_tokens", "output_tokens"):
            spec = t.get(key)
            if isinstance(spec, Mapping) and isinstance(spec.get("empirical"), Mapping):
                source = dict(spec["empirical"])
                if isinstance(source.get("path"), str) and source["path"].strip():
                    p = Path(source["path"]).expanduser()
                    source["path"] = str(p if p.is_absolute() else base / p)
                t[key] = {"empirical": source}
