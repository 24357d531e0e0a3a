"""Waiters in the admission queue through real processes: a queued client
killed with SIGKILL leaves the queue because it went away (counted cancelled while
queued, long before its queue wait could end it), and a session turn on a busy budget
waits in the queue like a Generate, then is served.

One scheduler and one CPU worker with 16 MiB of KV (352 tokens of the default model);
one Admit holds all of it while the waiters wait.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import grpcurl, reserved_bytes, scheduler_stub, start_cluster
from tests.e2e.ledger.test_request_outcomes_e2e import metrics_port, moved, outcomes

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CAPACITY_TOKENS = 352  # 16 MiB / 46,080 bytes a token, in whole 16-token blocks
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    # The queue wait is far longer than any wait below: a waiter that leaves the queue
    # within them left because its caller went away, and the outcome counter says so.
    cluster = start_cluster(tmp_path_factory, "queue-waiters", kv_capacities=["16MiB"],
                            scheduler_args=["--max-queue-wait-s", "600", "--metrics-port", "0"])
    cluster.metrics_port = metrics_port(cluster.services[0])
    yield cluster
    cluster.stop()


def queue_length(address: str) -> int:
    return scheduler_stub(address).GetBudget(scheduler_pb2.GetBudgetRequest(),
                                             timeout=5).queue_length


def wait_for(check, timeout_s: float = 60.0, poll_s: float = 0.02) -> float:
    """Seconds until check() holds (fails the test after timeout_s)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, "timed out"
        time.sleep(poll_s)
    return time.monotonic() - started


def hold_everything(address: str) -> types_pb2.Admission:
    new = CAPACITY_TOKENS - len(PROMPT)
    held = scheduler_stub(address).Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        token_ids=types_pb2.TokenIds(ids=PROMPT), max_new_tokens=new, min_new_tokens=new)),
        timeout=30)
    assert held.decision == types_pb2.ADMITTED, held
    return held


def release(address: str, held: types_pb2.Admission) -> None:
    scheduler_stub(address).Release(scheduler_pb2.ReleaseRequest(
        lease_id=held.lease_id, lease_secret=held.lease_secret), timeout=5)


def test_a_queued_client_killed_with_sigkill_leaves_the_queue_as_cancelled(tight):
    held = hold_everything(tight.address)
    body = json.dumps({"token_ids": {"ids": PROMPT}, "max_new_tokens": 8, "min_new_tokens": 8})
    try:
        for _ in range(3):  # the race was rare: a few rounds, each through a real process
            client = subprocess.Popen([grpcurl(), "-plaintext", "-d", body, tight.address,
                                       "ortserve.v1.Scheduler/Generate"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            wait_for(lambda: queue_length(tight.address) == 1)
            time.sleep(0.6)  # a few of the waiter's wake-ups (every 0.25 s) go by first
            before = outcomes(tight.metrics_port)
            client.kill()
            client.wait(10)
            left_s = wait_for(lambda: queue_length(tight.address) == 0, timeout_s=120)
            print(f"\nSIGKILLed queued client left the queue in {left_s * 1e3:.0f} ms")
            # Why it left, not how fast: its caller went away while it waited (not the
            # 600 s queue wait, not an admission), counted once.
            assert moved(tight.metrics_port, before) == {("generate", "cancelled", "queued"): 1}
    finally:
        release(tight.address, held)
    assert reserved_bytes(tight.address) == 0  # nothing leaked: no lease, no waiter


def test_a_session_turn_on_a_busy_budget_waits_in_the_queue_and_is_then_served(tight):
    stub = scheduler_stub(tight.address)
    sid = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30).session_id
    held = hold_everything(tight.address)
    events: list[types_pb2.GenerateEvent] = []

    def turn() -> None:
        events.extend(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
            session_id=sid, request=types_pb2.GenerateRequest(
                chat=types_pb2.ChatMessages(messages=[types_pb2.ChatMessage(
                    role="user", content="What is the capital of France?")]),
                max_new_tokens=8, min_new_tokens=8)), timeout=120))

    runner = threading.Thread(target=turn)
    try:
        runner.start()
        wait_for(lambda: queue_length(tight.address) == 1)  # the turn waits, not REJECTED
        time.sleep(0.5)
    finally:
        release(tight.address, held)
    runner.join(120)
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "queued" and events[0].queued.position == 1, kinds
    admission = next(e.admission for e in events if e.WhichOneof("event") == "admission")
    assert admission.decision == types_pb2.ADMITTED and admission.queue_wait_ms >= 400
    finished = events[-1].finished
    assert kinds[-1] == "finished" and finished.usage.generated_tokens == 8
    assert finished.session.turns == 1 and finished.session.reserved_bytes > 0
    closed = stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert closed.closed
    assert reserved_bytes(tight.address) == 0 and queue_length(tight.address) == 0
