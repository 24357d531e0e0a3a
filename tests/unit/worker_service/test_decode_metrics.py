"""The decode step's metrics read the runner's StepStats at scrape time."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from worker_service.metrics import _DecodeStepMetrics
from worker_service.runtime.decode_step import StepStats


def test_captured_and_uncaptured_steps_and_host_vs_device_seconds_are_exported():
    stats = StepStats(host_s=0.25, device_s=1.5, padded_rows=3, graph_bytes=4096)
    stats.ran(None)
    stats.ran(None)
    stats.ran("LoRA inputs")
    registry = CollectorRegistry()
    registry.register(_DecodeStepMetrics(SimpleNamespace(runner=SimpleNamespace(step_stats=stats))))
    value = registry.get_sample_value
    assert value("ortserve_worker_decode_steps_total", {"graph": "captured", "reason": ""}) == 2
    assert value("ortserve_worker_decode_steps_total",
                 {"graph": "uncaptured", "reason": "LoRA inputs"}) == 1
    assert value("ortserve_worker_decode_host_seconds_total") == 0.25
    assert value("ortserve_worker_decode_device_seconds_total") == 1.5
    assert value("ortserve_worker_decode_padded_rows_total") == 3
    assert value("ortserve_worker_decode_bucket_buffer_bytes") == 4096


def test_a_runner_without_buckets_reports_zeros():
    registry = CollectorRegistry()
    registry.register(_DecodeStepMetrics(SimpleNamespace(runner=object())))
    assert registry.get_sample_value("ortserve_worker_decode_host_seconds_total") == 0.0
