"""Worker.Info says what the device holds for KV beside what the ledger charges, through a
real channel: the device-rows layout over CPU OrtValues (the dry run's path), the tiny
model."""

from __future__ import annotations

import grpc
import pytest

from ortserve.rpc.error_path import register_service
from ortserve.v1 import worker_pb2, worker_pb2_grpc
from tests.aio_thread import LoopThread
from tests.service.worker_service.test_worker_service import FakeLink
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.lease_lifecycle import LeaseLifecycle
from worker_service.server import SERVICE
from worker_service.servicer import WorkerServicer


@pytest.fixture(scope="module")
def info_of(tiny_dir):
    loop = LoopThread()
    started = []

    def info(config: EngineConfig) -> worker_pb2.WorkerInfo:
        engine = Engine(config)

        async def start():
            server = grpc.aio.server()
            servicer = WorkerServicer("w-mem", "127.0.0.1:0", "cpu")
            servicer.leases = LeaseLifecycle("w-mem", engine, FakeLink(engine))
            register_service(server, SERVICE, servicer)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            return server, port

        server, port = loop.run(start())
        started.append((server, engine))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            return worker_pb2_grpc.WorkerStub(channel).Info(worker_pb2.InfoRequest(), timeout=10)

    yield info
    for server, engine in started:
        loop.run(server.stop(0))
        engine.close()
    loop.close()


def test_info_reports_kv_reserved_as_charged_plus_the_stated_overhead(tiny_dir, info_of):
    info = info_of(EngineConfig(model_dir=tiny_dir, kv_layout="device-rows", max_batch_rows=4,
                                max_context_tokens=512, kv_capacity_bytes=8 * 2**20,
                                intra_op_threads=1))
    assert info.kv_layout == "device-rows"
    # The decode buckets' fixed buffers are charged out of what was allocated (engine/engine.py).
    assert info.kv_allocated_bytes > info.capacity_bytes > 0
    assert info.kv_reserved_bytes == info.kv_allocated_bytes + info.kv_reserved_overhead_bytes
    # Rounding to 256 bytes per tensor and two scratch tokens: bytes, not a power of two.
    assert 0 < info.kv_reserved_overhead_bytes <= 256 * (2 * info.num_layers + 3)


def test_info_reports_no_reservation_where_kv_is_committed_on_touch(tiny_dir, info_of):
    info = info_of(EngineConfig(model_dir=tiny_dir, intra_op_threads=1))
    assert info.kv_layout == "arena"
    assert info.kv_reserved_bytes == info.kv_allocated_bytes == 0
    assert info.kv_reserved_overhead_bytes == 0
