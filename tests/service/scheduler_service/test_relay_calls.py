"""The scheduler's relay over Worker.Relay, through real channels to a stand-in worker:
requests share one call and each gets its own events; a cancel, a deadline and one
request's failure reach only that request; a worker without Relay, or going away."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.status import rich_status
from ortserve.status.errors import DomainError, ErrorReason
from ortserve.v1 import types_pb2, worker_pb2_grpc
from tests.service.fake_cluster import Cluster, StandInWorker


class SlowWorker(StandInWorker):
    """Generate: `tokens` chunks, one per `step_s`, then Finished; a prompt saying "fail"
    is refused as its KV not fitting, one saying "lost" as an unknown lease (expired
    before the worker took it). Records how each request ended."""

    def __init__(self, tokens: int = 5, step_s: float = 0.01) -> None:
        super().__init__()
        self.tokens, self.step_s = tokens, step_s
        self.ended: list[str] = []

    async def Generate(self, request, context):
        self.generate_requests.append(request)
        if "fail" in request.request.text:
            raise DomainError(ErrorReason.WORKER_KV_FULL, "the sequence's KV does not fit "
                              "here now; retry", metadata={"lease_id": request.lease_id})
        if "lost" in request.request.text:
            raise DomainError(ErrorReason.LEASE_NOT_FOUND, f"lease {request.lease_id} is not "
                              "live here; admit again", metadata={"lease_id": request.lease_id})
        how = "cancelled"
        try:
            for n in range(self.tokens):
                await asyncio.sleep(self.step_s)
                yield types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(token_ids=[n],
                                                                         text=f"t{n} "))
            yield types_pb2.GenerateEvent(finished=types_pb2.Finished(
                finish_reason=types_pb2.LENGTH))
            how = "finished"
        finally:
            self.ended.append(how)


class NoRelayWorker(SlowWorker):
    """A worker from before Relay: the method is not served (UNIMPLEMENTED)."""

    Relay = worker_pb2_grpc.WorkerServicer.Relay


@pytest.fixture()
def make_cluster():
    made: list[Cluster] = []

    def make(worker, **config) -> Cluster:
        cluster = Cluster(worker, **config)
        cluster.register()
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def request(text: str = "one two three", max_new_tokens: int = 8) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(text=text, max_new_tokens=max_new_tokens)


def texts(events) -> str:
    return "".join(e.chunk.text for e in events if e.WhichOneof("event") == "chunk")


def run_concurrently(cluster: Cluster, count: int, text: str = "one two three") -> list:
    results: list = [None] * count

    def one(i: int) -> None:
        try:
            results[i] = list(cluster.stub.Generate(request(text), timeout=10))
        except grpc.RpcError as error:
            results[i] = error

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return results


def wait_for(predicate, timeout_s: float = 5.0) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.01)
    return time.monotonic() - start


def test_concurrent_requests_share_one_relay_call_and_each_gets_its_own_events(make_cluster):
    cluster = make_cluster(SlowWorker())
    results = run_concurrently(cluster, 8)
    for events in results:
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds[0] == "admission" and kinds[-1] == "finished"
        assert texts(events) == "t0 t1 t2 t3 t4 "
        assert events[-1].finished.timings.total_ms >= events[-1].finished.timings.ttft_ms
    assert cluster.worker.relay_calls == 1 and len(cluster.worker.generate_requests) == 8
    assert cluster.worker.ended == ["finished"] * 8
    assert cluster.reserved_bytes() == 0


def test_a_client_cancel_reaches_only_its_request_on_the_worker(make_cluster):
    worker = SlowWorker(tokens=2_000, step_s=0.005)
    cluster = make_cluster(worker)
    other = cluster.stub.Generate(request(), timeout=30)
    stream = cluster.stub.Generate(request(), timeout=30)
    next(stream), next(stream), next(stream)  # admission and two chunks: running
    next(other), next(other)
    stream.cancel()
    waited = wait_for(lambda: worker.ended == ["cancelled"])
    print(f"client cancel -> the worker's request cancelled: {waited * 1e3:.0f} ms")
    assert next(other).chunk.text  # the other request streams on
    other.cancel()
    wait_for(lambda: worker.ended == ["cancelled", "cancelled"])
    wait_for(lambda: cluster.reserved_bytes() == 0)


def test_a_deadline_ends_the_request_and_cancels_it_on_the_worker(make_cluster):
    worker = SlowWorker(tokens=2_000, step_s=0.005)
    cluster = make_cluster(worker)
    with pytest.raises(grpc.RpcError) as failure:
        list(cluster.stub.Generate(request(), timeout=0.5))
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(lambda: worker.ended == ["cancelled"])
    wait_for(lambda: cluster.reserved_bytes() == 0)


def test_one_requests_failure_ends_it_alone_with_the_workers_code_and_details(make_cluster):
    worker = SlowWorker(tokens=20)
    cluster = make_cluster(worker)
    other = cluster.stub.Generate(request(), timeout=10)
    next(other)
    with pytest.raises(grpc.RpcError) as failure:
        list(cluster.stub.Generate(request("please fail now"), timeout=10))
    error = failure.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry" in error.details()
    info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
    assert info.reason == "WORKER_KV_FULL" and info.metadata["lease_id"]
    rest = list(other)
    assert rest[-1].WhichOneof("event") == "finished"
    assert cluster.worker.relay_calls == 1  # the failure did not end the shared call
    wait_for(lambda: cluster.reserved_bytes() == 0)


def test_a_worker_without_relay_is_served_by_a_generate_call_per_request(make_cluster):
    cluster = make_cluster(NoRelayWorker())
    first = run_concurrently(cluster, 4)
    then = run_concurrently(cluster, 2)
    for events in first + then:
        assert not isinstance(events, grpc.RpcError), events
        assert texts(events) == "t0 t1 t2 t3 t4 " and events[-1].finished
    assert cluster.worker.ended == ["finished"] * 6
    # Registered again (a restart may bring a version with Relay): Relay is tried again,
    # and this worker still gets its requests through the fall-back.
    cluster.register()
    assert texts(run_concurrently(cluster, 1)[0]) == "t0 t1 t2 t3 t4 "
    assert cluster.reserved_bytes() == 0


def test_per_request_relay_calls_serve_the_same_events(make_cluster):
    cluster = make_cluster(SlowWorker(), relay_calls="per-request")
    for events in run_concurrently(cluster, 3):
        assert texts(events) == "t0 t1 t2 t3 t4 " and events[-1].finished
    assert cluster.worker.relay_calls == 0


@pytest.mark.parametrize("relay_calls", ["shared", "per-request"])
def test_the_worker_going_away_fails_its_streams_unavailable_naming_it(make_cluster, relay_calls):
    worker = SlowWorker(tokens=2_000, step_s=0.005)
    cluster = make_cluster(worker, relay_calls=relay_calls)
    stream = cluster.stub.Generate(request(), timeout=30)
    sent = [event for event in (next(stream), next(stream), next(stream))
            if event.WhichOneof("event") == "chunk"]
    cluster.loop.run(cluster._worker_server.stop(0))
    with pytest.raises(grpc.RpcError) as failure:
        for event in stream:  # the chunks that were on their way
            sent += [event] if event.WhichOneof("event") == "chunk" else []
    error = failure.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"worker w1 at {cluster.worker_address} failed after {len(sent)} tokens" in \
        error.details()
    # The ErrorInfo every failure carries (docs/errors.md): the gateway's worker_failed.
    info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
    assert info is not None, "no ErrorInfo on a worker's failure"
    assert info.reason == "WORKER_FAILED" and info.domain == "ortserve.v1"
    assert dict(info.metadata) | {"upstream_code": "-"} == {
        "worker_id": "w1", "worker_address": cluster.worker_address,
        "tokens_sent": str(len(sent)), "upstream_code": "-"}


@pytest.mark.parametrize("relay_calls", ["shared", "per-request"])
def test_a_lease_lost_before_the_worker_took_it_is_the_worker_failing(make_cluster, relay_calls):
    # A worker stopped past the lease TTL finds, when it resumes, the lease of a request
    # relayed to it expired: its caller never held a lease (the scheduler's, on
    # Generate), so not "admit again" with NOT_FOUND, but UNAVAILABLE: retry.
    cluster = make_cluster(SlowWorker(), relay_calls=relay_calls)
    with pytest.raises(grpc.RpcError) as failure:
        list(cluster.stub.Generate(request("lost while stopped"), timeout=10))
    error = failure.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "its lease expired before the worker took the request" in error.details()
    assert "retry the request" in error.details()
    info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
    assert info.reason == "WORKER_FAILED" and info.metadata["tokens_sent"] == "0"
    assert info.metadata["upstream_code"] == "NOT_FOUND"
    wait_for(lambda: cluster.reserved_bytes() == 0)
