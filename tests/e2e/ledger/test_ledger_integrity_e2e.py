"""Ledger integrity under misuse, through real processes, as a black box."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, types_pb2, worker_pb2
from tests.e2e.conftest import (
    reserved_bytes,
    scheduler_stub,
    worker_held_bytes,
    worker_stub,
)

ESSAY = "Write a long essay about the history of the printing press in Europe."


def _reason(error: grpc.RpcError) -> str:
    info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
    return info.reason if info else ""


def _admit(address: str, max_new: int, request_id: str = "") -> types_pb2.Admission:
    # min_new_tokens = max_new_tokens: this plain-text prompt often ends at once with EOS.
    request = types_pb2.GenerateRequest(request_id=request_id, text=ESSAY, max_new_tokens=max_new,
                                        min_new_tokens=max_new)
    return scheduler_stub(address).Admit(scheduler_pb2.AdmitRequest(request=request), timeout=30)


def _wait_zero(roomy) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (reserved_bytes(roomy.address)
                                           or worker_held_bytes(roomy.worker_services[0].address)):
        time.sleep(0.05)
    assert reserved_bytes(roomy.address) == 0
    assert worker_held_bytes(roomy.worker_services[0].address) == 0


def test_a_caller_cannot_release_a_running_lease_and_the_stream_runs_to_completion(roomy):
    admission = _admit(roomy.address, 200)
    worker = worker_stub(admission.worker_address)
    stream = worker.Generate(worker_pb2.WorkerGenerateRequest(
        lease_id=admission.lease_id,
        request=types_pb2.GenerateRequest(text=ESSAY, max_new_tokens=200,
            min_new_tokens=200)), timeout=120)
    assert next(stream).WhichOneof("event") == "admission"
    assert next(stream).WhichOneof("event") == "chunk"  # claimed and running
    with pytest.raises(grpc.RpcError) as err:
        scheduler_stub(roomy.address).Release(
            scheduler_pb2.ReleaseRequest(lease_id=admission.lease_id,
                                         lease_secret=admission.lease_secret), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _reason(err.value) == "LEASE_CLAIMED"
    # The ledger still charges what the worker holds.
    assert reserved_bytes(roomy.address) == admission.reserved_bytes
    assert worker_held_bytes(roomy.worker_services[0].address) == admission.reserved_bytes
    # Per lease too: what a fault checker compares with the ledger's leases.
    info = worker_stub(roomy.worker_services[0].address).Info(worker_pb2.InfoRequest(), timeout=5)
    assert [(h.lease_id, h.held_bytes) for h in info.held_leases] == [
        (admission.lease_id, admission.reserved_bytes)]
    events = list(stream)
    assert events[-1].finished.usage.generated_tokens == 200
    _wait_zero(roomy)


def test_two_step_callers_with_unset_request_ids_run_concurrently(roomy):
    results: dict[int, list] = {}

    def two_step(i: int) -> None:
        admission = _admit(roomy.address, 24)
        stub = worker_stub(admission.worker_address)
        results[i] = list(stub.Generate(worker_pb2.WorkerGenerateRequest(
            lease_id=admission.lease_id,
            request=types_pb2.GenerateRequest(text=ESSAY, max_new_tokens=24,
            min_new_tokens=24)), timeout=120))

    threads = [threading.Thread(target=two_step, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0, 1, 2]
    assert all(r[-1].finished.usage.generated_tokens == 24 for r in results.values())
    _wait_zero(roomy)


def test_a_request_that_does_not_match_its_lease_is_refused_and_the_lease_stays_usable(roomy):
    admission = _admit(roomy.address, 16)
    worker = worker_stub(admission.worker_address)
    with pytest.raises(grpc.RpcError) as err:
        list(worker.Generate(worker_pb2.WorkerGenerateRequest(
            lease_id=admission.lease_id,
            request=types_pb2.GenerateRequest(text=ESSAY, max_new_tokens=64,
            min_new_tokens=64)), timeout=30))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _reason(err.value) == "LEASE_MISMATCH" and "max_new_tokens" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        list(worker.Generate(worker_pb2.WorkerGenerateRequest(
            lease_id=admission.lease_id,
            request=types_pb2.GenerateRequest(text=ESSAY + " Now.", max_new_tokens=16,
            min_new_tokens=16)),
            timeout=30))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _reason(err.value) == "LEASE_MISMATCH"
    assert reserved_bytes(roomy.address) == admission.reserved_bytes  # not burnt, not leaked
    events = list(worker.Generate(worker_pb2.WorkerGenerateRequest(
        lease_id=admission.lease_id,
        request=types_pb2.GenerateRequest(text=ESSAY, max_new_tokens=16,
            min_new_tokens=16)), timeout=60))
    assert events[-1].finished.usage.generated_tokens == 16
    _wait_zero(roomy)


def test_a_duplicate_worker_id_cannot_take_over_a_live_workers_leases(roomy):
    admission = _admit(roomy.address, 300)
    worker = worker_stub(admission.worker_address)
    stream = worker.Generate(worker_pb2.WorkerGenerateRequest(
        lease_id=admission.lease_id,
        request=types_pb2.GenerateRequest(text=ESSAY, max_new_tokens=300,
            min_new_tokens=300)), timeout=180)
    next(stream)
    # A second process under the same --worker-id, at another address.
    impostor = roomy.start_worker(0)
    try:
        deadline = time.monotonic() + 60
        refused = False
        while time.monotonic() < deadline and not refused:
            log_text = impostor.log_path.read_text(errors="replace")
            refused = "scheduler refused this worker" in log_text and "in use" in log_text
            time.sleep(0.2)
        assert refused, impostor.log_tail()
        budget = scheduler_stub(roomy.address).GetBudget(
            scheduler_pb2.GetBudgetRequest(include_leases=True), timeout=5)
        [entry] = budget.workers
        assert entry.address == admission.worker_address
        assert [lease.lease_id for lease in entry.leases] == [admission.lease_id]
        assert list(stream)[-1].finished.usage.generated_tokens == 300
    finally:
        from devtools.cluster import stop_service

        stop_service(impostor)
        roomy.services.remove(impostor)
    _wait_zero(roomy)
