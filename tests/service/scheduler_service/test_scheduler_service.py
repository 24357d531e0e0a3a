"""The scheduler through a real channel: Admit / Release / GetBudget and every rejection.

The worker here is a stand-in that only answers Tokenize (one token per
whitespace-separated word): these tests pin the scheduler's service, the
end-to-end tests use real workers.
"""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.status import rich_status
from ortserve.v1 import (
    internal_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from scheduler_service import default_tokens
from scheduler_service.config import SchedulerConfig
from scheduler_service.server import build_server
from tests.aio_thread import LoopThread

BPT = 46_080
CTX = 8_192
DEFAULT_TOKENS = default_tokens.DEFAULT_TOKENS


class TokenizeOnlyWorker(worker_pb2_grpc.WorkerServicer):
    async def Tokenize(self, request, context):
        req = request.request
        ids = list(req.token_ids.ids) if req.HasField("token_ids") else list(range(len(req.text.split())))
        return worker_pb2.TokenizeResponse(token_ids=ids, context_length=CTX)


@pytest.fixture()
def cluster():
    loop = LoopThread()

    async def start():
        worker = grpc.aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(TokenizeOnlyWorker(), worker)
        worker_port = worker.add_insecure_port("127.0.0.1:0")
        await worker.start()
        scheduler = await build_server(SchedulerConfig(port=0, internal_port=0, retry_after_s=2.5))
        return worker, worker_port, scheduler

    worker, worker_port, scheduler = loop.run(start())
    channel = grpc.insecure_channel(f"127.0.0.1:{scheduler.port}")
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    internal_channel = grpc.insecure_channel(f"127.0.0.1:{scheduler.internal_port}")
    internal = internal_pb2_grpc.SchedulerInternalStub(internal_channel)
    stub.internal = internal  # the worker-facing RPCs, as a worker dials them

    def register(capacity_tokens: int, worker_id: str = "w1"):
        internal.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(
            worker_id=worker_id, address=f"127.0.0.1:{worker_port}", model="m",
            context_length=CTX, bytes_per_token=BPT, capacity_bytes=capacity_tokens * BPT,
            block_tokens=1), timeout=5)

    yield stub, register
    channel.close()
    internal_channel.close()
    loop.run(scheduler.stop(0))
    loop.run(worker.stop(0))
    loop.close()


def prompt(n_words: int, **kw) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(text=" ".join(["w"] * n_words), **kw)


def test_admit_release_and_budget_through_a_real_channel(cluster):
    stub, register = cluster
    register(capacity_tokens=1_000)
    adm = stub.Admit(scheduler_pb2.AdmitRequest(request=prompt(10, max_new_tokens=90)), timeout=5)
    assert adm.decision == types_pb2.ADMITTED
    assert adm.reserved_bytes == 100 * BPT and adm.lease_id and adm.worker_id == "w1"
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(include_leases=True), timeout=5)
    assert budget.total_reserved_bytes == 100 * BPT
    assert budget.workers[0].available_bytes == 900 * BPT
    assert [lease.lease_id for lease in budget.workers[0].leases] == [adm.lease_id]
    freed = stub.Release(scheduler_pb2.ReleaseRequest(lease_id=adm.lease_id,
                                                     lease_secret=adm.lease_secret), timeout=5)
    assert freed.freed_bytes == 100 * BPT and freed.released
    again = stub.Release(scheduler_pb2.ReleaseRequest(lease_id=adm.lease_id,
                                                     lease_secret=adm.lease_secret), timeout=5)
    assert again.freed_bytes == 0 and not again.released
    assert stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).total_reserved_bytes == 0


def test_admit_caps_the_incident_and_dry_run_reserves_nothing(cluster):
    stub, register = cluster
    register(capacity_tokens=37 + 500)
    dry = stub.Admit(scheduler_pb2.AdmitRequest(request=prompt(37), dry_run=True), timeout=5)
    assert dry.decision == types_pb2.CAPPED and dry.dry_run and not dry.lease_id
    assert stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).total_reserved_bytes == 0
    adm = stub.Admit(scheduler_pb2.AdmitRequest(request=prompt(37)), timeout=5)
    assert adm.decision == types_pb2.CAPPED
    cap = adm.budget_cap
    # Unset: the server's default (--default-max-new-tokens), not the whole window.
    assert (cap.requested_max_new_tokens, cap.admitted_max_new_tokens) == (DEFAULT_TOKENS, 500)
    assert cap.requested_was_unset and cap.bytes_per_token == BPT
    assert cap.requested_source == types_pb2.MAX_NEW_TOKENS_FROM_SERVER_DEFAULT
    assert adm.max_new_tokens_source == types_pb2.MAX_NEW_TOKENS_FROM_SERVER_DEFAULT
    assert cap.requested_bytes == (37 + DEFAULT_TOKENS) * BPT and cap.admitted_bytes == 537 * BPT
    assert cap.available_bytes == cap.capacity_bytes == 537 * BPT


def test_admit_answers_a_rejection_as_a_normal_reply(cluster):
    stub, register = cluster
    register(capacity_tokens=100)
    adm = stub.Admit(scheduler_pb2.AdmitRequest(request=prompt(200)), timeout=5)
    assert adm.decision == types_pb2.REJECTED
    assert adm.rejection.cause == types_pb2.EXCEEDS_CAPACITY
    assert adm.rejection.needed_bytes == 201 * BPT and "--kv-capacity" in adm.rejection.remedy


