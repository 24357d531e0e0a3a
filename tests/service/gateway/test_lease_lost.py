"""A lease lost on its way to the worker (the scheduler that granted it restarted without
it): the gateway's default path answers a retryable 503 `lease_lost` with Retry-After, not
the 404 `lease_not_found` HTTP clients read as "no such route or model" (issue 52: 9 of
15,488 chat completions in a fault run). A real scheduler and a stand-in worker that
answers LEASE_NOT_FOUND, as the real one does when its claim finds no such lease; real
channels, the gateway's own open_direct and error mapping."""

from __future__ import annotations

import grpc
import pytest

from gateway.direct import Workers, open_direct
from gateway.reply.errors import from_grpc
from ortserve.status.errors import DomainError, ErrorReason
from ortserve.v1 import scheduler_pb2_grpc, types_pb2
from tests.service.fake_cluster import Cluster, StandInWorker


class LostLeaseWorker(StandInWorker):
    """Generate: the claim found no such lease (the worker's NoLiveLease)."""

    async def Generate(self, request, context):
        self.generate_requests.append(request)
        raise DomainError(ErrorReason.LEASE_NOT_FOUND, f"worker w1 serves only admitted "
                          f"requests: lease {request.lease_id} is not live",
                          metadata={"lease_id": request.lease_id})
        yield  # an async generator, as the servicer's Generate


@pytest.fixture()
def cluster():
    made = Cluster(worker=LostLeaseWorker())
    made.register()
    yield made
    made.close()


def test_a_lease_lost_before_the_worker_took_it_is_a_retryable_503(cluster):
    async def chat():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{cluster.scheduler.port}") as channel:
            workers = Workers(None)
            try:
                request = types_pb2.GenerateRequest(text="hi there", max_new_tokens=4,
                                                    request_id="r1")
                await open_direct(scheduler_pb2_grpc.SchedulerStub(channel), workers, request,
                                  timeout_s=10, metadata=())
            except grpc.RpcError as error:
                return error
            finally:
                await workers.close()
        raise AssertionError("the stream opened")

    error = cluster.loop.run(chat())
    assert cluster.worker.generate_requests, "the worker was never asked"
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    http = from_grpc(error, "messages")
    assert (http.status, http.code, http.type) == (503, "lease_lost", "service_unavailable")
    assert http.headers()["Retry-After"] == "1"
    assert http.ortserve["metadata"]["lease_id"] == cluster.worker.generate_requests[0].lease_id
    assert "retry the request" in http.message and "lost" in http.message
    # The lease no worker claimed went back to the budget.
    assert cluster.reserved_bytes() == 0


class UnrestoredWorker(StandInWorker):
    """Generate: two chunks, then the lease is gone (the worker re-registered and the ledger
    did not take it back: the worker's LeaseNotRestored, NOT_FOUND LEASE_NOT_FOUND)."""

    async def Generate(self, request, context):
        self.generate_requests.append(request)
        for n in range(2):
            yield types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(token_ids=[n], text="t"))
        raise DomainError(ErrorReason.LEASE_NOT_FOUND, f"worker w1 re-registered and the ledger "
                          f"did not take back lease {request.lease_id}",
                          metadata={"lease_id": request.lease_id})


def test_a_lease_lost_mid_stream_on_the_relayed_path_is_a_retryable_unavailable():
    cluster = Cluster(worker=UnrestoredWorker())
    try:
        cluster.register()
        chunks = 0
        with pytest.raises(grpc.RpcError) as failure:
            for event in cluster.stub.Generate(types_pb2.GenerateRequest(
                    text="hi there", max_new_tokens=8), timeout=10):
                chunks += event.WhichOneof("event") == "chunk"
        error = failure.value
        assert chunks >= 1
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
        http = from_grpc(error, "messages")
        assert (http.status, http.code) == (503, "lease_lost")
        assert http.headers()["Retry-After"] == "1"
        assert http.ortserve["metadata"]["tokens_sent"] == "2"
    finally:
        cluster.close()
