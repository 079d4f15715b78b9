"""Token arrival arithmetic: per-chunk token counts, TPOT and per-token inter-token latency."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["distribute_tokens", "per_token_gaps_ns"]


def distribute_tokens(total: int, weights: Sequence[int]) -> list[int] | None:
    """Split ``total`` tokens over chunks in proportion to ``weights`` (their text lengths).

    Every chunk gets at least one token and the counts add up to ``total`` exactly (largest
    remainder). When every token has the same width the split is exact. Returns None when
    ``total`` is smaller than the number of chunks: the server's count and the stream disagree,
    and the caller keeps one token per chunk.
    """
    n = len(weights)
    if n == 0 or total < n:
        return None
    clean = [max(w, 0) for w in weights]
    if not any(clean):
        clean = [1] * n
    weight_sum = sum(clean)
    shares = [total * w / weight_sum for w in clean]
    counts = [max(1, int(s)) for s in shares]
    by_remainder = sorted(range(n), key=lambda i: (counts[i] - shares[i], i))
    diff = total - sum(counts)
    while diff > 0:  # hand out what rounding down left, largest remainder first
        for i in by_remainder[:diff]:
            counts[i] += 1
        diff = total - sum(counts)
    while diff < 0:  # the at-least-one floor overshot: take back where it was most generous
        for i in reversed(by_remainder):
            if diff < 0 and counts[i] > 1:
                counts[i], diff = counts[i] - 1, diff + 1
    return counts


def per_token_gaps_ns(times_ns: Sequence[int], tokens: Sequence[int]) -> list[float]:
    """Inter-token latency per token: a chunk of k tokens contributes k equal gaps.

    The first chunk's extra tokens arrived together with its first token and contribute gaps of
    zero, so there are ``sum(tokens) - 1`` gaps and their mean is exactly the TPOT.
    """
    if not times_ns:
        return []
    gaps: list[float] = [0.0] * (tokens[0] - 1)
    for i in range(1, len(times_ns)):
        k = tokens[i]
        gaps.extend([(times_ns[i] - times_ns[i - 1]) / k] * k)
    return gaps
