"""The admission queue through a real channel: Queued events, waits, refusals, leaving cleanly."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.rpc.error_path import register_service
from ortserve.status import rich_status
from ortserve.v1 import (
    internal_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    worker_pb2,
)
from scheduler_service.config import SchedulerConfig
from scheduler_service.server import build_server
from tests.aio_thread import LoopThread
from tests.service.fake_cluster import BPT, CTX, StandInWorker


class QueueCluster:
    def __init__(self, **config) -> None:
        self.loop = LoopThread()

        async def start():
            server = grpc.aio.server()
            # Through the one error path, as the real worker (its Relay reads raw requests).
            register_service(server, worker_pb2.DESCRIPTOR.services_by_name["Worker"], StandInWorker())
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            return server, port, await build_server(SchedulerConfig(port=0, internal_port=0, retry_after_s=2.5, **config))

        self._worker, port, self.scheduler = self.loop.run(start())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.scheduler.port}")
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.internal_channel = grpc.insecure_channel(f"127.0.0.1:{self.scheduler.internal_port}")
        internal_pb2_grpc.SchedulerInternalStub(self.internal_channel).RegisterWorker(scheduler_pb2.RegisterWorkerRequest(
            worker_id="w1", address=f"127.0.0.1:{port}", model="m", context_length=CTX,
            bytes_per_token=BPT, capacity_bytes=100 * BPT, block_tokens=1, vocab_size=1_000),
            timeout=5)

    def hold_everything(self) -> types_pb2.Admission:
        adm = self.stub.Admit(scheduler_pb2.AdmitRequest(request=request(90)), timeout=5)
        assert adm.decision == types_pb2.ADMITTED and adm.reserved_bytes == 100 * BPT
        return adm

    def release(self, adm: types_pb2.Admission) -> None:
        self.stub.Release(scheduler_pb2.ReleaseRequest(lease_id=adm.lease_id,
                                                       lease_secret=adm.lease_secret), timeout=5)

    def budget(self) -> scheduler_pb2.Budget:
        return self.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)

    def budget_as(self, key: str) -> scheduler_pb2.Budget:
        return self.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5,
                                   metadata=(("authorization", f"Bearer {key}"),))

    def wait_queue_length(self, n: int) -> None:
        deadline = time.monotonic() + 5
        while self.budget().queue_length != n and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.budget().queue_length == n

    def close(self) -> None:
        self.channel.close()
        self.internal_channel.close()
        self.loop.run(self.scheduler.stop(0))
        self.loop.run(self._worker.stop(0))
        self.loop.close()


@pytest.fixture()
def make_cluster():
    made = []

    def make(**config) -> QueueCluster:
        made.append(QueueCluster(**config))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()


def request(max_new: int, min_new: int = 0, n_tokens: int = 10, **kw) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=list(range(n_tokens))),
                                     max_new_tokens=max_new, min_new_tokens=min_new, **kw)


def reason(error: grpc.RpcError) -> str:
    return rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo).reason


def test_a_busy_generate_waits_with_queued_events_then_is_admitted_on_release(make_cluster):
    cluster = make_cluster()
    held = cluster.hold_everything()
    call = cluster.stub.Generate(request(5, 5), timeout=30)
    first = next(call)
    assert first.WhichOneof("event") == "queued"
    q = first.queued
    assert (q.position, q.requests_ahead, q.bytes_ahead, q.needed_bytes, q.queue_length) == (
        1, 0, 0, 15 * BPT, 1)
    assert q.max_wait_ms == pytest.approx(30_000, rel=0.01)
    budget = cluster.budget()
    assert (budget.queue_length, budget.queue_waiting_bytes, budget.max_queue_length) == (
        1, 15 * BPT, 256)
    assert budget.total_reserved_bytes == 100 * BPT  # waiting holds nothing
    time.sleep(0.3)
    cluster.release(held)
    events = [first, *call]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[kinds.index("admission"):] == ["admission", "chunk", "finished"]
    assert set(kinds[:kinds.index("admission")]) == {"queued"}
    assert events[kinds.index("admission")].admission.queue_wait_ms >= 250
    assert cluster.budget().total_reserved_bytes == 0 and cluster.budget().queue_length == 0


def test_a_queued_client_that_disconnects_leaves_the_queue_holding_nothing(make_cluster):
    cluster = make_cluster()
    held = cluster.hold_everything()
    call = cluster.stub.Generate(request(5, 5), timeout=30)
    assert next(call).WhichOneof("event") == "queued"
    behind = cluster.stub.Generate(request(5, 5), timeout=30)
    assert next(behind).queued.position == 2
    call.cancel()
    cluster.wait_queue_length(1)
    cluster.release(held)
    assert list(behind)[-1].WhichOneof("event") == "finished"
    assert cluster.budget().total_reserved_bytes == 0 and cluster.budget().queue_length == 0


def test_queue_full_is_resource_exhausted_with_retry_info_and_the_numbers(make_cluster):
    cluster = make_cluster(max_queue_length=1)
    cluster.hold_everything()
    waiting = cluster.stub.Generate(request(5, 5), timeout=30)
    assert next(waiting).WhichOneof("event") == "queued"
    with pytest.raises(grpc.RpcError) as err:
        list(cluster.stub.Generate(request(5, 5), timeout=30))
    error = err.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(error) == "QUEUE_FULL"
    details = rich_status.details_of(error)
    assert rich_status.unpack(details, error_details_pb2.RetryInfo).retry_delay.ToMilliseconds() == 2_500
    rejection = rich_status.unpack(details, types_pb2.Rejection)
    assert (rejection.queue_length, rejection.max_queue_length, rejection.bytes_ahead) == (1, 1, 15 * BPT)
    assert "queue is full: 1 of 1" in error.details() and "--max-queue-length" in error.details()
    waiting.cancel()


def test_the_servers_wait_running_out_is_queue_timeout_and_the_callers_deadline_is_deadline_exceeded(
        make_cluster):
    cluster = make_cluster(max_queue_wait_s=0.5)
    cluster.hold_everything()
    with pytest.raises(grpc.RpcError) as err:
        list(cluster.stub.Generate(request(5, 5), timeout=30))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(err.value) == "QUEUE_TIMEOUT"
    rejection = rich_status.unpack(rich_status.details_of(err.value), types_pb2.Rejection)
    assert rejection.waited_ms >= 500 and rejection.max_queue_wait_ms == pytest.approx(500)
    assert "retry in 2.5 s" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        list(cluster.stub.Generate(request(5, 5), timeout=0.3))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    cluster.wait_queue_length(0)
    assert cluster.budget().total_reserved_bytes == 100 * BPT


def test_admit_with_a_wait_is_admitted_once_bytes_free_up(make_cluster):
    cluster = make_cluster()
    held = cluster.hold_everything()
    answer: list = []
    waiter = threading.Thread(target=lambda: answer.append(cluster.stub.Admit(
        scheduler_pb2.AdmitRequest(request=request(20), max_queue_wait_ms=10_000), timeout=30)))
    waiter.start()
    cluster.wait_queue_length(1)
    no_wait = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=request(20)), timeout=5)
    assert no_wait.decision == types_pb2.REJECTED
    cluster.release(held)
    waiter.join(10)
    adm = answer[0]
    assert adm.decision == types_pb2.ADMITTED and adm.reserved_bytes == 30 * BPT and adm.queue_wait_ms > 0
    assert cluster.budget().total_reserved_bytes == 30 * BPT


def test_wait_full_waits_for_the_whole_reservation_where_allow_is_capped_at_once(make_cluster):
    cluster = make_cluster()
    half = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=request(40)), timeout=5)  # 50 held
    allow = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=request(60, 1)), timeout=5)
    assert allow.decision == types_pb2.CAPPED and allow.max_new_tokens == 40
    cluster.release(allow)
    call = cluster.stub.Generate(request(60, 1, cap_policy=types_pb2.CAP_POLICY_WAIT_FULL), timeout=30)
    assert next(call).WhichOneof("event") == "queued"
    cluster.release(half)
    admission = next(e for e in call if e.WhichOneof("event") == "admission").admission
    assert admission.decision == types_pb2.ADMITTED and admission.max_new_tokens == 60
