"""WaterfallSet, percentiles with bootstrap CIs, trimming, filters, merging, comparisons.

Waterfalls here are synthetic (built with a Recorder at known instants), so every expected
value is computed from what was injected.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from latency_analyzer import Recorder, UsageError, Waterfall
from latency_analyzer.analysis import (
    Estimate,
    LogHistogram,
    Tags,
    WaterfallSet,
    check_claim,
    compare,
    fingerprint,
    gpu_cost,
    mean_ci,
    percentile,
    percentile_ci,
    percentiles_ci,
)
from latency_analyzer.analysis._stats import means_ci, means_samples

MS = 1_000_000


def synthetic(
    start_ns: int,
    wait_ms: float,
    tokens: int = 4,
    gap_ms: float = 1.0,
    *,
    lag_ms: float = 0.0,
    error: str | None = None,
    reused: bool = True,
) -> Waterfall:
    """A streamed request: schedule_lag, send, wait, first_token (1 ms), decode, tail (0)."""
    intended = start_ns
    t = start_ns + round(lag_ms * MS)
    rec = Recorder(
        "POST", "http://t/v1", start_ns=t, intended_start_ns=intended if lag_ms else None
    )
    rec.add("send", t, t + MS)
    headers = t + MS + round(wait_ms * MS)
    rec.response_headers(headers, 200)
    rec.http_version = "1.1"
    from latency_analyzer import ConnectionInfo

    rec.connection = ConnectionInfo(reused=reused)
    if error:
        rec.fail(error, "boom", headers)
        return rec.finish(headers)
    first = headers + MS
    for i in range(tokens):
        rec.chunk(first + round(i * gap_ms * MS), 5)
    return rec.finish(first + round((tokens - 1) * gap_ms * MS))


def build(waits_ms: list[float], **tags: object) -> WaterfallSet:
    ws = WaterfallSet()
    for i, w in enumerate(waits_ms):
        ws.add(synthetic(i * 10 * MS, w), Tags(**tags))  # type: ignore[arg-type]  # test tags given as **object
    return ws


# --- percentiles and CIs ----------------------------------------------------------------------


def test_nearest_rank_percentile() -> None:
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 95
    assert percentile(values, 99.9) == 100
    assert percentile(values, 0) == 1
    assert math.isnan(percentile([], 50))


@pytest.mark.parametrize(("p", "n"), [(50, 1000), (95, 1000), (99, 2000)])
def test_percentile_ci_covers_true_value(p: float, n: int) -> None:
    """Acceptance: ≥ 90% of 200 samples' 95% CIs cover the exponential's true percentile."""
    rng = np.random.default_rng(12345)
    true = -math.log(1 - p / 100)  # exponential(1) quantile
    covered = 0
    for trial in range(200):
        est = percentile_ci(rng.exponential(size=n), p, seed=trial)
        covered += est.low <= true <= est.high
    assert covered / 200 >= 0.90
    assert covered / 200 <= 0.995  # an interval that always covers would be uselessly wide


def test_percentile_ci_narrows_with_n_and_is_seeded() -> None:
    rng = np.random.default_rng(1)
    small, big = rng.exponential(size=200), rng.exponential(size=20_000)
    a, b = percentile_ci(small, 95), percentile_ci(big, 95)
    assert (b.high - b.low) < (a.high - a.low) / 5
    assert percentile_ci(small, 95, seed=7) == percentile_ci(small, 95, seed=7)
    assert a.low <= a.value <= a.high and a.n == 200


def test_mean_ci_covers_the_true_mean_and_columns_together_are_each_alone() -> None:
    """The mean's bootstrap, resampled for several columns at once (one set of draws per
    size), is each column's own bootstrap: the same draws a column alone gets, summed."""
    rng = np.random.default_rng(3)
    covered = 0
    for trial in range(200):
        est = mean_ci(rng.exponential(size=300), seed=trial)  # the true mean is 1
        covered += est.low <= 1.0 <= est.high
    assert 0.90 <= covered / 200 <= 0.995
    cols = [rng.lognormal(size=170), rng.exponential(size=40), rng.lognormal(size=170)]
    cols.append(rng.exponential(size=25_000))  # above 20,000: the normal approximation
    for col, boot in zip(cols, means_samples(cols, 500, seed=9), strict=True):
        alone = np.random.default_rng(9)
        if col.size > 20_000:
            sd = col.std(ddof=1) / math.sqrt(col.size)
            expect = alone.normal(col.mean(), sd, size=500)
        else:  # resampling by index, in the blocks the draws are taken in
            block = max(1, 2_000_000 // col.size)
            expect = np.concatenate(
                [
                    col[alone.integers(0, col.size, size=(min(block, 500 - s), col.size))].mean(1)
                    for s in range(0, 500, block)
                ]
            )
        np.testing.assert_allclose(boot, expect, rtol=1e-12)
    together = means_ci([*cols, []], seed=4)
    for est, col in zip(together, cols, strict=False):  # summed in another order: 1 ulp
        alone_est = mean_ci(col, seed=4)
        assert (est.value, est.n) == (alone_est.value, alone_est.n)
        assert (est.low, est.high) == pytest.approx((alone_est.low, alone_est.high), rel=1e-12)
    assert together[4].n == 0 and math.isnan(together[4].value)


def test_percentile_cis_of_one_size_share_their_ranks_and_match_a_fresh_generator() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.exponential(size=500), rng.lognormal(size=500)
    for col in (a, b, a):  # the ranks are computed once for n=500, then reused
        cached = percentiles_ci(col, (50, 99), seed=11)
        fresh = percentiles_ci(col, (50, 99), seed=np.random.default_rng(11))
        assert cached == fresh
        assert percentiles_ci(col, (50, 99), seed=np.int64(11)) == cached
    # seeds numpy takes that are not ints are not cached: used as given, each call
    listed = percentiles_ci(a, (50,), seed=[1, 2])
    assert listed == percentiles_ci(a, (50,), seed=np.random.default_rng([1, 2]))
    with pytest.raises(TypeError):
        percentiles_ci(a, (50,), seed=1.5)  # type: ignore[arg-type]  # numpy refuses it


def test_log_histogram_merge_is_exact_and_bounded() -> None:
    rng = np.random.default_rng(2)
    x, y = rng.lognormal(15, 1, 5000), rng.lognormal(16, 0.5, 3000)
    h1, h2 = LogHistogram(0.01), LogHistogram(0.01)
    h1.add(x)
    h2.add(y)
    both = LogHistogram(0.01)
    both.add(np.concatenate([x, y]))
    merged = h1.merge(h2)
    assert np.array_equal(merged.counts, both.counts)
    for p in (50, 95, 99):
        exact = percentile(np.concatenate([x, y]), p)
        assert abs(merged.percentile(p) - exact) <= 0.01 * exact
    with pytest.raises(UsageError):
        h1.merge(LogHistogram(0.02))


# --- the set ----------------------------------------------------------------------------------


def test_columns_hold_attribution_and_metrics_exactly() -> None:
    wf = synthetic(0, wait_ms=7, tokens=5, gap_ms=2, lag_ms=3)
    ws = WaterfallSet()
    ws.add(wf, Tags(scenario="s", template="t", prompt_tokens=512))
    assert len(ws) == 1
    for stage, ns in wf.attribution_ns().items():
        assert ws.column(f"stage:{stage}")[0] == ns
    assert ws.column("e2e_ns")[0] == wf.e2e_ns
    assert ws.column("ttft_ns")[0] == wf.ttft_ns
    assert ws.values("tpot")[0] == pytest.approx(0.002)
    assert ws.values("schedule_lag")[0] == pytest.approx(0.003)
    assert ws.labels("scenario") == ["s"] and ws.labels("template") == ["t"]
    assert ws.column("prompt_tokens")[0] == 512
    assert ws.stages[0] == "schedule_lag"


def test_stream_to_disk_and_reload_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with WaterfallSet(path, meta={"scenario": {"name": "x"}}, flush_every=3) as ws:
        for i in range(10):
            ws.add(synthetic(i * MS, i + 1, error="reset" if i == 4 else None), Tags("x"))
        if True:  # mid-run, the flushed lines are already on disk (a crash keeps them)
            assert len(path.read_text().splitlines()) == 1 + 9
    back = WaterfallSet.load(path)
    assert back.meta["scenario"] == {"name": "x"}
    for name in ("e2e_ns", "ttft_ns", "stage:wait", "status", "stage_mask"):
        assert np.array_equal(back.column(name), ws.column(name), equal_nan=True)
    assert back.labels("error_type") == ws.labels("error_type")
    assert back.counts()["errors_by_type"] == {"reset": 1}


@pytest.mark.parametrize("orjson", [True, False])
def test_rows_read_back_the_same_whichever_encoder_wrote_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, orjson: bool
) -> None:
    """Rows are orjson's when it is installed, the standard library's otherwise or where
    orjson cannot go (an integer beyond 64 bits, a lone surrogate): read back, every row is
    the waterfall it was, but for a non-finite float, which orjson writes as null."""
    import dataclasses

    from latency_analyzer import _jsonl

    if orjson and _jsonl._orjson_dumps is None:
        pytest.skip("orjson is not installed (the [fast] extra)")
    if not orjson:
        monkeypatch.setattr(_jsonl, "_orjson_dumps", None)
    plain = synthetic(0, 5)
    odd = dataclasses.replace(
        synthetic(MS, 7), attributes={"big": 2**70, "text": "d\u00e9j\u00e0 \ud800", "n": 1.5}
    )
    nan = dataclasses.replace(synthetic(2 * MS, 9), attributes={"x": math.nan})
    path = tmp_path / "run.jsonl"
    with WaterfallSet(path) as ws:
        for wf in (plain, odd, nan):
            ws.add(wf, Tags("s", "t\u00e9"))
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    assert [Waterfall.from_dict(r["wf"]) for r in rows[:2]] == [plain, odd]
    assert rows[0]["tags"] == Tags("s", "t\u00e9").to_dict()
    x = rows[2]["wf"]["attributes"]["x"]
    assert x is None if orjson else math.isnan(x)
    back = WaterfallSet.load(path)
    assert np.array_equal(back.column("e2e_ns"), ws.column("e2e_ns"))


