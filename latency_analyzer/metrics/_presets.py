"""Named metric selections for common servers: vLLM, llama.cpp, NVIDIA's DCGM exporter, the
test bed.

vLLM names are those of vLLM 0.32's ``/metrics`` (``shared/fixtures/real-servers/
vllm-0.32-metrics.prom``); llama.cpp names those of ``llama-server --metrics`` (``llamacpp:``
prefix; ``tests/fixtures/real-servers/llama-server-11434-metrics.prom``); DCGM names are
dcgm-exporter's default counters (one series per GPU, labelled ``gpu``, ``UUID``,
``modelName``; all exported as gauges). Any other metric is used by name:
``Metric("my_queue_depth")``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import UsageError
from ._series import MetricSeries
from ._timeseries import Kind, TimeSeries

__all__ = ["DCGM", "LLAMACPP", "PRESETS", "TESTBED", "VLLM", "Metric", "resolve", "specs"]


@dataclass(frozen=True, slots=True)
class Metric:
    """How to turn stored samples into one time series.

    Attributes:
        name: the sample or family name.
        kind: ``gauge`` (as scraped), ``rate`` (a counter per second) or ``quantile`` (of a
            histogram, per scrape interval).
        agg: over label sets (GPUs, engines): ``sum``, ``mean``, ``max``, ``min``.
        q: the quantile, for ``kind="quantile"``.
        label: a short name for tables, plots and joined columns (default: ``name``).
    """

    name: str
    kind: Kind = "gauge"
    agg: str = "sum"
    q: float = 0.99
    label: str = ""

    @property
    def key(self) -> str:
        return self.label or self.name

    @property
    def stored_name(self) -> str:
        """The sample name this metric reads (a histogram's ``_bucket``)."""
        return f"{self.name}_bucket" if self.kind == "quantile" else self.name

    def series(self, ms: MetricSeries, target: str | None = None) -> TimeSeries:
        """This metric's time series from ``ms``."""
        if self.kind == "gauge":
            return ms.gauge(self.name, agg=self.agg, target=target)
        if self.kind == "rate":
            return ms.rate(self.name, agg=self.agg, target=target)
        return ms.quantile(self.name, self.q, target=target)


VLLM = (
    Metric("vllm:num_requests_waiting", label="vllm_waiting"),
    Metric("vllm:num_requests_running", label="vllm_running"),
    Metric("vllm:kv_cache_usage_perc", agg="max", label="vllm_kv_cache"),
    Metric("vllm:num_preemptions_total", "rate", label="vllm_preemptions_per_s"),
    Metric("vllm:prompt_tokens_total", "rate", label="vllm_prompt_tokens_per_s"),
    Metric("vllm:generation_tokens_total", "rate", label="vllm_generation_tokens_per_s"),
    Metric("vllm:request_success_total", "rate", label="vllm_requests_per_s"),
    Metric("vllm:time_to_first_token_seconds", "quantile", q=0.99, label="vllm_ttft_p99"),
    Metric("vllm:request_queue_time_seconds", "quantile", q=0.99, label="vllm_queue_p99"),
    Metric("vllm:inter_token_latency_seconds", "quantile", q=0.99, label="vllm_itl_p99"),
)

LLAMACPP = (
    Metric("llamacpp:requests_processing", label="llamacpp_running"),
    Metric("llamacpp:requests_deferred", label="llamacpp_waiting"),
    Metric("llamacpp:n_busy_slots_per_decode", label="llamacpp_busy_slots_per_decode"),
    Metric("llamacpp:prompt_tokens_total", "rate", label="llamacpp_prompt_tokens_per_s"),
    Metric("llamacpp:tokens_predicted_total", "rate", label="llamacpp_generation_tokens_per_s"),
    Metric("llamacpp:n_decode_total", "rate", label="llamacpp_decodes_per_s"),
    Metric("llamacpp:prompt_seconds_total", "rate", label="llamacpp_prompt_busy"),
    Metric("llamacpp:tokens_predicted_seconds_total", "rate", label="llamacpp_generation_busy"),
)

DCGM = (
    Metric("DCGM_FI_DEV_GPU_UTIL", agg="mean", label="gpu_util_pct"),
    Metric("DCGM_FI_DEV_FB_USED", label="gpu_mem_used_mib"),
    Metric("DCGM_FI_DEV_FB_FREE", label="gpu_mem_free_mib"),
    Metric("DCGM_FI_DEV_GPU_TEMP", agg="max", label="gpu_temp_c"),
    Metric("DCGM_FI_DEV_POWER_USAGE", label="gpu_power_w"),
    Metric("DCGM_FI_DEV_SM_CLOCK", agg="mean", label="gpu_sm_clock_mhz"),
    Metric("DCGM_FI_DEV_MEM_COPY_UTIL", agg="mean", label="gpu_mem_copy_util_pct"),
    Metric("DCGM_FI_PROF_GR_ENGINE_ACTIVE", agg="mean", label="gpu_engine_active"),
)

TESTBED = (
    Metric("testbed_requests_waiting", label="testbed_waiting"),
    Metric("testbed_requests_running", label="testbed_running"),
    Metric("testbed_requests_total", "rate", label="testbed_requests_per_s"),
    Metric("testbed_queue_time_seconds", "quantile", q=0.99, label="testbed_queue_p99"),
)

PRESETS: dict[str, tuple[Metric, ...]] = {
    "vllm": VLLM,
    "llamacpp": LLAMACPP,
    "dcgm": DCGM,
    "testbed": TESTBED,
}


def specs(selection: str | Metric | Iterable[str | Metric]) -> list[Metric]:
    """Metrics named by a preset name, a metric name (a gauge), a :class:`Metric`, or a list.

    Raises:
        UsageError: an empty selection.
    """
    items: Sequence[str | Metric]
    items = [selection] if isinstance(selection, (str, Metric)) else list(selection)
    out: list[Metric] = []
    for item in items:
        if isinstance(item, Metric):
            out.append(item)
        elif item in PRESETS:
            out.extend(PRESETS[item])
        else:
            out.append(Metric(item))
    if not out:
        raise UsageError("no metrics selected")
    return out


def resolve(
    ms: MetricSeries, selection: str | Metric | Iterable[str | Metric], target: str | None = None
) -> dict[str, TimeSeries]:
    """Label → time series for each selected metric that ``ms`` holds.

    A preset's metrics the server does not export are left out; a metric named on its own
    must exist.

    Raises:
        UsageError: an explicitly named metric is not stored.
    """
    items = [selection] if isinstance(selection, (str, Metric)) else list(selection)
    out: dict[str, TimeSeries] = {}
    for item in items:
        optional = isinstance(item, str) and item in PRESETS
        for m in specs(item):
            if optional and not ms.find(m.stored_name, target=target):
                continue  # a preset's metric this server does not export
            out[m.key] = m.series(ms, target)
    return out
