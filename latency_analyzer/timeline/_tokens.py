"""Token arrival arithmetic: per-chunk token counts, TPOT and per-token inter-token latency."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "MAX_TOKENS_PER_CHAR",
    "MAX_TOKEN_COUNT",
    "claim_value",
    "distribute_tokens",
    "per_token_gaps_ns",
    "token_cap",
]

#: Largest token count kept as a count (columns store counts as int32); a larger claim is kept
#: only as a ``usage_*_claimed`` attribute.
MAX_TOKEN_COUNT = 2**31 - 1

#: A token carries at least one byte of text and a character is at most four UTF-8 bytes, so a
#: chunk of ``w`` characters holds at most ``4 * w`` tokens (plus one that shows no text, e.g.
#: a stop token). Servers' counts above that are claims, not what arrived.
MAX_TOKENS_PER_CHAR = 4


def claim_value(claimed: int) -> int | str:
    """A server's claim as an attribute value: an int where every export can hold it (int64)."""
    return claimed if -(2**63) <= claimed < 2**63 else str(claimed)


def token_cap(weight: int) -> int:
    """Most tokens a chunk of ``weight`` characters of text can have carried."""
    return MAX_TOKENS_PER_CHAR * max(weight, 0) + 1


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
    if total == n:  # one token per chunk, the usual stream: the only split with >= 1 each
        return [1] * n
    clean = [max(w, 0) for w in weights]
    if not any(clean):
        clean = [1] * n
    weight_sum = sum(clean)
    # integer shares: exact for any total (a float share of 10**25 is off by ~10**9, and handing
    # out that error one token per chunk per pass would never end)
    floors = [total * w // weight_sum for w in clean]
    remainders = [total * w % weight_sum for w in clean]
    counts = [max(1, f) for f in floors]
    largest_first = sorted(range(n), key=lambda i: (-remainders[i], i))
    diff = total - sum(counts)  # below n: each floor lost less than one token
    for i in largest_first[: max(diff, 0)]:  # what rounding down left, largest remainder first
        counts[i] += 1
    for i in reversed(largest_first):  # the at-least-one floor overshot: take back from the
        if diff >= 0:  # chunks with the smallest remainders that can spare a token
            break
        spare = min(counts[i] - 1, -diff)
        counts[i], diff = counts[i] - spare, diff + spare
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