def test_a_damaged_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "crash.jsonl"
    with WaterfallSet(path) as ws:
        ws.add(synthetic(0, 1))
        ws.add(synthetic(MS, 2))
    with path.open("a") as f:
        f.write('{"kind": "wf", "tags": {}, "wf": {"sche')  # the process died mid-write
    back = WaterfallSet.load(path)
    assert len(back) == 2 and back.damaged_lines == 1


def test_load_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"hello": 1}) + "\n")
    with pytest.raises(UsageError):
        WaterfallSet.load(path)


def test_merge_is_exact_concatenation() -> None:
    a = build([1, 2, 3], scenario="a", worker=0)
    b = WaterfallSet()
    b.add(synthetic(0, 9, lag_ms=2, reused=False), Tags("b", worker=1))
    m = WaterfallSet.merge(a, b)
    assert len(m) == 4
    assert m.labels("scenario") == ["a", "a", "a", "b"]
    assert list(m.column("worker")) == [0, 0, 0, 1]
    assert list(m.column("e2e_ns")) == [*a.column("e2e_ns"), *b.column("e2e_ns")]
    # a stage only b had: zero (and absent) for a's rows
    assert list(m.values("schedule_lag", present_only=True)) == [pytest.approx(0.002)]
    assert list(m.cold) == [False, False, False, True]


