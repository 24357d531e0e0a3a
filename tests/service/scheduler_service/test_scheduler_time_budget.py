"""The time budget through a real channel (docs/features/time-budget.md): a stand-in worker's
heartbeat carries synthetic step timings; admission then admits, refuses at once with the
numbers and RetryInfo, or queues with a place in line and admits when a stream ends."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.status import rich_status
from ortserve.v1 import internal_pb2_grpc, scheduler_pb2, types_pb2
from tests.service.scheduler_service.test_scheduler_queue import QueueCluster, request


@pytest.fixture()
def cluster():
    made = QueueCluster()
    internal = internal_pb2_grpc.SchedulerInternalStub(made.internal_channel)
    # One stream: 20 ms a step; two: 60 ms.
    assert internal.Heartbeat(scheduler_pb2.HeartbeatRequest(worker_id="w1", step_timings=[
        scheduler_pb2.StepTiming(rows=1, steps=10, seconds=0.2),
        scheduler_pb2.StepTiming(rows=2, steps=10, seconds=0.6)]), timeout=5).known
    yield made
    made.close()


def goal(max_new: int = 5, **kw) -> types_pb2.GenerateRequest:
    return request(max_new, max_itl_ms=50, **kw)


def test_one_stream_fits_the_goal_and_a_second_is_refused_at_once_with_the_numbers(cluster):
    first = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=goal()), timeout=5)
    assert first.decision == types_pb2.ADMITTED
    with pytest.raises(grpc.RpcError) as err:
        list(cluster.stub.Generate(goal(max_ttft_ms=10), timeout=10))
    error = err.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    details = rich_status.details_of(error)
    rejection = rich_status.unpack(details, types_pb2.Rejection)
    assert rejection.cause == types_pb2.TIME_BUSY
    assert (rejection.worker_id, rejection.streams, rejection.itl_goal_ms,
            rejection.ttft_goal_ms) == ("w1", 1, 50, 10)
    assert rejection.predicted_step_ms == pytest.approx(60.0)
    # the first stream's 5 tokens at 20 ms: about 0.1 s, past the 10 ms TTFT goal
    assert 0 < rejection.estimated_wait_ms <= 100.0
    retry = rich_status.unpack(details, error_details_pb2.RetryInfo)
    assert retry is not None and retry.retry_delay.ToNanoseconds() > 0
    assert "60.0 ms" in error.details() and "retry in" in error.details()
    assert cluster.budget().total_reserved_bytes == first.reserved_bytes  # nothing else held


def test_a_wait_within_its_goals_queues_with_a_place_and_starts_when_a_stream_ends(cluster):
    first = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=goal()), timeout=5)
    call = cluster.stub.Generate(goal(max_ttft_ms=60_000), timeout=30)
    queued = next(call)
    assert queued.WhichOneof("event") == "queued" and queued.queued.position == 1
    cluster.release(first)
    admission = next(e for e in call if e.WhichOneof("event") == "admission").admission
    assert admission.decision == types_pb2.ADMITTED
    list(call)


def test_get_budget_shows_the_measured_step_and_the_goal_in_force(cluster):
    cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=goal()), timeout=5)
    (worker,) = cluster.budget().workers
    assert worker.time_measured and worker.streams == 1 and worker.itl_goal_ms == 50
    assert worker.step_ms == pytest.approx(20.0) and worker.next_step_ms == pytest.approx(60.0)


def test_admit_caps_to_the_stream_deadline_its_caller_names_as_generate_caps_to_its_own(cluster):
    # 20 ms a step alone: half a second fits about 24 new tokens (the prompt one more step).
    answer = cluster.stub.Admit(scheduler_pb2.AdmitRequest(
        request=goal(max_new=80), stream_deadline_ms=500), timeout=5)
    assert answer.decision == types_pb2.CAPPED
    cap = answer.budget_cap
    assert cap.limit == types_pb2.CAP_LIMIT_DEADLINE and cap.requested_max_new_tokens == 80
    assert 10 <= cap.admitted_max_new_tokens <= 24 and 0 < cap.deadline_ms <= 500
    assert answer.max_new_tokens == cap.admitted_max_new_tokens
    assert answer.reserved_bytes == (10 + answer.max_new_tokens) * 1_024
    cluster.release(answer)
    # Not even min_new_tokens fit: refused at once, naming what fits.
    refused = cluster.stub.Admit(scheduler_pb2.AdmitRequest(
        request=goal(max_new=80, min_new=60), stream_deadline_ms=500), timeout=5)
    assert refused.decision == types_pb2.REJECTED
    assert refused.rejection.cause == types_pb2.TIME_BUSY
    # None named: Admit's own deadline (1 s: 49 tokens) bounds the admission only, not a cap.
    whole = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=goal(max_new=80)), timeout=1.0)
    assert whole.decision == types_pb2.ADMITTED and whole.max_new_tokens == 80
