"""Prometheus metrics shared machinery (prometheus-client): one registry per process,
served on its own HTTP port (`--metrics-port`; 0: any free port, None: off).

Each service defines its metrics in its own `metrics.py` on the registry this
module hands out; gauges that mirror state (capacity, reserved bytes, batch
rows) read it at scrape time through callbacks, so they can never drift from
the ledger or the engine they describe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Latency buckets in seconds: per-token times are milliseconds, requests seconds.
TOKEN_SECONDS_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
REQUEST_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def new_registry() -> CollectorRegistry:
    # NOTE: not the global default registry: tests start several services in one
    # process, and each must expose only its own numbers.
    return CollectorRegistry(auto_describe=True)


class PerWorkerGauges(Collector):
    """Gauge families whose samples are read from one snapshot at scrape time.

    `snapshot()` returns one item per worker (with .geometry.worker_id, the label);
    each family is (name, documentation, value_of_item). One snapshot per scrape:
    every family describes the same instant.
    """

    _labels = ["worker_id"]

    def __init__(self, snapshot: Callable[[], list],
                 families: tuple[tuple[str, str, Callable[[object], float]], ...]) -> None:
        self._snapshot, self._families = snapshot, families

    def collect(self):
        items = self._snapshot()
        for name, documentation, value in self._families:
            family = GaugeMetricFamily(name, documentation, labels=self._labels)
            for item in items:
                family.add_metric([item.geometry.worker_id], float(value(item)))
            yield family

    def describe(self):
        return [GaugeMetricFamily(name, doc, labels=self._labels)
                for name, doc, _ in self._families]


class RequestLatency:
    """Time to first token, time per output token and request duration, one place each."""

    def __init__(self, registry: CollectorRegistry, prefix: str, where: str) -> None:
        self.ttft_seconds = Histogram(
            f"{prefix}_time_to_first_token_seconds",
            f"From the request's arrival at the {where} to its first token",
            buckets=REQUEST_SECONDS_BUCKETS, registry=registry)
        self.tpot_seconds = Histogram(
            f"{prefix}_time_per_output_token_seconds",
            "Mean time between a request's tokens after the first",
            buckets=TOKEN_SECONDS_BUCKETS, registry=registry)
        self.duration_seconds = Histogram(
            f"{prefix}_request_duration_seconds",
            f"From the request's arrival at the {where} to its last token",
            buckets=REQUEST_SECONDS_BUCKETS, registry=registry)

    def observe(self, generated_tokens: int, ttft_ms: float, decode_ms: float,
                total_ms: float) -> None:
        self.ttft_seconds.observe(ttft_ms / 1e3)
        if generated_tokens > 1:
            self.tpot_seconds.observe(decode_ms / 1e3 / (generated_tokens - 1))
        self.duration_seconds.observe(total_ms / 1e3)


def callback_gauge(registry: CollectorRegistry, name: str, documentation: str,
                   fn: Callable[[], float]) -> Gauge:
    gauge = Gauge(name, documentation, registry=registry)
    gauge.set_function(fn)
    return gauge


def serve(registry: CollectorRegistry, host: str, port: int) -> tuple[int, Callable[[], None]]:
    """Serve /metrics for `registry`; returns (bound port, stop)."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    bound = server.server_address[1]

    def stop() -> None:
        server.shutdown()
        server.server_close()
        if thread is not threading.current_thread():
            thread.join(5)

    return bound, stop