def test_statistics_exclude_warmup_and_errors_but_keep_the_rows() -> None:
    ws = WaterfallSet()
    for i in range(100):
        ws.add(synthetic(i * 10 * MS, 50 if i < 10 else 5, error="reset" if i == 50 else None))
    trimmed = ws.trim_warmup(count=10)
    assert len(trimmed) == 100 and trimmed.counts()["warmup"] == 10
    assert trimmed.values("wait").max() == pytest.approx(0.005)
    assert len(trimmed.values("wait")) == 89  # 10 warm-up, 1 error left out
    assert len(trimmed.values("wait", include_warmup=True, include_errors=True)) == 100
    by_time = ws.trim_warmup(seconds=0.1)  # starts at 0, 10, ..., 90 ms
    assert by_time.counts()["warmup"] == 10


def test_filters_and_group_by() -> None:
    a = build([1] * 5, scenario="chat", template="short", prompt_tokens=100)
    b = build([2] * 3, scenario="code", template="long", prompt_tokens=50_000)
    ws = a + b
    assert len(ws.filter(scenario="chat")) == 5
    assert len(ws.filter(template="long", ok=True)) == 3
    assert len(ws.filter(window=(0.0, 0.015))) == 4  # starts at 0 and 10 ms, both scenarios
    groups = ws.group_by("scenario")
    assert {k: len(v) for k, v in groups.items()} == {"chat": 5, "code": 3}
    buckets = ws.group_by("prompt_tokens", bins=[1024, 131072])
    assert {k: len(v) for k, v in buckets.items()} == {"(0, 1024]": 5, "(1024, 131072]": 3}
    with pytest.raises(UsageError):
        ws.group_by("colour")


