"""Rules about the server and the token stream: queueing, prefill, decoding, inter-token
jitter, and empty-text tokens ahead of the first visible text (TTFC vs TTFT)."""

from __future__ import annotations

import statistics

from ._facts import _Context, _share, _share_rule
from ._findings import Finding, _ms

_server_queue = _share_rule(
    "server_queue",
    "server_queue",
    "ttft",
    lambda t: t.queue_share,
    (
        "time to first token is spent queueing in the server",
        "the server is at capacity: requests wait for a batch slot",
        "add replicas or GPUs, raise max batch size / max_num_seqs, or lower the load",
    ),
)


def _prefill(c: _Context) -> Finding | None:
    prefill, ttft = c.stage("prefill"), c.ttft
    share = _share(prefill, ttft)
    if share <= c.th.prefill_share or prefill < max(c.th.prefill_slow_s, c.th.min_time_s):
        return None
    return Finding(
        "prefill",
        "time to first token is dominated by prefill",
        f"prefill {_ms(prefill)} is {share:.0%} of TTFT {_ms(ttft)}{c.per()}",
        "long prompts: prefill time grows with the number of input tokens",
        "shorten prompts, enable prefix caching for shared system prompts, use chunked "
        "prefill so long prompts do not block others",
        prefill,
        c.n,
        {"share": share},
        stages=("prefill",),
    )


def _decode(c: _Context) -> Finding | None:
    decode, e2e = c.stage("decode"), c.e2e
    tpot = c.mean(lambda r: r.tpot)
    share = _share(decode, e2e)
    if share <= c.th.decode_share or tpot <= c.th.tpot_slow_s or decode < c.th.min_time_s:
        return None
    return Finding(
        "decode",
        "the request is dominated by slow decoding",
        f"decode {_ms(decode)} is {share:.0%} of e2e {_ms(e2e)}, TPOT {_ms(tpot)} "
        f"({1 / tpot:.0f} tokens/s){c.per()}",
        "slow time per output token: large batches, a large model, or memory-bound decoding",
        "cap max_tokens, use a smaller or quantized model, speculative decoding, or smaller "
        "batches for latency-sensitive traffic",
        decode,
        c.n,
        {"share": share, "tpot_s": tpot},
        ttft_at_stake_s=0.0,
    )


def _jitter(c: _Context) -> Finding | None:
    ratios, medians, p95s, excess = [], [], [], []
    for r in c.reqs:
        gaps = sorted(r.chunk_gaps)
        if len(gaps) < c.th.itl_min_gaps:
            continue
        median = statistics.median(gaps)
        if median < c.th.itl_burst_s:
            continue  # all tokens at once: no pace to judge, and a ratio over ~0 means nothing
        p95 = gaps[min(len(gaps) - 1, round(0.95 * (len(gaps) - 1)))]
        medians.append(median)
        p95s.append(p95)
        ratios.append(p95 / median)
        excess.append(sum(g - median for g in gaps if g > 2 * median))
    n = len(ratios)
    if not n:
        return None
    ratio, at_stake = statistics.median(ratios), sum(excess) / c.n
    p95, median = statistics.median(p95s), statistics.median(medians)
    if ratio <= c.th.itl_jitter_ratio or at_stake < c.th.min_time_s:
        return None
    return Finding(
        "itl_jitter",
        "tokens arrive in bursts (high inter-token jitter)",
        f"P95 gap between chunks {_ms(p95)} is {ratio:.1f}× the median {_ms(median)}"
        + ("" if c.single else f" (median over {n} requests)"),
        "the server pauses decoding (new requests' prefill in the same batch, preemption) or a "
        "proxy buffers the stream",
        "enable chunked prefill, limit batch size, disable proxy buffering for text/event-stream",
        at_stake,
        n,
        {"p95_over_median": ratio},
        ttft_at_stake_s=0.0,
    )


def _ttfc_gap(c: _Context) -> Finding | None:
    pairs = [(r.ttft, r.ttfc) for r in c.reqs if r.ttft is not None and r.ttfc is not None]
    if not pairs:
        return None
    ttft = statistics.fmean(t for t, _ in pairs)
    ttfc = statistics.fmean(f for _, f in pairs)
    gap, at_stake = ttft - ttfc, sum(t - f for t, f in pairs) / c.n
    if gap <= c.th.ttfc_gap_s or at_stake < c.th.min_time_s:
        return None
    later = sum(1 for t, f in pairs if t > f)
    return Finding(
        "ttfc_gap",
        "the first tokens had empty text: TTFT reads later than the server's first token",
        f"TTFT (first visible text) {_ms(ttft)}, TTFC (first token chunk, empty text included) "
        f"{_ms(ttfc)}: {_ms(gap)} apart{c.per()}; empty-text tokens came first on {later} of "
        f"{len(pairs)} requests",
        "the server streamed tokens whose text is empty (a byte-level tokenizer's partial UTF-8 "
        "pieces); the server's own TTFT and most benchmark tools count them, the user sees "
        "nothing until the first visible text",
        "compare TTFC (Waterfall.ttfc, the ttfc metric) with the server's TTFT and TTFT with "
        "what users see; a model or tokenizer that emits whole characters closes the gap",
        at_stake,
        len(pairs),
        {"ttft_s": ttft, "ttfc_s": ttfc, "gap_s": gap},
    )
