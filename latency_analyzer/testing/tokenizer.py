"""A tiny byte-level BPE tokenizer trained here, for tests and examples of token-true lengths.

Nothing is downloaded: the tokenizer is trained (``tokenizers``, the ``[tokenizer]`` extra) on
a few KB of word salad generated from a seed, the words of the load generator's filler text
among them, so a filler word is one to a few tokens as with a real model's tokenizer.

    python -m latency_analyzer.testing.tokenizer OUT.json [--seed 0] [--vocab 600]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

__all__ = ["WORDS", "build_tokenizer", "corpus"]

_ALPHABET = " .0123456789abcdefghijklmnopqrstuvwxyz"

#: The plain words of the corpora (e2e/build_model.py trains its model's tokenizer on them too).
WORDS = (  # noqa: SIM905 (a word list reads better as text)
    "the a server queue token prefill decode latency request stream network time first last "
    "model batch cache memory kernel thread clock span trace byte packet socket answer question "
    "why how when fast slow warm cold small large one two three four five"
).split()


def corpus(seed: int, sentences: int = 600) -> list[str]:
    """A few KB of sentences: plain words, and filler words (``w`` and three digits)."""
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        words = [
            rng.choice(WORDS) if rng.random() < 0.7 else f"w{rng.randrange(997):03d}"
            for _ in range(rng.randint(4, 14))
        ]
        out.append(" ".join(words) + ".")
    return out


def build_tokenizer(
    path: str | Path, *, seed: int = 0, vocab: int = 600, split_words: bool = True
) -> Path:
    """Train the tokenizer and save it as ``path`` (a ``tokenizer.json``); returns the path.

    ``split_words=False`` trains one without a pre-tokenizer: its tokens may span spaces, as
    some SentencePiece models' do, so a word's tokens depend on its neighbours.

    Raises:
        ModuleNotFoundError: the ``tokenizers`` package is not installed.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if split_words:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if split_words else list(_ALPHABET)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=600)
    args = parser.parse_args()
    path = build_tokenizer(args.out, seed=args.seed, vocab=args.vocab)
    print(json.dumps({"path": str(path), "bytes": path.stat().st_size}))


if __name__ == "__main__":
    main()