def generate_error(stub, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(request, timeout=5))
    return err.value


@pytest.mark.parametrize(
    ("capacity_tokens", "request_kw", "code", "cause"),
    [
        (1_000, dict(n_words=CTX), grpc.StatusCode.INVALID_ARGUMENT, "CONTEXT_LENGTH_EXCEEDED"),
        (100, dict(n_words=150), grpc.StatusCode.FAILED_PRECONDITION, "EXCEEDS_CAPACITY"),
        (537, dict(n_words=37, cap_policy=types_pb2.CAP_POLICY_STRICT),
         grpc.StatusCode.FAILED_PRECONDITION, "EXCEEDS_CAPACITY"),
        (None, dict(n_words=5), grpc.StatusCode.UNAVAILABLE, "NO_WORKER"),
    ],
)
def test_each_rejection_cause_has_its_status_code_and_readable_details(
        cluster, capacity_tokens, request_kw, code, cause):
    stub, register = cluster
    if capacity_tokens is not None:
        register(capacity_tokens=capacity_tokens)
    n_words = request_kw.pop("n_words")
    error = generate_error(stub, prompt(n_words, **request_kw))
    assert error.code() == code
    details = rich_status.details_of(error)
    rejection = rich_status.unpack(details, types_pb2.Rejection)
    assert types_pb2.RejectionCause.Name(rejection.cause) == cause
    assert rejection.message in error.details() and rejection.remedy in error.details()
    info = rich_status.unpack(details, error_details_pb2.ErrorInfo)
    assert info.reason == cause and info.domain == "ortserve.v1"
    if cause != "NO_WORKER":
        assert int(info.metadata["prompt_tokens"]) == n_words
    assert stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).total_reserved_bytes == 0


def test_busy_budget_is_resource_exhausted_with_retry_info_when_the_caller_will_not_wait(cluster):
    stub, register = cluster
    register(capacity_tokens=100)
    held = stub.Admit(scheduler_pb2.AdmitRequest(request=prompt(10, max_new_tokens=90)), timeout=5)
    assert held.decision == types_pb2.ADMITTED
    error = generate_error(stub, prompt(10, max_new_tokens=5, max_queue_wait_ms=0))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = rich_status.details_of(error)
    retry = rich_status.unpack(details, error_details_pb2.RetryInfo)
    assert retry.retry_delay.ToMilliseconds() == 2_500
    quota = rich_status.unpack(details, error_details_pb2.QuotaFailure)
    assert quota.violations[0].subject == "kv_cache_bytes"
    assert "retry in 2.5 s" in error.details()
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert budget.total_reserved_bytes == 100 * BPT  # the rejection held nothing


def test_request_without_prompt_is_invalid_argument_naming_the_field(cluster):
    stub, register = cluster
    register(capacity_tokens=100)
    error = generate_error(stub, types_pb2.GenerateRequest(max_new_tokens=3))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = rich_status.unpack(rich_status.details_of(error), error_details_pb2.BadRequest)
    assert bad.field_violations[0].field == "prompt"


def test_claim_of_an_unknown_lease_is_not_found(cluster):
    stub, register = cluster
    register(capacity_tokens=100)
    with pytest.raises(grpc.RpcError) as err:
        stub.internal.ClaimLease(scheduler_pb2.ClaimLeaseRequest(lease_id="forged", worker_id="w1"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Scheduler.Admit" in err.value.details()


def test_reregistration_restores_live_leases_and_heartbeat_tells_unknown_workers(cluster):
    stub, register = cluster
    assert not stub.internal.Heartbeat(scheduler_pb2.HeartbeatRequest(worker_id="w1"), timeout=5).known
    register(capacity_tokens=37 + 500)
    adm = stub.Admit(scheduler_pb2.AdmitRequest(request=prompt(37)), timeout=5)
    lease = stub.internal.ClaimLease(scheduler_pb2.ClaimLeaseRequest(lease_id=adm.lease_id, worker_id="w1"),
                            timeout=5)
    assert lease.budget_cap.admitted_max_new_tokens == 500
    # A "restarted scheduler" sees the worker register again (same address) with its live lease.
    address = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).workers[0].address
    reply = stub.internal.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(
        worker_id="w1", address=address, model="m", context_length=CTX, bytes_per_token=BPT,
        capacity_bytes=537 * BPT, live_leases=[lease]), timeout=5)
    assert list(reply.refused_lease_ids) == []
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(include_leases=True), timeout=5)
    restored = budget.workers[0].leases[0]
    assert restored.lease_id == adm.lease_id and restored.budget_cap == lease.budget_cap
    assert budget.total_reserved_bytes == 537 * BPT


def test_every_session_rpc_reaches_the_session_rpcs_through_the_servicer(cluster):
    # The servicer delegates the session RPCs to its SessionRPCs (composed, not mixed in):
    # each one answers its own domain error, none an INTERNAL for a missing method.
    stub, _ = cluster
    with pytest.raises(grpc.RpcError) as caught:
        stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # NO_WORKER: none registered
    unknown = scheduler_pb2.SessionRequest(session_id="nope")
    calls = [stub.GetSession, stub.SwapOutSession, stub.CloseSession,
             lambda request, timeout: list(stub.SessionTurn(
                 scheduler_pb2.SessionTurnRequest(session_id=request.session_id), timeout=timeout))]
    for call in calls:
        with pytest.raises(grpc.RpcError) as caught:
            call(unknown, timeout=5)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND, caught.value.details()
        assert "is not open" in caught.value.details()
