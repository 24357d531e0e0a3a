"""Time beside bytes through real processes: a scheduler and one worker on the default model.

Not the tiny model: its one-stream step can be under a millisecond on a fast CPU, below
the smallest gap goal a request can name (1 ms), so "a goal below the step" would not be
one there. SmolLM2-135M fp32 steps in tens of milliseconds on any CPU.

The worker measures its decode steps and reports them with its heartbeats; the
scheduler predicts the step from them (docs/features/time-budget.md). A gap goal
below the worker's one-stream step is refused with the numbers, a deadline too
short for max_new_tokens caps them (said in the first event, before any token),
and a request without goals is served as before (goals are off by default).
"""

from __future__ import annotations

import time

import grpc
import pytest
from google.rpc import error_details_pb2

from devtools.cluster import LocalCluster
from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import require_model, scheduler_stub


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # 256 MiB: ~5,800 tokens at 46,080 bytes each, so a 1,500-token ask is capped by its
    # deadline, never by bytes.
    cluster = LocalCluster(model_dir=require_model(),
                           log_dir=tmp_path_factory.mktemp("logs-time-budget"),
                           kv_capacities=[str(256 << 20)],
                           scheduler_args=["--heartbeat-interval-s", "0.5"]).start()
    yield cluster
    cluster.stop()


def measured(stub, timeout_s: float = 120.0, prompt_pace: bool = False) -> scheduler_pb2.WorkerBudget:
    """Decode until the scheduler holds a measured step for the worker (and, with
    `prompt_pace`, its prompt chunks' pace): waits on the state, not on a time (the worker
    reports with its next heartbeat)."""
    deadline = time.monotonic() + timeout_s
    while True:
        (worker,) = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=10).workers
        done = worker.time_measured and (worker.prompt_token_ms > 0 or not prompt_pace)
        if done or time.monotonic() > deadline:
            break
        list(stub.Generate(types_pb2.GenerateRequest(text="Hi", max_new_tokens=8), timeout=60))
    assert done, f"no step (or prompt pace) measured in {timeout_s:g} s: {worker}"
    return worker


def test_the_budget_shows_the_measured_step_and_goals_are_off_by_default(served):
    stub = scheduler_stub(served.address)
    worker = measured(stub, prompt_pace=True)
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=10)
    assert budget.max_itl_ms == 0 and budget.max_ttft_ms == 0
    assert worker.steps_measured > 0 and worker.next_step_ms > 0
    # The prompt pace its heartbeats carry, as the TTFT prediction reads it: the engine's
    # default chunk of 512 tokens.
    assert worker.prompt_token_ms > 0 and worker.prefill_chunk_tokens == 512
    assert worker.prompt_chunk_ms >= 0
    assert [m.rows for m in worker.step_means][0] >= 1
    # No goal anywhere: the request is admitted by bytes, whole, as before.
    events = list(stub.Generate(types_pb2.GenerateRequest(text="Hi", max_new_tokens=8,
                                                          ignore_eos=True), timeout=60))
    assert events[0].admission.decision == types_pb2.ADMITTED
    assert not events[-1].finished.HasField("budget_cap")
    assert events[-1].finished.usage.generated_tokens == 8


def test_a_gap_goal_below_one_streams_step_is_refused_with_the_numbers(served):
    stub = scheduler_stub(served.address)
    worker = measured(stub)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(types_pb2.GenerateRequest(text="Hi", max_new_tokens=8, max_itl_ms=1),
                           timeout=60))
    error = err.value
    # A goal the worker can never meet: the system as it is cannot serve it (400 at the gateway).
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    rejection = rich_status.unpack(rich_status.details_of(error), types_pb2.Rejection)
    assert rejection.cause == types_pb2.TIME_GOAL_UNREACHABLE
    assert rejection.worker_id == worker.worker_id and rejection.itl_goal_ms == 1
    assert rejection.fastest_step_ms > 1
    assert "max_itl_ms 1 " in error.details() and "loosen max_itl_ms" in error.details()
    info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
    assert info.reason == "TIME_GOAL_UNREACHABLE" and float(info.metadata["fastest_step_ms"]) > 1
    # Admit answers the same as a decision, nothing reserved.
    answer = stub.Admit(scheduler_pb2.AdmitRequest(
        request=types_pb2.GenerateRequest(text="Hi", max_new_tokens=8, max_itl_ms=1)), timeout=60)
    assert answer.decision == types_pb2.REJECTED
    assert answer.rejection.cause == types_pb2.TIME_GOAL_UNREACHABLE


