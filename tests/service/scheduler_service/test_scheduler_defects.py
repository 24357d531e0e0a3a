"""Regression tests for the scheduler's defects, through a real channel."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from ortserve_client.errors import NoWorker, from_rpc_error

from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.service.fake_cluster import BPT, Cluster


@pytest.fixture()
def cluster():
    c = Cluster()
    yield c
    c.close()


def ids(*tokens: int) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=list(tokens)), max_new_tokens=10)


def failure(fn, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        result = fn(*args, timeout=5)
        if not isinstance(result, scheduler_pb2.ReleaseResponse | types_pb2.Admission):
            list(result)
    return err.value


def reason(error: grpc.RpcError) -> str:
    return rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo).reason


def field(error: grpc.RpcError) -> str:
    bad = rich_status.unpack(rich_status.details_of(error), error_details_pb2.BadRequest)
    return bad.field_violations[0].field


def test_callers_release_of_a_claimed_lease_is_refused_and_keeps_its_bytes(cluster):
    cluster.register()
    adm = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=ids(1, 2)), timeout=5)
    cluster.internal.ClaimLease(scheduler_pb2.ClaimLeaseRequest(lease_id=adm.lease_id,
                                                                worker_id="w1"), timeout=5)
    error = failure(cluster.stub.Release, scheduler_pb2.ReleaseRequest(
        lease_id=adm.lease_id, lease_secret=adm.lease_secret))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and reason(error) == "LEASE_CLAIMED"
    assert "'w1'" in error.details() and "cancel its Generate stream" in error.details()
    assert cluster.reserved_bytes() == 12 * BPT  # the worker still holds it
    freed = cluster.internal.ReleaseClaimed(
        scheduler_pb2.ReleaseRequest(lease_id=adm.lease_id, worker_id="w1"), timeout=5)
    assert freed.released and cluster.reserved_bytes() == 0


def test_unclaimed_lease_is_released_by_whoever_holds_its_id_and_secret(cluster):
    cluster.register()
    adm = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=ids(1, 2)), timeout=5)
    assert cluster.stub.Release(scheduler_pb2.ReleaseRequest(
        lease_id=adm.lease_id, lease_secret=adm.lease_secret), timeout=5).released
    assert cluster.reserved_bytes() == 0


def test_no_worker_with_a_text_prompt_says_its_length_is_unknown_and_is_no_worker_for_clients(cluster):
    error = failure(cluster.stub.Generate, types_pb2.GenerateRequest(text="hello there"))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    rejection = rich_status.unpack(rich_status.details_of(error), types_pb2.Rejection)
    assert rejection.cause == types_pb2.NO_WORKER
    assert rejection.prompt_tokens_unknown and rejection.prompt_tokens == 0
    assert "length is unknown" in error.details()
    retry = rich_status.unpack(rich_status.details_of(error), error_details_pb2.RetryInfo)
    assert retry.retry_delay.ToMilliseconds() == 2_500
    assert isinstance(from_rpc_error(error), NoWorker)


def test_no_worker_with_a_token_id_prompt_reports_its_real_length(cluster):
    error = failure(cluster.stub.Generate, ids(5, 6, 7))
    rejection = rich_status.unpack(rich_status.details_of(error), types_pb2.Rejection)
    assert rejection.prompt_tokens == 3 and not rejection.prompt_tokens_unknown


def test_no_worker_answering_tokenize_is_the_same_no_worker_as_the_ledgers(cluster):
    cluster.register(address="127.0.0.1:1")  # registered, but nobody listens there
    error = failure(cluster.stub.Generate, types_pb2.GenerateRequest(text="hello there"))
    assert error.code() == grpc.StatusCode.UNAVAILABLE and reason(error) == "NO_WORKER"
    assert "none of the 1 registered workers answered Tokenize" in error.details()
    assert isinstance(from_rpc_error(error), NoWorker)  # was GenerationFailed
    adm = cluster.stub.Admit(scheduler_pb2.AdmitRequest(
        request=types_pb2.GenerateRequest(text="hi")), timeout=5)
    assert adm.decision == types_pb2.REJECTED and adm.rejection.cause == types_pb2.NO_WORKER


def test_a_bad_number_names_its_own_field_not_min_new_tokens(cluster):
    cluster.register()
    error = failure(cluster.stub.Generate, types_pb2.GenerateRequest(text="a", max_new_tokens=0))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and field(error) == "max_new_tokens"
    error = failure(cluster.stub.Admit, scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        text="a", max_new_tokens=2, min_new_tokens=3)))
    assert field(error) == "request.min_new_tokens"


def test_token_id_prompt_is_admitted_without_tokenize_and_checked_against_the_vocabulary(cluster):
    cluster.register()
    adm = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=ids(1, 2, 3)), timeout=5)
    assert adm.decision == types_pb2.ADMITTED and adm.prompt_tokens == 3
    assert cluster.worker.tokenize_calls == 0
    error = failure(cluster.stub.Admit, scheduler_pb2.AdmitRequest(request=ids(1, 5_000)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field(error) == "request.token_ids.ids[1]" and "1,000" in error.details()


def test_generate_forwards_the_counted_prompt_to_the_worker(cluster):
    cluster.register()
    list(cluster.stub.Generate(types_pb2.GenerateRequest(text="one two three"), timeout=5))
    sent = cluster.worker.generate_requests[-1]
    assert list(sent.prompt_token_ids) == [0, 1, 2] and sent.request.max_new_tokens > 0
    assert cluster.reserved_bytes() == 0


def test_duplicate_live_worker_id_at_another_address_is_already_exists_naming_both(cluster):
    cluster.register(worker_id="w1")
    error = failure(cluster.internal.RegisterWorker, scheduler_pb2.RegisterWorkerRequest(
        worker_id="w1", address="10.0.0.9:7000", model="m", context_length=64, bytes_per_token=BPT,
        capacity_bytes=100 * BPT))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS and reason(error) == "WORKER_ID_IN_USE"
    assert cluster.worker_address in error.details() and "10.0.0.9:7000" in error.details()
    budget = cluster.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert [w.address for w in budget.workers] == [cluster.worker_address]
    cluster.register(worker_id="w1")  # the same worker re-registering stays fine


def test_a_deregistered_worker_id_registers_again_at_once_from_another_address():
    # A worker's clean stop says it is gone: the ledger forgets it with its leases (each
    # once), so its restart on a new port is not refused WORKER_ID_IN_USE for lease_ttl_s.
    from ortserve.v1 import internal_pb2
    from tests.service.scheduler_service.test_scheduler_metrics import scrape

    cluster = Cluster(metrics_port=0)
    try:
        cluster.register(worker_id="w1")
        adm = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=ids(1, 2)), timeout=5)
        cluster.internal.ClaimLease(scheduler_pb2.ClaimLeaseRequest(lease_id=adm.lease_id,
                                                                    worker_id="w1"), timeout=5)
        restarted = dict(worker_id="w1", address="10.0.0.9:7000", model="m", context_length=64,
                         bytes_per_token=BPT, capacity_bytes=100 * BPT)
        error = failure(cluster.internal.RegisterWorker,
                        scheduler_pb2.RegisterWorkerRequest(**restarted))
        assert reason(error) == "WORKER_ID_IN_USE"  # its old self still holds the id
        # A refused duplicate's goodbye (its own address) takes nothing from the live worker.
        stray = cluster.internal.Deregister(internal_pb2.DeregisterRequest(
            worker_id="w1", address="10.0.0.9:7000"), timeout=5)
        assert not stray.known and cluster.reserved_bytes() == 12 * BPT

        gone = cluster.internal.Deregister(internal_pb2.DeregisterRequest(
            worker_id="w1", address=cluster.worker_address), timeout=5)
        assert gone.known and gone.released_leases == 1 and gone.freed_bytes == 12 * BPT
        budget = cluster.stub.GetBudget(scheduler_pb2.GetBudgetRequest(include_leases=True),
                                        timeout=5)
        assert not budget.workers and budget.total_leases == 0
        assert not cluster.internal.ReleaseClaimed(scheduler_pb2.ReleaseRequest(
            lease_id=adm.lease_id, worker_id="w1"), timeout=5).released  # released once
        assert not cluster.internal.Deregister(internal_pb2.DeregisterRequest(
            worker_id="w1", address=cluster.worker_address), timeout=5).known  # idempotent
        cluster.internal.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(**restarted),
                                        timeout=5)
        budget = cluster.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
        assert [w.address for w in budget.workers] == ["10.0.0.9:7000"]
        samples = scrape(cluster.scheduler.metrics_port)
        assert samples[("ortserve_scheduler_worker_deregistrations_total", ())] == 1
        assert samples[("ortserve_scheduler_deregistered_leases_total", ())] == 1
        assert samples[("ortserve_scheduler_lease_expiries_total", ())] == 0
    finally:
        cluster.close()


def test_registration_below_one_block_is_invalid_argument_naming_capacity_bytes(cluster):
    error = failure(cluster.internal.RegisterWorker, scheduler_pb2.RegisterWorkerRequest(
        worker_id="w2", address="x:1", model="m", context_length=64, bytes_per_token=BPT,
        block_tokens=16, capacity_bytes=15 * BPT))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and field(error) == "capacity_bytes"
    assert "--kv-capacity" in error.details()


@pytest.mark.parametrize("request_id", ["", "same"])
def test_requests_sharing_a_request_id_are_all_served(cluster, request_id):
    cluster.register()
    results, errors = [], []

    def generate():
        try:
            results.append(list(cluster.stub.Generate(types_pb2.GenerateRequest(
                text="a b", max_new_tokens=4, request_id=request_id), timeout=10)))
        except grpc.RpcError as error:
            errors.append(error)

    threads = [threading.Thread(target=generate) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 2
    assert all(events[-1].HasField("finished") for events in results)
    admits = [cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        text="a", max_new_tokens=4, request_id=request_id)), timeout=5) for _ in range(2)]
    assert len({a.lease_id for a in admits}) == 2 and all(a.lease_id for a in admits)
    for a in admits:
        cluster.stub.Release(scheduler_pb2.ReleaseRequest(lease_id=a.lease_id,
                                                          lease_secret=a.lease_secret), timeout=5)
    assert cluster.reserved_bytes() == 0


def test_long_ids_are_refused_naming_the_field_and_never_overflow_metadata(cluster):
    cluster.register()
    error = failure(cluster.stub.Release, scheduler_pb2.ReleaseRequest(lease_id="L" * 5_000))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and field(error) == "lease_id"
    error = failure(cluster.internal.ClaimLease, scheduler_pb2.ClaimLeaseRequest(
        lease_id="L" * 5_000, worker_id="w1"))
    assert error.code() == grpc.StatusCode.NOT_FOUND and len(error.details()) < 600
    error = failure(cluster.stub.Generate, types_pb2.GenerateRequest(text="a", request_id="r" * 300))
    assert field(error) == "request_id"


def test_unknown_chat_role_is_invalid_argument_naming_the_turn(cluster):
    cluster.register()
    chat = types_pb2.ChatMessages(messages=[types_pb2.ChatMessage(role="user", content="hi"),
                                            types_pb2.ChatMessage(role="wizard" * 4_000, content="x")])
    error = failure(cluster.stub.Generate, types_pb2.GenerateRequest(chat=chat))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field(error) == "chat.messages[1].role" and len(error.details()) < 400


def test_a_refused_duplicates_heartbeat_neither_drains_the_live_worker_nor_drops_its_leases():
    # The refused process under the same --worker-id heartbeats as it stops: draining,
    # with no live leases. Keyed on the id alone, that drained the live worker for good
    # (every later request NO_WORKER) and, past the grace, released its running leases.
    c = Cluster(heartbeat_interval_s=0.01)  # reconcile's grace: 2 x 0.01 s
    try:
        c.register(worker_id="w1")
        adm = c.stub.Admit(scheduler_pb2.AdmitRequest(request=ids(1, 2)), timeout=5)
        c.internal.ClaimLease(scheduler_pb2.ClaimLeaseRequest(lease_id=adm.lease_id,
                                                              worker_id="w1"), timeout=5)
        time.sleep(0.1)  # a lower bound: the claim is now older than the grace
        reply = c.internal.Heartbeat(scheduler_pb2.HeartbeatRequest(
            worker_id="w1", address="10.0.0.9:7000", draining=True), timeout=5)
        assert not reply.known
        assert c.reserved_bytes() == 12 * BPT  # the live worker's lease kept
        [worker] = c.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).workers
        assert not worker.draining
        c.stub.Admit(scheduler_pb2.AdmitRequest(request=ids(3, 4)), timeout=5)  # still placed on
        assert c.internal.Heartbeat(scheduler_pb2.HeartbeatRequest(
            worker_id="w1", address=c.worker_address, live_lease_ids=[adm.lease_id]),
            timeout=5).known
    finally:
        c.close()
