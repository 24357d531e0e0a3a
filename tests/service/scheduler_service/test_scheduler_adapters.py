"""LoRA adapters through a real scheduler server (stand-in worker): the registration's
adapters in GetBudget, an unserved adapter NOT_FOUND before anything is reserved, the
ledger's capacity moving on ResizeForAdapter, and the admin RPCs closed to generate keys."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.rpc.auth import parse_keys
from ortserve.status import rich_status
from ortserve.v1 import internal_pb2, internal_pb2_grpc, scheduler_pb2, types_pb2, worker_pb2
from tests.service.fake_cluster import BPT, CTX, Cluster, StandInWorker

GENERATE_KEY = "g" * 32
ADMIN_KEY = "a" * 32


class AdapterWorker(StandInWorker):
    """LoadAdapter: asks the ledger to move its capacity, as the real worker does."""

    def __init__(self) -> None:
        super().__init__()
        self.internal_address = ""  # the scheduler's internal port, set after start

    async def LoadAdapter(self, request, context):
        # An aio channel: the scheduler serves on this same event loop.
        async with grpc.aio.insecure_channel(self.internal_address) as channel:
            return await internal_pb2_grpc.SchedulerInternalStub(channel).ResizeForAdapter(
                internal_pb2.ResizeForAdapterRequest(
                    worker_id="w1", loaded=True,
                    adapter=types_pb2.LoraAdapter(name=request.name, held_bytes=10 * BPT,
                                                  path=request.path)),
                timeout=5)


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    return rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)


def bearer(key: str):
    return (("authorization", f"Bearer {key}"),)


@pytest.fixture()
def cluster():
    worker = AdapterWorker()
    cluster = Cluster(worker=worker, api_keys=parse_keys(
        f"generate:{GENERATE_KEY}\nadmin:{ADMIN_KEY}", "test"))
    worker.internal_address = f"127.0.0.1:{cluster.scheduler.internal_port}"
    cluster.internal.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(
        worker_id="w1", address=cluster.worker_address, model="m", context_length=CTX,
        bytes_per_token=BPT, capacity_bytes=1_000 * BPT, vocab_size=1_000,
        adapters=[types_pb2.LoraAdapter(name="fr", held_bytes=10 * BPT,
                                        path="/a/fr.onnx_adapter")]), timeout=5)
    yield cluster
    cluster.close()


def budget(cluster) -> scheduler_pb2.Budget:
    return cluster.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5,
                                  metadata=bearer(GENERATE_KEY))


def generate(cluster, adapter: str):
    return list(cluster.stub.Generate(types_pb2.GenerateRequest(
        model="m", adapter=adapter, token_ids=types_pb2.TokenIds(ids=[1, 2]), max_new_tokens=3),
        timeout=5, metadata=bearer(GENERATE_KEY)))


def test_the_ledger_shows_each_workers_adapters(cluster):
    b = budget(cluster)
    assert [(a.name, a.held_bytes) for a in b.workers[0].adapters] == [("fr", 10 * BPT)]
    assert list(b.models[0].adapters) == ["fr"]


def test_an_unserved_adapter_is_not_found_before_anything_is_reserved(cluster):
    with pytest.raises(grpc.RpcError) as error:
        generate(cluster, "es")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    info = error_info(error.value)
    assert info.reason == "MODEL_NOT_FOUND" and info.metadata["served_adapters"] == "fr"
    assert "'m': 'fr'" in error.value.details()
    assert budget(cluster).total_reserved_bytes == 0
    assert cluster.worker.tokenize_calls == 0 and not cluster.worker.generate_requests
    events = generate(cluster, "fr")  # a served one runs
    assert events[-1].HasField("finished")
    assert cluster.worker.generate_requests[0].request.adapter == "fr"


def test_load_adapter_is_an_admin_call_and_moves_the_ledgers_capacity(cluster):
    request = types_pb2.LoadAdapterRequest(name="de", path="/x/de.onnx_adapter")
    with pytest.raises(grpc.RpcError) as error:
        cluster.stub.LoadAdapter(request, timeout=5, metadata=bearer(GENERATE_KEY))
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert budget(cluster).workers[0].capacity_bytes == 1_000 * BPT
    change = cluster.stub.LoadAdapter(request, timeout=5, metadata=bearer(ADMIN_KEY))
    assert change.capacity_bytes == 990 * BPT
    assert [a.name for a in change.adapters] == ["de", "fr"]
    assert budget(cluster).workers[0].capacity_bytes == 990 * BPT
    with pytest.raises(grpc.RpcError) as error:
        cluster.stub.LoadAdapter(types_pb2.LoadAdapterRequest(worker_id="w9", name="x", path="/p"),
                                 timeout=5, metadata=bearer(ADMIN_KEY))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'w1'" in error.value.details()


def test_a_load_the_leases_leave_no_room_for_is_refused_with_the_numbers(cluster):
    admission = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        model="m", token_ids=types_pb2.TokenIds(ids=[1, 2]), max_new_tokens=980)),
        timeout=5, metadata=bearer(GENERATE_KEY))
    assert admission.lease_id  # 982 tokens of 1,000 held
    with pytest.raises(grpc.RpcError) as error:
        cluster.internal.ResizeForAdapter(internal_pb2.ResizeForAdapterRequest(
            worker_id="w1", adapter=types_pb2.LoraAdapter(name="de", held_bytes=30 * BPT),
            loaded=True), timeout=5)
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info(error.value)
    assert info.reason == "ADAPTER_NO_ROOM" and info.metadata["adapter_bytes"] == str(30 * BPT)
    assert budget(cluster).workers[0].capacity_bytes == 1_000 * BPT


def test_the_worker_protos_carry_adapters():
    assert worker_pb2.WorkerInfo.DESCRIPTOR.fields_by_name["adapters"].number == 30


def test_getbudget_shows_each_adapters_path_as_worker_info_does(cluster):
    # Issue 52 item 11: GetBudget's adapters had an empty path (the ledger kept name and bytes).
    assert [(a.name, a.path) for a in budget(cluster).workers[0].adapters] == [
        ("fr", "/a/fr.onnx_adapter")]
    change = cluster.stub.LoadAdapter(types_pb2.LoadAdapterRequest(
        name="de", path="/x/de.onnx_adapter"), timeout=5, metadata=bearer(ADMIN_KEY))
    assert {a.name: a.path for a in change.adapters} == {"de": "/x/de.onnx_adapter",
                                                         "fr": "/a/fr.onnx_adapter"}
    assert [(a.name, a.path) for a in budget(cluster).workers[0].adapters] == [
        ("de", "/x/de.onnx_adapter"), ("fr", "/a/fr.onnx_adapter")]
