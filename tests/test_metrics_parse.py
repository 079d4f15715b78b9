"""Parsing and the series arithmetic, without a network: the recorded vLLM 0.32 exposition,
OpenMetrics from prometheus_client's own exposer, gauges, rates, per-interval quantiles,
the file round trip and the instant lookup the join rests on."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as _generate_openmetrics

from latency_analyzer.errors import RequestError, UsageError
from latency_analyzer.metrics import (
    TESTBED,
    VLLM,
    Metric,
    MetricSeries,
    MetricsParseError,
    ParsedSample,
    is_openmetrics,
    parse,
    resolve,
    summary_text,
)
from latency_analyzer.timeline import ClockAnchor

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "real-servers"
VLLM_PROM = FIXTURES / "vllm-0.32-metrics.prom"
ANCHOR = ClockAnchor(perf_ns=0, epoch_ns=1_700_000_000_000_000_000, uncertainty_ns=0)
S = 1_000_000_000


def generate_latest(reg: CollectorRegistry) -> bytes:
    return bytes(_generate_latest(reg))


def generate_openmetrics(reg: CollectorRegistry) -> bytes:
    return bytes(_generate_openmetrics(reg))  # type: ignore[no-untyped-call]  # untyped upstream


def declared_types(text: str) -> dict[str, str]:
    """``# TYPE`` lines of the file, a counter named as its family (without ``_total``)."""
    out = {}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M):
        out[name.removesuffix("_total") if kind == "counter" else name] = kind
    return out


# -- the recorded vLLM exposition ---------------------------------------------------------------
def test_every_vllm_family_of_the_recorded_file_is_read_with_its_type() -> None:
    text = VLLM_PROM.read_text()
    declared = {n: k for n, k in declared_types(text).items() if n.startswith("vllm:")}
    samples = parse(text, "text/plain; version=0.0.4; charset=utf-8")
    families = {s.family: s.type for s in samples if s.family.startswith("vllm:")}
    assert len(declared) == 72  # what the file's README promises
    assert families == declared
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(samples) == len(lines)  # every sample line, none invented


def test_vllm_histograms_have_cumulative_buckets_and_counters_their_total() -> None:
    text = VLLM_PROM.read_text()
    samples = parse(text)
    hists = {s.family for s in samples if s.type == "histogram" and s.family.startswith("vllm:")}
    assert "vllm:time_to_first_token_seconds" in hists
    for fam in hists:
        buckets = [s for s in samples if s.name == f"{fam}_bucket"]
        by_series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
        for b in buckets:
            rest = tuple(kv for kv in b.labels if kv[0] != "le")
            by_series.setdefault(rest, []).append((float(dict(b.labels)["le"]), b.value))
        for rest, pairs in by_series.items():
            pairs.sort()
            assert math.isinf(pairs[-1][0])
            counts = [c for _, c in pairs]
            assert counts == sorted(counts)  # cumulative
            (count,) = [s.value for s in samples if s.name == f"{fam}_count" and s.labels == rest]
            assert counts[-1] == count
    # a counter keeps its _total sample; the value is the file's
    (prompt,) = [s for s in samples if s.name == "vllm:prompt_tokens_total"]
    assert prompt.type == "counter" and prompt.family == "vllm:prompt_tokens"
    line = re.search(r"^vllm:prompt_tokens_total\{[^}]*\} (\S+)$", text, flags=re.M)
    assert line is not None and prompt.value == float(line.group(1))