def test_a_deadline_too_short_for_max_new_tokens_caps_them_before_the_first_token(served):
    stub = scheduler_stub(served.address)
    worker = measured(stub)
    # About 100 steps at the step the scheduler predicts for one stream: far fewer than
    # the 1,500 tokens asked, whatever this machine's speed.
    deadline_s = max(worker.next_step_ms * 100 / 1e3, 0.5)
    call = stub.Generate(types_pb2.GenerateRequest(text="Hi", max_new_tokens=1_500,
                                                   ignore_eos=True, max_itl_ms=60_000),
                         timeout=deadline_s)
    try:
        first = next(call)
    finally:
        call.cancel()  # the cap is what this test reads; the stream may run to its deadline
    assert first.admission.decision == types_pb2.CAPPED
    cap = first.admission.budget_cap
    assert cap.limit == types_pb2.CAP_LIMIT_DEADLINE
    assert cap.requested_max_new_tokens == 1_500
    assert 0 < cap.admitted_max_new_tokens < 1_500
    assert first.admission.max_new_tokens == cap.admitted_max_new_tokens
    # The time left as the scheduler read it (gRPC's timeout header rounds up a little).
    assert cap.predicted_step_ms > 0 and 0 < cap.deadline_ms <= deadline_s * 1e3 * 1.05
    assert "deadline" in cap.reason and f"{cap.admitted_max_new_tokens:,}" in cap.reason


def test_the_client_s_two_step_path_is_capped_to_its_deadline_as_a_relayed_one(served):
    from ortserve_client import Client

    stub = scheduler_stub(served.address)
    worker = measured(stub)
    deadline_s = max(worker.next_step_ms * 100 / 1e3, 0.5)
    client = Client(served.address, timeout_s=deadline_s)  # direct: Admit, then the worker
    try:
        admissions = []
        stream = client.stream("Hi", max_new_tokens=1_500,
                               max_itl_ms=60_000, on_admission=admissions.append)
        try:
            next(iter(stream))
        except Exception:  # noqa: BLE001 - the cap is what this test reads, not the stream's end
            pass
        finally:
            stream.cancel()
    finally:
        client.close()
    (admission,) = admissions
    cap = admission.budget_cap
    assert cap is not None and cap.limit == "deadline", admission
    assert cap.requested_max_new_tokens == 1_500 and 0 < cap.admitted_max_new_tokens < 1_500


def _close(stub, session_id: str) -> None:
    """Close the session once its worker has ended the cancelled turn (SESSION_BUSY until then:
    waits on that state, bounded)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            stub.CloseSession(scheduler_pb2.SessionRequest(session_id=session_id), timeout=10)
            return
        except grpc.RpcError as error:
            info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
            if info is None or info.reason != "SESSION_BUSY" or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_session_turn_is_held_to_its_goal_and_capped_to_its_deadline_like_a_generate(served):
    stub = scheduler_stub(served.address)
    worker = measured(stub)
    session_id = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30).session_id
    try:
        def turn(timeout_s: float, **fields):
            return stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
                session_id=session_id, request=types_pb2.GenerateRequest(
                    token_ids=types_pb2.TokenIds(ids=[1, 15, 16]), **fields)), timeout=timeout_s)

        with pytest.raises(grpc.RpcError) as err:
            list(turn(60, max_new_tokens=8, max_itl_ms=1))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value.details()
        rejection = rich_status.unpack(rich_status.details_of(err.value), types_pb2.Rejection)
        assert rejection.cause == types_pb2.TIME_GOAL_UNREACHABLE
        assert rejection.worker_id == worker.worker_id and rejection.fastest_step_ms > 1
        # The turn's own deadline caps it as Generate's caps a request.
        deadline_s = max(worker.next_step_ms * 100 / 1e3, 0.5)
        call = turn(deadline_s, max_new_tokens=1_500, ignore_eos=True, max_itl_ms=60_000)
        try:
            first = next(call)
        finally:
            call.cancel()
        assert first.admission.decision == types_pb2.CAPPED
        cap = first.admission.budget_cap
        assert cap.limit == types_pb2.CAP_LIMIT_DEADLINE and cap.requested_max_new_tokens == 1_500
        assert 0 < cap.admitted_max_new_tokens < 1_500 and cap.predicted_step_ms > 0
        # A turn that ran to its end is a stream no more once its worker shrank the lease.
        _close(stub, session_id)
        session_id = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30).session_id
        events = list(turn(60, max_new_tokens=4, max_itl_ms=60_000))
        assert events[-1].WhichOneof("event") == "finished"
        deadline = time.monotonic() + 30
        while (streams := stub.GetBudget(scheduler_pb2.GetBudgetRequest(),
                                         timeout=10).workers[0].streams) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert streams == 0
    finally:
        _close(stub, session_id)
