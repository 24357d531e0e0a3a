"""The scheduler's /metrics through a real HTTP scrape, parsed with prometheus-client's parser."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ortserve.v1 import internal_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from scheduler_service.config import SchedulerConfig
from scheduler_service.server import build_server
from tests.aio_thread import LoopThread

BPT = 1_024


@pytest.fixture()
def scheduler():
    loop = LoopThread()
    running = loop.run(build_server(SchedulerConfig(port=0, internal_port=0, metrics_port=0)))
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    internal_channel = grpc.insecure_channel(f"127.0.0.1:{running.internal_port}")
    internal_pb2_grpc.SchedulerInternalStub(internal_channel).RegisterWorker(scheduler_pb2.RegisterWorkerRequest(
        worker_id="w1", address="127.0.0.1:1", model="m", context_length=4_096,
        bytes_per_token=BPT, capacity_bytes=1_000 * BPT, block_tokens=1, vocab_size=100),
        timeout=5)
    yield stub, running
    channel.close()
    internal_channel.close()
    loop.run(running.stop(0))
    loop.close()


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def admit(stub, n_prompt: int, max_new: int) -> types_pb2.Admission:
    request = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=[1] * n_prompt),
                                        max_new_tokens=max_new)
    return stub.Admit(scheduler_pb2.AdmitRequest(request=request), timeout=5)


def counter(samples, decision: str, cause: str = "") -> float:
    return samples.get(("ortserve_scheduler_admissions_total",
                        (("cause", cause), ("decision", decision))), 0.0)


def test_byte_gauges_equal_get_budget_and_counters_move_by_one(scheduler):
    stub, running = scheduler
    before = scrape(running.metrics_port)
    admitted = admit(stub, 10, 90)  # 100 tokens of 1,000
    capped = admit(stub, 10, 2_000)  # 900 left: capped to 890
    with pytest.raises(grpc.RpcError):
        stub.Generate(types_pb2.GenerateRequest(
            token_ids=types_pb2.TokenIds(ids=[1] * 10), max_new_tokens=5_000,
            max_queue_wait_ms=0), timeout=5).next()  # beyond the context window: rejected
    assert admitted.decision == types_pb2.ADMITTED and capped.decision == types_pb2.CAPPED
    after = scrape(running.metrics_port)
    assert counter(after, "admitted") - counter(before, "admitted") == 1
    assert counter(after, "capped") - counter(before, "capped") == 1
    assert counter(after, "rejected", "context_length_exceeded") - counter(
        before, "rejected", "context_length_exceeded") == 1
    assert after[("ortserve_scheduler_caps_total", ())] == 1
    assert after[("ortserve_scheduler_cap_tokens_cut_total", ())] == 2_000 - 890
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    [worker] = budget.workers
    label = (("worker_id", "w1"),)
    assert after[("ortserve_scheduler_kv_capacity_bytes", label)] == worker.capacity_bytes
    assert after[("ortserve_scheduler_kv_reserved_bytes", label)] == worker.reserved_bytes
    assert after[("ortserve_scheduler_kv_available_bytes", label)] == worker.available_bytes
    assert worker.reserved_bytes == 1_000 * BPT
    assert after[("ortserve_scheduler_queue_length", ())] == 0
