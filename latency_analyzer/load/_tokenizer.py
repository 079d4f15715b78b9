"""The tokenizer a run counts prompt lengths with: a local file or folder, never a download.

A scenario's ``tokenizer = "path/to/tokenizer.json"`` (or ``latency-analyzer run --tokenizer
PATH``) names one of:

* a ``tokenizer.json`` file (the Hugging Face ``tokenizers`` format), read with the
  ``tokenizers`` package (``pip install 'latency-analyzer[tokenizer]'``);
* a folder holding a ``tokenizer.json`` (what ``save_pretrained`` writes for a fast
  tokenizer, e.g. a model's folder), read the same way;
* another transformers tokenizer folder (e.g. a SentencePiece ``tokenizer.model``), read with
  ``transformers`` when it is installed, from the folder only (``local_files_only``).

A name that is not a path on this machine (a hub name such as ``org/model``) is an error:
nothing is downloaded at run time.

Counts are of the text itself: no special tokens (BOS) and no chat template. A server's
``usage.prompt_tokens`` adds what its template wraps around the messages; the run's summary
shows both.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = ["Tokenizer", "load_tokenizer"]

_OPTION = "'tokenizer' (--tokenizer)"
_INSTALL = "pip install 'latency-analyzer[tokenizer]'"


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer: ``encode`` text to token ids (with each token's end offset in the
    text, where the tokenizer knows it) and count.

    Attributes:
        path: the file or folder it was read from, as given.
        kind: ``"tokenizers"`` or ``"transformers"``.
    """

    path: str
    kind: str
    _encode: Callable[[str], tuple[list[int], list[int] | None]] = field(repr=False)
    _decode: Callable[[list[int]], str] = field(repr=False)
    _count: Callable[[str], int] = field(repr=False)

    def count(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens added)."""
        return self._count(text)

    def token_ends(self, text: str) -> tuple[list[int], list[int] | None]:
        """Token ids of ``text`` and, per token, the character offset where it ends (None
        when the tokenizer gives no offsets)."""
        return self._encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._decode(ids)

    @property
    def name(self) -> str:
        """The file's or folder's name, for summaries."""
        return Path(self.path).name or self.path


def load_tokenizer(path: str) -> Tokenizer:
    """Read the tokenizer at ``path`` (a file or a folder on this machine); cached per path.

    Raises:
        UsageError: ``path`` is empty or not a file or folder here (a hub name is not
            fetched), the needed package is missing (the message says what to install), or
            the file is not a tokenizer; the message names the option and the path.
    """
    return _load(path)


@functools.lru_cache(maxsize=8)
def _load(path: str) -> Tokenizer:
    if not path.strip():  # Path("") is the current folder: an empty value names no tokenizer
        raise UsageError(f"{_OPTION}: an empty path names no tokenizer")
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(
            f"{_OPTION}: {path!r} is not a file or folder on this machine; a tokenizer is read "
            "from a local tokenizer.json or a folder holding one, never downloaded (a hub "
            "name such as 'org/model' is not fetched: save the tokenizer to a folder first)"
        )
    if p.is_file():
        return _from_json(path, p)
    if (p / "tokenizer.json").is_file():
        return _from_json(path, p / "tokenizer.json")
    if importlib.util.find_spec("transformers") is None:
        raise UsageError(
            f"{_OPTION}: {path}: no tokenizer.json in this folder; another tokenizer format "
            "needs transformers (pip install transformers)"
        )
    return _from_transformers(path, p)


def _from_json(path: str, file: Path) -> Tokenizer:
    if importlib.util.find_spec("tokenizers") is None:
        raise UsageError(f"{_OPTION} needs the tokenizers package: {_INSTALL}")
    from tokenizers import Tokenizer as HfTokenizer

    try:
        tok = HfTokenizer.from_file(str(file))
    except Exception as exc:  # the Rust library raises its own exception types
        raise UsageError(f"{_OPTION}: {file}: not a tokenizer.json ({exc})") from None

    def encode(text: str) -> tuple[list[int], list[int] | None]:
        enc = tok.encode(text, add_special_tokens=False)
        return list(enc.ids), [end for _, end in enc.offsets]

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=False))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))  # no id list built

    return Tokenizer(path, "tokenizers", encode, decode, count)


def _from_transformers(path: str, folder: Path) -> Tokenizer:
    transformers: Any = importlib.import_module("transformers")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError and its own types
        raise UsageError(f"{_OPTION}: {path}: not a tokenizer folder ({exc})") from None
    fast = bool(getattr(tok, "is_fast", False))

    def encode(text: str) -> tuple[list[int], list[int] | None]:
        if fast:
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            return list(enc["input_ids"]), [end for _, end in enc["offset_mapping"]]
        return list(tok.encode(text, add_special_tokens=False)), None

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids, clean_up_tokenization_spaces=False))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    return Tokenizer(path, "transformers", encode, decode, count)
