"""Both /metrics endpoints of real processes, parsed with prometheus-client's parser."""

from __future__ import annotations

import socket
import urllib.request

from ortserve_client import Client
from prometheus_client.parser import text_string_to_metric_families

from ortserve.v1 import worker_pb2
from tests.e2e.conftest import start_cluster, worker_stub


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if not s.labels or s.name.endswith("_total")}


def test_worker_and_scheduler_metrics_follow_a_request(tmp_path_factory):
    scheduler_port, worker_port = free_port(), free_port()
    cluster = start_cluster(tmp_path_factory, "metrics", kv_capacities=["128MiB"],
                            scheduler_args=["--metrics-port", str(scheduler_port)],
                            worker_args=["--metrics-port", str(worker_port)])
    try:
        # Relayed: the scheduler's generated-token and duration metrics count what it relays.
        with Client(cluster.address, timeout_s=120, direct=False) as client:
            result = client.generate(chat=[("user", "Name three colours.")], max_new_tokens=12,
                                     min_new_tokens=12)
        worker = scrape(worker_port)
        info = worker_stub(cluster.worker_services[0].address).Info(worker_pb2.InfoRequest(),
                                                                     timeout=5)
        assert worker["ortserve_worker_generated_tokens_total"] == result.usage.generated_tokens
        assert worker["ortserve_worker_kv_capacity_bytes"] == info.capacity_bytes == 128 * 2**20
        assert worker["ortserve_worker_kv_held_bytes"] == info.held_bytes == 0
        assert worker["ortserve_worker_time_to_first_token_seconds_count"] == 1
        # Decode steps ran through the buckets: timed, and never padded on the host arena.
        assert worker["ortserve_worker_decode_device_seconds_total"] > 0
        assert worker["ortserve_worker_decode_padded_rows_total"] == 0
        scheduler = scrape(scheduler_port)
        assert scheduler["ortserve_scheduler_generated_tokens_total"] == 12
        assert scheduler["ortserve_scheduler_request_duration_seconds_count"] == 1
    finally:
        cluster.stop()
