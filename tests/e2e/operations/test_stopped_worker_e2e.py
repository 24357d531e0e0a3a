"""A worker stopped (kill -STOP) while registered: its process keeps its port and its TCP
connection but answers nothing. Admit passes it over for a worker that answers, or refuses
NO_WORKER with the reason, within a few seconds; it waited out Tokenize's 10 s deadline
and answered DEADLINE_EXCEEDED with no details (issue 52, item 3). The stopped worker is
marked until it answers again (its heartbeat after SIGCONT). Real processes: a scheduler
and two CPU workers."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

import grpc
import pytest

from devtools.cluster import stop_service
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import reserved_bytes, scheduler_stub, start_cluster
from tests.e2e.gateway.test_gateway_e2e import MODEL, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# Below Tokenize's own 10 s deadline, far above the ~2 s a stopped worker now costs.
ADMIT_DEADLINE_S = 8.0


@pytest.fixture()
def cluster(tmp_path_factory):
    # A long TTL: a stopped worker stays registered (silent) for the whole test.
    cluster = start_cluster(tmp_path_factory, "stopped-worker", workers=2,
                            kv_capacities=["128MiB", "128MiB"],
                            scheduler_args=["--lease-ttl-s", "600"])
    yield cluster
    for service in cluster.worker_services:  # a stopped process cannot take its SIGTERM
        service.process.send_signal(signal.SIGCONT)
    cluster.stop()


def chat_admit(stub, **kw) -> scheduler_pb2.Admission:
    return stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        chat=types_pb2.ChatMessages(messages=[types_pb2.ChatMessage(role="user", content="hi")]),
        max_new_tokens=4), **kw), timeout=ADMIT_DEADLINE_S)


def release(stub, admission: scheduler_pb2.Admission) -> None:
    stub.Release(scheduler_pb2.ReleaseRequest(lease_id=admission.lease_id,
                                              lease_secret=admission.lease_secret), timeout=10)


def test_admit_passes_a_stopped_worker_over_and_refuses_typed_when_none_answers(cluster):
    stub = scheduler_stub(cluster.address)
    # A lease on one worker: Tokenize asks the least busy worker first, the other one.
    held = stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        token_ids=types_pb2.TokenIds(ids=[1, 2, 3]), max_new_tokens=4)), timeout=10)
    assert held.decision == types_pb2.ADMITTED
    busy = held.worker_id
    [idle] = [s for s in cluster.worker_services if s.name != busy]
    [live] = [s for s in cluster.worker_services if s.name == busy]
    idle.process.send_signal(signal.SIGSTOP)

    passed_over = chat_admit(stub)  # DEADLINE_EXCEEDED at 8 s before: Tokenize on the stopped one
    assert passed_over.decision == types_pb2.ADMITTED and passed_over.worker_id == busy
    release(stub, passed_over)
    again = chat_admit(stub, dry_run=True)  # marked: not asked again
    assert again.decision == types_pb2.ADMITTED and again.worker_id == busy

    live.process.send_signal(signal.SIGSTOP)
    refused = chat_admit(stub)
    assert refused.decision == types_pb2.REJECTED
    assert refused.rejection.cause == types_pb2.NO_WORKER
    assert f"{busy}: answered neither Tokenize" in refused.rejection.message
    assert refused.rejection.HasField("retry_after") and refused.rejection.remedy

    # Both answer again: their heartbeats lift the marks, and a chat is admitted again.
    idle.process.send_signal(signal.SIGCONT)
    live.process.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 60
    while True:
        answer = chat_admit(stub, dry_run=True)
        if answer.decision == types_pb2.ADMITTED or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer.decision == types_pb2.ADMITTED, answer.rejection.message
    release(stub, held)
    assert reserved_bytes(cluster.address) == 0


def test_a_stopped_worker_costs_a_generate_no_deadline(cluster, tmp_path_factory):
    # The same counting path under Generate: NO_WORKER (UNAVAILABLE), typed, not a timeout;
    # through the gateway a 503 no_worker with Retry-After (was 504 deadline_exceeded, no reason).
    gateway = start_gateway(tmp_path_factory, cluster.address)
    try:
        stub = scheduler_stub(cluster.address)
        for service in cluster.worker_services:
            service.process.send_signal(signal.SIGSTOP)
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(types_pb2.GenerateRequest(text="hi", max_new_tokens=4),
                               timeout=ADMIT_DEADLINE_S))
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE, error.value.details()
        assert "answered neither Tokenize" in error.value.details()
        request = urllib.request.Request(
            f"http://{gateway.address}/v1/chat/completions", data=json.dumps({
                "model": MODEL, "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]}).encode(),
            headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as http:
            urllib.request.urlopen(request, timeout=ADMIT_DEADLINE_S)
        body = json.loads(http.value.read())
        assert http.value.code == 503, body
        assert body["error"]["code"] == "no_worker" and http.value.headers["Retry-After"]
    finally:
        stop_service(gateway)