def test_summary_rows_match_direct_percentiles() -> None:
    waits = [float(w) for w in range(1, 201)]
    ws = build(waits)
    s = ws.summary()
    wait = s.row("wait")
    assert wait.percentiles["p50"].value == pytest.approx(0.100)
    assert wait.percentiles["p99"].value == pytest.approx(0.198)
    assert s.counts["requests"] == 200
    assert "wait" in s.to_text()


def test_memory_per_row_is_small() -> None:
    ws = build([1.0] * 2000)
    assert ws.nbytes / len(ws) <= 200


# --- comparisons ------------------------------------------------------------------------------


def test_compare_recovers_an_injected_speedup() -> None:
    rng = np.random.default_rng(3)
    base_waits = list(rng.uniform(50, 150, 400))
    base = build(base_waits)
    cand = build([w / 4 for w in base_waits])  # wait exactly 4× shorter
    sp = compare(base, cand, metrics=["wait"], stats=["p95", "mean"]).get("wait_p95")
    assert sp.ratio.value == pytest.approx(4.0)
    assert sp.ratio.low < 4.0 < sp.ratio.high


def test_check_claim_verdicts() -> None:
    rng = np.random.default_rng(4)
    waits = list(rng.uniform(50, 150, 400))
    base, cand = build(waits), build([w / 5 for w in waits])
    no = check_claim(base, cand, claimed=15.0, metric="wait_p95")
    assert no.verdict == "not supported"
    assert str(no).startswith("wait_p95: claimed 15×, measured 5×")
    assert check_claim(base, cand, claimed=5.0, metric="wait_p95").verdict == "consistent"
    assert check_claim(base, cand, claimed=2.0, metric="wait_p95").verdict == "supported"
    with pytest.raises(UsageError):
        check_claim(base, cand, claimed=2.0, metric="wait")


def test_compare_weights_scenarios() -> None:
    b = build([100] * 50, scenario="x") + build([100] * 50, scenario="y")
    c = build([50] * 50, scenario="x") + build([25] * 50, scenario="y")
    comp = compare(b, c, metrics=["wait"], stats=["p50"], weights={"x": 1, "y": 1})
    assert comp.get("wait_p50", "x").ratio.value == pytest.approx(2.0)
    assert comp.get("wait_p50", "y").ratio.value == pytest.approx(4.0)
    assert comp.get("wait_p50").ratio.value == pytest.approx(math.sqrt(8))  # geometric mean


def test_gpu_cost() -> None:
    out = gpu_cost(demand_rps=10, throughput_rps=2.5, price_per_gpu_hour=2.0, gpus_per_replica=2)
    assert out["gpu_hours_per_month"] == pytest.approx(4 * 2 * 730)
    assert out["cost_per_month"] == pytest.approx(4 * 2 * 730 * 2.0)


def test_estimate_format() -> None:
    assert Estimate(5.7, 5.2, 6.1, 10).format(".2g", "×") == "5.7× [5.2, 6.1]"


def test_fingerprint_fields() -> None:
    fp = fingerprint("http://127.0.0.1:9/x", scenario={"name": "s"}, rtt_samples=1)
    for key in ("os", "kernel", "cpu_model", "cpu_count", "python", "libraries", "gpus"):
        assert key in fp
    assert fp["target_host"] == "127.0.0.1:9"
    assert fp["base_rtt_s"] is None  # nothing listens on port 9: no connect, no RTT
    assert fp["libraries"]["numpy"] == np.__version__