def test_vllm_preset_names_all_exist_in_the_recorded_file() -> None:
    ms = MetricSeries(anchor=ANCHOR)
    ms.add_target("vllm", "http://x/metrics", 1.0)
    samples = parse(VLLM_PROM.read_text())
    ms.add_scrape("vllm", 0, S // 100, samples)
    ms.add_scrape("vllm", S, S + S // 100, samples)
    got = resolve(ms, "vllm")
    assert set(got) == {m.key for m in VLLM}  # not one preset name is missing from vLLM 0.32
    assert got["vllm_waiting"].values.tolist() == [0.0, 0.0]
    assert got["vllm_prompt_tokens_per_s"].values.tolist() == [0.0]  # same text twice


# -- OpenMetrics and bad input -----------------------------------------------------------------
def _registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("jobs", "jobs done", ["queue"], registry=reg).labels("a").inc(7)
    Gauge("depth", "queue depth", registry=reg).set(3)
    h = Histogram("lat_seconds", "latency", buckets=(0.1, 1.0), registry=reg)
    for v in (0.05, 0.5, 0.5, 5.0):
        h.observe(v)
    return reg


def test_openmetrics_and_classic_text_of_one_registry_give_the_same_samples() -> None:
    reg = _registry()
    om = generate_openmetrics(reg).decode()
    classic = generate_latest(reg).decode()
    assert is_openmetrics(om) and not is_openmetrics(classic)
    assert is_openmetrics("x 1\n", "application/openmetrics-text; version=1.0.0")

    def values(samples: list[ParsedSample]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, s.labels): s.value for s in samples if not s.name.endswith("_created")}

    a, b = parse(om), parse(classic)
    assert values(a) == values(b)
    assert values(a)[("jobs_total", (("queue", "a"),))] == 7.0
    assert values(a)[("lat_seconds_bucket", (("le", "1.0"),))] == 3.0
    assert {s.family: s.type for s in a} == {
        "jobs": "counter",
        "depth": "gauge",
        "lat_seconds": "histogram",
    }


@pytest.mark.parametrize(
    "body",
    [
        "<html><body>502 Bad Gateway</body></html>",
        "garbage garbage garbage",
        'foo{a="b" 1',
        "\x00\x01\x02",
    ],
)
def test_garbage_is_a_parse_error_with_a_reason(body: str) -> None:
    with pytest.raises(MetricsParseError) as info:
        parse(body)
    assert isinstance(info.value, RequestError) and info.value.kind == "malformed"
    assert info.value.message.startswith("not a metrics exposition")


def test_openmetrics_cut_short_is_a_parse_error() -> None:
    om = generate_openmetrics(_registry()).decode()
    cut = om[: om.index("# EOF")]
    with pytest.raises(MetricsParseError):
        parse(cut, "application/openmetrics-text; version=1.0.0; charset=utf-8")


# -- the series -------------------------------------------------------------------------------
def g(name: str, value: float, **labels: str) -> ParsedSample:
    return ParsedSample(name, "gauge", name, tuple(sorted(labels.items())), value)


def c(family: str, value: float) -> ParsedSample:
    return ParsedSample(family, "counter", f"{family}_total", (), value)


def series_of(*scrapes: list[ParsedSample], gap_at: int | None = None) -> MetricSeries:
    """Scrape i at t = i s (bracket ±1 ms); ``gap_at``: that scrape failed."""
    ms = MetricSeries(anchor=ANCHOR)
    ms.add_target("t", "http://t/metrics", 1.0)
    for i, samples in enumerate(scrapes):
        if i == gap_at:
            ms.add_gap("t", i * S - 1_000_000, i * S + 1_000_000, "http 500")
        else:
            ms.add_scrape("t", i * S - 1_000_000, i * S + 1_000_000, samples)
    return ms


def test_gauges_aggregate_over_label_sets_and_skip_gaps() -> None:
    gpus = [[g("util", 10.0 * i, gpu="0"), g("util", 30.0 * i, gpu="1")] for i in range(4)]
    ms = series_of(*gpus, gap_at=2)
    assert ms.gauge("util").values.tolist() == [0.0, 40.0, 120.0]
    assert ms.gauge("util", agg="mean").values.tolist() == [0.0, 20.0, 60.0]
    assert ms.gauge("util", agg="max", gpu="0").values.tolist() == [0.0, 10.0, 30.0]
    ts = ms.gauge("util")
    assert ts.t_ns.tolist() == [0, S, 3 * S]  # midpoints of the brackets
    assert ts.uncertainty_ns.tolist() == [1_000_000] * 3
    assert [gap.reason for gap in ms.gaps] == ["http 500"]
    with pytest.raises(UsageError):
        ms.gauge("util", agg="median")
    with pytest.raises(UsageError):
        ms.gauge("nope")


def test_counter_rates_per_interval_with_a_reset() -> None:
    ms = series_of([c("req", 10)], [c("req", 30)], [c("req", 35)], [c("req", 4)])
    r = ms.rate("req")  # the family name finds req_total
    assert r.kind == "rate"
    assert r.values.tolist() == [20.0, 5.0, 4.0]  # 4 after a reset: 4 new since the restart
    assert r.start_ns.tolist() == [0, S, 2 * S] and r.t_ns.tolist() == [S, 2 * S, 3 * S]
    assert ms.rate("req_total").values.tolist() == r.values.tolist()


def _hist_scrape(reg_obs: list[float], edges: tuple[float, ...]) -> list[ParsedSample]:
    reg = CollectorRegistry()
    h = Histogram("lat_seconds", "l", buckets=edges, registry=reg)
    for v in reg_obs:
        h.observe(v)
    return parse(generate_latest(reg).decode())


def test_histogram_quantiles_are_per_interval_not_cumulative() -> None:
    edges = tuple(0.25 * k for k in range(1, 17))  # 0.25 .. 4.0 s
    first = [4.0 * (i + 0.5) / 1000 for i in range(1000)]  # uniform on [0, 4)
    second = [1.0 * (i + 0.5) / 1000 for i in range(1000)]  # uniform on [0, 1)
    ms = series_of(
        _hist_scrape([], edges),
        _hist_scrape(first, edges),
        _hist_scrape(first + second, edges),  # cumulative, as a server exports it
        _hist_scrape(first + second, edges),  # nothing observed in the last interval
    )
    p90 = ms.quantile("lat_seconds", 0.9)
    # uniform data: interpolation inside a bucket is exact up to the 1/1000 spacing
    assert p90.values[0] == pytest.approx(3.6, abs=0.004)
    assert p90.values[1] == pytest.approx(0.9, abs=0.001)  # cumulative would say ≈ 3.2
    assert math.isnan(p90.values[2])
    assert ms.quantile("lat_seconds", 0.5).values[1] == pytest.approx(0.5, abs=0.001)
    with pytest.raises(UsageError):
        ms.quantile("lat_seconds", 1.5)


def test_a_rank_in_the_inf_bucket_reports_the_highest_finite_edge() -> None:
    ms = series_of(_hist_scrape([], (1.0, 2.0)), _hist_scrape([0.5, 9.0, 9.0, 9.0], (1.0, 2.0)))
    assert ms.quantile("lat_seconds", 0.99).values.tolist() == [2.0]


def test_gauge_lookup_holds_the_last_value_and_stales_out() -> None:
    ms = series_of([g("q", 1)], [g("q", 5)], [g("q", 9)])
    ts = ms.gauge("q")
    t = np.array([-1, 0, S // 2, S, 2 * S + S // 2, 5 * S])
    assert ts.at(t).tolist()[1:] == [1.0, 1.0, 5.0, 9.0, 9.0]
    assert math.isnan(ts.at(t)[0])  # before the first scrape
    stale = ts.at(t, max_age_ns=S)
    assert math.isnan(stale[-1]) and stale[-2] == 9.0
    epoch = t + ANCHOR.epoch_ns
    np.testing.assert_array_equal(ts.at_epoch(epoch), ts.at(t))
    rate = series_of([c("n", 0)], [c("n", 10)], [c("n", 30)]).rate("n")
    assert rate.at(np.array([0, 1, S, S + 1, 2 * S, 3 * S])).tolist()[1:5] == [10, 10, 20, 20]


def test_the_streamed_file_loads_back_to_the_same_series(tmp_path: Path) -> None:
    path = tmp_path / "run.metrics.jsonl"
    ms = MetricSeries(path, anchor=ANCHOR, flush_every=2)
    ms.add_target("t", "http://t/metrics", 0.5)
    text = VLLM_PROM.read_text()
    for i in range(5):
        if i == 3:
            ms.add_gap("t", i * S, i * S + 10, "timeout after 0.5 s")
        else:
            ms.add_scrape("t", i * S, i * S + 10, parse(text.replace(" 19.0", f" {19 + i * i}.0")))
    ms.close()
    back = MetricSeries.load(path)
    assert back.anchor == ANCHOR and back.targets == {"t": "http://t/metrics"}
    assert back.gaps == ms.gaps
    assert back.keys == ms.keys
    for m in ("vllm:prompt_tokens_total", "vllm:num_requests_running"):
        np.testing.assert_array_equal(back.gauge(m).values, ms.gauge(m).values)
        np.testing.assert_array_equal(back.gauge(m).t_ns, ms.gauge(m).t_ns)
    assert back.rate("vllm:prompt_tokens").values.tolist() == [1.0, 3.0, 12.0 / 2]  # over the gap
    with path.open("a") as f:
        f.write('{"kind": "scrape", "target": "t", "t": [9')  # a crash mid-write
    assert MetricSeries.load(path).damaged_lines == 1
    (tmp_path / "other.jsonl").write_text('{"kind": "run", "schema": 1}\n')
    with pytest.raises(UsageError):
        MetricSeries.load(tmp_path / "other.jsonl")


def test_resolve_skips_a_presets_missing_metrics_but_not_a_named_one() -> None:
    ms = series_of([g("testbed_requests_waiting", 2)], [g("testbed_requests_waiting", 3)])
    got = resolve(ms, ["testbed", "vllm"])
    assert list(got) == ["testbed_waiting"]
    with pytest.raises(UsageError):
        resolve(ms, "vllm:num_requests_waiting")
    assert resolve(ms, Metric("testbed_requests_waiting", label="q"))["q"].values.tolist() == [
        2.0,
        3.0,
    ]
    assert {m.key for m in TESTBED} >= {"testbed_waiting", "testbed_running"}
    text = summary_text(ms)
    assert "testbed_waiting" in text and "2 scrapes, 0 gaps" in text


def test_one_name_on_two_targets_needs_a_choice() -> None:
    ms = MetricSeries(anchor=ANCHOR)
    for t in ("a", "b"):
        ms.add_target(t, f"http://{t}/metrics", 1.0)
        ms.add_scrape(t, 0, 10, [g("q", 1)])
    with pytest.raises(UsageError, match="target="):
        ms.gauge("q")
    assert ms.gauge("q", target="b").values.tolist() == [1.0]
    with pytest.raises(UsageError):
        ms.add_target("a", "http://a/metrics", 1.0)
