"""The decode path's bytes are charged in the ledger: a real engine on CPU device rows (the
dry run's path: the CUDA code over CPU OrtValues, tiny model) registers with a real
scheduler through its internal port, as server.py does, and GetBudget shows what was
taken off: capacity = what the worker allocated - the bucket buffers - the graphs."""

from __future__ import annotations

import pytest

from ortserve.v1 import scheduler_pb2, worker_pb2
from tests.service.fake_cluster import Cluster
from tests.service.worker_service.test_worker_info_memory import info_of  # noqa: F401 - a fixture
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.server import registration_request


@pytest.fixture()
def cluster():
    c = Cluster()
    yield c
    c.close()


def test_getbudget_capacity_is_the_allocation_less_the_reported_decode_bytes(tiny_dir, cluster):
    config = EngineConfig(model_dir=tiny_dir, kv_layout="device-rows", max_batch_rows=4,
                          max_context_tokens=512, kv_capacity_bytes=16 * 2**20,
                          intra_op_threads=1)
    with Engine(config) as engine:
        allocated = engine.runtime.allocated_bytes
        cluster.internal.RegisterWorker(
            registration_request(engine, "w-decode", cluster.worker_address), timeout=5)
        worker = cluster.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).workers[0]
    # On the CPU nothing is captured: the figure is the buckets' fixed buffers (1, 2, 4 rows:
    # 7 rows of float32 logits at least).
    assert worker.decode_graph_bytes == 0
    assert worker.decode_buffer_bytes >= 7 * engine.spec.vocab_size * 4
    assert worker.capacity_bytes == allocated - worker.decode_buffer_bytes - (
        worker.decode_graph_bytes)
    assert worker.available_bytes == worker.capacity_bytes  # nothing admitted yet


def test_info_and_the_registration_agree_on_the_capacity(tiny_dir, info_of):  # noqa: F811
    info: worker_pb2.WorkerInfo = info_of(EngineConfig(
        model_dir=tiny_dir, kv_layout="device-rows", max_batch_rows=4, max_context_tokens=512,
        kv_capacity_bytes=16 * 2**20, intra_op_threads=1))
    assert 0 < info.capacity_bytes < info.kv_allocated_bytes
