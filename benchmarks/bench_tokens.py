"""Token-true prompts (``python benchmarks/bench_tokens.py [--out FILE] [--draws N]``).

With the tiny BPEs of ``latency_analyzer.testing.tokenizer`` (trained here; byte-level, ≈ 2.9
tokens per filler word, and one whose tokens span spaces): the largest |tokens − target| over
N seeded draws of each length distribution (fixed, uniform, normal, lognormal, empirical),
every prompt counted by the ``tokenizers`` library; and, with the byte-level one, the time to
build one prompt of 1 K, 16 K and 128 K tokens (built and counted), beside the time to build
the same number of filler words without a tokenizer, measured side by side in one run
(median of 5).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Truth

from latency_analyzer.load import dist, synthetic_prompt
from latency_analyzer.load._lengths import fit_prompt
from latency_analyzer.load._tokenizer import load_tokenizer
from latency_analyzer.testing.tokenizer import build_tokenizer

DISTS = {
    "fixed": {"fixed": 300},
    "uniform": {"uniform": [1, 4000]},
    "normal": {"normal": [1000, 400]},
    "lognormal": {"lognormal": [500, 1.0]},
    "empirical": {"empirical": [float(n) for n in range(1, 4000, 97)]},
}


def _median_s(f: Any, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--draws", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        errors: dict[str, dict[str, int]] = {}
        for kind, split in (("byte_level", True), ("tokens_span_spaces", False)):
            path = build_tokenizer(Path(d) / f"{kind}.json", split_words=split)
            tok, truth = load_tokenizer(str(path)), Truth.from_file(str(path))
            rng = random.Random(0)
            errors[kind] = {}
            for name, spec in DISTS.items():
                d_ = dist(spec)
                worst = 0
                for i in range(args.draws):
                    target = max(1, round(d_.sample(rng)))
                    text, _ = fit_prompt(tok, target, offset=i)
                    real = len(truth.encode(text, add_special_tokens=False).ids)
                    worst = max(worst, abs(real - target))
                errors[kind][name] = worst
        path = Path(d) / "byte_level.json"
        tok = load_tokenizer(str(path))
        build = {}
        for n in (1024, 16384, 131072):
            tokens_s = _median_s(lambda n=n: fit_prompt(tok, n, offset=1))
            words_s = _median_s(lambda n=n: synthetic_prompt(n, offset=1))
            build[str(n)] = {"tokens_s": tokens_s, "words_s": words_s, "ratio": tokens_s / words_s}
    out = {"draws_per_distribution": args.draws, "max_abs_error_tokens": errors, "build": build}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
